//! The launcher seam itself: the [`Launcher`] trait and the values that cross it (an
//! [`AttemptIn`] in, [`News`] while it runs, an [`AttemptReport`] out). The implementations
//! ([`super::local`], [`super::slurm`]) import these, and `mod.rs` imports the
//! implementations, so the seam lives in a file of its own that neither side imports back.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::watch;

use crate::cell::Cell;
use crate::events::Event;
use crate::results::Environment;
use crate::run::executor::{AttemptOutput, Cancel};

/// What a launcher tells the dispatcher while an attempt runs.
pub(crate) enum News<'a> {
    /// A worker event, as it is printed.
    Event(&'a Event),
    /// A batch system accepted the attempt as job `job_id`.
    Submitted { job_id: &'a str },
    /// The job left the queue and runs on `nodes`.
    Running { job_id: &'a str, nodes: &'a str },
    /// The attempt's first node reported its environment (launchers whose cells run
    /// elsewhere, see [`Launcher::runs_elsewhere`]).
    NodeEnv {
        job_id: &'a str,
        env: &'a Environment,
    },
    /// The job failed as a lost peer makes jobs fail (`sign`); the runner asks the batch
    /// system about its `nodes` for up to `limit` before judging the attempt.
    AwaitingNodes {
        job_id: &'a str,
        nodes: &'a str,
        sign: &'a str,
        limit: std::time::Duration,
    },
}

/// One attempt to run: the cell and its place in the run.
pub(crate) struct AttemptIn<'a> {
    pub cell: &'a Cell,
    /// The device ids the dispatcher gave the cell from [`Launcher::devices`].
    pub devices: &'a [String],
    pub repeat: u32,
    pub attempt: u32,
    pub run_dir: &'a std::path::Path,
    /// `<run_dir>/logs/<cell>.r<repeat>[.a<attempt>]`: the log files' common stem.
    pub log_stem: PathBuf,
    /// The file stem of the attempt, for launcher files of its own (a job script).
    pub stem: &'a str,
    pub timeout: Duration,
    pub grace: Duration,
    /// Stops the attempt in any state (Ctrl-C).
    pub cancel: watch::Receiver<Cancel>,
    /// Raised when the run stops starting cells (`--fail-fast`, `--max-fail`): an attempt
    /// that has not started yet (a queued job) is withdrawn; a running one finishes.
    pub withdraw: watch::Receiver<bool>,
}

/// Where an attempt ran, when a batch system placed it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Placement {
    pub job_id: Option<String>,
    /// The nodes as Slurm writes a node list (`node[1-2]`).
    pub nodes: Option<String>,
    /// The same nodes by name.
    pub node_names: Vec<String>,
    /// The hardware key of the node the attempt ran on, when it reported one.
    pub node_hardware_key: Option<String>,
}

/// What an attempt produced.
pub(crate) struct AttemptReport {
    pub out: AttemptOutput,
    pub placement: Placement,
}

/// Where a launcher sends [`News`] of an attempt.
pub(crate) type NewsSink<'a> = &'a mut (dyn FnMut(News<'_>) + Send);

/// A boxed attempt future (the trait is used as `dyn Launcher`).
pub(crate) type AttemptFuture<'a> =
    Pin<Box<dyn Future<Output = Result<AttemptReport, String>> + Send + 'a>>;

/// How cells are started; see the module docs.
pub(crate) trait Launcher: Send + Sync {
    /// The name recorded in the results (`launcher`) and named by `--launcher`.
    fn name(&self) -> &'static str;

    /// Refuses, before anything starts, a cell that cannot even be planned (a bad
    /// template, a job that cannot be written): bad input, exit 2.
    fn check(&self, cell: &Cell) -> Result<(), crate::run::error::RunError>;

    /// Why this launcher can never run `cell`, if it cannot (the cell is skipped).
    fn unschedulable(&self, cell: &Cell) -> Option<String>;

    /// Slots of capacity: GPU slots of this host, or jobs in flight. `jobs` is `--jobs`.
    fn capacity(&self, jobs: Option<usize>) -> usize;

    /// At most this many cells in flight (`--jobs`, or the launcher's own default).
    fn max_running(&self, jobs: Option<usize>) -> Option<usize> {
        jobs
    }

    /// How many slots `cell` takes.
    fn need(&self, cell: &Cell) -> usize;

    /// The device ids behind the slots a cell was given (empty when the launcher does not
    /// hand out this host's devices).
    fn devices(&self, slots: &[usize]) -> Vec<String>;

    /// GPU slots of this host that cells run on, for the progress output (0 when cells
    /// run elsewhere or on CPU).
    fn gpu_slots(&self) -> usize;

    /// Where the cells go, in words, for the progress output (`None` for this host).
    fn describe(&self, _jobs: Option<usize>) -> Option<String> {
        None
    }

    /// Whether cells run on other machines: the run directory must then be absolute, this
    /// host's environment is only a fallback, and the nodes report their own
    /// ([`News::NodeEnv`], [`crate::run::dispatch`]'s node-environment policy).
    fn runs_elsewhere(&self) -> bool {
        false
    }

    /// Runs one attempt to its end; `Err` when the attempt cannot be planned (the cell
    /// fails with that reason). `news` hears what happens while it runs.
    fn attempt<'a>(&'a self, a: AttemptIn<'a>, news: NewsSink<'a>) -> AttemptFuture<'a>;

    /// How a timed-out attempt was stopped, in words, for the cell's reason (by default,
    /// as this host's process groups are stopped).
    fn timeout_reason(
        &self,
        r: u32,
        timeout_s: u64,
        report: &AttemptReport,
        grace: Duration,
    ) -> String {
        process_group_timeout(r, timeout_s, report, grace)
    }
}

/// How a timed-out attempt of this host's processes was stopped, in words.
pub(crate) fn process_group_timeout(
    repeat: u32,
    timeout_s: u64,
    report: &AttemptReport,
    grace: Duration,
) -> String {
    if report.out.escalated {
        format!(
            "repeat {repeat} ran past its {timeout_s}s timeout; its process group got SIGTERM, and SIGKILL after the {}s grace period",
            grace.as_secs_f64()
        )
    } else {
        format!(
            "repeat {repeat} ran past its {timeout_s}s timeout; its process group stopped on SIGTERM"
        )
    }
}
