//! How a framework is started, declared per adapter as a [`Launch`]: its driver script in
//! `scripts/frameworks/`, the flag that names the config file, who starts the ranks
//! (torchrun, or the driver itself), where the matrix's extra `args` go and which variable
//! carries the workload's `source`. [`Launch::command`] and [`Launch::env`] build every
//! adapter's command line and environment from it, so the launch is written once rather
//! than per adapter.

use crate::cell::Cell;
use crate::cell::FrameworkOpts;
use std::path::{Path, PathBuf};

/// Where an attempt's files go and what the adapter may use.
#[derive(Debug, Clone)]
pub(crate) struct AttemptFiles {
    /// The attempt's own folder inside the run folder (config, data, framework outputs).
    pub dir: PathBuf,
    /// The folder holding the adapters' Python drivers (`scripts/frameworks`).
    pub scripts: PathBuf,
    pub python: String,
}

/// Who starts a framework's ranks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Ranks {
    /// torchrun, one rank per GPU, for one GPU as well (the framework initialises
    /// torch.distributed even then).
    Torchrun,
    /// torchrun for several GPUs; one GPU runs the driver alone.
    TorchrunForSeveral,
    /// The driver, as the words say (one JAX process for the host's devices; one llm.c
    /// process per GPU).
    Driver(&'static str),
}

/// How an adapter starts its framework.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Launch {
    /// The driver script in `scripts/frameworks/`.
    pub driver: &'static str,
    /// The driver's flag before the config file's path.
    pub config_flag: &'static str,
    pub ranks: Ranks,
    /// Whether the matrix's `args` follow the driver's command line; false where the
    /// adapter writes them into the config (the framework's own argv, which the driver
    /// passes on).
    pub args_on_command_line: bool,
    /// The variable that hands the workload's `source` to the driver.
    pub source_env: Option<&'static str>,
}

impl Launch {
    /// The command line of `cell`: launcher, driver, `{config}` (the config file's path, put
    /// in by `bench adapt`) and the matrix's `args`.
    pub(crate) fn command(
        &self,
        cell: &Cell,
        opts: &FrameworkOpts,
        files: &AttemptFiles,
    ) -> Vec<String> {
        let torchrun = match self.ranks {
            Ranks::Torchrun => true,
            Ranks::TorchrunForSeveral => cell.gpus() > 1,
            Ranks::Driver(_) => false,
        };
        let mut argv = if torchrun {
            torchrun_argv(&files.python, cell.gpus())
        } else {
            vec![files.python.clone()]
        };
        argv.push(files.scripts.join(self.driver).display().to_string());
        argv.extend([self.config_flag.to_string(), "{config}".to_string()]);
        if self.args_on_command_line {
            argv.extend(opts.args.iter().cloned());
        }
        argv
    }

    /// The environment the driver needs beyond the matrix's `env`: the `source` variable.
    pub(crate) fn env(&self, opts: &FrameworkOpts) -> Vec<(String, String)> {
        match (self.source_env, &opts.source) {
            (Some(var), Some(src)) => vec![(var.to_string(), src.clone())],
            _ => vec![],
        }
    }
}

/// `python -m torch.distributed.run` for `nproc` ranks on this host, every rank's output
/// prefixed with `[rank<N>]:` so interleaved lines stay attributable.
pub(crate) fn torchrun_argv(python: &str, nproc: u32) -> Vec<String> {
    [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        &nproc.to_string(),
        "--role",
        "rank",
        "--tee",
        "3",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}
/// The folder of the adapters' Python drivers: `$BENCH_FRAMEWORK_SCRIPTS`, else
/// `scripts/frameworks` under the current folder, else beside the executable's checkout
/// (`target/<profile>/bench` -> `scripts/frameworks`).
pub(crate) fn scripts_dir(exe: &Path) -> PathBuf {
    if let Some(d) = std::env::var_os("BENCH_FRAMEWORK_SCRIPTS") {
        return PathBuf::from(d);
    }
    let here = PathBuf::from("scripts/frameworks");
    if here.is_dir() {
        return here;
    }
    exe.ancestors()
        .map(|a| a.join("scripts/frameworks"))
        .find(|p| p.is_dir())
        .unwrap_or(here)
}

/// The interpreter of a framework workload.
pub(crate) fn python(opts: &FrameworkOpts) -> String {
    opts.python
        .clone()
        .or_else(|| std::env::var("BENCH_PYTHON").ok())
        .unwrap_or_else(|| "python3".to_string())
}
