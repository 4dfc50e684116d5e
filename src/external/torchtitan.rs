//! The torchtitan adapter (torchtitan 0.2.x): bench's axes to torchtitan's TOML config,
//! launched with torchrun through `scripts/frameworks/torchtitan_train.py`, and its
//! `step: ... tps: ... mfu: ...` log lines read back.
//!
//! The model is bench's preset, registered with torchtitan as the llama3 flavor `bench`
//! (same width, layers, heads, FFN and vocabulary), so FLOPs per token are the same for
//! both. Step times come from the timestamps of consecutive step lines of rank 0 (torchtitan
//! logs every step, `metrics.log_freq = 1`): the interval torchtitan's own `tps` divides by.

use std::sync::LazyLock;

use regex::Regex;

use super::adapter::Config;
use super::launch::AttemptFiles;
use super::log::{self, DriverInfo, Line, LogParser, LoggedStep, ParseError, Progress, StepLines};
use crate::cell::Cell;
use crate::cell::FrameworkOpts;

pub(crate) struct Torchtitan;

pub(crate) const NAME: &str = "torchtitan";

/// A TOML value of the config file.
enum Toml {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    List(Vec<String>),
}

fn toml_str(s: &str) -> String {
    // JSON string escapes are valid TOML basic-string escapes.
    serde_json::to_string(s).unwrap_or_default()
}

