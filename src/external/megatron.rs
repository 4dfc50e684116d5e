//! The Megatron-LM / Megatron-Core adapter: bench's axes to `pretrain_gpt.py` flags (a
//! Megatron-Core `GPTModel` with the local layer spec, `--mock-data`), launched with
//! torchrun through `scripts/frameworks/megatron_train.py`, and Megatron's own
//! `training_log` lines read back.
//!
//! The driver runs the `pretrain_gpt.py` of the Megatron-LM checkout the cell names
//! (`source`, else `$BENCH_MEGATRON_SOURCE`), so every step line is printed by Megatron's
//! `megatron/training/training.py` itself, in its format:
//! `[<datetime>] iteration N/ M | consumed samples: .. | elapsed time per iteration (ms): X |
//! throughput per GPU (TFLOP/s/GPU): Y | ... | lm loss: L | ...`. With `--log-interval 1`
//! each line covers one iteration, so X is the step time; Y is Megatron's own TFLOP/s.

use std::sync::LazyLock;

use regex::Regex;

use super::adapter::Config;
use super::launch::AttemptFiles;
use super::log::{self, Line, LogParser, LoggedStep, ParseError, Progress, StepLines};
use crate::cell::Cell;
use crate::cell::FrameworkOpts;

pub(crate) struct Megatron;

pub(crate) const NAME: &str = "megatron";

impl super::adapter::Adapter for Megatron {
    fn config(&self, cell: &Cell, opts: &FrameworkOpts, _: &AttemptFiles) -> Config {
        let p = &cell.params;
        let cfg = super::mapping::mapped_llama(cell);
        let (tp, pp) = (
            super::mapping::degree(cell, "tp"),
            super::mapping::degree(cell, "pp"),
        );
        let dp = cell.gpus() / (tp * pp).max(1);
        let s = |v: &dyn ToString| v.to_string();
        let mut flags: Vec<String> = [
            "--transformer-impl",
            "local",
            "--use-mcore-models",
            "--mock-data",
            "--tokenizer-type",
            "NullTokenizer",
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        let mut kv = |k: &str, v: String| {
            flags.push(k.to_string());
            flags.push(v);
        };
        // NullTokenizer's vocabulary is `--vocab-size` plus its end-of-document token;
        // dividing by 1 keeps Megatron from padding it, so the model is exactly the preset.
        kv("--vocab-size", s(&(cfg.vocab - 1)));
        kv("--make-vocab-size-divisible-by", s(&1));
        kv("--num-layers", s(&cfg.layers));
        kv("--hidden-size", s(&cfg.hidden));
        kv("--ffn-hidden-size", s(&cfg.ffn));
        kv("--num-attention-heads", s(&cfg.heads));
        kv("--num-query-groups", s(&cfg.kv_heads));
        kv("--seq-length", s(&p.seq_len));
        kv("--max-position-embeddings", s(&p.seq_len));
        kv("--position-embedding-type", "rope".into());
        kv("--rotary-base", s(&(cfg.rope_theta as u64)));
        kv("--normalization", "RMSNorm".into());
        kv("--norm-epsilon", s(&cfg.norm_eps));
        kv("--attention-dropout", s(&0.0));
        kv("--hidden-dropout", s(&0.0));
        kv("--micro-batch-size", s(&p.micro_batch));
        kv("--global-batch-size", s(&p.global_batch));
        kv("--train-iters", s(&p.steps));
        kv("--lr", s(&p.lr));
        kv("--min-lr", s(&p.lr));
        kv("--lr-decay-style", "constant".into());
        kv("--lr-warmup-iters", s(&0));
        kv("--weight-decay", s(&0.0));
        // Megatron refuses seed 0 ("Seed (0) should be a positive integer", seen on the
        // H100): the cell's seed s is Megatron's s + 1, so distinct seeds stay distinct.
        kv("--seed", s(&p.seed.saturating_add(1)));
        kv("--tensor-model-parallel-size", s(&tp));
        kv("--pipeline-model-parallel-size", s(&pp));
        // One line per iteration, so each line's time is one step's; no evaluation or
        // checkpoint interrupts the steps.
        kv("--log-interval", s(&1));
        kv("--eval-iters", s(&0));
        kv("--eval-interval", s(&(p.steps + 1)));
        for f in [
            "--group-query-attention",
            "--swiglu",
            "--untie-embeddings-and-output-weights",
            "--disable-bias-linear",
            "--log-throughput",
            // The fused weight-gradient and softmax kernels come from Transformer Engine or
            // apex, which the local spec does not require.
            "--no-gradient-accumulation-fusion",
            "--no-masked-softmax-fusion",
            // Megatron-Core 0.19 refuses its default rope fusion without Transformer Engine
            // ("apply_rope_fusion is not available. Please install TE >= 1.4").
            "--no-rope-fusion",
            // The local spec's torch norm asserts "persist_layer_norm not supported by torch
            // LayerNorm" (seen on an H100): that kernel is apex's.
            "--no-persist-layer-norm",
        ] {
            flags.push(f.to_string());
        }
        if cell.dtype().name() == "bf16" {
            flags.push("--bf16".into());
        }
        if cell.features().contains("sac") {
            flags.extend(
                [
                    "--recompute-granularity",
                    "full",
                    "--recompute-method",
                    "uniform",
                    "--recompute-num-layers",
                    "1",
                ]
                .map(String::from),
            );
        }
        if cell.parallel().name() == "fsdp" && dp > 1 {
            flags.push("--use-torch-fsdp2".into());
        }
        flags.extend(opts.args.iter().cloned());
        let config = serde_json::json!({
            "cell": cell.id.as_str(),
            "source": opts.source,
            "argv": flags,
        });
        Config::json(&config)
    }

    fn parser(&self, cell: &Cell) -> Box<dyn LogParser> {
        log::reader(cell, MegatronLog)
    }
}

static ITERATION: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\biteration\s+(\d+)/\s*(\d+)\s*\|(.*)$").expect("static regex"));

/// The field every `training_log` step line has.
pub(crate) const ELAPSED: &str = "elapsed time per iteration (ms)";

/// One `training_log` step line of Megatron-LM / Megatron-Core (`[time] iteration N/ M |
/// key: value | ... |`), recognised the same way by `bench adapt` and `bench ingest`: the
/// iteration counter, and the fields after it looked up by key, so fields Megatron adds
/// (energy, MoE losses) do not matter. Each value is the text as printed: the two read
/// numbers by their own rules (an adapted cell's strictly, an ingested log's as frameworks
/// print them).
pub(crate) struct TrainingLogLine<'a> {
    pub step: &'a str,
    /// The run's iteration count (`N/ M`'s M).
    pub of: &'a str,
    fields: std::collections::BTreeMap<&'a str, &'a str>,
}

