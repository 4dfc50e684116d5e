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
//! judge and the reports come after this stage; the command layer (`crate::commands`)
//! composes them.

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
    TriageFlags, DEFAULT_GRACE,
};
pub use error::RunError;
pub(crate) use launcher::kernel_trace_path;

use crate::env::GpuInventory;
use crate::error::CliError;
use crate::matrix::Expansion;
use launcher::{Launcher, Local, Slurm};

/// Runs `expansion` as `bench matrix` asks (on this host, or as Slurm jobs), reporting
/// progress on stderr, and every event also to `observer` when given (the history's
/// recorder).
pub fn run_matrix(
    settings: &MatrixSettings,
    expansion: Expansion,
    observer: Option<&mut dyn progress::Reporter>,
) -> Result<RunOutcome, CliError> {
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
    match observer {
        Some(second) => {
            let mut tee = progress::Tee {
                first: reporter.as_mut(),
                second,
            };
            run_with(&config, expansion, &mut tee).map_err(CliError::from)
        }
        None => run_with(&config, expansion, reporter.as_mut()).map_err(CliError::from),
    }
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
    // The runner-only build has no `bench worker` of its own: a built-in cell is refused
    // before anything runs, unless --worker-exe names a binary that has one.
    if !cfg!(feature = "builtin") && config.bench_exe.is_none() {
        if let Some(c) = expansion
            .cells
            .iter()
            .find(|c| matches!(c.params.workload, crate::cell::Workload::Builtin))
        {
            return Err(RunError::Launch(launch::LaunchError::NotBuiltIn {
                cell: c.id.to_string(),
            }));
        }
    }
    executor::become_subreaper();
    // `--gpus 0` runs on CPU only: the GPU tools are not asked (a hung driver's
    // nvidia-smi then costs nothing).
    let inv = match config.gpus {
        Some(0) => GpuInventory::default().with_count(0),
        Some(n) => GpuInventory::detect().with_count(n),
        None => GpuInventory::detect(),
    };
    let env = crate::env::capture(&inv);
    let bench_exe = match &config.bench_exe {
        Some(p) => p.clone(),
        None => {
            std::env::current_exe().map_err(|e| launch::LaunchError::CurrentExe(e.to_string()))?
        }
    };
    let launcher: Arc<dyn Launcher> = match &config.launcher {
        Launch::Local => Arc::new(Local {
            trace_kernels: config.trace_kernels,
            ..Local::new(bench_exe, &inv)
        }),
        Launch::Slurm(sl) => Arc::new(Slurm::new(sl.clone(), bench_exe)),
    };
    // Telemetry is read on this host, so only cells that run here have it.
    // Only a run that uses GPUs has telemetry to read.
    let stream = match &config.launcher {
        Launch::Local if !inv.ids.is_empty() => crate::telemetry::Stream::start().map(Arc::new),
        _ => None,
    };
    // The host beside the GPUs (a CPU host too): only cells that run here are sampled.
    let host = match &config.launcher {
        Launch::Local => crate::telemetry::host::HostSampler::start().map(Arc::new),
        Launch::Slurm(_) => None,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(RunError::Runtime)?;
    let mut outcome = rt.block_on(dispatch::run(
        config,
        launcher,
        expansion,
        env,
        reporter,
        stream.clone(),
        host.clone(),
    ))?;
    if let Some(h) = &host {
        h.stop();
    }
    outcome.telemetry = stream.and_then(|s| s.finish());
    Ok(outcome)
}

/// Refuses, before the first cell (as the dry run does), a cell whose workload no process
/// can start.
pub(crate) fn check_cells(expansion: &Expansion) -> Result<(), CliError> {
    for cell in &expansion.cells {
        launch::check(cell).map_err(RunError::from)?;
    }
    Ok(())
}
