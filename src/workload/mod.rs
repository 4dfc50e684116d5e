//! The built-in training workload (`bench worker`): decoder-only models on libtorch.

use crate::cli::WorkerArgs;

/// Runs one worker and returns its exit code (see `events::exit`).
pub fn run_worker(_args: &WorkerArgs) -> i32 {
    eprintln!("bench worker: not built yet");
    crate::events::exit::INTERNAL
}
