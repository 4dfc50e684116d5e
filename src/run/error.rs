//! Failures of the runner itself (a failing cell is a result, not an error), and how
//! they map to the command's exit codes.

use std::path::PathBuf;

use crate::error::CliError;
use crate::results::ResultsError;
use crate::run::launch;

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
    #[error("--resume {path}: that run was made from a different matrix (`{was}` then, `{now}` now, and their contents differ); resume with the matrix it started from, or start a new run")]
    MatrixChanged {
        path: PathBuf,
        was: PathBuf,
        now: PathBuf,
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
        use std::io::ErrorKind as K;
        match e {
            // `--results-dir` names a file, a FIFO, a place the user cannot write: the
            // user's path, not bench, is at fault.
            RunError::RunDir { ref source, .. }
                if matches!(
                    source.kind(),
                    K::NotADirectory
                        | K::AlreadyExists
                        | K::PermissionDenied
                        | K::ReadOnlyFilesystem
                        | K::InvalidInput
                ) =>
            {
                CliError::bad_input(miette::miette!("{e}"))
            }
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
            | RunError::LauncherChanged { .. }
            | RunError::MatrixChanged { .. } => CliError::bad_input(miette::miette!("{e}")),
        }
    }
}
