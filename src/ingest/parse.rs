//! What every framework's log parser shares: the [`LineParser`] trait, the [`Framework`]
//! names and their detection, launcher prefixes (torchrun, srun, mpirun), numbers as
//! frameworks print them, and the [`Collector`] that turns parsed lines into the run's
//! steps or refuses them.
//!
//! The collector is where a log stops being believed: a step out of order (lines of
//! several ranks mixed without prefixes, a log that repeats), a gap in the logging
//! interval (lines lost), a step time that is not a finite number of seconds between zero
//! and a day, a NaN or negative loss, or a line that contradicts the parameters given
//! (another global batch) is an error naming the file and line, never a step.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use regex::Regex;

/// The frameworks `bench ingest` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Framework {
    /// Detect from the first step line.
    Auto,
    /// NeMo 2 / Megatron-Bridge: the progress printer or Lightning's progress bar.
    Nemo,
    /// Paxml: `[PAX STATUS]: train_step() took X seconds.`
    Paxml,
    /// Megatron-LM / Megatron-Core: `iteration N/ M | ... elapsed time per iteration (ms)`.
    Megatron,
    /// MaxText: `completed step: N, seconds: X, ...`.
    Maxtext,
    /// torchtitan: `step: N loss: ... tps: ... tflops: ... mfu: ...%`.
    Torchtitan,
    /// llm.c: `step N/M | loss ... | X ms | Y tok/s`.
    Llmc,
    /// DeepSpeed's throughput timer: `global_step=N, ..., CurrSamplesPerSec=X`.
    Deepspeed,
}

impl Framework {
    /// Every concrete framework, in the order auto-detection tries them.
    pub(crate) const ALL: [Framework; 7] = [
        Framework::Nemo,
        Framework::Paxml,
        Framework::Megatron,
        Framework::Maxtext,
        Framework::Torchtitan,
        Framework::Llmc,
        Framework::Deepspeed,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Framework::Auto => "auto",
            Framework::Nemo => "nemo",
            Framework::Paxml => "paxml",
            Framework::Megatron => "megatron",
            Framework::Maxtext => "maxtext",
            Framework::Torchtitan => "torchtitan",
            Framework::Llmc => "llmc",
            Framework::Deepspeed => "deepspeed",
        }
    }
}

/// What a parser may need from the run's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Context {
    pub global_batch: u64,
    pub gpus: u32,
}

/// The figures a framework printed about a step itself, kept beside bench's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub(crate) struct Own {
    pub tokens_per_s_per_gpu: Option<f64>,
    pub tflops_per_gpu: Option<f64>,
    /// 0..1.
    pub mfu: Option<f64>,
}

/// One step line as a parser read it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Logged {
    /// The framework's step number; `None` for frameworks that print none (Paxml), whose
    /// lines are counted.
    pub step: Option<u64>,
    /// The epoch a progress bar counts steps in (steps restart at each epoch).
    pub epoch: Option<u64>,
    /// Seconds of the step; `None` when the line gives none (torchtitan's first logged
    /// step, which has no earlier line to measure from).
    pub step_time_s: Option<f64>,
    pub loss: Option<f64>,
    pub own: Own,
    /// The global batch the line states, checked against `--global-batch`.
    pub global_batch: Option<u64>,
    /// Who printed the line when the line says (absl's thread id), so that two processes'
    /// lines mixed in one file are told apart even without rank prefixes.
    pub writer: Option<String>,
}

/// A framework's step-line reader. `Ok(None)`: not a step line. `Err`: a step line that
/// does not read as the framework prints it (the message; the caller adds file and line).
pub(crate) trait LineParser {
    fn framework(&self) -> Framework;
    fn parse(&mut self, rank: Option<u32>, text: &str) -> Result<Option<Logged>, String>;
}

