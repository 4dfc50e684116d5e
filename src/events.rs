//! Worker events: the JSON-lines contract between a worker process and the runner.
//!
//! A worker (the built-in `bench worker`, or any external command) prints one JSON object
//! per line on stdout. Lines that do not parse as an event are log text and are kept in the
//! cell's log, never an error: external frameworks print whatever they like. Both sides of
//! the contract use these types, so the built-in workload cannot drift from the runner.
//!
//! This is also where the runner's trust ends. Output is split by [`LineSplitter`] into
//! lines of at most [`MAX_LINE_BYTES`] (a worker printing a 10 GB line costs no more memory
//! than that), and
//! every line becomes text through [`crate::sanitize`]. A line that names a known event is
//! held to the contract by [`EventReader`]: it must parse, its figures must be measurements
//! (a step time that is finite and above zero, a token count below 2^53, step numbers that
//! increase on each rank), or the attempt fails with the first violation as its reason,
//! instead of passing with nothing measured.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::exit::worker as exit;

/// Why a worker failed, as reported in an [`Event::Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    Internal,
    BadInput,
    Unsupported,
    Oom,
    NanLoss,
    Distributed,
}

impl ErrorKind {
    pub(crate) fn exit_code(self) -> i32 {
        match self {
            ErrorKind::Internal => exit::INTERNAL,
            ErrorKind::BadInput => exit::BAD_INPUT,
            ErrorKind::Unsupported => exit::UNSUPPORTED,
            ErrorKind::Oom => exit::OOM,
            ErrorKind::NanLoss => exit::NAN_LOSS,
            ErrorKind::Distributed => exit::DISTRIBUTED,
        }
    }
}

/// One measured (or warm-up) optimizer step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StepEvent {
    /// 0-based step index, warm-up included.
    pub step: u64,
    /// Device-synchronized wall time of the step in seconds.
    pub step_time_s: f64,
    /// Tokens processed by the step across all ranks (global batch x seq len).
    pub tokens: u64,
    pub loss: f64,
    /// True for warm-up steps, which statistics exclude. Workers that do not say are
    /// judged by the cell's `warmup` count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup: Option<bool>,
    /// The rank that reports (rank 0 reports the slowest rank's time in multi-rank runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

/// Final figures of a worker. Every field is optional so external commands can report
/// what they know; the runner computes step statistics from the step events itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SummaryEvent {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_s_per_gpu: Option<f64>,
    /// Median step time over measured steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_time_s: Option<f64>,
    /// Achieved model TFLOP/s per GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tflops_per_gpu: Option<f64>,
    /// Model FLOPs utilisation (0..1) against the peak of the dtype the matmuls run in;
    /// absent on devices with no peak in the table (CPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mfu: Option<f64>,
    /// Which peak MFU was computed against, e.g. "H100 SXM bf16 dense 989.4 TFLOP/s".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mfu_policy: Option<String>,
    /// Peak device memory of each rank, in bytes (index = rank).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peak_mem_bytes: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_params: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flops_per_token: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_loss: Option<f64>,
    /// Seconds from worker start to the first measured step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_to_first_step_s: Option<f64>,
    /// Device description, e.g. "NVIDIA H100 80GB HBM3" or "cpu".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// A framework adapter's record: the framework's version, its config file and hash, and
    /// the figures the framework itself printed (beside bench's own above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework: Option<Box<FrameworkReport>>,
    /// What actually ran: execution, attention kernel, checkpointing, optimizer, precision
    /// and what the parallel setting meant, as the worker or the framework's own log and
    /// config say it, so that a comparison between stacks can show whether it compares like
    /// with like.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ran: Option<Box<Ran>>,
}

/// What a run actually executed, one short phrase per aspect (absent: nobody said), and the
/// records each phrase was read from. A cell's switches say what was asked; this says what
/// happened, e.g. `compile` under FSDP running eager steps in the built-in workload, or
/// torch.compile falling back to eager where dynamo hit its recompile limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Ran {
    /// How steps executed: eager, one CUDA graph per step, torch.compile per block, jax.jit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution: Option<String>,
    /// The attention kernel, e.g. "SDPA: flash attention", "cuDNN flash attention (JAX)".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention: Option<String>,
    /// Activation checkpointing: none, selective (which), full recompute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpointing: Option<String>,
    /// The optimizer and its implementation, e.g. "AdamW, fused, fp32 master weights".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<String>,
    /// The precision of the matmuls, weights and optimizer state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<String>,
    /// What the cell's parallel setting meant here, e.g. "FSDP over 1 rank: units whole".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<String>,
    /// Where each phrase came from: "config: ...", "log line 47: ...", "worker".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
}

