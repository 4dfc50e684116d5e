//! The DeepSpeed adapter: bench's axes to a DeepSpeed config (ZeRO stage, precision,
//! batch sizes) and a Llama model of the cell's preset (transformers' `LlamaForCausalLM`
//! from random weights), trained by DeepSpeed's engine in
//! `scripts/frameworks/deepspeed_train.py` under torchrun.
//!
//! The ZeRO stage is the `zero` axis (0 to 3) when the matrix has one, else follows
//! `parallel`: `single` and `ddp` are stage 0 (plain data parallelism), `fsdp` is stage 3
//! (parameters sharded). A `zero` value that contradicts `parallel` (stage 3 with ddp, stage
//! 0 to 2 with fsdp on several GPUs) is dropped: bench's `parallel` says whether parameters
//! are sharded, and the cell must run as it says.
//!
//! The optimizer is torch's fused AdamW through DeepSpeed's `torch_adam` switch, so that
//! nothing of DeepSpeed is compiled at run time (its FusedAdam would be, with nvcc or g++).
//!
//! DeepSpeed prints no loss and no step time of its own per step; its `ThroughputTimer`
//! prints `epoch=E/micro_step=M/global_step=G, RunningAvgSamplesPerSec=.., CurrSamplesPerSec=..,
//! MemAllocated=..GB, MaxMemAllocated=..GB` at every `steps_per_print` (set to 1), from the
//! third global step on, at INFO (`log_level` set to `info`: DeepSpeed's own default is
//! WARNING, which hides it). The driver prints `[bench-ds] step: N time: T loss: L tokens: K
//! memory: B` after each `engine.step()` (T: seconds between step ends after a device
//! synchronisation). bench's step time is the driver's; DeepSpeed's own tokens/s is its
//! `CurrSamplesPerSec` x seq_len / GPUs of the same step.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use regex::Regex;

use super::adapter::Config;
use super::launch::AttemptFiles;
use super::log::{
    self, DriverFigures, Line, LogParser, LoggedStep, ParseError, Progress, StepLines,
};
use crate::axes::Parallel;
use crate::cell::FrameworkOpts;
use crate::cell::{Cell, Value};

pub(crate) struct DeepSpeed;

pub(crate) const NAME: &str = "deepspeed";

/// The ZeRO stage of a cell: the `zero` axis, else what `parallel` means (see the module
/// doc); `Err` for a `zero` value that is not an integer.
pub(crate) fn zero_stage(cell: &Cell) -> Result<i64, String> {
    match cell.values.get("zero") {
        Some(Value::Int(z)) => Ok(*z),
        Some(other) => Err(format!("zero `{other}` is not a ZeRO stage (0, 1, 2 or 3)")),
        None if cell.parallel().name() == "fsdp" => Ok(3),
        None => Ok(0),
    }
}

/// Why a cell's ZeRO stage contradicts its `parallel` (see the module doc), if it does:
/// the one refusal of the adapter that is no table data, since it reads the `zero` axis
/// against `parallel` and the GPUs.
fn zero_refusal(cell: &Cell) -> Option<String> {
    let zero = match zero_stage(cell) {
        Ok(z) => z,
        Err(e) => return Some(e),
    };
    let sharded = cell.parallel() == Parallel::Fsdp;
    match zero {
        0..=2 if sharded && cell.gpus() > 1 => Some(format!(
            "ZeRO stage {zero} keeps every parameter on every rank, which bench calls ddp, not fsdp"
        )),
        3 if !sharded => Some(
            "ZeRO stage 3 shards the parameters, which bench calls fsdp, not ddp or single".into(),
        ),
        0..=3 => None,
        z => Some(format!("ZeRO has stages 0 to 3, not {z}")),
    }
}

impl super::adapter::Adapter for DeepSpeed {
    fn refuses(&self, cell: &Cell) -> Option<String> {
        zero_refusal(cell)
    }