impl Toml {
    fn render(&self) -> String {
        match self {
            Toml::Str(s) => toml_str(s),
            Toml::Int(i) => i.to_string(),
            Toml::Float(f) => format!("{f:?}"),
            Toml::Bool(b) => b.to_string(),
            Toml::List(v) => format!(
                "[{}]",
                v.iter().map(|s| toml_str(s)).collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

/// The keyword arguments of torchtitan's `TransformerModelArgs` for a preset: FFN width is
/// given exactly (`multiple_of` = the width, and a multiplier only when torchtitan's
/// default 8/3 x hidden would exceed it).
pub(crate) fn model_args(cfg: &crate::workload::models::presets::ModelConfig) -> serde_json::Value {
    let base = (2 * 4 * cfg.hidden) / 3;
    let multiplier = if base <= cfg.ffn {
        serde_json::Value::Null
    } else {
        serde_json::json!(cfg.ffn as f64 / base as f64)
    };
    serde_json::json!({
        "dim": cfg.hidden,
        "n_layers": cfg.layers,
        "n_heads": cfg.heads,
        "n_kv_heads": cfg.kv_heads,
        "vocab_size": cfg.vocab,
        "multiple_of": cfg.ffn,
        "ffn_dim_multiplier": multiplier,
        "norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
    })
}

/// Pseudo-random words for torchtitan's JSON-lines text loader: the throughput of a step
/// does not depend on the text, and a file generated from the seed needs no download.
fn synthetic_text(seed: u64, records: usize, words: usize) -> String {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
        | 1;
    let mut out = String::with_capacity(records * words * 7);
    for _ in 0..records {
        out.push_str("{\"text\": \"");
        for w in 0..words {
            if w > 0 {
                out.push(' ');
            }
            // xorshift64*: fast, and the same text for the same seed everywhere.
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let r = x.wrapping_mul(0x2545F4914F6CDD1D);
            let len = 2 + (r % 7) as usize;
            for i in 0..len {
                out.push((b'a' + ((r >> (8 + 5 * i)) % 26) as u8) as char);
            }
        }
        out.push_str("\"}\n");
    }
    out
}

impl super::adapter::Adapter for Torchtitan {
    fn config(&self, cell: &Cell, opts: &FrameworkOpts, files: &AttemptFiles) -> Config {
        let p = &cell.params;
        let cfg = super::mapping::mapped_llama(cell);
        let (tp, replicate, shard) = super::mapping::parallel_degrees(cell);
        let features = cell.features();
        let data_dir = files.dir.join("data");
        let tokenizer = opts
            .tokenizer
            .clone()
            .unwrap_or_else(|| "tests/assets/tokenizer".to_string());
        let mut sections: Vec<(&str, Vec<(&str, Toml)>)> = vec![
            (
                "job",
                vec![
                    (
                        "dump_folder",
                        Toml::Str(files.dir.join("outputs").display().to_string()),
                    ),
                    ("description", Toml::Str(format!("bench cell {}", cell.id))),
                ],
            ),
            (
                "metrics",
                vec![
                    ("log_freq", Toml::Int(1)),
                    ("disable_color_printing", Toml::Bool(true)),
                    ("enable_tensorboard", Toml::Bool(false)),
                ],
            ),
            (
                "model",
                vec![
                    ("name", Toml::Str("llama3".into())),
                    ("flavor", Toml::Str("bench".into())),
                    ("hf_assets_path", Toml::Str(tokenizer)),
                    (
                        "converters",
                        Toml::List(if cell.dtype().name() == "fp8" {
                            vec!["quantize.linear.float8".into()]
                        } else {
                            vec![]
                        }),
                    ),
                ],
            ),
            (
                "optimizer",
                vec![
                    ("name", Toml::Str("AdamW".into())),
                    ("lr", Toml::Float(p.lr)),
                ],
            ),
            (
                "lr_scheduler",
                vec![("warmup_steps", Toml::Int(p.warmup.into()))],
            ),
            (
                "training",
                vec![
                    ("local_batch_size", Toml::Int(p.micro_batch.into())),
                    ("global_batch_size", Toml::Int(p.global_batch.into())),
                    ("seq_len", Toml::Int(p.seq_len.into())),
                    ("steps", Toml::Int(p.steps.into())),
                    ("dataset", Toml::Str("c4_test".into())),
                    ("dataset_path", Toml::Str(data_dir.display().to_string())),
                    (
                        "mixed_precision_param",
                        Toml::Str(
                            if cell.dtype().name() == "fp32" {
                                "float32"
                            } else {
                                "bfloat16"
                            }
                            .into(),
                        ),
                    ),
                ],
            ),
            (
                "parallelism",
                vec![
                    (
                        "data_parallel_replicate_degree",
                        Toml::Int(replicate.into()),
                    ),
                    ("data_parallel_shard_degree", Toml::Int(shard.into())),
                    ("tensor_parallel_degree", Toml::Int(tp.into())),
                    ("pipeline_parallel_degree", Toml::Int(1)),
                    ("context_parallel_degree", Toml::Int(1)),
                ],
            ),
            ("checkpoint", vec![("enable", Toml::Bool(false))]),
            (
                "activation_checkpoint",
                if features.contains("sac") {
                    vec![
                        ("mode", Toml::Str("selective".into())),
                        ("selective_ac_option", Toml::Str(p.sac_every.to_string())),
                    ]
                } else {
                    vec![("mode", Toml::Str("none".into()))]
                },
            ),
            (
                "compile",
                vec![
                    ("enable", Toml::Bool(features.contains("compile"))),
                    (
                        "components",
                        Toml::List(vec!["model".into(), "loss".into()]),
                    ),
                ],
            ),
            ("debug", vec![("seed", Toml::Int(p.seed as i64))]),
        ];
        if cell.dtype().name() == "fp8" {
            sections.push((
                "quantize.linear.float8",
                vec![
                    ("recipe_name", Toml::Str("tensorwise".into())),
                    ("filter_fqns", Toml::List(vec!["output".into()])),
                ],
            ));
        }
        let model = model_args(&cfg);
        let mut text = format!(
            "# torchtitan config written by bench for cell {}\n# bench model ({}): {}\n",
            cell.id, cfg.name, model
        );
        for (name, keys) in &sections {
            text.push_str(&format!("\n[{name}]\n"));
            for (k, v) in keys {
                text.push_str(&format!("{k} = {}\n", v.render()));
            }
        }
        Config {
            ext: "toml",
            text,
            env: vec![("BENCH_TT_MODEL".into(), model.to_string())],
            files: vec![(
                data_dir.join("data.json"),
                synthetic_text(p.seed, 2000, 200).into_bytes(),
            )],
        }
    }

    fn parser(&self, cell: &Cell) -> Box<dyn LogParser> {
        log::reader(cell, TitanLog::default())
    }
}

static STEP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"^\[titan\] (\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3}) - \S+ - INFO - ",
        r"step:\s*(\d+)\s+loss:\s*(\S+)\s+grad_norm:\s*(\S+)\s+",
        r"memory:\s*([0-9.]+)GiB\(([0-9.]+)%\)\s+tps:\s*([0-9,]+)\s+",
        r"tflops:\s*([0-9,.]+)\s+mfu:\s*([0-9.]+)%\s*$"
    ))
    .expect("static regex")
});
static CONFIG: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"local batch size (\d+), global batch size (\d+), gradient accumulation steps (\d+), sequence length (\d+), total steps (\d+)")
        .expect("static regex")
});