impl Ran {
    /// The most phrases of evidence kept: a log that matches a signature on every line
    /// must not grow a summary without bound.
    pub const MAX_EVIDENCE: usize = 32;
    /// The longest phrase kept, in characters.
    pub const MAX_PHRASE: usize = 240;
    /// The aspects' names, in the order reports show them.
    pub const NAMES: [&'static str; 6] = [
        "execution",
        "attention",
        "checkpointing",
        "optimizer",
        "precision",
        "parallel",
    ];

    /// The aspects in the order reports show them, with their names.
    pub fn aspects(&self) -> [(&'static str, Option<&str>); 6] {
        [
            ("execution", self.execution.as_deref()),
            ("attention", self.attention.as_deref()),
            ("checkpointing", self.checkpointing.as_deref()),
            ("optimizer", self.optimizer.as_deref()),
            ("precision", self.precision.as_deref()),
            ("parallel", self.parallel.as_deref()),
        ]
    }

    /// The aspect called `name`, for writing.
    pub fn aspect_mut(&mut self, name: &str) -> Option<&mut Option<String>> {
        Some(match name {
            "execution" => &mut self.execution,
            "attention" => &mut self.attention,
            "checkpointing" => &mut self.checkpointing,
            "optimizer" => &mut self.optimizer,
            "precision" => &mut self.precision,
            "parallel" => &mut self.parallel,
            _ => return None,
        })
    }

    /// Every phrase made safe to keep and show (see [`crate::sanitize`]).
    fn sanitized(mut self) -> Ran {
        use crate::sanitize::clean;
        for name in Ran::NAMES {
            if let Some(v) = self.aspect_mut(name) {
                *v = v.take().map(|s| shorten(&clean(&s)));
            }
        }
        self.evidence.truncate(Ran::MAX_EVIDENCE);
        self.evidence = self.evidence.iter().map(|e| shorten(&clean(e))).collect();
        self
    }
}

/// What a framework adapter records per repeat: the framework's identity and config, and
/// the figures the framework itself printed, kept beside bench's own measurements.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FrameworkReport {
    /// The framework's own name as its driver reports it (`torchtitan`, `transformers`,
    /// `megatron-core`, ...).
    pub name: String,
    /// The framework's version as its package reports it, e.g. `0.2.2`.
    pub version: String,
    /// Versions of the libraries under it, e.g. `{"torch": "2.11.0+cu130"}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub libraries: BTreeMap<String, String>,
    /// The config file bench wrote for the framework, relative to the run folder.
    pub config_file: PathBuf,
    /// SHA-256 of that file (hex), so that a config change shows as a cause.
    pub config_sha256: String,
    /// The framework's own tokens/s per GPU (median over the measured steps, or its
    /// end-of-run figure when it prints no per-step throughput).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_s_per_gpu: Option<f64>,
    /// The framework's own achieved TFLOP/s per GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tflops_per_gpu: Option<f64>,
    /// The framework's own MFU (0..1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mfu: Option<f64>,
    /// How the framework's figures were measured, for the report.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub method: String,
}

/// `text` cut to [`Ran::MAX_PHRASE`] characters: a phrase is read in a table cell.
fn shorten(text: &str) -> String {
    match text.char_indices().nth(Ran::MAX_PHRASE) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// One line of worker output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The worker has built its model and is about to train.
    Start {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        n_params: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        device: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        world_size: Option<u32>,
    },
    Step(StepEvent),
    Summary(SummaryEvent),
    /// Something the user should know that is not a failure, e.g. `compile` fell back to
    /// plain execution on CPU.
    Notice {
        message: String,
    },
    /// The worker is failing; it exits with `kind.exit_code()` after this line.
    Error {
        kind: ErrorKind,
        message: String,
    },
}

/// What one line of worker output is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Line {
    /// Log text (including JSON that names no event this version knows).
    Text,
    /// A valid event, its text fields sanitized (boxed: a summary is far larger than the
    /// other variants, and most lines are text).
    Event(Box<Event>),
    /// A line that names an event but breaks the contract, with why.
    Invalid(String),
}

/// The event kinds of the contract; a JSON line naming another kind is log text, so that a
/// newer worker's events do not fail an older runner.
const KINDS: [&str; 5] = ["start", "step", "summary", "notice", "error"];