    fn config(&self, cell: &Cell, _: &FrameworkOpts, _: &AttemptFiles) -> Config {
        let p = &cell.params;
        let cfg = super::mapping::mapped_llama(cell);
        let features = cell.features();
        let bf16 = cell.dtype().name() == "bf16";
        let ds_config = serde_json::json!({
            "train_batch_size": p.global_batch,
            "train_micro_batch_size_per_gpu": p.micro_batch,
            "gradient_accumulation_steps": p.grad_accum,
            "steps_per_print": 1,
            "wall_clock_breakdown": false,
            // DeepSpeed's logger defaults to WARNING; its ThroughputTimer lines are INFO.
            "log_level": "info",
            "bf16": {"enabled": bf16},
            "zero_optimization": {"stage": zero_stage(cell).unwrap_or(0)},
            // torch's fused AdamW (`torch_adam`): DeepSpeed's FusedAdam is compiled at run
            // time (nvcc on a GPU, g++ on CPU), which a pure-Python install cannot count on.
            "optimizer": {
                "type": "AdamW",
                "params": {
                    "lr": p.lr,
                    "betas": [0.9, 0.95],
                    "eps": 1e-8,
                    "weight_decay": 0.0,
                    "torch_adam": true,
                    "fused": true,
                },
            },
            "gradient_clipping": 1.0,
        });
        let config = serde_json::json!({
            "cell": cell.id.as_str(),
            "seq_len": p.seq_len,
            "steps": p.steps,
            "seed": p.seed,
            "compile": features.contains("compile"),
            "gradient_checkpointing": features.contains("sac"),
            "model": super::hf::llama_config(&cfg, p.seq_len),
            "deepspeed": ds_config,
        });
        Config::json(&config)
    }

    fn parser(&self, cell: &Cell) -> Box<dyn LogParser> {
        log::reader(cell, DeepSpeedLog::default())
    }
}

static STEP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^\[bench-ds\] step: (\d+) time: (\S+) loss: (\S+) tokens: (\d+) memory: (-?\d+)\s*$",
    )
    .expect("static regex")
});
static THROUGHPUT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"global_step=(\d+), RunningAvgSamplesPerSec=([^,]*), CurrSamplesPerSec=([^,]*),")
        .expect("static regex")
});

/// DeepSpeed's ThroughputTimer line (`deepspeed/utils/timer.py`, `ThroughputTimer.stop`,
/// 0.14 to 0.19: `epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=110.87,
/// CurrSamplesPerSec=111.34, MemAllocated=1.87GB, MaxMemAllocated=6.12GB`), recognised the
/// same way by `bench adapt` and `bench ingest`. `CurrSamplesPerSec` is the engine's
/// `train_batch_size` (the global batch) over the step's elapsed time. Each value is the
/// text as printed: the two read numbers by their own rules.
pub(crate) struct ThroughputLine<'a> {
    pub global_step: &'a str,
    pub curr_samples_per_s: &'a str,
}

