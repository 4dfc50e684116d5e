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

use super::ran::Signature;
use std::sync::LazyLock;

use regex::Regex;

use super::log::{self, DriverInfo, LogEnd, LogParser, LoggedStep, ParseError, StepOrder};
use super::{AttemptFiles, FrameworkOpts, Prepared};
use crate::cell::Cell;
use crate::workload::models::presets::{self, Family};

pub(crate) struct Llmc;

const NAME: &str = "llmc";

/// llm.c's GPT-2 depths (`gpt2_set_hyperparameters` in train_gpt2.cu) and their widths.
const DEPTHS: [(i64, i64, i64); 4] = [
    (12, 768, 12),
    (24, 1024, 16),
    (36, 1280, 20),
    (48, 1600, 25),
];

/// The `-e dN` descriptor of a cell's model, or why llm.c cannot build it.
fn descriptor(cell: &Cell) -> Result<String, String> {
    let name = cell.model();
    let cfg = presets::get(name).ok_or_else(|| {
        format!("model `{name}` is not a bench preset, so llm.c cannot be given its shape")
    })?;
    let gpt2 = cfg.family == Family::Gpt2
        && cfg.vocab == 50304
        && cfg.max_seq == 1024
        && cfg.tied_embeddings
        && DEPTHS.contains(&(cfg.layers, cfg.hidden, cfg.heads));
    if !gpt2 {
        return Err(format!(
            "llm.c builds GPT-2 of depth 12, 24, 36 or 48 only (`-e d12` .. `-e d48`: gpt2-125m, gpt2-350m, gpt2-774m, gpt2-1.5b); `{name}` is not one"
        ));
    }
    Ok(format!("d{}", cfg.layers))
}

/// The precision llm.c is built with for a cell's dtype.
fn precision(cell: &Cell) -> Result<&'static str, String> {
    match cell.dtype().name() {
        "bf16" => Ok("BF16"),
        "fp32" => Ok("FP32"),
        "fp8" => {
            Err("llm.c's train_gpt2.cu has no fp8 path (it builds in bf16, fp16 or fp32)".into())
        }
        other => Err(format!("dtype `{other}` is not bf16 or fp32")),
    }
}

/// llm.c's build line and its settings table, read into the cell's record (`super::ran`):
/// its own CUDA kernels, no graph capture, no compiler.
const SIGNATURES: &[Signature] = &[
    Signature {
        aspect: "execution",
        pattern: r"llmc_train\.py: (?:building|cached build): make train_gpt2cu",
        says: "llm.c's hand-written CUDA kernels (no graph capture)",
    },
    Signature {
        aspect: "attention",
        pattern: r"llmc_train\.py: (?:building|cached build): make .*USE_CUDNN=0",
        says: "llm.c's own attention kernels (no cuDNN flash attention)",
    },
    Signature {
        aspect: "attention",
        pattern: r"llmc_train\.py: (?:building|cached build): make .*USE_CUDNN=1",
        says: "cuDNN flash attention",
    },
    Signature {
        aspect: "checkpointing",
        pattern: r"^\| recompute +\| (\d+) ",
        says: "recompute level $1 (0: none, 1: GeLU, 2: GeLU and LayerNorm)",
    },
    Signature {
        aspect: "optimizer",
        pattern: r"^\| use_master_weights +\| (\w+) ",
        says: "llm.c's fused AdamW kernel, fp32 master weights $1",
    },
    Signature {
        aspect: "precision",
        pattern: r"^\| precision +\| (\w+) ",
        says: "$1 weights and activations",
    },
    Signature {
        aspect: "parallel",
        pattern: r"^\| zero_stage +\| (\d+) ",
        says: "ZeRO stage $1",
    },
    Signature {
        aspect: "parallel",
        pattern: r"^\| num_processes +\| (\d+) ",
        says: "$1 process(es)",
    },
];

