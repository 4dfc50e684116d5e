//! What can go wrong with `--launcher slurm`: a bad setting, a cell that does not fit the
//! nodes, or a Slurm tool that fails. The settings, the job script and the job calls all
//! return it, so it lives apart from the facade in `mod.rs` that imports them.

#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error("{origin}: {what} {value:?} is not a Slurm name (letters, digits, `_ . , + -` only)")]
    BadName {
        origin: String,
        what: &'static str,
        value: String,
    },
    #[error("matrix slurm.time: {0}")]
    BadTime(String),
    #[error("matrix slurm.gpus_per_node: must be at least 1")]
    ZeroGpusPerNode,
    #[error("cell {cell}: {ranks} ranks do not split evenly over nodes of {per_node} GPUs; use a multiple of {per_node} or set slurm.gpus_per_node")]
    UnevenNodes {
        cell: String,
        ranks: u32,
        per_node: u32,
    },
    #[error("cell {cell}: a framework cell runs as one Slurm task on one node (its launcher, e.g. torchrun, starts a process per GPU there), and its {gpus} GPUs exceed the {per_node} a node has (slurm.gpus_per_node)")]
    FrameworkOverNodes {
        cell: String,
        gpus: u32,
        per_node: u32,
    },
    #[error("cell {cell}: environment variable name {name:?} is not an identifier")]
    BadEnvName { cell: String, name: String },
    #[error("a value contains a NUL byte, which no command argument can hold: {value:?}")]
    Nul { value: String },
    #[error("{0}")]
    Launch(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot run `{tool}` ({source}); is the Slurm client installed and on PATH?")]
    Tool {
        tool: &'static str,
        source: std::io::Error,
    },
    #[error("sbatch refused cell {cell} (exit {status}): {stderr}")]
    Submit {
        cell: String,
        status: String,
        stderr: String,
    },
    #[error("`{cmd}` failed: {stderr}")]
    Query { cmd: String, stderr: String },
}

impl SlurmError {
    /// True for errors in the user's matrix, flags or environment (exit 2); the rest
    /// are failures of the cluster or of this host.
    pub(crate) fn is_bad_input(&self) -> bool {
        matches!(
            self,
            SlurmError::BadName { .. }
                | SlurmError::BadTime(_)
                | SlurmError::ZeroGpusPerNode
                | SlurmError::UnevenNodes { .. }
                | SlurmError::FrameworkOverNodes { .. }
                | SlurmError::BadEnvName { .. }
                | SlurmError::Nul { .. }
                | SlurmError::Launch(_)
        )
    }
}

impl From<SlurmError> for crate::error::CliError {
    fn from(e: SlurmError) -> Self {
        if e.is_bad_input() {
            crate::error::CliError::bad_input(miette::Report::msg(e.to_string()))
        } else {
            crate::error::CliError::internal(miette::Report::msg(e.to_string()))
        }
    }
}
