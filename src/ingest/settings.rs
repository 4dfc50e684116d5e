//! The resolved settings of `bench ingest` (built by the CLI stage) and where MFU's peak
//! comes from; the stage's files import them from here, not from the module's root.

use std::path::PathBuf;

use crate::axes::Dtype;
use crate::format::Format;

use super::model;
use super::parse::Framework;

/// Where MFU's peak comes from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PeakSource {
    /// `--peak-tflops P`: dense TFLOP/s of one GPU for the run's dtype.
    Tflops(f64),
    /// `--gpu NAME`: the peak table of [`crate::metrics::flops`].
    Gpu(String),
    /// Neither: MFU is left out (TFLOP/s per GPU is still reported).
    None,
}

/// Resolved settings of `bench ingest`.
#[derive(Debug, Clone)]
pub(crate) struct IngestSettings {
    /// The run's log files, read in this order as one log.
    pub logs: Vec<PathBuf>,
    pub framework: Framework,
    pub model: model::ModelSpec,
    /// A recipe's own model FLOPs per sequence, taken as given.
    pub flops_per_sequence: Option<f64>,
    pub global_batch: u64,
    pub seq_len: u64,
    pub gpus: u32,
    pub dtype: Dtype,
    pub peak: PeakSource,
    /// The leading step lines left out as warm-up.
    pub skip_steps: usize,
    /// The cell id; `None`: derived from the framework and the parameters.
    pub cell: Option<String>,
    /// The run id; `None`: derived from the log's steps (so ingesting a log again replaces
    /// its run instead of adding one).
    pub run_id: Option<String>,
    pub hardware_key: Option<String>,
    /// The history store (a SQLite file or a postgres:// URL).
    pub history: Option<String>,
    pub results_dir: PathBuf,
    pub baselines: PathBuf,
    pub format: Format,
}
