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

use super::ran::Signature;
use std::sync::LazyLock;

use regex::Regex;

use super::log::{self, DriverInfo, LogEnd, LogParser, LoggedStep, ParseError, StepOrder};
use super::{AttemptFiles, FrameworkOpts, Prepared};
use crate::cell::Cell;

pub(crate) struct Megatron;

const NAME: &str = "megatron";

/// Megatron prints every argument it resolved (`  name ..... value`); these are the ones
/// that say what ran, read into the cell's record (`super::ran`).
const SIGNATURES: &[Signature] = &[
    Signature { aspect: "execution", pattern: r"^\s*cuda_graph_impl \.+ none\s*$", says: "eager (no CUDA graphs; Megatron has no torch.compile of the model)" },
    Signature { aspect: "execution", pattern: r"^\s*cuda_graph_impl \.+ (local|transformer_engine)\s*$", says: "CUDA graphs ($1)" },
    Signature { aspect: "attention", pattern: r"^\s*transformer_impl \.+ local\s*$", says: "the local layer spec's unfused DotProductAttention (scores materialised; no Transformer Engine)" },
    Signature { aspect: "attention", pattern: r"^\s*transformer_impl \.+ transformer_engine\s*$", says: "Transformer Engine's attention" },
    Signature { aspect: "attention", pattern: r"^\s*use_flash_attn \.+ True\s*$", says: "flash attention" },
    Signature { aspect: "checkpointing", pattern: r"^\s*recompute_granularity \.+ (\w+)\s*$", says: "$1 recompute" },
    Signature { aspect: "checkpointing", pattern: r"^\s*recompute_method \.+ (\w+)\s*$", says: "method $1" },
    Signature { aspect: "checkpointing", pattern: r"^\s*recompute_num_layers \.+ (\d+)\s*$", says: "$1 layer(s) per recompute unit" },
    Signature { aspect: "optimizer", pattern: r"^\s*optimizer \.+ (\w+)\s*$", says: "Megatron's $1 (decoupled weight decay)" },
    Signature { aspect: "optimizer", pattern: r"^\s*use_distributed_optimizer \.+ True\s*$", says: "distributed optimizer" },
    Signature { aspect: "precision", pattern: r"^\s*bf16 \.+ True\s*$", says: "bf16 weights and activations" },
    Signature { aspect: "precision", pattern: r"^\s*main_params_dtype \.+ torch\.(\w+)\s*$", says: "$1 main params" },
    Signature { aspect: "precision", pattern: r"^\s*fp8 \.+ (e4m3|hybrid)\s*$", says: "fp8 ($1)" },
    Signature { aspect: "parallel", pattern: r"^\s*use_torch_fsdp2 \.+ True\s*$", says: "torch FSDP2" },
    Signature { aspect: "parallel", pattern: r"^\s*use_torch_fsdp2 \.+ False\s*$", says: "Megatron's own DDP wrapper (torch FSDP2 off)" },
    Signature { aspect: "parallel", pattern: r"^\s*data_parallel_size \.+ (\d+)\s*$", says: "data-parallel size $1" },
];