impl super::Adapter for Llmc {
    fn name(&self) -> &'static str {
        NAME
    }

    fn unexpressible(&self, cell: &Cell) -> Option<String> {
        if let Err(e) = descriptor(cell).and(precision(cell)) {
            return Some(e);
        }
        let features = cell.features();
        if features.contains("compile") {
            return Some(
                "llm.c is hand-written CUDA: there is no compiler of the model to switch on".into(),
            );
        }
        if features.contains("sac") {
            return Some(
                "llm.c recomputes only GeLU and LayerNorm outputs in the backward (`-r 1`/`-r 2`), never whole blocks: no equivalent of selective activation checkpointing"
                    .into(),
            );
        }
        if let Some(why) = super::common_checks(cell, "llm.c", &[]) {
            return Some(why);
        }
        if cell.parallel().name() == "fsdp" {
            return Some(
                "llm.c shards at most the optimizer state (ZeRO-1, `-z 1`), never the parameters: fsdp cannot run as it says"
                    .into(),
            );
        }
        if super::degree(cell, "tp") > 1 || super::degree(cell, "pp") > 1 {
            return Some("llm.c is data parallel only: no tensor or pipeline parallelism".into());
        }
        if cell.params.seq_len > 1024 {
            return Some(format!(
                "llm.c's GPT-2 has 1,024 positions; seq_len {} does not fit",
                cell.params.seq_len
            ));
        }
        None
    }

    fn prepare(&self, cell: &Cell, opts: &FrameworkOpts, files: &AttemptFiles) -> Prepared {
        let p = &cell.params;
        let s = |v: &dyn ToString| v.to_string();
        let tokens_per_step = u64::from(p.global_batch) * u64::from(p.seq_len);
        let mut argv: Vec<String> = vec![];
        let mut kv = |k: &str, v: String| {
            argv.push(k.to_string());
            argv.push(v);
        };
        kv("-e", descriptor(cell).unwrap_or_else(|_| "d12".into()));
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
        let config = serde_json::json!({
            "cell": cell.id.as_str(),
            "source": opts.source,
            "precision": precision(cell).unwrap_or("BF16"),
            "nproc": cell.gpus(),
            "tokens": shard_tokens,
            "seed": p.seed,
            "argv": argv,
        });
        let mut env = vec![];
        if let Some(src) = &opts.source {
            env.push(("BENCH_LLMC_SOURCE".to_string(), src.clone()));
        }
        Prepared {
            config_ext: "json",
            config_text: serde_json::to_string_pretty(&config).unwrap_or_default() + "\n",
            argv: vec![
                files.python.clone(),
                files.scripts.join("llmc_train.py").display().to_string(),
                "--config".into(),
                "{config}".into(),
            ],
            env,
            files: vec![],
        }
    }

    fn signatures(&self) -> &'static [Signature] {
        SIGNATURES
    }

    fn torch_based(&self) -> bool {
        false
    }

    fn parser(&self, cell: &Cell) -> Box<dyn LogParser> {
        Box::new(LlmcLog {
            steps_expected: cell.params.steps,
            // An fp32 cell runs with TF32 off, but llm.c divides by its TF32 peak: its MFU
            // would be several times too low, so it is not kept.
            keep_mfu: cell.dtype().name() != "fp32",
            ..LlmcLog::default()
        })
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
    steps_expected: u32,
    keep_mfu: bool,
    info: Option<DriverInfo>,
    order: StepOrder,
    peak_mem: Option<u64>,
}

