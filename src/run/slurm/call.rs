//! How the runner calls Slurm's client tools (`sbatch`, `squeue`, `scancel`), which block:
//! off the runtime's thread. The facade in `mod.rs`, the job loop and the queue all call
//! them, so the helper lives in a file of its own that imports none of those three.

use crate::slurm::SlurmError;

/// Runs a blocking Slurm call off the runtime's thread.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SlurmError> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()))
}
