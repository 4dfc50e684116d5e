//! The built-in training workload (`bench worker`): decoder-only models on libtorch through
//! tch, trained on synthetic or file tokens, measured and reported as worker events.
//!
//! Stages: check the requested [`WorkerSettings`] ([`Settings`]), pick the device ([`device`]), build the
//! model ([`models`]) and data ([`data`]), run the loop ([`train`], with [`sac`],
//! [`precision`], [`optim`] and [`overlap`]), and summarise ([`measure`], formulas in
//! [`crate::metrics::flops`]). Every failure becomes one error event and a distinct exit
//! code (`exit::worker`); libtorch errors, which tch raises as panics, are caught at one
//! boundary here and classified. The failures themselves are in [`error`], which every
//! stage imports without importing this file back.

// What needs libtorch is the Cargo feature `builtin`; the presets and the measuring are
// pure and serve the framework adapters and the runner-only build as well.
#[cfg(feature = "builtin")]
pub mod data;
#[cfg(feature = "builtin")]
pub mod device;
#[cfg(feature = "builtin")]
pub mod dp;
#[cfg(feature = "builtin")]
mod engine;
#[cfg(feature = "builtin")]
pub mod error;
#[cfg(feature = "builtin")]
pub mod ffi;
#[cfg(feature = "builtin")]
pub mod group;
pub mod measure;
pub mod models;
#[cfg(feature = "builtin")]
pub mod optim;
#[cfg(feature = "builtin")]
pub mod overlap;
#[cfg(feature = "builtin")]
pub mod precision;
#[cfg(feature = "builtin")]
pub mod sac;
mod settings;
#[cfg(feature = "builtin")]
pub mod train;

use models::presets;
pub(crate) use settings::WorkerSettings;

/// Runs one worker and returns its exit code (see `exit::worker`).
pub(crate) fn run_worker(args: &WorkerSettings) -> i32 {
    if args.list_models {
        for c in presets::all() {
            let n = c.n_params() as f64;
            // Tiny CPU presets have well under a million parameters; show them in M.
            let size = if n >= 1e9 {
                format!("{:.3}B", n / 1e9)
            } else {
                format!("{:.2}M", n / 1e6)
            };
            println!(
                "{:<22} {:>9} params  {} layers  hidden {}  heads {}/{}  vocab {}",
                c.name, size, c.layers, c.hidden, c.heads, c.kv_heads, c.vocab
            );
        }
        return crate::exit::worker::OK;
    }
    run_training(args)
}

#[cfg(feature = "builtin")]
use engine::run_training;

/// The runner-only build has no engine: `bench worker` says which build has one, as an
/// error event and exit code 2 (what it was asked for is not in this binary).
#[cfg(not(feature = "builtin"))]
fn run_training(args: &WorkerSettings) -> i32 {
    let message = NOT_BUILT_IN.to_string();
    eprintln!("bench worker {}: {message}", args.cell_id);
    let e = crate::events::Event::Error {
        kind: crate::events::ErrorKind::BadInput,
        message,
    };
    println!("{}", e.to_line());
    crate::exit::worker::BAD_INPUT
}

/// What a runner-only build says of the built-in workload it lacks.
pub const NOT_BUILT_IN: &str = "this bench is the runner-only build (built with --no-default-features), which has no built-in workload; the full build has it: `cargo install --path . --locked` with libtorch (scripts/env.sh), or the CUDA or ROCm image of docker/";
