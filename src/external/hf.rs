//! The Hugging Face Trainer adapter: bench's axes to `TrainingArguments` and a
//! `LlamaConfig` of the cell's preset, written as one JSON file that
//! `scripts/frameworks/hf_train.py` reads; the Trainer trains on synthetic tokens.
//!
//! The Trainer prints its logs (`{'loss': ..}` per step with `logging_steps=1`, and the
//! end-of-run `{'train_runtime': .., 'train_samples_per_second': ..}`), but no step time:
//! the driver's `TrainerCallback` prints `[bench-hf] step: N time: T tokens: K memory: B`
//! at every optimizer step (end-to-end time between step ends, after a device
//! synchronisation). Each step line must be followed by its loss line.

use super::ran::Signature;
use std::sync::LazyLock;

use regex::Regex;

use super::log::{self, DriverInfo, LogEnd, LogParser, LoggedStep, ParseError, StepOrder};
use super::{AttemptFiles, FrameworkOpts, Prepared};
use crate::cell::Cell;

pub(crate) struct Hf;

const NAME: &str = "hf";

/// The Trainer logs little of what it runs; its driver prints the record (`super::ran`)
/// from the Trainer's resolved arguments and model.
const SIGNATURES: &[Signature] = &[];

impl super::Adapter for Hf {
    fn name(&self) -> &'static str {
        NAME
    }

    fn unexpressible(&self, cell: &Cell) -> Option<String> {
        if let Err(e) = super::llama_preset(cell, "the HF Trainer") {
            return Some(e);
        }
        if let Some(why) = super::common_checks(cell, "the HF Trainer", &["compile", "sac"]) {
            return Some(why);
        }
        match cell.dtype().name() {
            "bf16" | "fp32" => {}
            "fp8" => {
                return Some(
                    "the HF Trainer has no fp8 training of its own (accelerate's FP8 needs Transformer Engine or torchao recipes the adapter does not map)"
                        .into(),
                )
            }
            other => return Some(format!("dtype `{other}` is not bf16 or fp32")),
        }
        if cell.features().contains("sac") && cell.params.sac_every != 1 {
            return Some(format!(
                "the Trainer's gradient checkpointing covers every block; sac_every {} has no Trainer equivalent",
                cell.params.sac_every
            ));
        }
        if super::degree(cell, "tp") > 1 || super::degree(cell, "pp") > 1 {
            return Some("the HF Trainer has no tensor or pipeline parallelism".into());
        }
        None
    }

    fn prepare(&self, cell: &Cell, opts: &FrameworkOpts, files: &AttemptFiles) -> Prepared {
        let p = &cell.params;
        let cfg = super::llama_preset(cell, NAME).unwrap_or_else(|_| {
            crate::workload::models::presets::get("llama-tiny").expect("built-in preset")
        });
        let features = cell.features();
        let fsdp = cell.parallel().name() == "fsdp" && cell.gpus() > 1;
        let sac = features.contains("sac");
        let mut args = serde_json::json!({
            "output_dir": files.dir.join("outputs").display().to_string(),
            "per_device_train_batch_size": p.micro_batch,
            "gradient_accumulation_steps": p.grad_accum,
            "max_steps": p.steps,
            "learning_rate": p.lr,
            "warmup_steps": 0,
            "lr_scheduler_type": "constant",
            "weight_decay": 0.0,
            "logging_steps": 1,
            "save_strategy": "no",
            "report_to": [],
            "bf16": cell.dtype().name() == "bf16",
            "torch_compile": features.contains("compile"),
            // Under FSDP, checkpointing goes through FSDP's own wrapper (the Trainer refuses
            // both at once).
            "gradient_checkpointing": sac && !fsdp,
            "seed": p.seed,
            "data_seed": p.seed,
            "disable_tqdm": true,
            "dataloader_num_workers": 0,
        });
        if fsdp {
            args["fsdp"] = "full_shard auto_wrap".into();
            args["fsdp_config"] = serde_json::json!({
                "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
                "activation_checkpointing": sac,
            });
        }
        let config = serde_json::json!({
            "cell": cell.id.as_str(),
            "seq_len": p.seq_len,
            "model": {
                "hidden_size": cfg.hidden,
                "intermediate_size": cfg.ffn,
                "num_hidden_layers": cfg.layers,
                "num_attention_heads": cfg.heads,
                "num_key_value_heads": cfg.kv_heads,
                "vocab_size": cfg.vocab,
                "rope_theta": cfg.rope_theta,
                "rms_norm_eps": cfg.norm_eps,
                "max_position_embeddings": p.seq_len.max(2048),
                "tie_word_embeddings": cfg.tied_embeddings,
                "attention_bias": false,
            },
            "training_args": args,
        });
        let driver = files.scripts.join("hf_train.py").display().to_string();
        let mut argv = if cell.gpus() > 1 {
            super::torchrun(&files.python, cell.gpus())
        } else {
            vec![files.python.clone()]
        };
        argv.extend([driver, "--config".into(), "{config}".into()]);
        argv.extend(opts.args.iter().cloned());
        Prepared {
            config_ext: "json",
            config_text: serde_json::to_string_pretty(&config).unwrap_or_default() + "\n",
            argv,
            env: vec![],
            files: vec![],
        }
    }

    fn signatures(&self) -> &'static [Signature] {
        SIGNATURES
    }

    fn parser(&self, cell: &Cell) -> Box<dyn LogParser> {
        Box::new(HfLog {
            steps_expected: cell.params.steps,
            tokens_per_step: u64::from(cell.params.global_batch) * u64::from(cell.params.seq_len),
            seq_len: cell.params.seq_len,
            ..HfLog::default()
        })
    }
}

