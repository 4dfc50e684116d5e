//! What a framework cell actually ran, read from the run's own records: the framework's log
//! lines (each adapter's [`Signature`]s, and the signatures every torch stack shares) and
//! the driver's `bench-ran: {json}` line, which reads the framework's resolved settings
//! from its own objects once it has built them.
//!
//! A cell's switches say what was asked; this record says what happened. The comparison
//! table (`frameworks.md`) shows it beside each figure, so that "compile" on one row and
//! "compile" on another are seen to be one CUDA graph per step against torch.compile per
//! block, or torch.compile that hit dynamo's recompile limit and ran partly eager. An
//! aspect no record speaks of starts as what the cell asked, marked as such, so a missing
//! log line shows instead of passing for a confirmation.

use std::collections::BTreeSet;

use regex::Regex;

use crate::cell::Cell;
use crate::events::Ran;

/// The prefix of a driver's record line.
pub(crate) const RAN_PREFIX: &str = "bench-ran: ";

/// A log line that says what ran: when `pattern` matches a line, `says` (with `$1`... from
/// the pattern's groups) becomes the `aspect`'s phrase, or joins it after a `; ` when an
/// earlier line already spoke of that aspect.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Signature {
    pub aspect: &'static str,
    pub pattern: &'static str,
    pub says: &'static str,
}

/// Lines any torch-based stack may print, whatever the framework.
pub(crate) const TORCH: &[Signature] = &[
    // torch 2.11 names it `recompile_limit`; earlier releases `cache_size_limit`.
    Signature {
        aspect: "execution",
        pattern: r"torch\._dynamo hit config\.(?:recompile_limit|cache_size_limit) \((\d+)\)",
        says: "partly eager: dynamo hit its recompile limit ($1), so frames past it ran uncompiled",
    },
];

/// Reads a framework's records line by line into a [`Ran`].
pub(crate) struct RanReader {
    ran: Ran,
    signatures: Vec<(Signature, Regex)>,
    /// The aspects a record has spoken of (the cell's request no longer stands for them).
    spoken: BTreeSet<&'static str>,
}

impl RanReader {
    /// A reader for `cell` with the adapter's `signatures` (plus [`TORCH`] when `torch`).
    pub(crate) fn new(cell: &Cell, signatures: &[Signature], torch: bool) -> RanReader {
        let mut all: Vec<(Signature, Regex)> = Vec::new();
        let shared: &[Signature] = if torch { TORCH } else { &[] };
        for s in signatures.iter().chain(shared) {
            // The tables are static and tested (every adapter's signatures compile in
            // `signatures_compile`), so a bad pattern cannot reach a user.
            if let Ok(re) = Regex::new(s.pattern) {
                all.push((*s, re));
            }
        }
        RanReader {
            ran: asked(cell),
            signatures: all,
            spoken: BTreeSet::new(),
        }
    }

    /// One line of the framework's output (1-based `line_no`), its rank prefix removed.
    pub(crate) fn line(&mut self, line_no: usize, text: &str) {
        if let Some(json) = text.trim_start().strip_prefix(RAN_PREFIX) {
            self.driver_record(line_no, json);
            return;
        }
        for i in 0..self.signatures.len() {
            let (sig, re) = &self.signatures[i];
            let Some(caps) = re.captures(text) else {
                continue;
            };
            let mut phrase = String::new();
            caps.expand(sig.says, &mut phrase);
            let aspect = sig.aspect;
            self.speak(aspect, phrase, line_no, text);
        }
    }

    /// The driver's `bench-ran: {json}` record: each aspect it names is spoken of.
    fn driver_record(&mut self, line_no: usize, json: &str) {
        let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(json)
        else {
            self.note(format!(
                "log line {line_no}: the driver's record does not parse as a JSON object"
            ));
            return;
        };
        for (key, value) in map {
            let Some(text) = value.as_str() else { continue };
            match Ran::NAMES.iter().find(|a| **a == key) {
                Some(aspect) => {
                    self.speak(aspect, text.to_string(), line_no, "the driver's record");
                }
                None if key == "note" => self.note(format!("log line {line_no}: {text}")),
                None => {}
            }
        }
    }

    fn speak(&mut self, aspect: &'static str, phrase: String, line_no: usize, source: &str) {
        let Some(slot) = self.ran.aspect_mut(aspect) else {
            return;
        };
        if self.spoken.insert(aspect) {
            *slot = Some(phrase);
        } else {
            match slot {
                // The same phrase again (another rank, another compile of the same block)
                // says nothing new.
                Some(s) if s.split("; ").any(|p| p == phrase) => return,
                // A phrase already past what a report shows takes no more: a log that
                // matches on every line must not grow it without bound.
                Some(s) if s.len() > 4 * Ran::MAX_PHRASE => return,
                Some(s) => {
                    s.push_str("; ");
                    s.push_str(&phrase);
                }
                None => *slot = Some(phrase),
            }
        }
        let source = source.trim();
        let cut: String = source.chars().take(160).collect();
        self.note(format!("log line {line_no} ({aspect}): {cut}"));
    }