/// The largest token count of a step: integers above 2^53 are not exact as `f64`, in which
/// statistics are computed, and no step processes that many tokens.
pub const MAX_TOKENS: u64 = 1 << 53;

/// Why a figure that must be a finite number above 0 is not one (`None`: it is).
fn not_positive(name: &str, v: f64) -> Option<String> {
    (!(v.is_finite() && v > 0.0)).then(|| format!("{name} {v}: it must be a finite number above 0"))
}

/// Why a figure that must be a finite number, 0 or more, is not one (`None`: it is).
fn negative(name: &str, v: f64) -> Option<String> {
    (!(v.is_finite() && v >= 0.0))
        .then(|| format!("{name} {v}: it must be a finite number, 0 or more"))
}

/// Why a world size is no run's (`None`: it is one).
fn world_size_implausible(w: u32) -> Option<String> {
    (w == 0 || u64::from(w) > crate::bounds::MAX_WORLD_SIZE).then(|| {
        format!(
            "world_size {w}: a run has 1 to {} ranks",
            crate::bounds::MAX_WORLD_SIZE
        )
    })
}

impl StepEvent {
    /// The first figure of the step that no measurement can have, as its field and why
    /// (`None`: every figure is plausible). The worker's door ([`Event::read_line`]) and
    /// every reader of a results document (`RunResults::implausible_measurement`) hold a
    /// step to this one rule, so a figure refused from a worker is refused from a file.
    pub(crate) fn implausible(&self) -> Option<(String, String)> {
        let field = |f: &str, why: String| Some((f.to_string(), why));
        if let Some(why) = not_positive("step_time_s", self.step_time_s) {
            return field("step_time_s", why);
        }
        // Each step within the step time's plausibility bound (crate::bounds): a
        // microsecond to a day.
        if let Err(why) = crate::bounds::check("step_time_s", self.step_time_s) {
            return field("step_time_s", why);
        }
        if self.tokens > MAX_TOKENS {
            return field(
                "tokens",
                format!(
                    "tokens {}: more than 2^53 tokens in one step is not a measurement",
                    self.tokens
                ),
            );
        }
        if !self.loss.is_finite() {
            return field(
                "loss",
                format!(
                    "loss {}: report a non-finite loss as an `error` event of kind nan_loss",
                    self.loss
                ),
            );
        }
        None
    }
}

impl SummaryEvent {
    /// The first figure of the summary that no measurement can have, as its field (with
    /// its index for a figure per rank) and why (`None`: every figure is plausible). Held
    /// at the worker's door and by every reader of a results document, as
    /// [`StepEvent::implausible`].
    pub(crate) fn implausible(&self) -> Option<(String, String)> {
        let positive = [
            ("tokens_per_s", self.tokens_per_s),
            ("tokens_per_s_per_gpu", self.tokens_per_s_per_gpu),
            ("step_time_s", self.step_time_s),
            ("flops_per_token", self.flops_per_token),
        ];
        // 0 is a workload's "could not compute it" (no peak known for the device), which
        // [`Event::sanitized`] makes absent: not a measurement to bound.
        let non_negative = [
            ("tflops_per_gpu", self.tflops_per_gpu),
            ("mfu", self.mfu),
            ("time_to_first_step_s", self.time_to_first_step_s),
        ];
        for (name, v) in positive {
            if let Some(why) = v.and_then(|v| not_positive(name, v)) {
                return Some((name.to_string(), why));
            }
        }
        for (name, v) in non_negative {
            if let Some(why) = v.and_then(|v| negative(name, v)) {
                return Some((name.to_string(), why));
            }
        }
        // Each figure within its metric's plausibility bound (crate::bounds); a figure
        // outside the catalog (flops_per_token, time_to_first_step_s) is held to its
        // generic rule, which refuses an overflow such as 1e308.
        for (name, v) in positive.into_iter().chain(non_negative) {
            let v =
                v.filter(|v| !(*v == 0.0 && crate::bounds::ZERO_IS_NOT_COMPUTED.contains(&name)));
            if let Err(why) = crate::bounds::check_opt(name, v) {
                return Some((name.to_string(), why));
            }
        }
        for (r, b) in self.peak_mem_bytes.iter().enumerate() {
            if let Err(why) = crate::bounds::check("peak_mem_bytes", *b as f64) {
                return Some((format!("peak_mem_bytes[{r}]"), why));
            }
        }
        if let Some(why) = self.world_size.and_then(world_size_implausible) {
            return Some(("world_size".to_string(), why));
        }
        match self.final_loss {
            Some(l) if !l.is_finite() => {
                Some(("final_loss".to_string(), format!("final_loss {l}")))
            }
            _ => None,
        }
    }
}