static STEP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\[bench-hf\] step: (\d+) time: ([0-9.eE+-]+) tokens: (\d+) memory: (-?\d+)\s*$")
        .expect("static regex")
});
static LOSS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"'loss':\s*'?([^,'}\s]+)'?").expect("static regex"));
static SAMPLES_PER_S: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"'train_samples_per_second':\s*'?([0-9.eE+-]+)'?").expect("static regex")
});

/// The Trainer's log with the driver's step lines, as `bench adapt` reads it.
#[derive(Default)]
pub(crate) struct HfLog {
    steps_expected: u32,
    tokens_per_step: u64,
    seq_len: u32,
    info: Option<DriverInfo>,
    order: StepOrder,
    /// A step line waiting for its loss line.
    pending: Option<(usize, LoggedStep)>,
    peak_mem: Option<u64>,
    samples_per_s: Option<f64>,
}

impl LogParser for HfLog {
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
        if text.starts_with("[bench-hf] step:") {
            let c = STEP.captures(&text).ok_or_else(|| {
                bad("a step line that does not read as `[bench-hf] step: N time: T tokens: K memory: B`".into())
            })?;
            let step: u64 = c[1]
                .parse()
                .map_err(|_| bad("step number out of range".into()))?;
            if let Some((at, p)) = &self.pending {
                return Err(bad(format!(
                    "step {step} comes before the loss line of step {} (line {at}): the Trainer's log lines are missing or mixed",
                    p.step
                )));
            }
            self.order.check(rank, step).map_err(bad)?;
            let tokens: u64 = c[3]
                .parse()
                .map_err(|_| bad("token count out of range".into()))?;
            if tokens != self.tokens_per_step {
                return Err(bad(format!(
                    "the Trainer ran {tokens} tokens a step; the cell asks for {}",
                    self.tokens_per_step
                )));
            }
            let time = log::number(&c[2])
                .filter(|t| t.is_finite() && *t > 0.0)
                .ok_or_else(|| bad("step time is not a positive number".into()))?;
            if let Ok(m) = c[4].parse::<u64>() {
                self.peak_mem = Some(self.peak_mem.unwrap_or(0).max(m));
            }
            self.pending = Some((
                line_no,
                LoggedStep {
                    step,
                    step_time_s: time,
                    loss: f64::NAN,
                    tokens_per_s_per_gpu: None,
                    tflops_per_gpu: None,
                    mfu: None,
                },
            ));
            return Ok(vec![]);
        }
        if text.starts_with('{') && text.contains("'train_runtime'") {
            let c = SAMPLES_PER_S.captures(&text).ok_or_else(|| {
                bad("the Trainer's end-of-run line has no train_samples_per_second".into())
            })?;
            self.samples_per_s = log::number(&c[1]);
            return Ok(vec![]);
        }
        if text.starts_with('{') && text.contains("'loss'") {
            let c = LOSS
                .captures(&text)
                .ok_or_else(|| bad("a loss line whose loss does not read".into()))?;
            let loss = log::number(&c[1]).ok_or_else(|| bad("unreadable loss".into()))?;
            let Some((_, mut step)) = self.pending.take() else {
                return Err(bad(
                    "a loss line with no step line before it: the driver's step lines are missing or mixed"
                        .into(),
                ));
            };
            step.loss = loss;
            return Ok(vec![step]);
        }
        Ok(vec![])
    }

    fn finish(&mut self, exited_ok: bool) -> Result<(Vec<LoggedStep>, LogEnd), ParseError> {
        if exited_ok {
            if let Some((at, p)) = &self.pending {
                return Err(ParseError::new(
                    NAME,
                    *at,
                    "",
                    format!("step {} has no loss line (truncated log)", p.step),
                ));
            }
        }
        let last = self.order.last_step();
        // A step whose loss line never came is not complete: the last complete step is the
        // one before it.
        let complete = if self.pending.is_some() {
            last.saturating_sub(1)
        } else {
            last
        };
        let info = log::check_complete(NAME, &self.info, complete, self.steps_expected, exited_ok)?;
        let world = f64::from(info.world_size.max(1));
        Ok((
            vec![],
            LogEnd {
                run_tokens_per_s_per_gpu: self
                    .samples_per_s
                    .map(|s| s * f64::from(self.seq_len) / world),
                peak_mem_bytes: self.peak_mem.into_iter().collect(),
                info,
                method: "HF Trainer: step times from the driver's TrainerCallback (device-synchronised, between step ends); the Trainer's own figure is train_samples_per_second x seq_len over the whole run, warm-up included".into(),
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::external::Adapter;

    #[test]
    fn mapping_and_drops() {
        let mut c = crate::external::tests::cell("llama-tiny", "bf16", 1, "single", &["sac"]);
        c.params.workload = crate::cell::Workload::framework("hf");
        assert_eq!(Hf.unexpressible(&c), None);
        let files = AttemptFiles {
            dir: "/r/x".into(),
            scripts: "/s".into(),
            python: "py".into(),
        };
        let p = Hf.prepare(&c, &FrameworkOpts::default(), &files);
        let v: serde_json::Value = serde_json::from_str(&p.config_text).unwrap();
        assert_eq!(v["training_args"]["gradient_checkpointing"], true);
        assert_eq!(v["model"]["num_key_value_heads"], 2);
        assert_eq!(p.argv, vec!["py", "/s/hf_train.py", "--config", "{config}"]);
        c.params.sac_every = 2;
        assert!(Hf.unexpressible(&c).unwrap().contains("sac_every 2"));
        let fp8 = crate::external::tests::cell("llama-tiny", "fp8", 1, "single", &[]);
        assert!(Hf.unexpressible(&fp8).unwrap().contains("fp8"));
    }

    fn fixture() -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/frameworks/hf-4.57.1-cpu-llama-tiny.log");
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    fn parser() -> HfLog {
        HfLog {
            steps_expected: 6,
            tokens_per_step: 128,
            seq_len: 64,
            ..HfLog::default()
        }
    }

    #[test]
    fn captured_cpu_log() {
        let (steps, end) = log::read_all(&mut parser(), &fixture(), true).unwrap();
        assert_eq!(steps.len(), 6);
        assert_eq!(steps[5].step, 6);
        assert!((steps[5].step_time_s - 0.297864).abs() < 1e-12);
        assert!((steps[5].loss - 6.1523).abs() < 1e-12);
        assert!((end.run_tokens_per_s_per_gpu.unwrap() - 1.337 * 64.0).abs() < 1e-9);
        assert!(
            end.peak_mem_bytes.is_empty(),
            "memory -1 on CPU is not a figure"
        );
        assert_eq!(end.info.name, "transformers");
        assert_eq!(end.info.version, "4.57.1");
    }

    #[test]
    fn truncated_malformed_and_mixed_logs_are_refused() {
        let text = fixture();
        // Cut before the last loss line: step 6 never got its loss.
        let cut = text.rfind("{'loss'").unwrap();
        let e = log::read_all(&mut parser(), &text[..cut], true).unwrap_err();
        assert!(e.message.contains("step 6 has no loss line"), "{e}");
        let e = log::read_all(
            &mut parser(),
            &text.replace("time: 0.297864", "time: abc"),
            true,
        )
        .unwrap_err();
        assert!(e.line.contains("time: abc"), "{e}");
        // Two ranks' step lines without prefixes: a step line before the previous loss.
        let doubled = text.replacen(
            "[bench-hf] step: 2 time: 1.979535 tokens: 128 memory: -1",
            "[bench-hf] step: 2 time: 1.979535 tokens: 128 memory: -1\n[bench-hf] step: 2 time: 1.979535 tokens: 128 memory: -1",
            1,
        );
        let e = log::read_all(&mut parser(), &doubled, true).unwrap_err();
        assert!(e.message.contains("before the loss line of step 2"), "{e}");
        let mut other_batch = parser();
        other_batch.tokens_per_step = 256;
        let e = log::read_all(&mut other_batch, &text, true).unwrap_err();
        assert!(e.message.contains("asks for 256"), "{e}");
    }
}