impl super::Adapter for Megatron {
    fn name(&self) -> &'static str {
        NAME
    }

    fn unexpressible(&self, cell: &Cell) -> Option<String> {
        let cfg = match super::llama_preset(cell, "Megatron-Core") {
            Ok(c) => c,
            Err(e) => return Some(e),
        };
        if cell.features().contains("compile") {
            return Some(
                "Megatron-Core has no torch.compile of the model (its speed comes from fused kernels, which the local layer spec leaves out); run it without `compile`"
                    .into(),
            );
        }
        if let Some(why) = super::common_checks(cell, "Megatron-Core", &["sac"]) {
            return Some(why);
        }
        match cell.dtype().name() {
            "bf16" | "fp32" => {}
            "fp8" => {
                return Some(
                    "fp8 in Megatron-Core runs through Transformer Engine layers; the adapter builds the local layer spec, which has none"
                        .into(),
                )
            }
            other => return Some(format!("dtype `{other}` is not bf16 or fp32")),
        }
        if cell.features().contains("sac") && cell.params.sac_every != 1 {
            return Some(format!(
                "Megatron's full recompute checkpoints every layer (`--recompute-method uniform --recompute-num-layers 1`); sac_every {} has no Megatron equivalent",
                cell.params.sac_every
            ));
        }
        let (tp, pp) = (super::degree(cell, "tp"), super::degree(cell, "pp"));
        if cfg.heads % i64::from(tp) != 0 || cfg.kv_heads % i64::from(tp) != 0 {
            return Some(format!(
                "tp {tp} does not divide the {} heads and {} key/value heads",
                cfg.heads, cfg.kv_heads
            ));
        }
        if cfg.layers % i64::from(pp) != 0 {
            return Some(format!("pp {pp} does not divide the {} layers", cfg.layers));
        }
        if cfg.vocab % i64::from(tp) != 0 {
            return Some(format!(
                "tp {tp} does not divide the vocabulary of {}: Megatron would pad it, and the model would not be the preset",
                cfg.vocab
            ));
        }
        None
    }

    fn prepare(&self, cell: &Cell, opts: &FrameworkOpts, files: &AttemptFiles) -> Prepared {
        let p = &cell.params;
        let cfg = super::llama_preset(cell, NAME).unwrap_or_else(|_| {
            crate::workload::models::presets::get("llama-tiny").expect("built-in preset")
        });
        let (tp, pp) = (super::degree(cell, "tp"), super::degree(cell, "pp"));
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
        // Megatron initialises torch.distributed even for one rank; torchrun sets its
        // variables and prefixes every rank's lines.
        let mut argv = super::torchrun(&files.python, cell.gpus());
        argv.push(
            files
                .scripts
                .join("megatron_train.py")
                .display()
                .to_string(),
        );
        argv.extend(["--config".into(), "{config}".into()]);
        let mut env = vec![];
        if let Some(src) = &opts.source {
            env.push(("BENCH_MEGATRON_SOURCE".to_string(), src.clone()));
        }
        Prepared {
            config_ext: "json",
            config_text: serde_json::to_string_pretty(&config).unwrap_or_default() + "\n",
            argv,
            env,
            files: vec![],
        }
    }

    fn signatures(&self) -> &'static [Signature] {
        SIGNATURES
    }

    fn parser(&self, cell: &Cell) -> Box<dyn LogParser> {
        Box::new(MegatronLog {
            steps_expected: cell.params.steps,
            global_batch: cell.params.global_batch,
            tokens_per_sample: cell.params.seq_len,
            gpus: cell.gpus(),
            ..MegatronLog::default()
        })
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
pub(crate) struct MegatronLog {
    steps_expected: u32,
    global_batch: u32,
    tokens_per_sample: u32,
    gpus: u32,
    info: Option<DriverInfo>,
    order: StepOrder,
    mem: std::collections::BTreeMap<u32, u64>,
}

impl LogParser for MegatronLog {
    fn device(&self) -> Option<&str> {
        self.info.as_ref().map(|i| i.device.as_str())
    }

    fn line(&mut self, line_no: usize, raw: &str) -> Result<Vec<LoggedStep>, ParseError> {
        let (rank, text) = log::split_rank(raw);
        let bad = |msg: String| ParseError::new(NAME, line_no, raw, msg);
        if let Some(info) = log::driver_info(NAME, line_no, &text) {
            self.info = Some(info?);
            return Ok(vec![]);
        }
        if let Some(c) = MEMORY.captures(&text) {
            let r: u32 = c[1].parse().map_err(|_| bad("rank out of range".into()))?;
            let mb = log::number(&c[2]).ok_or_else(|| bad("unreadable max reserved".into()))?;
            let e = self.mem.entry(r).or_default();
            *e = (*e).max((mb * 1024.0 * 1024.0).round() as u64);
            return Ok(vec![]);
        }
        let Some(line) = TrainingLogLine::read(&text) else {
            return Ok(vec![]);
        };
        let line = line.map_err(bad)?;
        let step: u64 = line
            .step
            .parse()
            .map_err(|_| bad("iteration number out of range".into()))?;
        let total: u64 = line
            .of
            .parse()
            .map_err(|_| bad("iteration count out of range".into()))?;
        if total != u64::from(self.steps_expected) {
            return Err(bad(format!(
                "Megatron says it trains {total} iterations, the cell asked for {}: the flags did not take",
                self.steps_expected
            )));
        }
        let batch: u32 = line
            .get("global batch size")
            .and_then(|b| b.parse().ok())
            .ok_or_else(|| bad("a step line without a readable `global batch size`".into()))?;
        if batch != self.global_batch {
            return Err(bad(format!(
                "Megatron ran a global batch of {batch}; the cell asks for {}",
                self.global_batch
            )));
        }
        self.order.check(rank, step).map_err(bad)?;
        let ms = line
            .get(ELAPSED)
            .and_then(log::number)
            .filter(|t| t.is_finite() && *t > 0.0)
            .ok_or_else(|| bad("elapsed time per iteration is not a positive number".into()))?;
        let loss = match line.get("lm loss") {
            Some(l) => log::number(l).ok_or_else(|| bad("unreadable lm loss".into()))?,
            // Megatron leaves out a loss that averaged to below zero, and a NaN iteration
            // has none: either way this step has no loss to believe.
            None => f64::NAN,
        };
        let step_time_s = ms / 1000.0;
        let tflops = match line.get("throughput per GPU (TFLOP/s/GPU)") {
            Some(t) => Some(log::number(t).ok_or_else(|| bad("unreadable throughput".into()))?),
            None => None,
        };
        let tokens = f64::from(self.global_batch) * f64::from(self.tokens_per_sample);
        Ok(vec![LoggedStep {
            step,
            step_time_s,
            loss,
            tokens_per_s_per_gpu: Some(tokens / step_time_s / f64::from(self.gpus.max(1))),
            tflops_per_gpu: tflops,
            mfu: None,
        }])
    }

    fn finish(&mut self, exited_ok: bool) -> Result<(Vec<LoggedStep>, LogEnd), ParseError> {
        let info = log::check_complete(
            NAME,
            &self.info,
            self.order.last_step(),
            self.steps_expected,
            exited_ok,
        )?;
        Ok((
            vec![],
            LogEnd {
                info,
                peak_mem_bytes: self.mem.values().copied().collect(),
                run_tokens_per_s_per_gpu: None,
                method: "Megatron training_log (log_interval 1): elapsed time per iteration from its interval timer (barrier at each log), TFLOP/s/GPU from its num_floating_point_operations (causal attention counted at half); tokens/s per GPU is global batch x seq over that time; medians over the measured steps".into(),
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::external::Adapter;

    fn cell(gpus: i64, parallel: &str, feats: &[&str]) -> Cell {
        let mut c = crate::external::tests::cell("llama-tiny", "bf16", gpus, parallel, feats);
        c.params.workload = crate::cell::Workload::framework(NAME);
        c.params.steps = 6;
        c.params.warmup = 2;
        c.params.seq_len = 64;
        c
    }

    #[test]
    fn mapping_and_drops() {
        let c = cell(2, "fsdp", &["sac"]);
        assert_eq!(Megatron.unexpressible(&c), None);
        let files = AttemptFiles {
            dir: "/r/x".into(),
            scripts: "/s".into(),
            python: "py".into(),
        };
        let p = Megatron.prepare(&c, &FrameworkOpts::default(), &files);
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
        assert!(Megatron
            .unexpressible(&compiled)
            .unwrap()
            .contains("torch.compile"));
        let mut fp8 = cell(1, "single", &[]);
        fp8.values
            .insert("dtype".into(), crate::cell::Value::Str("fp8".into()));
        assert!(Megatron
            .unexpressible(&fp8)
            .unwrap()
            .contains("Transformer Engine"));
        let mut tp3 = cell(3, "ddp", &[]);
        tp3.values.insert("tp".into(), crate::cell::Value::Int(3));
        tp3.params.global_batch = 2;
        assert!(Megatron.unexpressible(&tp3).unwrap().contains("tp 3"));
        let mut pp2 = cell(2, "ddp", &[]);
        pp2.values.insert("pp".into(), crate::cell::Value::Int(2));
        pp2.params.global_batch = 2;
        assert_eq!(Megatron.unexpressible(&pp2), None);
    }

    fn fixture() -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/frameworks/megatron-core-0.20.0-2rank-from-source.log");
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    fn parser() -> MegatronLog {
        MegatronLog {
            steps_expected: 6,
            global_batch: 4,
            tokens_per_sample: 2048,
            gpus: 2,
            ..MegatronLog::default()
        }
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
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/frameworks/megatron-core-0.19.0-h200x2-fsdp2.log");
        let text = std::fs::read_to_string(&p).unwrap();
        let mut parser = MegatronLog {
            steps_expected: 12,
            global_batch: 8,
            tokens_per_sample: 2048,
            gpus: 2,
            ..MegatronLog::default()
        };
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
        let e = log::read_all(&mut parser(), &text[..line_start], true).unwrap_err();
        assert!(e.message.contains("ends after step 5 of 6"), "{e}");
        // A garbled time field.
        let e = log::read_all(
            &mut parser(),
            &text.replace("(ms): 250.4 |", "(ms): fast |"),
            true,
        )
        .unwrap_err();
        assert!(e.message.contains("positive number"), "{e}");
        // A line cut after its elapsed time (`250.4` read as `25`) is not a shorter step.
        let line = text.lines().find(|l| l.contains("(ms): 250.4 |")).unwrap();
        let cut = &line[..line.find("250.4").unwrap() + 2];
        let e = log::read_all(&mut parser(), &text.replace(line, cut), true).unwrap_err();
        assert!(e.message.contains("the line is cut"), "{e}");
        // Two ranks' lines mixed without prefixes: an iteration repeats.
        let doubled = text.replace("[rank1]:", "").replacen(
            " [2026-11-24 10:00:02",
            " iteration        1/       6 | elapsed time per iteration (ms): 250.1 | global batch size:     4 | lm loss: 6.900000E+00 |\n [2026-11-24 10:00:02",
            1,
        );
        let e = log::read_all(&mut parser(), &doubled, true).unwrap_err();
        assert!(e.message.contains("mixed"), "{e}");
        // Flags that did not take.
        let mut other = parser();
        other.steps_expected = 8;
        let e = log::read_all(&mut other, &text, true).unwrap_err();
        assert!(e.message.contains("asked for 8"), "{e}");
        let mut other = parser();
        other.global_batch = 8;
        let e = log::read_all(&mut other, &text, true).unwrap_err();
        assert!(e.message.contains("asks for 8"), "{e}");
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
