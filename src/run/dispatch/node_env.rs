//! The environment of a run whose cells run elsewhere (Slurm): the nodes' the cells ran
//! on, not the submitting host's.
//!
//! Under `--launcher slurm` the host that runs `bench` is often a login node without the
//! partition's GPUs, so its environment (and hardware key, which picks
//! `baselines/<key>.yaml`) says nothing about where the cells ran. Each job's script
//! therefore runs `bench env --format json` on the job's first node
//! ([`crate::slurm::script::plan_with_env_probe`]), and this module decides what the run
//! makes of those reports. The rules (docs/runner.md, "Environment"):
//!
//! - A Slurm run starts with the submitting host's environment, marked `submit_host` in
//!   `results.json` (`environment_source`), and keeps it, with a warning, if no job ever
//!   reports (e.g. every job failed before it started).
//! - The first job to report decides: the run's environment becomes its node's (with the
//!   submitting host's git commit, which is what was checked out and submitted), marked
//!   `slurm_node`.
//! - Every attempt keeps its own node's hardware key. A cell measured on a node of another
//!   key than the run's fails, with both keys in its reason: its figures are never compared
//!   with the baselines of the run's key, nor filed there by `bench baseline update`.
//! - `--resume` of a run whose environment came from its nodes keeps their key; if the first
//!   node to report in the resumed session has another, the run is refused (exit 2), as a
//!   local resume on other hardware is, before anything measured there is kept.

use std::path::PathBuf;

use super::cell::NodeReport;
use super::resume::Book;
use crate::results::{CellResult, Environment, EnvironmentSource, Metrics, Outcome, RunResults};
use crate::run::error::RunError;
use crate::run::events::RunEvent;
use crate::run::progress::Reporter;

/// What a report of a node's environment means for the run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Decision {
    /// The first report of the run: its environment becomes the run's.
    Adopt(Box<Environment>),
    /// Same hardware as the run's.
    Matches,
    /// Another hardware key than the run's (a partition of mixed nodes): the cell it ran
    /// cannot be compared with the run's baselines.
    Mismatch { run_key: String },
    /// A resumed run's nodes are now other hardware than those that measured it.
    Refuse { was: String },
}

/// Follows the node reports of one run (one session of it: a resume starts a new one).
#[derive(Debug, Clone)]
pub(crate) struct NodeEnvs {
    submit: Environment,
    /// The key the resumed run recorded from its nodes, which this session's must match.
    pinned: Option<String>,
    /// Whether a report has been decided on in this session.
    reported: bool,
}

impl NodeEnvs {
    /// `submit` is the submitting host's environment; `pinned` the hardware key the run
    /// being resumed recorded from its nodes (`None` for a new run, or one whose
    /// environment was the submitting host's).
    pub(crate) fn new(submit: Environment, pinned: Option<String>) -> NodeEnvs {
        NodeEnvs {
            submit,
            pinned,
            reported: false,
        }
    }

    /// Decides on `node`, a node's report, given the run's environment now (`run`).
    pub(crate) fn on_report(&mut self, run: &Environment, node: &Environment) -> Decision {
        if !self.reported {
            self.reported = true;
            return match &self.pinned {
                Some(was) if *was != node.hardware_key => Decision::Refuse { was: was.clone() },
                // A resumed run on the same hardware takes the fresh report (a newer driver
                // or commit is what this session measures with), as a local resume does.
                _ => Decision::Adopt(Box::new(merge(node, &self.submit))),
            };
        }
        if node.hardware_key == run.hardware_key {
            Decision::Matches
        } else {
            Decision::Mismatch {
                run_key: run.hardware_key.clone(),
            }
        }
    }
}

/// The run's environment from a node's report: everything the node says, except the git
/// commit, which is the submitting host's when it knows one (the job starts in the
/// submitting directory, but compute nodes often have no git).
pub(crate) fn merge(node: &Environment, submit: &Environment) -> Environment {
    let mut env = node.clone();
    if submit.git_commit.is_some() {
        env.git_commit = submit.git_commit.clone();
        env.git_dirty = submit.git_dirty;
    }
    env
}

/// Why a passed cell's measurements cannot count for a run of hardware `run_key`: one of
/// its successful attempts ran on a node of another key. `None` when every successful
/// attempt ran on `run_key` (or did not report its node).
pub(crate) fn foreign_hardware(cell: &CellResult, run_key: &str) -> Option<String> {
    if cell.outcome != Outcome::Passed {
        return None;
    }
    let foreign: Vec<String> = cell
        .attempts
        .iter()
        .filter(|a| a.error.is_none())
        .filter_map(|a| {
            let key = a.node_hardware_key.as_deref()?;
            (key != run_key).then(|| {
                let job = a
                    .slurm_job_id
                    .as_deref()
                    .map(|j| format!("Slurm job {j}"))
                    .unwrap_or_else(|| "a job".into());
                match &a.slurm_nodes {
                    Some(n) => format!("`{key}` ({job} on {n}, repeat {})", a.repeat),
                    None => format!("`{key}` ({job}, repeat {})", a.repeat),
                }
            })
        })
        .collect();
    (!foreign.is_empty()).then(|| {
        format!(
            "measured on hardware {}, but this run's hardware key is `{run_key}`: its figures cannot be compared with `{run_key}` baselines; pin the partition's hardware (e.g. slurm.sbatch_args: [--constraint=...])",
            foreign.join(", ")
        )
    })
}

