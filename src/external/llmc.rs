//! The llm.c adapter: bench's GPT-2 cells as llm.c's own `train_gpt2.cu`, built with nvcc on
//! the host by `scripts/frameworks/llmc_train.py` (llm.c's Makefile, once per checkout and
//! precision) and trained from random weights (`-e dN`) on a synthetic token shard; its
//! `step N/M | loss L (..z)| norm .. | lr .. | X ms | Y% bf16 MFU | Z tok/s` lines read back.
//!
//! llm.c trains GPT-2 of depth 12, 24, 36 or 48 (the `gpt2-125m` to `gpt2-1.5b` presets,
//! the same shapes: 50,304-row padded vocabulary, tied embeddings, 1,024 positions) in bf16
//! (or fp32, a separate build) with fp32 master weights and AdamW state, data parallel over
//! one process per GPU with NCCL. `X ms` is the step's own CUDA-event time (forward,
//! backward and update, without the data loader's host work or the print), so it is the
//! step time bench keeps; llm.c's tok/s is a bias-corrected moving average (it lags a
//! change) and its MFU counts against llm.c's own peak table.

use std::sync::LazyLock;

use regex::Regex;

use super::adapter::Config;
use super::launch::AttemptFiles;
use super::log::{self, Line, LogParser, LoggedStep, ParseError, Progress, StepLines};
use crate::axes::Dtype;
use crate::cell::Cell;
use crate::cell::FrameworkOpts;

pub(crate) struct Llmc;

pub(crate) const NAME: &str = "llmc";

/// The `-e dN` descriptor of an expressible cell's model.
fn descriptor(cell: &Cell) -> String {
    match crate::workload::models::presets::get(cell.model()) {
        Some(cfg) => format!("d{}", cfg.layers),
        None => "d12".into(),
    }
}

/// The precision llm.c is built with for an expressible cell's dtype.
fn precision(cell: &Cell) -> &'static str {
    match cell.dtype() {
        Dtype::Fp32 => "FP32",
        Dtype::Bf16 | Dtype::Fp8 => "BF16",
    }
}

impl super::adapter::Adapter for Llmc {
    fn config(&self, cell: &Cell, opts: &FrameworkOpts, _: &AttemptFiles) -> Config {
        let p = &cell.params;
        let s = |v: &dyn ToString| v.to_string();
        let tokens_per_step = log::Asked::of(cell).tokens_per_step();
        let mut argv: Vec<String> = vec![];
        let mut kv = |k: &str, v: String| {
            argv.push(k.to_string());
            argv.push(v);
        };
        kv("-e", descriptor(cell));
        kv("-b", s(&p.micro_batch));
        kv("-t", s(&p.seq_len));
        // llm.c's total batch is in tokens; it derives gradient accumulation from it.
        kv("-d", s(&tokens_per_step));
        kv("-x", s(&p.steps));
        kv("-l", s(&p.lr));
        kv("-k", "constant".into());
        kv("-u", s(&0));
        kv("-c", s(&0.0));
        // Whole activations kept (no recomputation), as a cell without `sac` means; TF32
        // only where bench's fp32 would not use it either: off.
        kv("-r", s(&0));
        kv("-f", s(&u8::from(cell.dtype().name() != "fp32")));
        // The validation pass runs once before step 1 and once after the last (one batch),
        // outside the timed steps; no sampling, checkpoints or HellaSwag.
        kv("-v", s(&(p.steps + 1)));
        kv("-m", s(&1));
        kv("-s", s(&0));
        kv("-n", s(&0));
        kv("-h", s(&0));
        // The matrix's extra flags come last, so they win (llm.c keeps a flag's last value).
        argv.extend(opts.args.iter().cloned());
        // The data loader needs one more token than it reads; the shard holds every step's
        // tokens plus the validation batch, so no step reads the same tokens twice.
        let shard_tokens = tokens_per_step * (u64::from(p.steps) + 1) + 1;
        let keys = serde_json::json!({
            "precision": precision(cell),
            "nproc": cell.gpus(),
            "tokens": shard_tokens,
            "seed": p.seed,
            "argv": argv,
        });
        Config::from_source(cell, opts, keys)
    }

