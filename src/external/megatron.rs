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
        Config::from_source(cell, opts, serde_json::json!({ "argv": argv(cell, opts) }))
    }

    fn parser(&self, cell: &Cell) -> Box<dyn LogParser> {
        log::reader(cell, MegatronLog)
    }
}

/// `pretrain_gpt.py`'s flags for `cell` (model, batch, schedule, precision, recompute and
/// parallelism), then the matrix's own `args`.
fn argv(cell: &Cell, opts: &FrameworkOpts) -> Vec<String> {
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
    flags
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
    use crate::external::log::checks::{Captured, Case, Edit::*, Fixture, Then::*};
    use crate::external::log::Asked;
    use crate::external::tests::{config_json, refuses_cell};

    /// A log built from Megatron-LM's logging code: 6 iterations of 4 sequences of 2,048
    /// tokens on 2 GPUs.
    const SOURCE: Fixture<MegatronLog> = Fixture {
        file: "megatron-core-0.20.0-2rank-from-source.log",
        asked: Asked {
            steps: 6,
            global_batch: 4,
            seq_len: 2048,
            gpus: 2,
        },
        lines: MegatronLog::default,
    };

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
        let (p, v) = config_json(&FRAMEWORK, &c);
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
        refuses_cell(&FRAMEWORK, &compiled, "torch.compile");
        let mut fp8 = cell(1, "single", &[]);
        fp8.values
            .insert("dtype".into(), crate::cell::Value::Str("fp8".into()));
        refuses_cell(&FRAMEWORK, &fp8, "Transformer Engine");
        let mut tp3 = cell(3, "ddp", &[]);
        tp3.values.insert("tp".into(), crate::cell::Value::Int(3));
        tp3.params.global_batch = 2;
        refuses_cell(&FRAMEWORK, &tp3, "tp 3");
        let mut pp2 = cell(2, "ddp", &[]);
        pp2.values.insert("pp".into(), crate::cell::Value::Int(2));
        pp2.params.global_batch = 2;
        assert_eq!(FRAMEWORK.unexpressible(&pp2), None);
    }

    /// Iteration 3 as Megatron printed it (`elapsed time per iteration (ms): 250.4 |
    /// throughput per GPU (TFLOP/s/GPU): 137.6 | ... | lm loss: 6.234567E+00`), in bench's
    /// units.
    const STEP_3: LoggedStep = LoggedStep {
        step: 3,
        step_time_s: 250.4 / 1000.0,
        loss: 6.234567,
        // 4 x 2048 tokens in 250.4 ms on 2 GPUs.
        tokens_per_s_per_gpu: Some(8192.0 / (250.4 / 1000.0) / 2.0),
        tflops_per_gpu: Some(137.6),
        mfu: None,
    };

    #[test]
    fn fixture_from_megatrons_logging_code() {
        SOURCE.reads_as(&Captured {
            steps: 6,
            own_tokens_from: Some(1),
            read: &[STEP_3],
            name: "megatron-core",
            version: "0.20.0",
            device: "NVIDIA H100 80GB HBM3",
            world_size: 2,
            // Data-parallel rank 0 reports memory; its largest `max reserved` (2,100 MB) is
            // kept.
            peak_mem_bytes: &[2_202_009_600],
            run_tokens_per_s_per_gpu: None,
        });
    }

    #[test]
    fn captured_two_rank_h200_log() {
        // A real run (2026-11-26, two H200s, torch FSDP2, seq 2048 x micro batch 4): the last
        // rank prints the iteration lines, data-parallel rank 0 the memory reports.
        let h200 = Fixture {
            file: "megatron-core-0.19.0-h200x2-fsdp2.log",
            asked: Asked {
                steps: 12,
                global_batch: 8,
                seq_len: 2048,
                gpus: 2,
            },
            lines: MegatronLog::default,
        };
        h200.reads_as(&Captured {
            steps: 12,
            own_tokens_from: Some(1),
            read: &[LoggedStep {
                step: 12,
                step_time_s: 435.9 / 1000.0,
                loss: 0.2555234,
                // 8 x 2048 tokens in 435.9 ms on 2 GPUs.
                tokens_per_s_per_gpu: Some(16384.0 / (435.9 / 1000.0) / 2.0),
                tflops_per_gpu: Some(161.4),
                mfu: None,
            }],
            name: "megatron-core",
            version: "0.19.0",
            device: "NVIDIA H200",
            world_size: 2,
            // `max reserved: 32326.00` MB.
            peak_mem_bytes: &[33_896_267_776],
            run_tokens_per_s_per_gpu: None,
        });
    }

    #[test]
    fn hostile_logs_are_refused() {
        SOURCE.check(&[
            // Truncated before the last iteration although Megatron exited 0.
            Case {
                edit: CutBefore("iteration        6/"),
                then: Refused("ends after step 5 of 6"),
            },
            // A garbled time field.
            Case {
                edit: Replace {
                    from: "(ms): 250.4 |",
                    to: "(ms): fast |",
                },
                then: Refused("positive number"),
            },
            // A line cut after its elapsed time (`250.4` read as `25`) is not a shorter step.
            Case {
                edit: Truncate {
                    line: "(ms): 250.4 |",
                    after: "(ms): 25",
                },
                then: Refused("the line is cut"),
            },
            // Two ranks' lines mixed without prefixes: an iteration repeats.
            Case {
                edit: Each(&[
                    Replace {
                        from: "[rank1]:",
                        to: "",
                    },
                    Insert {
                        before: " [2026-11-24 10:00:02",
                        line: " iteration        1/       6 | elapsed time per iteration (ms): 250.1 | global batch size:     4 | lm loss: 6.900000E+00 |",
                    },
                ]),
                then: Refused("mixed"),
            },
            // Flags that did not take.
            Case {
                edit: Steps(8),
                then: Refused("asked for 8"),
            },
            Case {
                edit: GlobalBatch(8),
                then: Refused("asks for 8"),
            },
            // A NaN loss reads as NaN (the reader fails the cell with exit 5).
            Case {
                edit: Replace {
                    from: "lm loss: 6.234567E+00",
                    to: "lm loss: nan",
                },
                then: Reads(LoggedStep {
                    loss: f64::NAN,
                    ..STEP_3
                }),
            },
        ]);
    }
}
