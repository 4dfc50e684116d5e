//! The resolved settings of a run and what a run produced: the types the entry point
//! ([`super::run_with`]) and the dispatcher share, and [`MatrixSettings`], everything
//! `bench matrix` was asked to do (the CLI stage builds it from its arguments).

use std::path::PathBuf;
use std::time::Duration;

use crate::error::CliError;
use crate::exit::bench as exit;
use crate::format::Format;
use crate::matrix::cmd::MatrixSource;
use crate::results::{Outcome, RunResults};
use crate::slurm::Settings;

/// Default time between SIGTERM and SIGKILL when a cell is stopped.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// How cells are started.
#[derive(Debug, Clone, PartialEq)]
pub enum Launch {
    /// Worker processes on this host, on its GPU slots.
    Local,
    /// One Slurm job per attempt.
    Slurm(SlurmLaunch),
}

impl Launch {}

/// The launcher `bench matrix` asked for, before the matrix is loaded: the Slurm settings
/// merge the matrix's `slurm:` block with the environment and these flags, so they can
/// only be resolved into a [`Launch`] once the matrix is at hand.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum LauncherRequest {
    /// Worker processes on this host.
    #[default]
    Local,
    /// One Slurm job per attempt, with the `--partition` and `--account` flags.
    Slurm {
        partition: Option<String>,
        account: Option<String>,
    },
}

/// Resolved settings of `bench matrix` without `--dry-run`: the matrix, the run, and what
/// happens after it (reports, the history gate).
#[derive(Debug, Clone)]
pub struct MatrixSettings {
    pub source: MatrixSource,
    /// The run's settings, with [`Launch::Local`]: [`super::run_matrix`] turns
    /// [`Self::launcher`] into the launch once the matrix is loaded.
    pub config: RunConfig,
    pub launcher: LauncherRequest,
    /// Folder of baseline files (one per hardware key).
    pub baselines: PathBuf,
    /// Output format of the terminal summary.
    pub format: Format,
    /// List every dropped cell's id under its rule in the terminal summary.
    pub verbose: bool,
    /// Price of one GPU-hour, for the framework comparison's cost per 1T tokens.
    pub gpu_hour_price: Option<f64>,
    /// The history store to record the run in and judge its cells against.
    pub history: Option<String>,
    /// Re-run the cells the history finds suspect once before failing them.
    pub confirm: bool,
    /// GPU-seconds the confirming re-runs may take; `None`: twice what the run took.
    pub confirm_budget_gpu_s: Option<f64>,
    /// `--triage-*`: what overrides the matrix's `triage:` block.
    pub triage: TriageFlags,
    /// `--shard I/N`: run only this share of the cells (`commands::shard` plans it).
    pub shard: Option<crate::shard::Shard>,
    /// `--repeats N`: every cell's repeats, over what the matrix says.
    pub repeats: Option<u32>,
}

/// The `--triage-*` flags of `bench matrix`, as given: the command layer lays them over the
/// matrix's `triage:` block.
#[derive(Debug, Clone, Default)]
pub struct TriageFlags {
    pub budget_gpu_s: Option<f64>,
    pub setup: Option<String>,
    pub worker: Option<PathBuf>,
}

/// Resolved settings of a run (from `bench matrix` arguments, or built by tests).
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub results_dir: PathBuf,
    pub run_id: Option<String>,
    pub resume: Option<PathBuf>,
    pub fail_fast: bool,
    pub max_fail: Option<u32>,
    /// `--gpus N`: use N GPUs (0: run on CPU); `None`: every GPU the tools show.
    pub gpus: Option<u32>,
    /// Time between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// The matrix file, recorded in the results.
    pub matrix: PathBuf,
    pub filters: Vec<String>,
    pub no_progress: bool,
    /// Program for built-in cells (`bench worker`); `None`: this executable.
    pub bench_exe: Option<PathBuf>,
    pub launcher: Launch,
    /// `--jobs N`: at most N cells in flight; `None`: as many as fit the GPU slots
    /// locally, [`crate::run::slurm::DEFAULT_JOBS`] under Slurm.
    pub jobs: Option<usize>,
    /// Every cell traces one step into the run folder's `kernels/` (`BENCH_PROFILE`), for
    /// the history's kernel summaries (`triage.trace_every_run`, `--trace-kernels`); cells
    /// under Slurm do not.
    pub trace_kernels: bool,
}

/// A run id names one folder directly under `--results-dir`: letters, digits, `.`, `_`
/// and `-`, not starting with `.` (so neither `..` nor a hidden folder), at most 128
/// characters. Anything else could write outside the results folder (`../x`, `/tmp/x`) or
/// make a name a file system or a CI artifact upload refuses; it is bad input.
pub fn check_run_id(id: &str) -> Result<(), CliError> {
    Ok(crate::ids::check_run_id("--run-id", id)?)
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub run_dir: PathBuf,
    pub results: RunResults,
    /// Stopped by Ctrl-C or SIGTERM (exit 130).
    pub interrupted: bool,
    /// The GPU telemetry of the whole run (`telemetry.json`); per cell it is in the
    /// results. `None` on a host without GPU telemetry or under `--launcher slurm`.
    pub telemetry: Option<crate::telemetry::Telemetry>,
}

impl RunOutcome {
    /// The exit code of the run alone (before baselines are compared): 130 when
    /// interrupted, 1 when a cell failed or timed out, else 0.
    pub fn exit_code(&self) -> i32 {
        if self.interrupted {
            exit::INTERRUPTED
        } else if self
            .results
            .cells
            .iter()
            .any(|c| matches!(c.outcome, Outcome::Failed { .. } | Outcome::TimedOut { .. }))
        {
            exit::FAILED
        } else {
            exit::OK
        }
    }
}

/// Settings of the Slurm launcher for a run.
#[derive(Debug, Clone, PartialEq)]
pub struct SlurmLaunch {
    pub settings: Settings,
    /// Request one GPU per task (`--gpus-per-node`); false for a CPU partition or `--gpus 0`.
    pub use_gpus: bool,
    pub poll: Duration,
}

impl SlurmLaunch {
    /// A one-line description for the progress output.
    pub(crate) fn describe(&self, jobs: usize) -> String {
        let mut parts = vec![match &self.settings.partition {
            Some(p) => format!("partition {p}"),
            None => "default partition".to_string(),
        }];
        if let Some(a) = &self.settings.account {
            parts.push(format!("account {a}"));
        }
        parts.push(if self.use_gpus {
            format!("{} GPUs per node", self.settings.gpus_per_node)
        } else {
            "CPU tasks".to_string()
        });
        parts.push(format!("up to {jobs} job(s) at once"));
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::check_run_id;

    #[test]
    fn run_ids_stay_one_folder_under_the_results_dir() {
        for ok in ["20261122T134501Z", "nightly-42", "pr_7.retry"] {
            assert!(check_run_id(ok).is_ok(), "{ok}");
        }
        let long = "x".repeat(129);
        for bad in [
            "",
            "..",
            "../x",
            "a/b",
            "/tmp/x",
            ".hidden",
            "a\u{1b}[31m",
            long.as_str(),
        ] {
            assert!(check_run_id(bad).is_err(), "{bad:?}");
        }
    }
}
