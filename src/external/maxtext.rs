//! The MaxText adapter (JAX): bench's axes to MaxText config keys (its `base.yml` with
//! `key=value` overrides), run by `scripts/frameworks/maxtext_train.py` as one JAX process
//! for the host's GPUs, on MaxText's synthetic data; its `completed step: N, seconds: X,
//! TFLOP/s/device: Y, Tokens/s/device: Z, total_weights: W, loss: L, ...` lines read back.
//!
//! The model is the cell's Llama preset as MaxText's `llama2` decoder block (the Llama 3
//! shapes: grouped-query attention, SwiGLU, RoPE at the preset's theta, untied output).
//! MaxText counts steps from 0. Its `seconds` (`perf/step_time_seconds`) is the time
//! between consecutive step *dispatches*: JAX runs the step asynchronously, so one step can
//! show 0.011 s for work that takes 0.16 s (seen on an H100, where bench's physical bounds
//! refused it). The line itself is printed when the step's metrics are read back, which
//! waits for the step to finish on the device (its metric_logger keeps one step buffered),
//! so bench's step time is the interval between consecutive step lines' absl timestamps
//! (`I1125 16:30:43.196700 ...`, microseconds): time between step ends, as for the other
//! frameworks. The first step, which has no line before it, keeps MaxText's `seconds`; a
//! log without absl timestamps keeps `seconds` throughout.

use std::sync::LazyLock;

use regex::Regex;

use super::adapter::Config;
use super::launch::AttemptFiles;
use super::log::{self, Line, LogParser, LoggedStep, ParseError, Progress, StepLines};
use crate::cell::Cell;
use crate::cell::FrameworkOpts;

pub(crate) struct MaxText;

pub(crate) const NAME: &str = "maxtext";

impl super::adapter::Adapter for MaxText {
    fn config(&self, cell: &Cell, opts: &FrameworkOpts, files: &AttemptFiles) -> Config {
        let p = &cell.params;
        let cfg = super::mapping::mapped_llama(cell);
        let (tp, data, fsdp) = super::mapping::parallel_degrees(cell);
        // MaxText's global batch is per_device_batch_size x every device (tensor-parallel ones
        // included) x gradient accumulation; bench's is data-parallel ranks x micro batch x
        // accumulation, so a tensor-parallel group shares one micro batch.
        let per_device = f64::from(p.micro_batch) / f64::from(tp.max(1));
        let (dtype, quantization) = match cell.dtype().name() {
            "fp32" => ("float32", ""),
            "fp8" => ("bfloat16", "fp8"),
            _ => ("bfloat16", ""),
        };
        let remat = if cell.features().contains("sac") {
            "full"
        } else {
            // MaxText has no policy that saves everything; `minimal` saves every matmul
            // output and recomputes only the cheap elementwise ops.
            "minimal"
        };
        let overrides = serde_json::json!({
            "run_name": cell.id.as_str(),
            "base_output_directory": files.dir.join("outputs").display().to_string(),
            "dataset_type": "synthetic",
            "enable_checkpointing": false,
            "enable_goodput_recording": false,
            "enable_tensorboard": false,
            // One JAX process drives the host's devices: MaxText's jax.distributed set-up
            // (which on CPU reads a launcher's JOB_INDEX variables) has nothing to do.
            "skip_jax_distributed_system": true,
            // No persistent compilation cache (MaxText's default is ~/jax_cache): every
            // attempt compiles as the first one did, and nothing is left outside the run.
            "jax_cache_dir": "",
            "decoder_block": "llama2",
            "base_emb_dim": cfg.hidden,
            "base_num_query_heads": cfg.heads,
            "base_num_kv_heads": cfg.kv_heads,
            "base_mlp_dim": cfg.ffn,
            "base_num_decoder_layers": cfg.layers,
            "head_dim": cfg.hidden / cfg.heads,
            "vocab_size": cfg.vocab,
            "mlp_activations": ["silu", "linear"],
            "logits_via_embedding": cfg.tied_embeddings,
            "normalization_layer_epsilon": cfg.norm_eps,
            "rope_max_timescale": cfg.rope_theta as u64,
            "enable_dropout": false,
            "max_target_length": p.seq_len,
            "per_device_batch_size": per_device,
            "gradient_accumulation_steps": p.grad_accum,
            "steps": p.steps,
            "learning_rate": p.lr,
            "warmup_steps_fraction": 0.0,
            "learning_rate_final_fraction": 1.0,
            "init_weights_seed": p.seed,
            "dtype": dtype,
            "weight_dtype": "float32",
            "quantization": quantization,
            "remat_policy": remat,
            "ici_data_parallelism": data,
            "ici_fsdp_parallelism": fsdp,
            "ici_tensor_parallelism": tp,
        });
        Config::from_source(cell, opts, serde_json::json!({ "overrides": overrides }))
    }