impl<'a> ThroughputLine<'a> {
    /// `None` for a line without `CurrSamplesPerSec=`; an error for one that has it but does
    /// not read (a cut line among them).
    pub(crate) fn read(text: &'a str) -> Option<Result<ThroughputLine<'a>, String>> {
        if !text.contains("CurrSamplesPerSec=") {
            return None;
        }
        let Some(c) = THROUGHPUT.captures(text) else {
            return Some(Err("a `CurrSamplesPerSec=` line that is not DeepSpeed's `global_step=N, RunningAvgSamplesPerSec=X, CurrSamplesPerSec=Y, ...` (the line is cut: truncated log?)".to_string()));
        };
        let group = |i| c.get(i).map_or("", |m| m.as_str());
        Some(Ok(ThroughputLine {
            global_step: group(1),
            curr_samples_per_s: group(3).trim(),
        }))
    }
}

/// DeepSpeed's ThroughputTimer lines and the driver's step lines, as `bench adapt` reads
/// them.
#[derive(Default)]
pub(crate) struct DeepSpeedLog {
    /// DeepSpeed's `CurrSamplesPerSec` of the lowest rank by global step, until that step's
    /// driver line comes.
    samples_per_s: BTreeMap<u64, f64>,
    ds_rank: Option<Option<u32>>,
}

impl StepLines for DeepSpeedLog {
    const NAME: &'static str = NAME;
    const METHOD: &'static str = "DeepSpeed ThroughputTimer (steps_per_print 1): CurrSamplesPerSec x seq_len / GPUs, timed from the engine's forward to its optimizer step (data loading and the driver's synchronisation outside it), from the third global step on; bench's step time is between step ends";

    fn line(&mut self, log: &mut Progress, line: &Line<'_>) -> Result<Vec<LoggedStep>, ParseError> {
        let text = line.text.as_str();
        if let Some(throughput) = ThroughputLine::read(text) {
            let throughput = throughput.map_err(|m| line.bad(m))?;
            // Every rank prints it; the first rank seen speaks for the run.
            let first = *self.ds_rank.get_or_insert(line.rank);
            if first != line.rank {
                return Ok(vec![]);
            }
            let step: u64 = line.int(throughput.global_step, "global step")?;
            let curr = line.number(throughput.curr_samples_per_s, "CurrSamplesPerSec")?;
            self.samples_per_s.insert(step, curr);
            return Ok(vec![]);
        }
        if !text.starts_with("[bench-ds] step:") {
            return Ok(vec![]);
        }
        let c = STEP.captures(text).ok_or_else(|| {
            line.bad("a step line that does not read as `[bench-ds] step: N time: T loss: L tokens: K memory: B`")
        })?;
        let step: u64 = line.int(&c[1], "step number")?;
        let printed = DriverFigures {
            time: &c[2],
            tokens: &c[4],
            memory: &c[5],
        };
        let time = log.driver_step(line, step, printed, "DeepSpeed")?;
        let loss = line.number(&c[3], "loss")?;
        let own = self
            .samples_per_s
            .remove(&step)
            .map(|s| s * f64::from(log.asked.seq_len) / log.world_size());
        Ok(vec![LoggedStep {
            step,
            step_time_s: time,
            loss,
            tokens_per_s_per_gpu: own,
            tflops_per_gpu: None,
            mfu: None,
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::external::declared::DEEPSPEED as FRAMEWORK;
    use crate::external::log::checks::{Captured, Case, Edit::*, Fixture, Then::*};
    use crate::external::log::Asked;
    use crate::external::tests::{config_json, refuses_cell};

    /// A log built from DeepSpeed's logging code: 6 steps of 4 sequences of 1,024 tokens on
    /// 2 GPUs.
    const SOURCE: Fixture<DeepSpeedLog> = Fixture {
        file: "deepspeed-0.19.6-2rank-from-source.log",
        asked: Asked {
            steps: 6,
            global_batch: 4,
            seq_len: 1024,
            gpus: 2,
        },
        lines: DeepSpeedLog::default,
    };

    fn cell(gpus: i64, parallel: &str, zero: Option<i64>) -> Cell {
        let mut c = crate::external::tests::tiny_cell(NAME, gpus, parallel, &["sac"]);
        if let Some(z) = zero {
            c.values.insert("zero".into(), Value::Int(z));
        }
        c
    }

    #[test]
    fn zero_stages_follow_parallel_or_the_axis() {
        for (gpus, parallel, zero, stage) in [
            (1, "single", None, 0),
            (2, "ddp", None, 0),
            (2, "fsdp", None, 3),
            (2, "ddp", Some(1), 1),
            (2, "ddp", Some(2), 2),
            (2, "fsdp", Some(3), 3),
            (1, "fsdp", Some(2), 2),
        ] {
            let c = cell(gpus, parallel, zero);
            let (p, v) = config_json(&FRAMEWORK, &c);
            let ds = &v["deepspeed"];
            assert_eq!(ds["zero_optimization"]["stage"], stage, "{}", c.id);
            assert_eq!(ds["train_batch_size"], 2 * gpus);
            assert_eq!(ds["bf16"]["enabled"], true);
            assert_eq!(ds["log_level"], "info");
            assert_eq!(ds["optimizer"]["params"]["torch_adam"], true);
            assert_eq!(v["gradient_checkpointing"], true);
            assert!(p.argv.contains(&"/s/deepspeed_train.py".to_string()));
        }
        for (gpus, parallel, zero, why) in [
            (2, "ddp", Some(3), "calls fsdp"),
            (2, "fsdp", Some(1), "calls ddp"),
            (2, "ddp", Some(4), "0 to 3"),
        ] {
            refuses_cell(&FRAMEWORK, &cell(gpus, parallel, zero), why);
        }
        let mut tp = cell(2, "ddp", None);
        tp.values.insert("tp".into(), Value::Int(2));
        tp.params.global_batch = 2;
        refuses_cell(&FRAMEWORK, &tp, "tensor");
    }

    #[test]
    fn fixture_from_deepspeeds_logging_code() {
        SOURCE.reads_as(&Captured {
            steps: 6,
            // The ThroughputTimer starts at the third global step.
            own_tokens_from: Some(3),
            read: &[LoggedStep {
                step: 4,
                step_time_s: 0.4012,
                loss: 10.4375,
                // CurrSamplesPerSec 10.02 x 1024 tokens / 2 GPUs, rank 0's line.
                tokens_per_s_per_gpu: Some(10.02 * 1024.0 / 2.0),
                tflops_per_gpu: None,
                mfu: None,
            }],
            name: "deepspeed",
            version: "0.19.6",
            device: "NVIDIA H100 80GB HBM3",
            world_size: 2,
            peak_mem_bytes: &[3_221_225_472],
            run_tokens_per_s_per_gpu: None,
        });
    }

    #[test]
    fn hostile_logs_are_refused() {
        SOURCE.check(&[
            Case {
                edit: CutBefore("[rank0]:[bench-ds] step: 6"),
                then: Refused("ends after step 5 of 6"),
            },
            Case {
                edit: Replace {
                    from: "CurrSamplesPerSec=10.02,",
                    to: "CurrSamplesPerSec=10.02",
                },
                then: Refused("unreadable CurrSamplesPerSec"),
            },
            // Rank 0's step 3 without its prefix starts an unprefixed stream at step 3: its
            // steps 1 and 2 are missing.
            Case {
                edit: Replace {
                    from: "[rank0]:[bench-ds] step: 3",
                    to: "[bench-ds] step: 3",
                },
                then: Refused("missing"),
            },
            Case {
                edit: Replace {
                    from: "time: 0.401200",
                    to: "time: -0.4",
                },
                then: Refused("positive"),
            },
            Case {
                edit: GlobalBatch(8),
                then: Refused("asks for 8192"),
            },
        ]);
    }

    #[test]
    fn captured_cpu_log_two_ranks_zero3() {
        let cpu = Fixture {
            file: "deepspeed-0.19.8-cpu-2rank-zero3.log",
            asked: Asked {
                steps: 8,
                global_batch: 4,
                seq_len: 64,
                gpus: 2,
            },
            lines: DeepSpeedLog::default,
        };
        // A step's own tokens/s: CurrSamplesPerSec of its global step x 64 tokens / 2 ranks.
        let own = |samples_per_s: f64| Some(samples_per_s * 64.0 / 2.0);
        cpu.reads_as(&Captured {
            steps: 8,
            own_tokens_from: Some(3),
            read: &[
                LoggedStep {
                    step: 3,
                    step_time_s: 0.107223,
                    loss: 6.235396,
                    tokens_per_s_per_gpu: own(40.76303232084185),
                    tflops_per_gpu: None,
                    mfu: None,
                },
                LoggedStep {
                    step: 8,
                    step_time_s: 0.127966,
                    loss: 6.258643,
                    tokens_per_s_per_gpu: own(32.699650430403494),
                    tflops_per_gpu: None,
                    mfu: None,
                },
            ],
            name: "deepspeed",
            version: "0.19.8",
            device: "cpu",
            world_size: 2,
            // The driver prints memory -1 on a CPU: no figure.
            peak_mem_bytes: &[],
            run_tokens_per_s_per_gpu: None,
        });
    }
}