static TORCHRUN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\[(?:rank|default)(\d+)\]:").expect("static regex"));
static MPIRUN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\[\d+,(\d+)\]<std(?:out|err)>:").expect("static regex"));
static SRUN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\s*(\d{1,6}): ").expect("static regex"));

/// Splits a launcher's rank prefix off a line: torchrun's `[rank3]:`, mpirun's
/// `[1,3]<stdout>:`, srun `--label`'s `3: `.
pub(crate) fn split_rank(line: &str) -> (Option<u32>, &str) {
    for re in [&*TORCHRUN, &*MPIRUN, &*SRUN] {
        if let Some(c) = re.captures(line) {
            let end = c.get(0).map(|m| m.end()).unwrap_or(0);
            return (c[1].parse().ok(), &line[end..]);
        }
    }
    (None, line)
}

/// A number as frameworks print it: [`crate::external::log::number`], the one reader of
/// printed numbers (a comma only as an unambiguous thousands separator; `8,5` is refused,
/// never read as 85).
pub(crate) fn number(s: &str) -> Option<f64> {
    crate::external::log::number(s)
}

/// A field of a step line that must be a number, or the message saying which is not. A
/// `%` is refused: only a percentage field ([`percent_field`]) may carry one, and a time
/// printed as `8.5%` is not 8.5 s.
pub(crate) fn field(name: &str, value: &str) -> Result<f64, String> {
    read_field(name, value, number(value))
}

/// A percentage field of a step line (an MFU): one trailing `%` allowed, the value as
/// printed (`42.7%` is 42.7).
pub(crate) fn percent_field(name: &str, value: &str) -> Result<f64, String> {
    read_field(name, value, crate::external::log::percent(value))
}

fn read_field(name: &str, value: &str, read: Option<f64>) -> Result<f64, String> {
    read.ok_or_else(|| {
        if value.contains('%') && crate::external::log::percent(value).is_some() {
            format!(
                "`{name}` is `{value}`: a `%` on a field that is not a percentage; refusing rather than reading it as {}",
                value.trim().trim_end_matches('%')
            )
        } else if value.contains(',') {
            format!(
                "`{name}` is `{value}`: a comma bench cannot read unambiguously (a decimal comma? a thousands separator is 1,234,567); refusing rather than guessing"
            )
        } else {
            format!("`{name}` is `{value}`, not a number")
        }
    })
}

/// A whole number (a step, a batch), refusing fractions and signs.
pub(crate) fn count(name: &str, value: &str) -> Result<u64, String> {
    let v = field(name, value)?;
    if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 1e15 {
        Ok(v as u64)
    } else {
        Err(format!("`{name}` is `{value}`, not a whole number"))
    }
}

/// `key: value` (or `key=value`) pairs of a line whose fields are separated by `sep`.
pub(crate) fn pairs<'a>(text: &'a str, sep: &str, kv: char) -> BTreeMap<&'a str, &'a str> {
    text.split(sep)
        .filter_map(|f| {
            let (k, v) = f.split_once(kv)?;
            Some((k.trim(), v.trim()))
        })
        .collect()
}

/// The most step lines one log may have. A month-long run at 3 s per step logs under a
/// million; the bound keeps the steps held in memory to a few hundred megabytes whatever a
/// file holds.
pub(crate) const MAX_STEP_LINES: usize = 1_000_000;

/// The longest a training step may take and still be believed: a day.
pub(crate) const MAX_STEP_S: f64 = 86_400.0;

/// A step the collector accepted, with where it came from. `ingest.json` writes it as
/// `record::StepRow`, naming its file by index into the document's `logs`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Step {
    /// The framework's step number (or the count of step lines for Paxml).
    pub step: u64,
    pub epoch: Option<u64>,
    pub step_time_s: f64,
    pub loss: Option<f64>,
    pub own: Own,
    /// The file, shared by every step read from it (a long path is held once, not once
    /// per step: a million steps under a 3,000-character path are 3 GB otherwise).
    pub file: Arc<str>,
    pub line: usize,
}
