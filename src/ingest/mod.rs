//! `bench ingest LOG...`: judge a finished run that was launched elsewhere (a 576-GPU NeMo
//! job, a Paxml recipe on a cluster, a nightly Megatron run) from its log, like a cell.
//!
//! Stages, one per file:
//! - [`read`]: a log file as lines, in bounded memory (a binary file or a line longer than
//!   a megabyte stops with file:line).
//! - [`parse`]: the [`parse::LineParser`] trait, framework detection, launcher rank
//!   prefixes, and the [`parse::Collector`] that orders steps and refuses what no run could
//!   have logged; one file per framework: [`nemo`], [`paxml`], [`megatron`], [`maxtext`],
//!   [`torchtitan`], [`llmc`], [`deepspeed`], each naming the logging code it reads.
//! - [`model`]: the model's FLOPs per token and which formula gives them.
//! - [`figures`]: tokens/s, per GPU, TFLOP/s, MFU, days and GPU-hours per 1T tokens, by
//!   the published recipes' formulas ([`crate::metrics::flops`]).
//! - [`record`]: the run folder (`results.json` and the usual reports, `ingest.json`),
//!   and the history: recorded under the run's own cell id and judged by the history gate
//!   ([`crate::history::gate`]) as a cell of `bench matrix --history` is.
//!
//! Nothing here runs a workload or re-runs anything: a suspect verdict cannot be
//! confirmed by a re-run of a job bench did not start, so it stays suspect (and the
//! repeats' test, with one value per run, waits for the band of five runs).

pub mod deepspeed;
pub mod figures;
pub mod llmc;
pub mod maxtext;
pub mod megatron;
pub mod model;
pub mod nemo;
pub mod parse;
pub mod paxml;
pub mod read;
pub mod record;
pub mod torchtitan;

use std::path::PathBuf;

use crate::axes::Dtype;
use crate::error::CliError;
use crate::format::Format;

pub use parse::Framework;

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

/// Why a log cannot be judged. Every variant names the file (and line) at fault; all are
/// bad input (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("{path}: cannot read the log: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}{}", if .text.is_empty() { String::new() } else { format!("\n  the line: `{}`", .text) })]
    Line {
        path: String,
        line: usize,
        /// The line, shortened.
        text: String,
        message: String,
    },
    #[error("{path}: {message}")]
    Log { path: String, message: String },
    #[error("{0}")]
    Args(String),
}

impl IngestError {
    /// An error at `path:line` about `text` (shortened to 200 characters).
    pub(crate) fn at(path: &str, line: usize, text: &str, message: impl Into<String>) -> Self {
        let mut text = text.trim().to_string();
        if text.chars().count() > 200 {
            text = text.chars().take(200).collect::<String>() + "…";
        }
        IngestError::Line {
            path: path.to_string(),
            line,
            text,
            message: message.into(),
        }
    }
}

impl From<IngestError> for CliError {
    fn from(e: IngestError) -> Self {
        CliError::bad_input(miette::miette!("{e}"))
    }
}

/// One log's bytes through the reader and the collector (`--framework auto`), as
/// `bench ingest` reads a file: the accepted steps as `(step time, loss)`, or the error.
/// The fuzz target (`tests/fuzz.rs`) holds every accepted step to the collector's bounds.
pub fn read_bytes(
    bytes: &[u8],
    global_batch: u64,
    gpus: u32,
) -> Result<Vec<(f64, Option<f64>)>, IngestError> {
    let mut c = parse::Collector::new(Framework::Auto, parse::Context { global_batch, gpus });
    read::for_each_line("log", bytes, |n, text| c.line("log", n, text))?;
    let (steps, ..) = c.finish();
    Ok(steps.iter().map(|s| (s.step_time_s, s.loss)).collect())
}

/// `bench ingest`: read the log, compute the figures, write the run folder, record and
/// judge it. Exit 0 when it passes, 1 on a regression, 2 on a log or argument bench cannot
/// trust.
pub(crate) fn cmd(s: &IngestSettings) -> Result<i32, CliError> {
    let flops =
        model::flops(&s.model, s.seq_len, s.flops_per_sequence).map_err(IngestError::Args)?;
    let peak = figures::peak(&s.peak, s.dtype).map_err(IngestError::Args)?;
    // The store is checked before the log is read: a store bench cannot trust is found
    // before any work, as `bench matrix` does.
    if let Some(location) = &s.history {
        crate::history::check(location)?;
    }
    let log = figures::read_logs(s)?;
    let fig = figures::compute(s, &log, &flops, peak.as_ref())?;
    record::write_and_judge(s, &log, &flops, peak.as_ref(), &fig)
}