    fn parser(&self, cell: &Cell) -> Box<dyn LogParser> {
        log::reader(cell, MaxTextLog::default())
    }
}

/// absl's line prefix: severity, month and day, wall-clock time to the microsecond.
static ABSL_STAMP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2}(?:\.\d+)?) ").expect("static regex")
});

/// The time of day, in seconds, of an absl-prefixed line; `None` without one. Intervals are
/// taken modulo a day, so a run that crosses midnight (or a month's end) reads right; a
/// step would have to last a day to be misread.
fn absl_seconds(text: &str) -> Option<f64> {
    let c = ABSL_STAMP.captures(text)?;
    let n = |i: usize| c[i].parse::<f64>().ok();
    Some((n(3)? * 60.0 + n(4)?) * 60.0 + n(5)?)
}

const DAY_S: f64 = 86_400.0;

/// MaxText's step times from its step lines, for `bench adapt` and `bench ingest` alike:
/// the interval since the previous step line's absl timestamp, or MaxText's own `seconds`
/// for the first line and for a log without timestamps (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct StepClock {
    /// The time of day of the last step line's timestamp.
    last_stamp: Option<f64>,
}

impl StepClock {
    /// The time of the step whose line is `text` (absl's prefix first), MaxText having
    /// printed `seconds` for it; `Err` for a line that cannot be timed honestly.
    pub(crate) fn step_time(&mut self, text: &str, seconds: f64) -> Result<f64, String> {
        let stamp = absl_seconds(text);
        let t = match (self.last_stamp, stamp) {
            (Some(before), Some(now)) => {
                let dt = (now - before).rem_euclid(DAY_S);
                if dt.is_nan() || dt <= 0.0 {
                    return Err(format!(
                        "this step line's timestamp is not after the previous step line's ({dt:.6} s): a repeated line, or the clock stepped back"
                    ));
                }
                dt
            }
            // Once the lines carry stamps, a step line without one would be timed by
            // MaxText's dispatch interval instead: refused rather than mixed.
            (Some(_), None) => {
                return Err(
                    "a step line without absl's timestamp after lines with one (lines mangled?)"
                        .into(),
                )
            }
            _ => seconds,
        };
        self.last_stamp = stamp;
        Ok(t)
    }
}

static STEP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"completed step: (\d+), seconds: ([^,]+), TFLOP/s/device: ([^,]+), ",
        r"Tokens/s/device: ([^,]+), total_weights: ([^,]+), loss: ([^,\s]+)"
    ))
    .expect("static regex")
});

/// MaxText's training log, as `bench adapt` reads it.
#[derive(Default)]
pub(crate) struct MaxTextLog {
    clock: StepClock,
}

