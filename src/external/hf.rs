//! The Hugging Face Trainer adapter: bench's axes to `TrainingArguments` and a
//! `LlamaConfig` of the cell's preset, written as one JSON file that
//! `scripts/frameworks/hf_train.py` reads; the Trainer trains on synthetic tokens.
//!
//! The Trainer prints its logs (`{'loss': ..}` per step with `logging_steps=1`, and the
//! end-of-run `{'train_runtime': .., 'train_samples_per_second': ..}`), but no step time:
//! the driver's `TrainerCallback` prints `[bench-hf] step: N time: T tokens: K memory: B`
//! at every optimizer step (end-to-end time between step ends, after a device
//! synchronisation). Each step line must be followed by its loss line.

use std::sync::LazyLock;

use regex::Regex;

use super::adapter::Config;
use super::launch::AttemptFiles;
use super::log::{
    self, DriverFigures, DriverInfo, Line, LogParser, LoggedStep, ParseError, Progress, StepLines,
};
use crate::cell::Cell;
use crate::cell::FrameworkOpts;
use crate::workload::models::presets::ModelConfig;

pub(crate) struct Hf;

pub(crate) const NAME: &str = "hf";

/// transformers' `LlamaConfig` of a preset for sequences of `seq_len`, as the HF and
/// DeepSpeed drivers build `LlamaForCausalLM` from it.
pub(crate) fn llama_config(cfg: &ModelConfig, seq_len: u32) -> serde_json::Value {
    serde_json::json!({
        "hidden_size": cfg.hidden,
        "intermediate_size": cfg.ffn,
        "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.kv_heads,
        "vocab_size": cfg.vocab,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.norm_eps,
        "max_position_embeddings": seq_len.max(2048),
        "tie_word_embeddings": cfg.tied_embeddings,
        "attention_bias": false,
    })
}