    fn note(&mut self, text: String) {
        if self.ran.evidence.len() < Ran::MAX_EVIDENCE {
            self.ran.evidence.push(text);
        }
    }

    /// The record, once the log has ended.
    pub(crate) fn finish(self) -> Ran {
        self.ran
    }
}

/// What the cell asked for, marked as asked: the starting point that records replace.
fn asked(cell: &Cell) -> Ran {
    let f = cell.features();
    let mark = |s: &str| format!("{s} (asked; no record of the run says)");
    Ran {
        execution: Some(mark(if f.contains("compile") {
            "compile"
        } else {
            "eager"
        })),
        checkpointing: Some(mark(if f.contains("sac") {
            "activation checkpointing"
        } else {
            "none"
        })),
        precision: Some(mark(cell.dtype().name())),
        ..Ran::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::external::tests::cell;

    #[test]
    fn signatures_compile() {
        for a in crate::external::ADAPTERS {
            for s in a.signatures().iter().chain(TORCH) {
                assert!(Regex::new(s.pattern).is_ok(), "{}: {}", a.name(), s.pattern);
                assert!(Ran::NAMES.contains(&s.aspect), "{}: {}", a.name(), s.aspect);
            }
        }
    }

    #[test]
    fn records_replace_the_request_and_join_in_log_order() {
        let c = cell("llama-tiny", "bf16", 1, "fsdp", &["compile", "sac"]);
        let sigs = [
            Signature {
                aspect: "execution",
                pattern: "Compiling each TransformerBlock",
                says: "torch.compile per block",
            },
            Signature {
                aspect: "precision",
                pattern: r"Float8 training active with recipe (\w+)",
                says: "fp8 $1",
            },
        ];
        let mut r = RanReader::new(&c, &sigs, true);
        assert_eq!(
            r.ran.execution.as_deref(),
            Some("compile (asked; no record of the run says)")
        );
        r.line(
            3,
            "INFO - Compiling each TransformerBlock with torch.compile",
        );
        r.line(
            4,
            "INFO - Compiling each TransformerBlock with torch.compile",
        );
        r.line(5, "INFO - Float8 training active with recipe tensorwise");
        r.line(
            9,
            r#"bench-ran: {"attention": "SDPA: flash attention", "bogus": "x", "optimizer": 3}"#,
        );
        r.line(
            12,
            "W1126 convert_frame.py:1743] [22/8] torch._dynamo hit config.recompile_limit (8)",
        );
        r.line(13, "bench-ran: [not an object");
        let ran = r.finish();
        assert_eq!(
            ran.execution.as_deref(),
            Some("torch.compile per block; partly eager: dynamo hit its recompile limit (8), so frames past it ran uncompiled")
        );
        assert_eq!(ran.precision.as_deref(), Some("fp8 tensorwise"));
        assert_eq!(ran.attention.as_deref(), Some("SDPA: flash attention"));
        assert_eq!(ran.optimizer, None, "a non-string value is no record");
        assert_eq!(
            ran.checkpointing.as_deref(),
            Some("activation checkpointing (asked; no record of the run says)")
        );
        assert!(ran.evidence[0].starts_with("log line 3 (execution): INFO - Compiling"));
        assert!(
            ran.evidence.iter().any(|e| e.contains("log line 13")),
            "{:?}",
            ran.evidence
        );
        assert_eq!(ran.evidence.len(), 5, "{:?}", ran.evidence);
    }

    #[test]
    fn evidence_is_bounded_whatever_the_log() {
        let c = cell("llama-tiny", "bf16", 1, "single", &[]);
        let sigs = [Signature {
            aspect: "attention",
            pattern: r"attn (\d+)",
            says: "kernel $1",
        }];
        let mut r = RanReader::new(&c, &sigs, false);
        for i in 0..10_000 {
            r.line(i, &format!("attn {i}"));
        }
        let ran = r.finish();
        assert_eq!(ran.evidence.len(), Ran::MAX_EVIDENCE);
        // The phrase grows, but the summary event cuts it (events::Ran::MAX_PHRASE).
        assert!(ran.attention.unwrap().starts_with("kernel 0; kernel 1"));
    }

    /// The record each adapter's signatures read from the cell logs of the GPU runs of
    /// 2026-11-26 (docs/results/frameworks-2026-11-26), as `bench adapt` echoed them.
    fn record_of(kind: &str, log: &str, c: &Cell) -> Ran {
        let a = crate::external::find(kind).unwrap();
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("docs/results/frameworks-2026-11-26")
            .join(log);
        let text = std::fs::read_to_string(&path).unwrap();
        let mut r = RanReader::new(c, a.signatures(), a.torch_based());
        for (i, line) in text.lines().enumerate() {
            r.line(i + 1, &crate::external::log::split_rank(line).1);
        }
        r.finish()
    }

    #[test]
    fn torchtitan_logs_say_compile_checkpointing_fp8_and_no_fsdp_on_one_gpu() {
        let c = cell("llama-3.1-8b-proxy", "fp8", 1, "fsdp", &["compile", "sac"]);
        let ran = record_of(
            "torchtitan",
            "h200x2-run1/logs/torchtitan.llama-3.1-8b-proxy.fp8.1gpu.fsdp.compile+sac.r0.log",
            &c,
        );
        assert_eq!(
            ran.execution.as_deref(),
            Some("torch.compile of the loss; torch.compile of each TransformerBlock")
        );
        assert_eq!(
            ran.attention.as_deref(),
            Some("torchtitan `sdpa` attention")
        );
        assert!(ran
            .checkpointing
            .unwrap()
            .starts_with("torchtitan's selective"));
        assert_eq!(
            ran.precision.as_deref(),
            Some("fp8 linears: torchao Float8Linear, tensorwise scaling; mixed precision by AMP autocast")
        );
        assert_eq!(
            ran.parallel.as_deref(),
            Some("no active mesh dimension: no FSDP or DDP applied (a plain loop)")
        );
    }

    #[test]
    fn deepspeed_log_says_its_compile_ran_partly_eager() {
        let c = cell("llama-3.1-8b-proxy", "bf16", 1, "fsdp", &["compile", "sac"]);
        let ran = record_of(
            "deepspeed",
            "h200x2-run1/logs/deepspeed.llama-3.1-8b-proxy.bf16.1gpu.fsdp.compile+sac.r0.log",
            &c,
        );
        let exec = ran.execution.unwrap();
        assert!(exec.starts_with("torch.compile through engine.compile() (mode model, deepcompile False, backend inductor)"), "{exec}");
        assert!(
            exec.contains("partly eager: dynamo hit its recompile limit (8)"),
            "{exec}"
        );
        assert_eq!(
            ran.optimizer.as_deref(),
            Some("DeepSpeed's final optimizer DeepSpeedZeroOptimizer_Stage3")
        );
    }

    #[test]
    fn megatron_arguments_say_full_recompute_fsdp2_and_unfused_attention() {
        let c = cell("llama-3.1-8b-proxy", "bf16", 2, "fsdp", &["sac"]);
        let ran = record_of(
            "megatron",
            "h200x2-run2-megatron-8192/logs/megatron.llama-3.1-8b-proxy.bf16.2gpu.fsdp.sac.r0.log",
            &c,
        );
        assert_eq!(
            ran.checkpointing.as_deref(),
            Some("full recompute; method uniform; 1 layer(s) per recompute unit")
        );
        assert_eq!(
            ran.parallel.as_deref(),
            Some("data-parallel size 2; torch FSDP2")
        );
        assert!(ran
            .attention
            .unwrap()
            .starts_with("the local layer spec's unfused"));
        assert!(ran.execution.unwrap().starts_with("eager (no CUDA graphs"));
        assert_eq!(
            ran.precision.as_deref(),
            Some("bf16 weights and activations; float32 main params")
        );
    }

    #[test]
    fn maxtext_and_llmc_records_come_from_their_config_printouts() {
        let c = cell("llama-3.1-8b-proxy", "fp8", 1, "fsdp", &["compile", "sac"]);
        let ran = record_of(
            "maxtext",
            "h200x2-run1/logs/maxtext.llama-3.1-8b-proxy.fp8.1gpu.fsdp.compile+sac.r0.log",
            &c,
        );
        assert_eq!(
            ran.attention.as_deref(),
            Some("MaxText `cudnn_flash_jax` attention")
        );
        assert_eq!(ran.checkpointing.as_deref(), Some("remat policy `full`"));
        assert!(ran.precision.unwrap().contains("quantization FP8"));
        assert!(ran
            .execution
            .unwrap()
            .starts_with("jax.jit of the whole step"));
        let c = cell("gpt2-125m", "bf16", 1, "single", &[]);
        let ran = record_of(
            "llmc",
            "h200x2-run1/logs/llmc.gpt2-125m.bf16.1gpu.single.base.r0.log",
            &c,
        );
        assert_eq!(
            ran.attention.as_deref(),
            Some("llm.c's own attention kernels (no cuDNN flash attention)")
        );
        assert!(ran.checkpointing.unwrap().starts_with("recompute level 0"));
        assert_eq!(
            ran.precision.as_deref(),
            Some("BF16 weights and activations")
        );
    }
}