/// Decides on a job's report of its node's environment: the first one
/// becomes the run's (saved at once), later ones of other hardware are warned about, and a
/// resumed run on other hardware is refused. Returns why the run must stop, if it must.
pub(crate) fn on_report(
    report: NodeReport,
    node_envs: &mut NodeEnvs,
    book: &mut Book,
    refused: &mut Option<RunError>,
    resume: &Option<PathBuf>,
    reporter: &mut dyn Reporter,
) -> Result<Option<String>, RunError> {
    let NodeReport { cell, job_id, env } = report;
    if refused.is_some() {
        // The run is stopping on the first refusal; the rest would only repeat it.
        return Ok(None);
    }
    match node_envs.on_report(&book.doc.environment, &env) {
        Decision::Adopt(adopted) => {
            let was = &book.doc.environment.hardware_key;
            if was != &adopted.hardware_key
                && book.doc.environment_source == Some(EnvironmentSource::SubmitHost)
                && book.all().any(|c| c.outcome == Outcome::Passed)
            {
                reporter.on_event(&RunEvent::Warning {
                    message: format!(
                        "the run being resumed recorded the submitting host's hardware key `{was}`; the nodes' is `{}`, which now applies to its kept cells too",
                        adopted.hardware_key
                    ),
                });
            }
            reporter.on_event(&RunEvent::EnvironmentAdopted {
                hardware_key: adopted.hardware_key.clone(),
                host: adopted.host.clone(),
                job_id: job_id.clone(),
            });
            book.doc.environment = *adopted;
            book.doc.environment_source = Some(EnvironmentSource::SlurmNode {
                job_id,
                cell: cell.to_string(),
            });
            book.save()?;
            Ok(None)
        }
        Decision::Matches => Ok(None),
        Decision::Mismatch { run_key } => {
            reporter.on_event(&RunEvent::Warning {
                message: format!(
                    "Slurm job {job_id} of cell {cell} runs on node {} of hardware `{}`, but this run's hardware key is `{run_key}` (from its first job's node): the cell's measurements will not be compared with `{run_key}` baselines and the cell fails; pin the partition's hardware (e.g. slurm.sbatch_args: [--constraint=...])",
                    env.host, env.hardware_key
                ),
            });
            Ok(None)
        }
        Decision::Refuse { was } => {
            let why = format!(
                "the resumed run was measured on `{was}`, but Slurm job {job_id} runs on {} of hardware `{}`",
                env.host, env.hardware_key
            );
            *refused = Some(RunError::NodesHardwareChanged {
                path: resume.clone().unwrap_or_else(|| book.dir.clone()),
                was,
                now: env.hardware_key,
                job_id,
                host: env.host,
            });
            Ok(Some(why))
        }
    }
}

/// A finished cell of a run whose environment came from its nodes, measured on a node of
/// other hardware: never compared with (or filed under) another hardware's baselines. A
/// refused resume keeps it unfinished, for a resume on the right nodes.
pub(crate) fn check_cell(result: &mut CellResult, doc: &RunResults, refused: bool) {
    if !matches!(
        doc.environment_source,
        Some(EnvironmentSource::SlurmNode { .. })
    ) {
        return;
    }
    if let Some(why) = foreign_hardware(result, &doc.environment.hardware_key) {
        result.metrics = Metrics::new();
        result.outcome = if refused {
            Outcome::Skipped {
                reason: format!("not kept: {why}"),
            }
        } else {
            Outcome::Failed { reason: why }
        };
    }
}

