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

pub(crate) mod collect;
pub mod deepspeed;
mod error;
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
mod settings;
pub mod torchtitan;

use crate::error::CliError;

pub use error::IngestError;
pub use parse::Framework;
pub(crate) use settings::{IngestSettings, PeakSource};

/// One log's bytes through the reader and the collector (`--framework auto`), as
/// `bench ingest` reads a file: the accepted steps as `(step time, loss)`, or the error.
/// The fuzz target (`tests/fuzz.rs`) holds every accepted step to the collector's bounds.
pub fn read_bytes(
    bytes: &[u8],
    global_batch: u64,
    gpus: u32,
) -> Result<Vec<(f64, Option<f64>)>, IngestError> {
    let mut c = collect::Collector::new(Framework::Auto, parse::Context { global_batch, gpus });
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