impl<'a> TrainingLogLine<'a> {
    /// `None` for a line without the elapsed-time field; an error for one cut short or
    /// without its counter.
    pub(crate) fn read(text: &'a str) -> Option<Result<TrainingLogLine<'a>, String>> {
        let at = text.find(ELAPSED)?;
        // Every field ends with ` |`: a value with none after it may be cut short.
        if !text[at..].contains('|') {
            return Some(Err(format!(
                "the `{ELAPSED}` value is not followed by ` |`: the line is cut (truncated log?)"
            )));
        }
        let Some(c) = ITERATION.captures(text) else {
            return Some(Err(format!(
                "an `{ELAPSED}` line that does not start as Megatron's `iteration N/ M |` (truncated?)"
            )));
        };
        let group = |i| c.get(i).map_or("", |m| m.as_str());
        let fields = group(3)
            .split('|')
            .filter_map(|f| {
                let (k, v) = f.split_once(':')?;
                Some((k.trim(), v.trim()))
            })
            .collect();
        Some(Ok(TrainingLogLine {
            step: group(1),
            of: group(2),
            fields,
        }))
    }

    /// The value printed for `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&'a str> {
        self.fields.get(key).copied()
    }
}
static MEMORY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"\[Rank (\d+)\] \(after \d+ iterations\) memory \(MB\) \|.*\| max reserved: ([0-9.]+)",
    )
    .expect("static regex")
});

/// Megatron's `training_log` output, as `bench adapt` reads it.
#[derive(Default)]
pub(crate) struct MegatronLog;

impl StepLines for MegatronLog {
    const NAME: &'static str = NAME;
    const METHOD: &'static str = "Megatron training_log (log_interval 1): elapsed time per iteration from its interval timer (barrier at each log), TFLOP/s/GPU from its num_floating_point_operations (causal attention counted at half); tokens/s per GPU is global batch x seq over that time; medians over the measured steps";