impl LogParser for LlmcLog {
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
            let mib: u64 = c[1]
                .parse()
                .map_err(|_| bad("memory out of range".into()))?;
            self.peak_mem = Some(mib.saturating_mul(1024 * 1024));
            return Ok(vec![]);
        }
        if text.contains("Fell back to cudaMallocManaged") {
            // llm.c keeps running with its optimizer state in host memory when the device's
            // is full: every step would then measure host-memory traffic, not the cell.
            return Err(bad(
                "llm.c ran out of device memory and fell back to managed (host) memory for its optimizer state: the steps would not measure the cell".into(),
            ));
        }
        if !text.starts_with("step ") || !text.contains(" ms ") {
            return Ok(vec![]);
        }
        let line = StepLine::read(&text)
            .ok_or_else(|| {
                bad(
                    "a step line that does not read as llm.c's `step N/M | loss L (..z)| ...`"
                        .into(),
                )
            })?
            .map_err(bad)?;
        let step: u64 = line
            .step
            .parse()
            .map_err(|_| bad("step number out of range".into()))?;
        let of: u64 = line
            .of
            .parse()
            .map_err(|_| bad("step count out of range".into()))?;
        if of != u64::from(self.steps_expected) {
            return Err(bad(format!(
                "llm.c runs {of} steps; the cell asks for {}",
                self.steps_expected
            )));
        }
        self.order.check(rank, step).map_err(bad)?;
        let loss = log::number(line.loss).ok_or_else(|| bad("unreadable loss".into()))?;
        let ms = log::number(line.ms)
            .filter(|t| t.is_finite() && *t > 0.0)
            .ok_or_else(|| bad("a step line without a positive `| X ms |` (truncated?)".into()))?;
        // llm.c prints -100% for a GPU its peak table lacks (the H200, for one): no figure.
        let mfu = line
            .mfu_percent
            .map(|m| log::percent(m).ok_or_else(|| bad("unreadable MFU".into())))
            .transpose()?
            .filter(|m| *m >= 0.0);
        let toks = line
            .tokens_per_s
            .map(|t| log::number(t).ok_or_else(|| bad("unreadable tok/s".into())))
            .transpose()?;
        let world = f64::from(self.info.as_ref().map_or(1, |i| i.world_size.max(1)));
        Ok(vec![LoggedStep {
            step,
            step_time_s: ms / 1000.0,
            loss,
            tokens_per_s_per_gpu: toks.map(|t| t / world),
            tflops_per_gpu: None,
            mfu: mfu.filter(|_| self.keep_mfu).map(|m| m / 100.0),
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
                peak_mem_bytes: self.peak_mem.into_iter().collect(),
                run_tokens_per_s_per_gpu: None,
                method: "llm.c train_gpt2.cu step line: `X ms` is the step's CUDA-event time (bench's step time); its tok/s is a bias-corrected moving average over the steps after the first (it lags), divided by the GPUs; its MFU is against llm.c's own peak table (none for fp32, which it divides by a TF32 peak); memory is llm.c's `device memory usage` once its parameters, gradients, activations and optimizer state are allocated (it allocates everything up front; the figure is the whole device's use)".into(),
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::external::Adapter;

    fn cell(model: &str, dtype: &str, gpus: i64, parallel: &str, features: &[&str]) -> Cell {
        let mut c = crate::external::tests::cell(model, dtype, gpus, parallel, features);
        c.params.workload = crate::cell::Workload::framework(NAME);
        c
    }

    #[test]
    fn maps_gpt2_depths_and_drops_what_llmc_cannot_run() {
        let files = AttemptFiles {
            dir: "/r/x".into(),
            scripts: "/s".into(),
            python: "py".into(),
        };
        let mut c = cell("gpt2-125m", "bf16", 1, "single", &[]);
        c.params.seq_len = 1024;
        assert_eq!(Llmc.unexpressible(&c), None);
        let p = Llmc.prepare(&c, &FrameworkOpts::default(), &files);
        let v: serde_json::Value = serde_json::from_str(&p.config_text).unwrap();
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
        assert_eq!(Llmc.unexpressible(&big), None);
        let p = Llmc.prepare(&big, &FrameworkOpts::default(), &files);
        let v: serde_json::Value = serde_json::from_str(&p.config_text).unwrap();
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
            let got = Llmc.unexpressible(&c).unwrap_or_default();
            assert!(got.contains(why), "{}: {got}", c.id);
        }
        let mut long = cell("gpt2-125m", "bf16", 1, "single", &[]);
        long.params.seq_len = 2048;
        assert!(Llmc
            .unexpressible(&long)
            .unwrap()
            .contains("1,024 positions"));
    }

    fn fixture() -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/frameworks/llmc-f1e2ace-1gpu-from-source.log");
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    fn parser() -> LlmcLog {
        LlmcLog {
            steps_expected: 6,
            keep_mfu: true,
            ..LlmcLog::default()
        }
    }

    #[test]
    fn fixture_from_llmcs_printf() {
        let (steps, end) = log::read_all(&mut parser(), &fixture(), true).unwrap();
        assert_eq!(steps.len(), 6);
        assert!((steps[2].step_time_s - 0.08712).abs() < 1e-12);
        assert!((steps[2].loss - 10.912345).abs() < 1e-12);
        assert!((steps[2].mfu.unwrap() - 0.412).abs() < 1e-12);
        assert_eq!(steps[2].tokens_per_s_per_gpu, Some(188_062.0));
        assert_eq!(end.info.name, "llm.c");
        assert_eq!(end.peak_mem_bytes, vec![21_345 * 1024 * 1024]);
    }

    #[test]
    fn hostile_logs_are_refused() {
        let text = fixture();
        let cut = text.find("step    6/6").unwrap();
        let e = log::read_all(&mut parser(), &text[..cut], true).unwrap_err();
        assert!(e.message.contains("ends after step 5 of 6"), "{e}");
        let e = log::read_all(
            &mut parser(),
            &text.replace("| 87.12 ms |", "| -1 ms |"),
            true,
        )
        .unwrap_err();
        assert!(e.message.contains("positive"), "{e}");
        let e = log::read_all(
            &mut parser(),
            &text.replace("step    4/6", "step    3/6"),
            true,
        )
        .unwrap_err();
        assert!(e.message.contains("step 3 after step 3"), "{e}");
        let mut other = parser();
        other.steps_expected = 8;
        let e = log::read_all(&mut other, &text, true).unwrap_err();
        assert!(e.message.contains("asks for 8"), "{e}");
        let e = log::read_all(
            &mut parser(),
            &text.replace("| loss 10.912345 (+0.52z)|", "| los 10.912345 (+0.52z)|"),
            true,
        )
        .unwrap_err();
        assert!(e.message.contains("does not read as"), "{e}");
        let e = log::read_all(
            &mut parser(),
            &text.replace("| loss 10.912345 (+0.52z)|", "| loss 10.9x (+0.52z)|"),
            true,
        )
        .unwrap_err();
        assert!(e.message.contains("unreadable loss"), "{e}");
        // llm.c before its z-scores printed `train loss L |`: the same reader as `bench
        // ingest` takes both.
        let (steps, _) = log::read_all(
            &mut parser(),
            &text.replace("| loss 10.912345 (+0.52z)|", "| train loss 10.912345 |"),
            true,
        )
        .unwrap();
        assert_eq!(steps[2].loss, 10.912345);
        let e = log::read_all(
            &mut parser(),
            &text.replace(
                "device memory usage",
                "WARNING: Fell back to cudaMallocManaged when initializing m,v,master_weights on 1 GPUs\ndevice memory usage",
            ),
            true,
        )
        .unwrap_err();
        assert!(e.message.contains("managed (host) memory"), "{e}");
        // A GPU llm.c's peak table lacks prints -100%: no framework MFU, the step stands.
        let (steps, _) = log::read_all(
            &mut parser(),
            &text.replace("| 41.2% bf16 MFU |", "| -100.0% bf16 MFU |"),
            true,
        )
        .unwrap();
        assert_eq!(steps[2].mfu, None);
    }
}
