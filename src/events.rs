//! Worker events: the JSON-lines contract between a worker process and the runner.
//!
//! A worker (the built-in `bench worker`, or any external command) prints one JSON object
//! per line on stdout. Lines that do not parse as an event are log text and are kept in the
//! cell's log, never an error: external frameworks print whatever they like. Both sides of
//! the contract use these types, so the built-in workload cannot drift from the runner.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Exit codes of `bench worker`, distinct per failure class so the runner can tell an
/// unsupported configuration (a skip) from a crash (an infrastructure failure, retried)
/// from a training failure (out of memory, NaN loss: a failed cell, not retried).
pub mod exit {
    pub const OK: i32 = 0;
    /// Internal error (a bug or an unexpected libtorch error).
    pub const INTERNAL: i32 = 1;
    /// Bad arguments or configuration.
    pub const BAD_INPUT: i32 = 2;
    /// The device cannot run this configuration (e.g. fp8 on a GPU without fp8 support).
    pub const UNSUPPORTED: i32 = 3;
    /// Out of device memory.
    pub const OOM: i32 = 4;
    /// The loss became NaN or infinite.
    pub const NAN_LOSS: i32 = 5;
    /// A collective (NCCL) or rendezvous failure in a multi-rank cell.
    pub const DISTRIBUTED: i32 = 6;
}

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
    pub fn exit_code(self) -> i32 {
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
    pub framework: Option<Box<crate::external::FrameworkReport>>,
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

impl Event {
    /// Parses one output line; `None` for log text.
    pub fn parse_line(line: &str) -> Option<Event> {
        let t = line.trim();
        if !t.starts_with('{') {
            return None;
        }
        serde_json::from_str(t).ok()
    }

    /// Every event in a block of worker output, in order; log lines are skipped.
    pub fn parse_text(text: &str) -> Vec<Event> {
        text.lines().filter_map(Event::parse_line).collect()
    }

    /// The event as one JSON line (no trailing newline).
    pub fn to_line(&self) -> String {
        // Serialising these plain structs cannot fail: no maps with non-string keys.
        serde_json::to_string(self).unwrap_or_default()
    }
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
}