    fn line(&mut self, log: &mut Progress, line: &Line<'_>) -> Result<Vec<LoggedStep>, ParseError> {
        let text = line.text.as_str();
        if let Some(c) = MEMORY.captures(text) {
            let r: u32 = line.int(&c[1], "rank")?;
            let mb = line.number(&c[2], "max reserved")?;
            log.memory.record(r, (mb * 1024.0 * 1024.0).round() as u64);
            return Ok(vec![]);
        }
        let Some(read) = TrainingLogLine::read(text) else {
            return Ok(vec![]);
        };
        let read = read.map_err(|m| line.bad(m))?;
        let step: u64 = line.int(read.step, "iteration number")?;
        let total: u64 = line.int(read.of, "iteration count")?;
        let asked = log.asked;
        line.agrees(total, u64::from(asked.steps), || {
            format!(
                "Megatron says it trains {total} iterations, the cell asked for {}: the flags did not take",
                asked.steps
            )
        })?;
        let batch: u32 = read
            .get("global batch size")
            .and_then(|b| b.parse().ok())
            .ok_or_else(|| line.bad("a step line without a readable `global batch size`"))?;
        line.agrees(batch, asked.global_batch, || {
            format!(
                "Megatron ran a global batch of {batch}; the cell asks for {}",
                asked.global_batch
            )
        })?;
        log.in_order(line, step)?;
        let ms = line.positive(
            read.get(ELAPSED),
            "elapsed time per iteration is not a positive number",
        )?;
        let loss = match read.get("lm loss") {
            Some(l) => line.number(l, "lm loss")?,
            // Megatron leaves out a loss that averaged to below zero, and a NaN iteration
            // has none: either way this step has no loss to believe.
            None => f64::NAN,
        };
        let step_time_s = ms / 1000.0;
        let tflops = match read.get("throughput per GPU (TFLOP/s/GPU)") {
            Some(t) => Some(line.number(t, "throughput")?),
            None => None,
        };
        let tokens = asked.tokens_per_step() as f64;
        Ok(vec![LoggedStep {
            step,
            step_time_s,
            loss,
            tokens_per_s_per_gpu: Some(tokens / step_time_s / f64::from(asked.gpus.max(1))),
            tflops_per_gpu: tflops,
            mfu: None,
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::external::declared::MEGATRON as FRAMEWORK;
    use crate::external::log::{self, Reader};
    use crate::external::tests::asked;

    fn cell(gpus: i64, parallel: &str, feats: &[&str]) -> Cell {
        let mut c = crate::external::tests::tiny_cell(NAME, gpus, parallel, feats);
        c.params.steps = 6;
        c.params.warmup = 2;
        c.params.seq_len = 64;
        c
    }

    #[test]
    fn mapping_and_drops() {
        let c = cell(2, "fsdp", &["sac"]);
        assert_eq!(FRAMEWORK.unexpressible(&c), None);
        let p = FRAMEWORK.prepare(
            &c,
            &FrameworkOpts::default(),
            &crate::external::tests::files(),
        );
        let v: serde_json::Value = serde_json::from_str(&p.config_text).unwrap();
        let argv: Vec<String> = serde_json::from_value(v["argv"].clone()).unwrap();
        let flag = |k: &str| {
            let i = argv
                .iter()
                .position(|a| a == k)
                .unwrap_or_else(|| panic!("{k}: {argv:?}"));
            argv.get(i + 1).cloned().unwrap_or_default()
        };
        // llama-tiny: 2 layers, width 64, 4 heads, 2 KV heads, FFN 176, vocabulary 512.
        assert_eq!(flag("--num-layers"), "2");
        assert_eq!(flag("--ffn-hidden-size"), "176");
        assert_eq!(flag("--num-query-groups"), "2");
        assert_eq!(flag("--vocab-size"), "511");
        assert_eq!(flag("--global-batch-size"), "4");
        assert_eq!(flag("--recompute-granularity"), "full");
        assert!(argv.contains(&"--bf16".to_string()));
        assert!(argv.contains(&"--use-torch-fsdp2".to_string()));
        assert!(p.argv.contains(&"--nproc_per_node".to_string()));
        assert!(p.argv.last().unwrap() == "{config}");
        let compiled = cell(1, "single", &["compile"]);
        assert!(FRAMEWORK
            .unexpressible(&compiled)
            .unwrap()
            .contains("torch.compile"));
        let mut fp8 = cell(1, "single", &[]);
        fp8.values
            .insert("dtype".into(), crate::cell::Value::Str("fp8".into()));
        assert!(FRAMEWORK
            .unexpressible(&fp8)
            .unwrap()
            .contains("Transformer Engine"));
        let mut tp3 = cell(3, "ddp", &[]);
        tp3.values.insert("tp".into(), crate::cell::Value::Int(3));
        tp3.params.global_batch = 2;
        assert!(FRAMEWORK.unexpressible(&tp3).unwrap().contains("tp 3"));
        let mut pp2 = cell(2, "ddp", &[]);
        pp2.values.insert("pp".into(), crate::cell::Value::Int(2));
        pp2.params.global_batch = 2;
        assert_eq!(FRAMEWORK.unexpressible(&pp2), None);
    }

    fn fixture() -> String {
        crate::external::tests::fixture("megatron-core-0.20.0-2rank-from-source.log")
    }

    /// A reader of `steps` iterations of `global_batch` sequences of 2,048 tokens on 2 GPUs.
    fn parser_of(steps: u32, global_batch: u32) -> Reader<MegatronLog> {
        Reader::new(asked(steps, global_batch, 2048, 2), MegatronLog)
    }

    fn parser() -> Reader<MegatronLog> {
        parser_of(6, 4)
    }

    #[test]
    fn fixture_from_megatrons_logging_code() {
        let (steps, end) = log::read_all(&mut parser(), &fixture(), true).unwrap();
        assert_eq!(steps.len(), 6);
        assert_eq!(steps[2].step, 3);
        assert!((steps[2].step_time_s - 0.2504).abs() < 1e-12);
        assert!((steps[2].loss - 6.234567).abs() < 1e-9);
        assert_eq!(steps[2].tflops_per_gpu, Some(137.6));
        // 4 x 2048 tokens in 0.2504 s on 2 GPUs.
        let tps = steps[2].tokens_per_s_per_gpu.unwrap();
        assert!((tps - 8192.0 / 0.2504 / 2.0).abs() < 1e-6, "{tps}");
        // Data-parallel rank 0 reports memory; its largest `max reserved` is kept.
        assert_eq!(
            end.peak_mem_bytes,
            vec![(2100.0f64 * 1024.0 * 1024.0) as u64]
        );
        assert_eq!(end.info.name, "megatron-core");
    }

    #[test]
    fn captured_two_rank_h200_log() {
        // A real run (2026-11-26, two H200s, torch FSDP2, seq 2048 x micro batch 4): the last
        // rank prints the iteration lines, data-parallel rank 0 the memory reports.
        let text = crate::external::tests::fixture("megatron-core-0.19.0-h200x2-fsdp2.log");
        let mut parser = parser_of(12, 8);
        let (steps, end) = log::read_all(&mut parser, &text, true).unwrap();
        assert_eq!(steps.len(), 12);
        assert!((steps[11].step_time_s - 0.4359).abs() < 1e-12);
        assert!((steps[11].loss - 0.2555234).abs() < 1e-9);
        assert_eq!(steps[11].tflops_per_gpu, Some(161.4));
        let tps = steps[11].tokens_per_s_per_gpu.unwrap();
        assert!((tps - 8.0 * 2048.0 / 0.4359 / 2.0).abs() < 1e-6, "{tps}");
        assert_eq!(
            end.peak_mem_bytes,
            vec![(32326.0f64 * 1024.0 * 1024.0) as u64]
        );
        assert_eq!(end.info.name, "megatron-core");
        assert_eq!(end.info.version, "0.19.0");
        assert_eq!(end.info.device, "NVIDIA H200");
    }

    #[test]
    fn hostile_logs_are_refused() {
        let text = fixture();
        // Truncated before the last iteration although Megatron exited 0.
        let cut = text.find("iteration        6/").unwrap();
        let line_start = text[..cut].rfind('\n').unwrap() + 1;
        log::refuses(parser(), &text[..line_start], "ends after step 5 of 6");
        // A garbled time field.
        log::refuses(
            parser(),
            &text.replace("(ms): 250.4 |", "(ms): fast |"),
            "positive number",
        );
        // A line cut after its elapsed time (`250.4` read as `25`) is not a shorter step.
        let line = text.lines().find(|l| l.contains("(ms): 250.4 |")).unwrap();
        let cut = &line[..line.find("250.4").unwrap() + 2];
        log::refuses(parser(), &text.replace(line, cut), "the line is cut");
        // Two ranks' lines mixed without prefixes: an iteration repeats.
        let doubled = text.replace("[rank1]:", "").replacen(
            " [2026-11-24 10:00:02",
            " iteration        1/       6 | elapsed time per iteration (ms): 250.1 | global batch size:     4 | lm loss: 6.900000E+00 |\n [2026-11-24 10:00:02",
            1,
        );
        log::refuses(parser(), &doubled, "mixed");
        // Flags that did not take.
        let mut other = parser();
        other.log.asked.steps = 8;
        log::refuses(other, &text, "asked for 8");
        log::refuses(parser_of(6, 8), &text, "asks for 8");
        // A NaN loss reads as NaN (the reader fails the cell with exit 5).
        let (steps, _) = log::read_all(
            &mut parser(),
            &text.replace("lm loss: 6.234567E+00", "lm loss: nan"),
            true,
        )
        .unwrap();
        assert!(steps[2].loss.is_nan());
    }
}