impl super::adapter::Adapter for Hf {
    fn config(&self, cell: &Cell, _: &FrameworkOpts, files: &AttemptFiles) -> Config {
        let p = &cell.params;
        let cfg = super::mapping::mapped_llama(cell);
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
            "model": llama_config(&cfg, p.seq_len),
            "training_args": args,
        });
        Config::json(&config)
    }

    fn parser(&self, cell: &Cell) -> Box<dyn LogParser> {
        log::reader(cell, HfLog::default())
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

/// The Trainer's own lines and the driver's step lines, as `bench adapt` reads them.
#[derive(Default)]
pub(crate) struct HfLog {
    /// A step line waiting for its loss line.
    pending: Option<(usize, LoggedStep)>,
    samples_per_s: Option<f64>,
}

impl StepLines for HfLog {
    const NAME: &'static str = NAME;
    const METHOD: &'static str = "HF Trainer: step times from the driver's TrainerCallback (device-synchronised, between step ends); the Trainer's own figure is train_samples_per_second x seq_len over the whole run, warm-up included";

    fn line(&mut self, log: &mut Progress, line: &Line<'_>) -> Result<Vec<LoggedStep>, ParseError> {
        let text = line.text.as_str();
        if text.starts_with("[bench-hf] step:") {
            let c = STEP.captures(text).ok_or_else(|| {
                line.bad("a step line that does not read as `[bench-hf] step: N time: T tokens: K memory: B`")
            })?;
            let step: u64 = line.int(&c[1], "step number")?;
            if let Some((at, p)) = &self.pending {
                return Err(line.bad(format!(
                    "step {step} comes before the loss line of step {} (line {at}): the Trainer's log lines are missing or mixed",
                    p.step
                )));
            }
            let printed = DriverFigures {
                time: &c[2],
                tokens: &c[3],
                memory: &c[4],
            };
            let time = log.driver_step(line, step, printed, "the Trainer")?;
            self.pending = Some((
                line.no,
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
            let c = SAMPLES_PER_S.captures(text).ok_or_else(|| {
                line.bad("the Trainer's end-of-run line has no train_samples_per_second")
            })?;
            self.samples_per_s = log::number(&c[1]);
            return Ok(vec![]);
        }
        if text.starts_with('{') && text.contains("'loss'") {
            let c = LOSS
                .captures(text)
                .ok_or_else(|| line.bad("a loss line whose loss does not read"))?;
            let loss = line.number(&c[1], "loss")?;
            let Some((_, mut step)) = self.pending.take() else {
                return Err(line.bad(
                    "a loss line with no step line before it: the driver's step lines are missing or mixed",
                ));
            };
            step.loss = loss;
            return Ok(vec![step]);
        }
        Ok(vec![])
    }

    fn complete(&self, log: &Progress, exited_ok: bool) -> Result<u64, ParseError> {
        if let (true, Some((at, p))) = (exited_ok, &self.pending) {
            return Err(ParseError::new(
                NAME,
                *at,
                "",
                format!("step {} has no loss line (truncated log)", p.step),
            ));
        }
        // A step whose loss line never came is not complete: the last complete step is the
        // one before it.
        let last = log.order.last_step();
        Ok(if self.pending.is_some() {
            last.saturating_sub(1)
        } else {
            last
        })
    }

    fn end(&self, log: &Progress, info: &DriverInfo) -> Result<Option<f64>, ParseError> {
        let world = f64::from(info.world_size.max(1));
        Ok(self
            .samples_per_s
            .map(|s| s * f64::from(log.asked.seq_len) / world))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::external::declared::HF as FRAMEWORK;
    use crate::external::log::checks::{Captured, Case, Edit::*, Fixture, Then::*};
    use crate::external::log::Asked;
    use crate::external::tests::{config_json, refuses_cell};

    /// A real run on a CPU: 6 steps of 2 sequences of 64 tokens on one rank.
    const CPU: Fixture<HfLog> = Fixture {
        file: "hf-4.57.1-cpu-llama-tiny.log",
        asked: Asked {
            steps: 6,
            global_batch: 2,
            seq_len: 64,
            gpus: 1,
        },
        lines: HfLog::default,
    };

    #[test]
    fn mapping_and_drops() {
        let mut c = crate::external::tests::framework_cell(
            NAME,
            "llama-tiny",
            "bf16",
            1,
            "single",
            &["sac"],
        );
        let (p, v) = config_json(&FRAMEWORK, &c);
        assert_eq!(v["training_args"]["gradient_checkpointing"], true);
        assert_eq!(v["model"]["num_key_value_heads"], 2);
        assert_eq!(p.argv, vec!["py", "/s/hf_train.py", "--config", "{config}"]);
        c.params.sac_every = 2;
        refuses_cell(&FRAMEWORK, &c, "sac_every 2");
        let fp8 = crate::external::tests::cell("llama-tiny", "fp8", 1, "single", &[]);
        refuses_cell(&FRAMEWORK, &fp8, "fp8");
    }

    #[test]
    fn captured_cpu_log() {
        CPU.reads_as(&Captured {
            steps: 6,
            // The Trainer prints its throughput once, for the whole run.
            own_tokens_from: None,
            read: &[LoggedStep {
                step: 6,
                step_time_s: 0.297864,
                loss: 6.1523,
                tokens_per_s_per_gpu: None,
                tflops_per_gpu: None,
                mfu: None,
            }],
            name: "transformers",
            version: "4.57.1",
            device: "cpu",
            world_size: 1,
            // Memory -1 on a CPU is not a figure.
            peak_mem_bytes: &[],
            // train_samples_per_second 1.337 x 64 tokens.
            run_tokens_per_s_per_gpu: Some(1.337 * 64.0),
        });
    }

    #[test]
    fn truncated_malformed_and_mixed_logs_are_refused() {
        CPU.check(&[
            // Cut before the last loss line: step 6 never got its loss.
            Case {
                edit: CutBefore("{'loss': 6.1523,"),
                then: Refused("step 6 has no loss line"),
            },
            Case {
                edit: Replace {
                    from: "time: 0.297864",
                    to: "time: abc",
                },
                then: RefusedAt {
                    says: "does not read as",
                    line: "time: abc",
                },
            },
            // Two ranks' step lines without prefixes: a step line before the previous loss.
            Case {
                edit: Double("[bench-hf] step: 2 "),
                then: Refused("before the loss line of step 2"),
            },
            Case {
                edit: GlobalBatch(4),
                then: Refused("asks for 256"),
            },
        ]);
    }
}