/// Milliseconds since the epoch of torchtitan's `%(asctime)s` (`2026-11-22 10:00:00,123`).
fn millis(ts: &str) -> Option<i64> {
    let fmt = time::macros::format_description!(
        "[year]-[month]-[day] [hour]:[minute]:[second],[subsecond digits:3]"
    );
    let t = time::PrimitiveDateTime::parse(ts, &fmt).ok()?;
    Some((t.assume_utc().unix_timestamp_nanos() / 1_000_000) as i64)
}

/// torchtitan's log, as `bench adapt` reads it.
#[derive(Default)]
pub(crate) struct TitanLog {
    last_ms: Option<i64>,
    /// Tokens per step per data-parallel rank, from torchtitan's own config line.
    local_tokens: Option<u64>,
}

impl StepLines for TitanLog {
    const NAME: &'static str = NAME;
    const METHOD: &'static str = "torchtitan 0.2 per-step log (log_freq 1): tps and tflops per GPU, MFU against torchtitan's own bf16 peak table; medians over the measured steps";

    fn line(&mut self, log: &mut Progress, line: &Line<'_>) -> Result<Vec<LoggedStep>, ParseError> {
        let text = line.text.as_str();
        if let Some(c) = CONFIG.captures(text) {
            let n = |i: usize| c[i].parse::<u64>().unwrap_or(0);
            self.local_tokens = Some(n(1) * n(3) * n(4));
            let asked = log.asked.steps;
            line.agrees(n(5), u64::from(asked), || {
                format!(
                    "torchtitan says it runs {} steps, the cell asked for {asked}: the config did not take",
                    n(5)
                )
            })?;
            return Ok(vec![]);
        }
        if !text.contains(" - INFO - step:") {
            return Ok(vec![]);
        }
        let c = STEP
            .captures(text)
            .ok_or_else(|| line.bad("a step line that does not read as torchtitan 0.2's `step: .. loss: .. grad_norm: .. memory: ..GiB(..%) tps: .. tflops: .. mfu: ..%`"))?;
        let step: u64 = line.int(&c[2], "step number")?;
        let mem_gib = line.number(&c[5], "memory")?;
        let r = line.rank.unwrap_or(0);
        log.memory
            .record(r, (mem_gib * (1u64 << 30) as f64).round() as u64);
        log.in_order(line, step)?;
        if r != 0 {
            // Other ranks' lines give their memory; rank 0 (or an unprefixed one-rank log)
            // gives the steps, whichever rank's line torchrun printed first.
            return Ok(vec![]);
        }
        let ms = millis(&c[1]).ok_or_else(|| line.bad("unreadable timestamp"))?;
        let tps = line.number(&c[7], "tps")?;
        let step_time_s = match self.last_ms {
            Some(prev) if ms > prev => (ms - prev) as f64 / 1000.0,
            Some(_) => return Err(line.bad("timestamps do not advance between steps; the step time cannot be read from them")),
            // The first step has no previous line: its time is the tokens over torchtitan's
            // own throughput (it is a warm-up step, never measured).
            None => match (self.local_tokens, tps > 0.0) {
                (Some(t), true) => t as f64 / tps,
                _ => return Err(line.bad("the first step line came before torchtitan's `Trainer is initialized with ...` line, or with no throughput")),
            },
        };
        self.last_ms = Some(ms);
        Ok(vec![LoggedStep {
            step,
            step_time_s,
            loss: line.number(&c[3], "loss")?,
            tokens_per_s_per_gpu: Some(tps),
            tflops_per_gpu: log::number(&c[8]),
            mfu: log::percent(&c[9]).map(|m| m / 100.0),
        }])
    }

    fn end(&self, log: &Progress, info: &DriverInfo) -> Result<Option<f64>, ParseError> {
        // Each rank's memory comes from its own lines: a run whose lines come from some
        // ranks only lost lines.
        let world = info.world_size.max(1);
        let ranks = log.memory.bytes().len();
        if ranks > 1 && ranks != world as usize {
            return Err(ParseError::new(
                NAME,
                0,
                "",
                format!("memory lines of {ranks} ranks in a {world}-rank run"),
            ));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests;
