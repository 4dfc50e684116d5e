//! The runner: runs an expanded matrix's cells, each in its own process(es), and writes
//! `results/<run-id>/results.json` after every cell.
//!
//! Stages: [`launch`] (a cell to command lines, no shell), [`executor`] (one attempt:
//! spawn, read events, timeout, SIGTERM/SIGKILL to the process group), [`slurm`] (one
//! attempt as a Slurm job under `--launcher slurm`: sbatch, squeue, scancel, per-rank
//! logs), [`scheduler`] (GPU slots or jobs in flight, repeats, retries, resume,
//! fail-fast, Ctrl-C), [`events`] (what the runner tells reporters) and [`progress`] (the
//! reporters: a bar on a terminal, plain lines in CI). The comparison with baselines and
//! the report formats come after this stage.

pub mod events;
pub mod executor;
pub mod launch;
pub mod node_env;
pub mod progress;
pub mod scheduler;
pub mod slurm;

use std::path::PathBuf;
use std::time::Duration;

use crate::cli::MatrixArgs;
use crate::env::GpuInventory;
use crate::error::{exit, CliError};
use crate::matrix::Expansion;
use crate::results::{Outcome, ResultsError, RunResults};

/// Default time between SIGTERM and SIGKILL when a cell is stopped.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// How cells are started.
#[derive(Debug, Clone, PartialEq)]
pub enum Launch {
    /// Worker processes on this host, on its GPU slots.
    Local,
    /// One Slurm job per attempt.
    Slurm(slurm::SlurmLaunch),
}

impl Launch {
    /// The name recorded in the results (`launcher`).
    pub fn name(&self) -> &'static str {
        match self {
            Launch::Local => "local",
            Launch::Slurm(_) => "slurm",
        }
    }
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
    /// locally, [`slurm::DEFAULT_JOBS`] under Slurm.
    pub jobs: Option<usize>,
}

impl RunConfig {
    /// Resolves `bench matrix` arguments (with the local launcher; [`run_matrix`] sets up
    /// Slurm); a grace period that is not a finite, non-negative number of seconds is bad
    /// input.
    pub fn from_args(args: &MatrixArgs) -> Result<RunConfig, CliError> {
        let grace = Duration::try_from_secs_f64(args.kill_grace).map_err(|_| {
            CliError::bad_input(miette::miette!(
                "--kill-grace {}: expected a non-negative number of seconds",
                args.kill_grace
            ))
        })?;
        Ok(RunConfig {
            results_dir: args.results_dir.clone(),
            run_id: args.run_id.clone(),
            resume: args.resume.clone(),
            fail_fast: args.fail_fast,
            max_fail: args.max_fail,
            gpus: args.gpus,
            grace,
            matrix: args.file.clone(),
            filters: args.filters.clone(),
            no_progress: args.no_progress,
            bench_exe: None,
            launcher: Launch::Local,
            jobs: match args.jobs {
                Some(0) => {
                    return Err(CliError::bad_input(miette::miette!(
                        "--jobs 0: at least one cell must be able to run"
                    )))
                }
                j => j.map(|j| j as usize),
            },
        })
    }
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub run_dir: PathBuf,
    pub results: RunResults,
    /// Stopped by Ctrl-C or SIGTERM (exit 130).
    pub interrupted: bool,
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

/// Failures of the runner itself (a failing cell is a result, not an error).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Launch(#[from] launch::LaunchError),
    #[error("{path}: cannot create the run directory: {source}")]
    RunDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: a run with this id already exists; pass --resume {path} to continue it or choose another --run-id")]
    Exists { path: PathBuf },
    #[error("--resume: {0}")]
    Resume(ResultsError),
    #[error("--resume {path}: that run was measured on `{was}` but this host is `{now}`; results of different hardware cannot be mixed")]
    HardwareChanged {
        path: PathBuf,
        was: String,
        now: String,
    },
    #[error("{0}")]
    Results(ResultsError),
    #[error("runner: {0}")]
    Runtime(std::io::Error),
    #[error("--launcher slurm: {0}")]
    Slurm(crate::slurm::SlurmError),
    #[error("--resume {path}: that run was measured on Slurm nodes of hardware `{was}`, but Slurm job {job_id} ran on {host}, which is `{now}`; results of different hardware cannot be mixed (pin the partition's hardware, e.g. slurm.sbatch_args: [--constraint=...])")]
    NodesHardwareChanged {
        path: PathBuf,
        was: String,
        now: String,
        job_id: String,
        host: String,
    },
    #[error("--resume {path}: that run used --launcher {was}, this one --launcher {now}; finish it with --launcher {was}")]
    LauncherChanged {
        path: PathBuf,
        was: String,
        now: String,
    },
}

