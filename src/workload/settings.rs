//! What `bench worker` was asked to run ([`WorkerSettings`]): the CLI stage builds it, the
//! worker's engine checks it against the presets. Its own file, so the engine
//! (`super::engine`) and the module's front (`super`) import it without importing each
//! other.

use std::path::PathBuf;

use crate::axes::{Device, Dtype, Parallel};

/// What `bench worker` was asked to run, typed but not yet checked (the CLI stage builds it
/// from `cli::WorkerArgs`; [`Settings::resolve`] checks it against the presets).
#[derive(Debug, Clone)]
// The runner-only build reads only `cell_id` and `list_models` (it has no engine to train).
#[cfg_attr(not(feature = "builtin"), allow(dead_code))]
pub(crate) struct WorkerSettings {
    /// The cell id, echoed in events and logs.
    pub cell_id: String,
    /// Model preset name.
    pub model: String,
    /// The dtype the matmuls run in; [`Dtype::default`] unless asked otherwise, as in cells.
    pub dtype: Dtype,
    pub parallel: Parallel,
    /// Feature flags (compile, sac).
    pub features: Vec<String>,
    pub steps: u32,
    pub warmup: u32,
    pub seq_len: u32,
    pub micro_batch: u32,
    pub grad_accum: u32,
    pub sac_every: u32,
    pub seed: u64,
    pub lr: f64,
    /// Token file; synthetic tokens when absent.
    pub data: Option<PathBuf>,
    /// Synthetic tokens when no `data`: `random` or `pattern`.
    pub synthetic: String,
    /// Element width of the token file: 2 (uint16) or 4 (uint32).
    pub data_bytes: u8,
    pub device: Device,
    /// List the model presets instead of training.
    pub list_models: bool,
}