impl Event {
    /// Parses one output line; `None` for log text and for an event that breaks the
    /// contract (see [`Event::read_line`] to tell them apart).
    pub fn parse_line(line: &str) -> Option<Event> {
        match Event::read_line(line) {
            Line::Event(e) => Some(*e),
            Line::Text | Line::Invalid(_) => None,
        }
    }

    /// Classifies one output line, checking an event's figures (what can be checked
    /// without the lines before it; [`EventReader`] checks the order of steps).
    pub(crate) fn read_line(line: &str) -> Line {
        let t = line.trim();
        if !t.starts_with('{') {
            return Line::Text;
        }
        // Only the tag is read first: serde skips the other values without converting them,
        // so a step whose figure is out of range (`1e999`) is still seen as a step, and then
        // fails to parse as one below instead of passing for log text.
        #[derive(Deserialize)]
        struct Tag {
            event: String,
        }
        let Ok(tag) = serde_json::from_str::<Tag>(t) else {
            return Line::Text;
        };
        let Some(kind) = KINDS.iter().find(|k| **k == tag.event) else {
            return Line::Text;
        };
        match serde_json::from_str::<Event>(t) {
            Err(e) => Line::Invalid(format!("a `{kind}` event that does not parse: {e}")),
            Ok(ev) => match ev.check() {
                Ok(()) => Line::Event(Box::new(ev.sanitized())),
                Err(why) => Line::Invalid(format!("a `{kind}` event {why}")),
            },
        }
    }

    /// The figures of an event that no measurement can have.
    fn check(&self) -> Result<(), String> {
        let why = match self {
            Event::Step(s) => s.implausible(),
            Event::Summary(s) => s.implausible(),
            Event::Start {
                world_size: Some(w),
                ..
            } => world_size_implausible(*w).map(|why| ("world_size".to_string(), why)),
            Event::Start { .. } | Event::Notice { .. } | Event::Error { .. } => None,
        };
        match why {
            Some((_, why)) => Err(format!("with {why}")),
            None => Ok(()),
        }
    }

    /// The event with every text field made safe to keep (see [`crate::sanitize`]).
    fn sanitized(self) -> Event {
        use crate::sanitize::clean;
        let opt = |s: Option<String>| s.map(|s| clean(&s));
        match self {
            Event::Start {
                model,
                n_params,
                device,
                world_size,
            } => Event::Start {
                model: opt(model),
                n_params,
                device: opt(device),
                world_size,
            },
            Event::Summary(mut s) => {
                // A TFLOP/s or MFU of exactly 0 is a workload saying it could not compute
                // the figure: absent, so that no 0 is stored as a measurement (bench
                // history import leaves a 0 out the same way: crate::bounds::not_computed).
                s.tflops_per_gpu = s.tflops_per_gpu.filter(|v| *v != 0.0);
                s.mfu = s.mfu.filter(|v| *v != 0.0);
                s.mfu_policy = opt(s.mfu_policy);
                s.device = opt(s.device);
                s.ran = s.ran.map(|r| Box::new(r.sanitized()));
                Event::Summary(s)
            }
            Event::Notice { message } => Event::Notice {
                message: clean(&message),
            },
            Event::Error { kind, message } => Event::Error {
                kind,
                message: clean(&message),
            },
            step @ Event::Step(_) => step,
        }
    }

    /// Every event in a block of worker output, in order; log lines are skipped.
    pub fn parse_text(text: &str) -> Vec<Event> {
        text.lines().filter_map(Event::parse_line).collect()
    }