impl From<RunError> for CliError {
    fn from(e: RunError) -> Self {
        match e {
            RunError::Launch(launch::LaunchError::CurrentExe(_))
            | RunError::RunDir { .. }
            | RunError::Results(_)
            | RunError::Runtime(_) => CliError::internal(miette::miette!("{e}")),
            RunError::Slurm(ref s) if !s.is_bad_input() => {
                CliError::internal(miette::miette!("{e}"))
            }
            RunError::Launch(_)
            | RunError::Slurm(_)
            | RunError::Exists { .. }
            | RunError::Resume(_)
            | RunError::HardwareChanged { .. }
            | RunError::NodesHardwareChanged { .. }
            | RunError::LauncherChanged { .. } => CliError::bad_input(miette::miette!("{e}")),
        }
    }
}

/// Runs `expansion` as `bench matrix` asks (on this host, or as Slurm jobs), reporting
/// progress on stderr.
pub fn run_matrix(args: &MatrixArgs, expansion: Expansion) -> Result<RunOutcome, CliError> {
    let mut config = RunConfig::from_args(args)?;
    if args.launcher == crate::cli::Launcher::Slurm {
        config.launcher = Launch::Slurm(slurm_launch(args, &expansion)?);
    }
    let mut reporter = progress::for_stderr(config.no_progress);
    run_with(&config, expansion, reporter.as_mut()).map_err(CliError::from)
}

/// The Slurm settings of a run: the matrix's `slurm:` block, the environment and the
/// flags merged; GPUs are requested when the partition has them, unless `--gpus 0`.
fn slurm_launch(args: &MatrixArgs, expansion: &Expansion) -> Result<slurm::SlurmLaunch, CliError> {
    let settings = crate::slurm::Settings::for_run(expansion.spec.slurm.as_ref(), args)?;
    let poll = slurm::poll_from_env().map_err(|e| CliError::bad_input(miette::miette!("{e}")))?;
    let use_gpus = match args.gpus {
        Some(0) => false,
        _ => crate::slurm::partition_has_gpus(settings.partition.as_deref())?,
    };
    Ok(slurm::SlurmLaunch {
        settings,
        use_gpus,
        poll,
    })
}

/// Runs `expansion` with explicit settings and reporter (the library entry tests use).
pub fn run_with(
    config: &RunConfig,
    expansion: Expansion,
    reporter: &mut dyn progress::Reporter,
) -> Result<RunOutcome, RunError> {
    let mut inv = GpuInventory::detect();
    if let Some(n) = config.gpus {
        inv = inv.with_count(n);
    }
    let env = crate::env::capture(&inv);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(RunError::Runtime)?;
    rt.block_on(scheduler::run(config, expansion, inv, env, reporter))
}

/// `bench matrix FILE` without `--dry-run`: load, run, then compare with the baselines and
/// write the reports (`report::finish_run`).
///
/// Exit code: 130 when interrupted (the reports of the finished cells are still written);
/// otherwise 1 when a cell failed, timed out or regressed, else 0.
pub fn cmd(args: &MatrixArgs) -> Result<i32, CliError> {
    let expansion = crate::matrix::cmd::load(args)?;
    // GPU clocks, power and throttle reasons while the cells run (absent on a CPU host).
    let sampler = args
        .history
        .as_ref()
        .and_then(|_| crate::history::telemetry::Sampler::start());
    let outcome = run_matrix(args, expansion)?;
    eprintln!(
        "results: {}",
        outcome.run_dir.join(RunResults::FILE).display()
    );
    let verdict = crate::report::finish_run(
        &outcome.run_dir,
        &outcome.results,
        &args.baselines,
        args.format,
    )?;
    if outcome.interrupted {
        return Ok(exit::INTERRUPTED);
    }
    let Some(location) = &args.history else {
        return Ok(verdict.max(outcome.exit_code()));
    };
    let history = crate::history::gate::with_history(args, location, &outcome, sampler)?;
    // With a history the cells it can judge are judged by it; the stored baseline's verdict
    // counts only where the history is too short (`CellJudgement::fails_run`).
    Ok(history.exit_code().max(outcome.exit_code()))
}
