//! What one Slurm attempt is given ([`JobSpec`]), what it produces ([`JobAttempt`]) and
//! what the launcher hears while it runs ([`JobNews`]). The job loop and the output reader
//! use these as much as the facade in `mod.rs` does, so they live in a file of their own
//! that none of them imports back.

use std::path::Path;
use std::time::Duration;

use crate::events::Event;
use crate::results::Environment;
use crate::run::executor::AttemptOutput;
use crate::slurm::JobPlan;

/// Settings of one Slurm attempt.
pub(crate) struct JobSpec<'a> {
    pub plan: JobPlan,
    /// Counted from the job's start (not its submission).
    pub timeout: Duration,
    pub grace: Duration,
    /// The log files' common stem, as for a local attempt.
    pub log_stem: &'a Path,
}

/// What a Slurm attempt produced, beyond what a local one does.
pub(crate) struct JobAttempt {
    pub out: AttemptOutput,
    pub job_id: Option<String>,
    /// The job's nodes as Slurm writes a node list (`node[1-2]`).
    pub nodes: Option<String>,
    /// The same nodes by name (`node1`, `node2`), in Slurm's order.
    pub node_names: Vec<String>,
    /// The environment the job script captured on the job's first node, when it did.
    pub node_env: Option<Environment>,
}

impl JobAttempt {
    /// An attempt that never got a job (cancelled before it was submitted, or refused by
    /// `sbatch`).
    pub(super) fn without_job(out: AttemptOutput) -> JobAttempt {
        JobAttempt {
            out,
            job_id: None,
            nodes: None,
            node_names: vec![],
            node_env: None,
        }
    }
}

/// What the launcher hears about a job while it runs.
pub(crate) enum JobNews<'a> {
    Submitted(&'a str),
    Running {
        job_id: &'a str,
        nodes: &'a str,
    },
    Event(&'a Event),
    /// The job's first node reported its environment (once per job, as soon as it is read).
    NodeEnv {
        job_id: &'a str,
        env: &'a Environment,
    },
    /// The job failed as a lost peer makes jobs fail (`sign`), and the runner asks Slurm
    /// about its nodes for up to `limit` before judging it.
    AwaitingNodes {
        job_id: &'a str,
        nodes: &'a str,
        sign: &'a str,
        limit: Duration,
    },
}