    fn parser(&self, cell: &Cell) -> Box<dyn LogParser> {
        log::reader(
            cell,
            LlmcLog {
                // An fp32 cell runs with TF32 off, but llm.c divides by its TF32 peak: its
                // MFU would be several times too low, so it is not kept.
                keep_mfu: cell.dtype().name() != "fp32",
            },
        )
    }
}

static STEP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^step\s+(\d+)/(\d+)\s*\|\s*(?:train )?loss\s+([^\s|(]+)").expect("static regex")
});
static MS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\|\s*([^\s|]+)\s*ms\s*(?:\||$)").expect("static regex"));
static MFU: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\|\s*(?:(-?[0-9.]+)%[^|]*MFU|MFU\s+(-?[0-9.]+)%)").expect("static regex")
});
static TOKS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\|\s*([^\s|]+)\s*tok/s").expect("static regex"));

/// One llm.c step line, as `train_gpt2.cu` prints it (`step 10/5000 | loss 7.13 (+0.12z)|
/// norm .. | lr .. | 351.23 ms | 45.2% bf16 MFU | 1492523 tok/s`; before its z-scores,
/// `train loss L` and no parentheses), recognised the same way by `bench adapt` and `bench
/// ingest`. Each field is the text as printed: the two read numbers by their own rules (an
/// adapted cell's strictly, an ingested log's as frameworks print them).
#[derive(Debug, PartialEq)]
pub(crate) struct StepLine<'a> {
    pub step: &'a str,
    /// The run's step count (`N/M`'s M).
    pub of: &'a str,
    pub loss: &'a str,
    /// The step's own CUDA-event time.
    pub ms: &'a str,
    /// Against llm.c's own peak table (it prints -100% for a GPU the table lacks).
    pub mfu_percent: Option<&'a str>,
    /// All ranks together, a bias-corrected moving average.
    pub tokens_per_s: Option<&'a str>,
}

impl<'a> StepLine<'a> {
    /// `None` for a line that is not a step line; an error for one that starts as a step
    /// line but has no step time (a truncated line).
    pub(crate) fn read(text: &'a str) -> Option<Result<StepLine<'a>, String>> {
        let text = text.trim_start();
        let c = STEP.captures(text)?;
        let Some(ms) = MS.captures(text) else {
            return Some(Err(
                "an llm.c step line without `| X ms |` (truncated?)".to_string()
            ));
        };
        let group = |c: &regex::Captures<'a>, i| c.get(i).map_or("", |m| m.as_str());
        Some(Ok(StepLine {
            step: group(&c, 1),
            of: group(&c, 2),
            loss: group(&c, 3),
            ms: group(&ms, 1),
            mfu_percent: MFU
                .captures(text)
                .and_then(|m| m.get(1).or(m.get(2)))
                .map(|m| m.as_str()),
            tokens_per_s: TOKS.captures(text).map(|t| group(&t, 1)),
        }))
    }
}

static MEMORY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^device memory usage: (\d+) MiB / (\d+) MiB\s*$").expect("static regex")
});

/// llm.c's log (rank 0 prints everything), as `bench adapt` reads it.
#[derive(Default)]
pub(crate) struct LlmcLog {
    keep_mfu: bool,
}

impl StepLines for LlmcLog {
    const NAME: &'static str = NAME;
    const METHOD: &'static str = "llm.c train_gpt2.cu step line: `X ms` is the step's CUDA-event time (bench's step time); its tok/s is a bias-corrected moving average over the steps after the first (it lags), divided by the GPUs; its MFU is against llm.c's own peak table (none for fp32, which it divides by a TF32 peak); memory is llm.c's `device memory usage` once its parameters, gradients, activations and optimizer state are allocated (it allocates everything up front; the figure is the whole device's use)";