/// The warning a run ends with when no node reported its environment, so that the
/// results still hold the submitting host's.
pub(crate) fn submit_host_warning(doc: &RunResults) -> Option<String> {
    (doc.environment_source == Some(EnvironmentSource::SubmitHost)).then(|| {
        format!(
            "no Slurm job reported its node's environment, so results.json records the submitting host's ({}, hardware key `{}`): the comparison with baselines/{}.yaml may be against hardware other than the nodes' (each job's log under logs/ says why its node did not report)",
            doc.environment.host, doc.environment.hardware_key, doc.environment.hardware_key
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cell::CellId;
    use crate::results::Attempt;

    fn env(key: &str, host: &str) -> Environment {
        Environment {
            hardware_key: key.into(),
            host: host.into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_first_report_decides_and_later_ones_are_checked_against_it() {
        let mut submit = env("cpu-x86_64", "login1");
        submit.git_commit = Some("abc".into());
        submit.git_dirty = true;
        let mut t = NodeEnvs::new(submit.clone(), None);
        let mut node = env("h100-sxm-80gb", "gpu01");
        node.gpu_model = Some("NVIDIA H100 80GB HBM3".into());
        let adopted = match t.on_report(&submit, &node) {
            Decision::Adopt(e) => e,
            other => panic!("{other:?}"),
        };
        assert_eq!(adopted.hardware_key, "h100-sxm-80gb");
        assert_eq!(adopted.host, "gpu01");
        assert_eq!(adopted.gpu_model, node.gpu_model);
        // The code measured is what the submitting host checked out.
        assert_eq!(
            (adopted.git_commit.as_deref(), adopted.git_dirty),
            (Some("abc"), true)
        );
        assert_eq!(
            t.on_report(&adopted, &env("h100-sxm-80gb", "gpu02")),
            Decision::Matches
        );
        assert_eq!(
            t.on_report(&adopted, &env("h200-141gb", "gpu03")),
            Decision::Mismatch {
                run_key: "h100-sxm-80gb".into()
            }
        );
    }

    #[test]
    fn a_resumed_run_refuses_nodes_of_other_hardware_first() {
        let recorded = env("h100-sxm-80gb", "gpu01");
        let submit = env("cpu-x86_64", "login1");
        let mut t = NodeEnvs::new(submit.clone(), Some("h100-sxm-80gb".into()));
        assert_eq!(
            t.on_report(&recorded, &env("h200-141gb", "gpu09")),
            Decision::Refuse {
                was: "h100-sxm-80gb".into()
            }
        );
        // Same hardware: the fresh report replaces the recorded one.
        let mut t = NodeEnvs::new(submit, Some("h100-sxm-80gb".into()));
        match t.on_report(&recorded, &env("h100-sxm-80gb", "gpu02")) {
            Decision::Adopt(e) => assert_eq!(e.host, "gpu02"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_node_without_git_keeps_its_own_when_the_submitter_has_none() {
        let mut node = env("h100-sxm-80gb", "gpu01");
        node.git_commit = Some("def".into());
        let merged = merge(&node, &env("cpu-x86_64", "login1"));
        assert_eq!(merged.git_commit.as_deref(), Some("def"));
    }

    fn attempt(repeat: u32, key: Option<&str>, error: Option<&str>) -> Attempt {
        Attempt {
            repeat,
            attempt: 0,
            exit_code: Some(0),
            duration_s: 1.0,
            error: error.map(String::from),
            slurm_job_id: Some(format!("{}", 10 + repeat)),
            slurm_nodes: Some("gpu03".into()),
            slurm_node_names: vec!["gpu03".into()],
            node_hardware_key: key.map(String::from),
        }
    }

    fn cell(outcome: Outcome, attempts: Vec<Attempt>) -> CellResult {
        CellResult {
            id: CellId("c".into()),
            values: Default::default(),
            params: Default::default(),
            outcome,
            flaky: false,
            attempts,
            repeats: vec![],
            metrics: Default::default(),
            logs: vec![],
            duration_s: 1.0,
            telemetry: None,
        }
    }

    #[test]
    fn a_cell_measured_on_other_hardware_is_told_apart() {
        let ok = cell(
            Outcome::Passed,
            vec![
                attempt(0, Some("h100-sxm-80gb"), None),
                attempt(1, None, None),
            ],
        );
        assert_eq!(foreign_hardware(&ok, "h100-sxm-80gb"), None);
        // A failed attempt on other hardware did not measure anything.
        let retried = cell(
            Outcome::Passed,
            vec![
                attempt(0, Some("h200-141gb"), Some("crashed")),
                attempt(0, Some("h100-sxm-80gb"), None),
            ],
        );
        assert_eq!(foreign_hardware(&retried, "h100-sxm-80gb"), None);
        let mixed = cell(
            Outcome::Passed,
            vec![
                attempt(0, Some("h100-sxm-80gb"), None),
                attempt(1, Some("h200-141gb"), None),
            ],
        );
        let why = foreign_hardware(&mixed, "h100-sxm-80gb").unwrap();
        assert!(
            why.contains("`h200-141gb` (Slurm job 11 on gpu03, repeat 1)")
                && why.contains("this run's hardware key is `h100-sxm-80gb`"),
            "{why}"
        );
        // Only passed cells have figures to protect.
        let failed = cell(
            Outcome::Failed { reason: "x".into() },
            mixed.attempts.clone(),
        );
        assert_eq!(foreign_hardware(&failed, "h100-sxm-80gb"), None);
    }
}