impl StepLines for MaxTextLog {
    const NAME: &'static str = NAME;
    const METHOD: &'static str = "MaxText metric_logger: bench's step time is the interval between consecutive step lines' absl timestamps (each printed once its step's metrics are read back from the device); MaxText's own Tokens/s/device and TFLOP/s/device (its own FLOP count, causal attention at half) use its `seconds`, the interval between step dispatches, which JAX's asynchronous dispatch skews step by step; medians over the measured steps";

    fn line(&mut self, log: &mut Progress, line: &Line<'_>) -> Result<Vec<LoggedStep>, ParseError> {
        let text = line.text.as_str();
        if text.contains("[Rampup Batch Size Phase]") {
            return Err(line.bad(
                "MaxText ramps up its batch size, so its steps are not the cell's batch (set rampup off)",
            ));
        }
        if !text.contains("completed step:") {
            return Ok(vec![]);
        }
        let c = STEP.captures(text).ok_or_else(|| {
            line.bad("a step line that does not read as MaxText's `completed step: N, seconds: X, TFLOP/s/device: Y, Tokens/s/device: Z, total_weights: W, loss: L`")
        })?;
        // MaxText counts from 0; bench's framework steps are 1-based.
        let step = line.int::<u64>(&c[1], "step number")? + 1;
        log.in_order(line, step)?;
        let weights = line.number(&c[5], "total_weights")?;
        let asked = log.asked.tokens_per_step();
        line.agrees(weights, asked as f64, || {
            format!("MaxText trained on {weights} target tokens a step; the cell asks for {asked}")
        })?;
        let seconds = line.positive(Some(&c[2]), "seconds is not a positive number")?;
        let step_time_s = self
            .clock
            .step_time(text, seconds)
            .map_err(|m| line.bad(m))?;
        let num = |i: usize, what: &str| line.number(c[i].trim(), what);
        Ok(vec![LoggedStep {
            step,
            step_time_s,
            loss: num(6, "loss")?,
            tokens_per_s_per_gpu: Some(num(4, "Tokens/s/device")?),
            tflops_per_gpu: Some(num(3, "TFLOP/s/device")?),
            mfu: None,
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::external::declared::MAXTEXT as FRAMEWORK;
    use crate::external::log::checks::{Captured, Case, Edit::*, Fixture, Then::*};
    use crate::external::log::{Asked, Reader};
    use crate::external::tests::{asked, config_json, fixture, refuses_cell};

    /// A log built from MaxText's logging code: 6 steps (MaxText's steps 0 to 5) of 8,192
    /// tokens.
    const SOURCE: Fixture<MaxTextLog> = Fixture {
        file: "maxtext-0.2.4-from-source.log",
        asked: Asked {
            steps: 6,
            global_batch: 8,
            seq_len: 1024,
            gpus: 1,
        },
        lines: MaxTextLog::default,
    };

    fn cell(gpus: i64, parallel: &str, feats: &[&str]) -> Cell {
        crate::external::tests::tiny_cell(NAME, gpus, parallel, feats)
    }

    #[test]
    fn mapping_and_drops() {
        let c = cell(2, "fsdp", &["compile", "sac"]);
        let (p, v) = config_json(&FRAMEWORK, &c);
        let o = &v["overrides"];
        assert_eq!(o["base_num_kv_heads"], 2);
        assert_eq!(o["head_dim"], 16);
        assert_eq!(o["ici_fsdp_parallelism"], 2);
        assert_eq!(o["remat_policy"], "full");
        assert_eq!(o["dataset_type"], "synthetic");
        assert_eq!(o["per_device_batch_size"], 2.0);
        assert_eq!(o["learning_rate_final_fraction"], 1.0);
        assert_eq!(o["skip_jax_distributed_system"], true);
        assert_eq!(
            p.argv,
            vec!["py", "/s/maxtext_train.py", "--config", "{config}"]
        );
        let mut tp = cell(2, "fsdp", &["compile"]);
        tp.values.insert("tp".into(), crate::cell::Value::Int(2));
        tp.params.global_batch = 2;
        let (_, v) = config_json(&FRAMEWORK, &tp);
        assert_eq!(v["overrides"]["per_device_batch_size"], 1.0);
        assert_eq!(v["overrides"]["ici_tensor_parallelism"], 2);
        assert_eq!(v["overrides"]["ici_fsdp_parallelism"], 1);
        refuses_cell(&FRAMEWORK, &cell(1, "single", &[]), "jax.jit");
        let mut fp8 = cell(1, "single", &["compile"]);
        fp8.values
            .insert("dtype".into(), crate::cell::Value::Str("fp8".into()));
        assert_eq!(FRAMEWORK.unexpressible(&fp8), None);
        fp8.params.grad_accum = 2;
        fp8.params.global_batch = 4;
        refuses_cell(&FRAMEWORK, &fp8, "gradient accumulation");
    }

    /// Step 4 (MaxText's `completed step: 3`): its time is the interval between the lines
    /// of steps 3 and 4, not its `seconds`.
    const STEP_4: LoggedStep = LoggedStep {
        step: 4,
        step_time_s: 0.125,
        loss: 10.123,
        tokens_per_s_per_gpu: Some(32768.0),
        tflops_per_gpu: Some(250.5),
        mfu: None,
    };

    #[test]
    fn fixture_from_maxtexts_logging_code() {
        SOURCE.reads_as(&Captured {
            steps: 6,
            own_tokens_from: Some(1),
            read: &[
                // The first step keeps MaxText's own `seconds` (compile included).
                LoggedStep {
                    step: 1,
                    step_time_s: 14.321,
                    loss: 10.876,
                    tokens_per_s_per_gpu: Some(571.996),
                    tflops_per_gpu: Some(2.191),
                    mfu: None,
                },
                STEP_4,
            ],
            name: "maxtext",
            version: "0.2.4",
            device: "NVIDIA H100 80GB HBM3",
            world_size: 4,
            // MaxText logs no memory figure.
            peak_mem_bytes: &[],
            run_tokens_per_s_per_gpu: None,
        });
    }

    #[test]
    fn hostile_logs_are_refused() {
        SOURCE.check(&[
            Case {
                edit: CutBefore("completed step: 5,"),
                then: Refused("ends after step 5 of 6"),
            },
            Case {
                edit: Replace {
                    from: "seconds: 0.125,",
                    to: "seconds: 0.0,",
                },
                then: Refused("positive"),
            },
            // The line of MaxText's step 3 stamped as the one before it.
            Case {
                edit: Replace {
                    from: "10:00:01.482200",
                    to: "10:00:01.357200",
                },
                then: Refused("not after the previous"),
            },
            // The same line without its absl prefix.
            Case {
                edit: Replace {
                    from: "I1124 10:00:01.482200 140212 metric_logger.py:230] ",
                    to: "",
                },
                then: Refused("without absl's timestamp"),
            },
            // Across midnight at a month's end: 0.125 s, not minus a month.
            Case {
                edit: Each(&[
                    Replace {
                        from: "I1124 10:00:01.357200",
                        to: "I1130 23:59:59.950000",
                    },
                    Replace {
                        from: "I1124 10:00:01.482200",
                        to: "I1201 00:00:00.075000",
                    },
                ]),
                then: Reads(STEP_4),
            },
            Case {
                edit: Replace {
                    from: "total_weights: 8192,",
                    to: "total_weights: 4096,",
                },
                then: Refused("asks for 8192"),
            },
            // A second process's lines mixed in without prefixes repeat a step.
            Case {
                edit: Double("completed step: 2,"),
                then: Refused("mixed"),
            },
            Case {
                edit: Replace {
                    from: "completed step: 0,",
                    to: "[Rampup Batch Size Phase], completed step: 0,",
                },
                then: Refused("ramps up"),
            },
        ]);
    }

    /// The first step lines of a real run on an H100 (2026-11-25, MaxText 0.2.5, jax 0.11.2,
    /// the Llama 3 8B-width proxy, bf16): MaxText's `seconds` for its step 2 is 0.011 (a
    /// dispatch interval, over 6,700 TFLOP/s if taken as the step's time); the lines are
    /// 0.178 s and 0.164 s apart.
    #[test]
    fn real_h100_lines_are_timed_by_their_stamps() {
        let text = fixture("maxtext-0.2.5-h100-first-steps.log");
        let mut p = Reader::new(asked(12, 8, 1024, 1), MaxTextLog::default());
        let mut steps = vec![];
        for (i, l) in text.lines().enumerate() {
            steps.extend(p.line(i + 1, l).unwrap());
        }
        assert_eq!(steps.len(), 3);
        assert!((steps[0].step_time_s - 0.199).abs() < 1e-12);
        assert!((steps[1].step_time_s - 0.178373).abs() < 1e-9);
        assert!((steps[2].step_time_s - 0.164058).abs() < 1e-9);
        // MaxText's own figure stays what it printed.
        assert_eq!(steps[2].tokens_per_s_per_gpu, Some(733524.355));
        // The log ends after 3 of 12 steps: truncated.
        assert!(p.finish(true).is_err());
    }

    /// The whole captured H100 run, read as `bench adapt` reads it (the physical bounds
    /// included): all 12 steps are measurements, timed by their stamps (median 0.17318 s
    /// over steps 4 to 12, 47.3K tokens/s; MaxText's own median 46,978 tokens/s), and the
    /// last step's printed `loss: 0.000` is a loss a run can log.
    #[test]
    fn the_captured_h100_run_reads_as_twelve_measured_steps() {
        let text = fixture("maxtext-0.2.5-h100-12-steps.log");
        let mut c = crate::external::tests::framework_cell(
            NAME,
            "llama-3.1-8b-proxy",
            "bf16",
            1,
            "fsdp",
            &["compile", "sac"],
        );
        c.params.seq_len = 8192;
        c.params.micro_batch = 1;
        c.params.global_batch = 1;
        c.params.steps = 12;
        let steps = crate::external::run::read_log(&c, text.as_bytes(), 60.0).unwrap();
        assert_eq!(steps.len(), 12);
        let mut measured: Vec<f64> = steps[3..].iter().map(|s| s.1).collect();
        measured.sort_by(f64::total_cmp);
        assert!((measured[4] - 0.173183).abs() < 1e-6, "{measured:?}");
        assert_eq!(steps[11].2, 0.0);
    }
}