    fn line(&mut self, log: &mut Progress, line: &Line<'_>) -> Result<Vec<LoggedStep>, ParseError> {
        let text = line.text.as_str();
        if let Some(c) = MEMORY.captures(text) {
            let mib: u64 = line.int(&c[1], "memory")?;
            log.memory.record(0, mib.saturating_mul(1024 * 1024));
            return Ok(vec![]);
        }
        if text.contains("Fell back to cudaMallocManaged") {
            // llm.c keeps running with its optimizer state in host memory when the device's
            // is full: every step would then measure host-memory traffic, not the cell.
            return Err(line.bad(
                "llm.c ran out of device memory and fell back to managed (host) memory for its optimizer state: the steps would not measure the cell",
            ));
        }
        if !text.starts_with("step ") || !text.contains(" ms ") {
            return Ok(vec![]);
        }
        let read = StepLine::read(text)
            .ok_or_else(|| {
                line.bad("a step line that does not read as llm.c's `step N/M | loss L (..z)| ...`")
            })?
            .map_err(|m| line.bad(m))?;
        let step: u64 = line.int(read.step, "step number")?;
        let of: u64 = line.int(read.of, "step count")?;
        let asked = log.asked.steps;
        line.agrees(of, u64::from(asked), || {
            format!("llm.c runs {of} steps; the cell asks for {asked}")
        })?;
        log.in_order(line, step)?;
        let loss = line.number(read.loss, "loss")?;
        let ms = line.positive(
            Some(read.ms),
            "a step line without a positive `| X ms |` (truncated?)",
        )?;
        // llm.c prints -100% for a GPU its peak table lacks (the H200, for one): no figure.
        let mfu = read
            .mfu_percent
            .map(|m| super::log::percent(m).ok_or_else(|| line.bad("unreadable MFU")))
            .transpose()?
            .filter(|m| *m >= 0.0);
        let toks = read
            .tokens_per_s
            .map(|t| line.number(t, "tok/s"))
            .transpose()?;
        Ok(vec![LoggedStep {
            step,
            step_time_s: ms / 1000.0,
            loss,
            tokens_per_s_per_gpu: toks.map(|t| t / log.world_size()),
            tflops_per_gpu: None,
            mfu: mfu.filter(|_| self.keep_mfu).map(|m| m / 100.0),
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::external::declared::LLMC as FRAMEWORK;
    use crate::external::log::checks::{Captured, Case, Edit::*, Fixture, Then::*};
    use crate::external::log::Asked;
    use crate::external::tests::{config_json, refuses_cell};

    /// A log built from llm.c's printf calls: 6 steps of one sequence of 1,024 tokens on
    /// one GPU, bf16 (llm.c's MFU kept).
    const SOURCE: Fixture<LlmcLog> = Fixture {
        file: "llmc-f1e2ace-1gpu-from-source.log",
        asked: Asked {
            steps: 6,
            global_batch: 1,
            seq_len: 1024,
            gpus: 1,
        },
        lines: || LlmcLog { keep_mfu: true },
    };

    fn cell(model: &str, dtype: &str, gpus: i64, parallel: &str, features: &[&str]) -> Cell {
        crate::external::tests::framework_cell(NAME, model, dtype, gpus, parallel, features)
    }

    #[test]
    fn maps_gpt2_depths_and_drops_what_llmc_cannot_run() {
        let mut c = cell("gpt2-125m", "bf16", 1, "single", &[]);
        c.params.seq_len = 1024;
        let (p, v) = config_json(&FRAMEWORK, &c);
        let argv: Vec<String> = serde_json::from_value(v["argv"].clone()).unwrap();
        let flag = |k: &str| argv[argv.iter().position(|a| a == k).unwrap() + 1].clone();
        assert_eq!(flag("-e"), "d12");
        assert_eq!(flag("-t"), "1024");
        assert_eq!(
            flag("-d").parse::<u64>().unwrap(),
            u64::from(c.params.global_batch) * 1024
        );
        assert_eq!(flag("-x"), c.params.steps.to_string());
        assert_eq!(flag("-r"), "0");
        assert_eq!(v["precision"], "BF16");
        assert_eq!(p.argv[1], "/s/llmc_train.py");
        let mut big = cell("gpt2-1.5b", "fp32", 2, "ddp", &[]);
        big.params.seq_len = 512;
        big.params.global_batch = 2 * big.params.micro_batch;
        let (p, v) = config_json(&FRAMEWORK, &big);
        assert_eq!(v["precision"], "FP32");
        assert_eq!(v["nproc"], 2);
        assert!(p.config_text.contains("\"d48\""));

        for (model, dtype, gpus, parallel, features, why) in [
            ("llama-tiny", "bf16", 1, "single", &[][..], "GPT-2 of depth"),
            ("gpt2-tiny", "bf16", 1, "single", &[], "GPT-2 of depth"),
            ("gpt2-125m", "fp8", 1, "single", &[], "no fp8"),
            (
                "gpt2-125m",
                "bf16",
                1,
                "single",
                &["compile"],
                "hand-written",
            ),
            ("gpt2-125m", "bf16", 1, "single", &["sac"], "whole blocks"),
            ("gpt2-125m", "bf16", 2, "fsdp", &[], "ZeRO-1"),
        ] {
            let mut c = cell(model, dtype, gpus, parallel, features);
            c.params.seq_len = 1024;
            c.params.global_batch = gpus as u32 * c.params.micro_batch;
            refuses_cell(&FRAMEWORK, &c, why);
        }
        let mut long = cell("gpt2-125m", "bf16", 1, "single", &[]);
        long.params.seq_len = 2048;
        refuses_cell(&FRAMEWORK, &long, "1,024 positions");
    }

    /// Step 3 as llm.c printed it (`| loss 10.912345 (+0.52z)| ... | 87.12 ms | 41.2% bf16
    /// MFU | 188062 tok/s`), in bench's units.
    const STEP_3: LoggedStep = LoggedStep {
        step: 3,
        step_time_s: 87.12 / 1000.0,
        loss: 10.912345,
        tokens_per_s_per_gpu: Some(188_062.0),
        tflops_per_gpu: None,
        mfu: Some(41.2 / 100.0),
    };

    #[test]
    fn fixture_from_llmcs_printf() {
        SOURCE.reads_as(&Captured {
            steps: 6,
            own_tokens_from: Some(1),
            read: &[STEP_3],
            name: "llm.c",
            version: "f1e2ace",
            device: "NVIDIA H100 80GB HBM3",
            world_size: 1,
            // `device memory usage: 21345 MiB`.
            peak_mem_bytes: &[22_381_854_720],
            run_tokens_per_s_per_gpu: None,
        });
    }

    #[test]
    fn hostile_logs_are_refused() {
        SOURCE.check(&[
            Case {
                edit: CutBefore("step    6/6"),
                then: Refused("ends after step 5 of 6"),
            },
            Case {
                edit: Replace {
                    from: "| 87.12 ms |",
                    to: "| -1 ms |",
                },
                then: Refused("positive"),
            },
            Case {
                edit: Replace {
                    from: "step    4/6",
                    to: "step    3/6",
                },
                then: Refused("step 3 after step 3"),
            },
            Case {
                edit: Steps(8),
                then: Refused("asks for 8"),
            },
            Case {
                edit: Replace {
                    from: "| loss 10.912345 (+0.52z)|",
                    to: "| los 10.912345 (+0.52z)|",
                },
                then: Refused("does not read as"),
            },
            Case {
                edit: Replace {
                    from: "| loss 10.912345 (+0.52z)|",
                    to: "| loss 10.9x (+0.52z)|",
                },
                then: Refused("unreadable loss"),
            },
            // llm.c before its z-scores printed `train loss L |`: the same reader as `bench
            // ingest` takes both.
            Case {
                edit: Replace {
                    from: "| loss 10.912345 (+0.52z)|",
                    to: "| train loss 10.912345 |",
                },
                then: Reads(STEP_3),
            },
            Case {
                edit: Insert {
                    before: "device memory usage",
                    line: "WARNING: Fell back to cudaMallocManaged when initializing m,v,master_weights on 1 GPUs",
                },
                then: Refused("managed (host) memory"),
            },
            // A GPU llm.c's peak table lacks prints -100%: no framework MFU, the step stands.
            Case {
                edit: Replace {
                    from: "| 41.2% bf16 MFU |",
                    to: "| -100.0% bf16 MFU |",
                },
                then: Reads(LoggedStep { mfu: None, ..STEP_3 }),
            },
        ]);
    }
}
