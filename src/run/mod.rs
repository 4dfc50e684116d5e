//! The runner: runs an expanded matrix's cells, each in its own process(es), and writes
//! `results/<run-id>/results.json` after every cell.
//!
//! Layers, each importing only the ones below it (scripts/module-graph.sh draws and checks
//! this): this entry point takes the command's resolved settings ([`MatrixSettings`], built
//! by the CLI stage; [`config`] defines them), resolves the Slurm launch once the matrix is
//! loaded and picks the launcher; [`dispatch`] decides which cell runs when, judges
//! attempts, resumes runs and keeps the results; [`launcher`] is the seam that starts one
//! attempt of a cell (the [`launcher::Local`] and [`launcher::Slurm`] implementations);
//! [`executor`] runs a plan's processes, [`slurm`] one Slurm job, and [`launch`] turns a
//! cell into command lines (no shell). [`events`] is what the runner tells reporters and
//! [`progress`] holds the reporters (a bar on a terminal, plain lines in CI). The
//! comparison with baselines and the report formats come after this stage.

// Public: what tests/ and reporters use. The rest is the runner's own (crate-visible, so
// the compiler reports what nothing uses).
pub(crate) mod config;
pub(crate) mod dispatch;
pub(crate) mod error;
pub mod events;
pub(crate) mod executor;
pub mod launch;
pub(crate) mod launcher;
pub mod progress;
pub(crate) mod slurm;

use std::sync::Arc;

pub use config::{
    check_run_id, Launch, LauncherRequest, MatrixSettings, RunConfig, RunOutcome, SlurmLaunch,
    DEFAULT_GRACE,
};
pub use error::RunError;

use crate::env::GpuInventory;
use crate::error::CliError;
use crate::exit::bench as exit;
use crate::matrix::Expansion;
use crate::results::RunResults;
use launcher::{Launcher, Local, Slurm};

/// Runs `expansion` as `bench matrix` asks (on this host, or as Slurm jobs), reporting
/// progress on stderr.
pub fn run_matrix(settings: &MatrixSettings, expansion: Expansion) -> Result<RunOutcome, CliError> {
    let mut config = settings.config.clone();
    if let LauncherRequest::Slurm { partition, account } = &settings.launcher {
        config.launcher = Launch::Slurm(slurm_launch(
            partition.as_deref(),
            account.as_deref(),
            config.gpus,
            &expansion,
        )?);
    }
    let mut reporter = progress::for_stderr(config.no_progress);
    run_with(&config, expansion, reporter.as_mut()).map_err(CliError::from)
}

/// The Slurm settings of a run: the matrix's `slurm:` block, the environment and the
/// flags merged; GPUs are requested when the partition has them, unless `--gpus 0`.
fn slurm_launch(
    partition: Option<&str>,
    account: Option<&str>,
    gpus: Option<u32>,
    expansion: &Expansion,
) -> Result<config::SlurmLaunch, CliError> {
    let settings =
        crate::slurm::Settings::resolve(expansion.spec.slurm.as_ref(), partition, account, |k| {
            std::env::var(k).ok()
        })?;
    let poll = slurm::poll_from_env().map_err(|e| CliError::bad_input(miette::miette!("{e}")))?;
    let use_gpus = match gpus {
        Some(0) => false,
        _ => crate::slurm::partition_has_gpus(settings.partition.as_deref())?,
    };
    Ok(config::SlurmLaunch {
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
    executor::become_subreaper();
    let mut inv = GpuInventory::detect();
    if let Some(n) = config.gpus {
        inv = inv.with_count(n);
    }
    let env = crate::env::capture(&inv);
    let bench_exe = match &config.bench_exe {
        Some(p) => p.clone(),
        None => {
            std::env::current_exe().map_err(|e| launch::LaunchError::CurrentExe(e.to_string()))?
        }
    };
    let launcher: Arc<dyn Launcher> = match &config.launcher {
        Launch::Local => Arc::new(Local::new(bench_exe, &inv)),
        Launch::Slurm(sl) => Arc::new(Slurm::new(sl.clone(), bench_exe)),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(RunError::Runtime)?;
    rt.block_on(dispatch::run(config, launcher, expansion, env, reporter))
}

/// `bench matrix FILE` without `--dry-run`: load, run, then compare with the baselines and
/// write the reports (`report::finish_run`).
///
/// Exit code: 130 when interrupted (the reports of the finished cells are still written);
/// otherwise 1 when a cell failed, timed out or regressed, else 0.
pub(crate) fn cmd(args: &MatrixSettings) -> Result<i32, CliError> {
    crate::external::compare::set_gpu_hour_price(args.gpu_hour_price);
    let expansion = crate::matrix::cmd::load(&args.source)?;
    // Before the first cell: a malformed baseline file found after the run would leave
    // no reports for cells that took hours.
    crate::baseline::Baselines::check_dir(&args.baselines)?;
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
        args.verbose,
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