    /// The event as one JSON line (no trailing newline).
    pub(crate) fn to_line(&self) -> String {
        // Serialising these plain structs cannot fail: no maps with non-string keys.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Checks the events of one attempt in order, across its ranks: each line through
/// [`Event::read_line`], and step numbers that increase on every reporting rank. The first
/// violation is kept (with how many there were) for the attempt's failure reason.
#[derive(Debug, Default)]
pub struct EventReader {
    /// Last step number per (process rank, rank the event names).
    last_step: HashMap<(u32, u32), u64>,
    first_violation: Option<String>,
    violations: usize,
}

impl EventReader {
    /// Takes one line printed by process `rank`; returns the event on it when it is a
    /// valid one.
    pub fn line(&mut self, rank: u32, line: &str) -> Option<Event> {
        let ev = match Event::read_line(line) {
            Line::Text => return None,
            Line::Invalid(why) => {
                self.violate(rank, why);
                return None;
            }
            Line::Event(ev) => *ev,
        };
        if let Event::Step(s) = &ev {
            let key = (rank, s.rank.unwrap_or(rank));
            if let Some(&last) = self.last_step.get(&key) {
                if s.step <= last {
                    self.violate(
                        rank,
                        format!(
                            "a `step` event numbered {} after step {last}: step numbers must increase",
                            s.step
                        ),
                    );
                    return None;
                }
            }
            self.last_step.insert(key, s.step);
        }
        Some(ev)
    }

    fn violate(&mut self, rank: u32, why: String) {
        self.violations += 1;
        self.first_violation
            .get_or_insert_with(|| format!("rank {rank} printed {why}"));
    }

    /// Why the attempt's output cannot be trusted, if it cannot.
    pub fn violation(&self) -> Option<String> {
        let first = self.first_violation.as_ref()?;
        let more = match self.violations {
            1 => String::new(),
            n => format!(" ({} more such lines)", n - 1),
        };
        Some(format!(
            "the worker broke the event contract (docs/runner.md, worker events): {first}{more}"
        ))
    }
}

/// The longest line of worker output kept; the rest of a longer line is read and dropped.
/// Events are a few hundred bytes; 1 MiB keeps any real log line whole.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Splits worker output into lines of at most [`MAX_LINE_BYTES`], whatever the chunks it
/// arrives in (pipe reads, or the growth of a Slurm job's output file): the rest of a
/// longer line is dropped as it arrives, so memory stays bounded. Each line comes out as
/// [`line_text`].
#[derive(Debug, Default)]
pub struct LineSplitter {
    partial: Vec<u8>,
    cut: bool,
}

impl LineSplitter {
    /// Feeds the next bytes of the stream; `line` gets every line they complete.
    pub fn push(&mut self, mut bytes: &[u8], line: &mut impl FnMut(String)) {
        while let Some(i) = bytes.iter().position(|b| *b == b'\n') {
            self.take(&bytes[..i]);
            line(self.finish());
            bytes = &bytes[i + 1..];
        }
        self.take(bytes);
    }

    /// The last line of a stream that does not end with a newline.
    pub fn flush(&mut self) -> Option<String> {
        (!self.partial.is_empty() || self.cut).then(|| self.finish())
    }

    fn take(&mut self, bytes: &[u8]) {
        let room = MAX_LINE_BYTES - self.partial.len();
        if bytes.len() > room {
            self.partial.extend_from_slice(&bytes[..room]);
            self.cut = true;
        } else {
            self.partial.extend_from_slice(bytes);
        }
    }

    fn finish(&mut self) -> String {
        let text = line_text(&self.partial, self.cut);
        self.partial.clear();
        self.cut = false;
        text
    }
}

/// A line of worker output as the text the runner keeps: sanitized, without a trailing
/// carriage return, and marked when it was cut.
pub(crate) fn line_text(bytes: &[u8], cut: bool) -> String {
    let mut text = crate::sanitize::clean_bytes(bytes);
    if cut {
        text.push_str(&format!(" [bench: line cut at {MAX_LINE_BYTES} bytes]"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_design_md_step_line() {
        let e = Event::parse_line(
            r#"{"event":"step","step":3,"step_time_s":0.5,"tokens":16384,"loss":7.1}"#,
        )
        .unwrap();
        match e {
            Event::Step(s) => {
                assert_eq!(s.step, 3);
                assert_eq!(s.tokens, 16384);
                assert_eq!(s.warmup, None);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn log_text_is_not_an_event() {
        assert!(Event::parse_line("loss 7.1 at step 3").is_none());
        assert!(Event::parse_line("{not json").is_none());
        assert!(Event::parse_line(r#"{"event":"unknown"}"#).is_none());
    }

    #[test]
    fn round_trip() {
        let e = Event::Error {
            kind: ErrorKind::Oom,
            message: "CUDA out of memory".into(),
        };
        assert_eq!(Event::parse_line(&e.to_line()), Some(e));
    }

    fn reader_lines(lines: &[(u32, &str)]) -> (Vec<Event>, Option<String>) {
        let mut r = EventReader::default();
        let evs = lines.iter().filter_map(|(k, l)| r.line(*k, l)).collect();
        (evs, r.violation())
    }

    fn step(n: u64, t: &str) -> String {
        format!(r#"{{"event":"step","step":{n},"step_time_s":{t},"tokens":64,"loss":1.5}}"#)
    }

    #[test]
    fn figures_that_are_no_measurement_break_the_contract() {
        for (line, why) in [
            (step(5, "0"), "step_time_s 0"),
            (step(5, "-1.5"), "step_time_s -1.5"),
            (step(5, "1e999"), "does not parse"),
            (
                r#"{"event":"step","step":1,"step_time_s":1,"tokens":-4,"loss":1}"#.into(),
                "does not parse",
            ),
            (
                r#"{"event":"step","step":1,"step_time_s":1,"tokens":9007199254740993,"loss":1}"#
                    .into(),
                "more than 2^53",
            ),
            (
                r#"{"event":"step","step":1,"step_time_s":1,"tokens":1,"loss":null}"#.into(),
                "does not parse",
            ),
            (
                r#"{"event":"summary","tokens_per_s":0}"#.into(),
                "tokens_per_s 0",
            ),
            (r#"{"event":"summary","mfu":-0.1}"#.into(), "mfu -0.1"),
            (
                r#"{"event":"error","kind":"melted","message":"x"}"#.into(),
                "does not parse",
            ),
        ] {
            let (evs, v) = reader_lines(&[(0, &line)]);
            assert!(evs.is_empty(), "{line}");
            let v = v.unwrap_or_default();
            assert!(v.contains(why), "{line}: {v}");
            assert!(v.starts_with("the worker broke the event contract"), "{v}");
        }
    }

    #[test]
    fn step_numbers_must_increase_per_rank() {
        let (evs, v) = reader_lines(&[(0, &step(0, "1")), (0, &step(0, "1")), (0, &step(0, "1"))]);
        assert_eq!(evs.len(), 1);
        assert_eq!(
            v.unwrap(),
            "the worker broke the event contract (docs/runner.md, worker events): rank 0 printed a `step` event numbered 0 after step 0: step numbers must increase (1 more such lines)"
        );
        // Two ranks may report the same step; each increases on its own.
        let (evs, v) = reader_lines(&[
            (0, &step(0, "1")),
            (1, &step(0, "1")),
            (1, &step(1, "1")),
            (0, &step(1, "1")),
        ]);
        assert_eq!((evs.len(), v), (4, None));
    }

    #[test]
    fn unknown_kinds_and_other_json_stay_log_text() {
        let (evs, v) = reader_lines(&[
            (0, r#"{"event":"progress","pct":3}"#),
            (0, r#"{"level":"info","msg":"hi"}"#),
            (0, "{not json"),
        ]);
        assert!(evs.is_empty());
        assert_eq!(v, None);
    }

    /// 0 is a worker's "could not compute it": absent, never stored as a measurement.
    #[test]
    fn an_mfu_or_tflops_of_zero_is_absent() {
        let line = r#"{"event":"summary","mfu":0,"tflops_per_gpu":0,"tokens_per_s":5.0}"#;
        match Event::parse_line(line) {
            Some(Event::Summary(s)) => {
                assert_eq!((s.mfu, s.tflops_per_gpu), (None, None));
                assert_eq!(s.tokens_per_s, Some(5.0));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn event_text_is_sanitized() {
        let line = r#"{"event":"error","kind":"oom","message":"\u001b[31mCUDA\u0000 out of memory\u001b[0m"}"#;
        assert_eq!(
            Event::parse_line(line),
            Some(Event::Error {
                kind: ErrorKind::Oom,
                message: "CUDA out of memory".into()
            })
        );
    }

    #[test]
    fn long_lines_are_cut_and_the_rest_skipped() {
        let mut input = vec![b'x'; 3 * MAX_LINE_BYTES];
        input.extend_from_slice(b"\nnext\r\n\x1b[1mlast");
        let mut split = LineSplitter::default();
        let mut lines = Vec::new();
        // In chunks of 4 KiB, as from a pipe: what is kept never exceeds one line's bound.
        for chunk in input.chunks(4096) {
            split.push(chunk, &mut |l| lines.push(l));
            assert!(split.partial.len() <= MAX_LINE_BYTES);
        }
        lines.extend(split.flush());
        assert_eq!(lines.len(), 3);
        assert!(lines[0].ends_with(" [bench: line cut at 1048576 bytes]"));
        assert_eq!(lines[0].len(), MAX_LINE_BYTES + 35);
        assert_eq!(lines[1], "next");
        assert_eq!(lines[2], "last");
        assert_eq!(split.flush(), None);
    }
}
