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

use super::log::{self, DriverInfo, LogEnd, LogParser, LoggedStep, ParseError, StepOrder};
use super::{AttemptFiles, FrameworkOpts, Prepared};
use crate::cell::Cell;

pub struct Torchtitan;

const NAME: &str = "torchtitan";

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
pub fn model_args(cfg: &crate::workload::models::presets::ModelConfig) -> serde_json::Value {
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

impl super::Adapter for Torchtitan {
    fn name(&self) -> &'static str {
        NAME
    }

    fn unexpressible(&self, cell: &Cell) -> Option<String> {
        let cfg = match super::llama_preset(cell, NAME) {
            Ok(c) => c,
            Err(e) => return Some(e),
        };
        if let Some(why) = super::common_checks(cell, NAME, &["compile", "sac"]) {
            return Some(why);
        }
        if !matches!(cell.dtype().name(), "bf16" | "fp32" | "fp8") {
            return Some(format!(
                "dtype `{}` is not bf16, fp32 or fp8",
                cell.dtype().name()
            ));
        }
        let tp = super::degree(cell, "tp");
        if super::degree(cell, "pp") > 1 {
            return Some(
                "the torchtitan adapter does not map pipeline schedules (pp > 1) yet".into(),
            );
        }
        if tp > 1 && cell.parallel().name() == "ddp" {
            return Some("torchtitan's DDP does not combine with tensor parallelism".into());
        }
        if tp > 1 && (cfg.heads % i64::from(tp) != 0 || cfg.kv_heads % i64::from(tp) != 0) {
            return Some(format!(
                "tp {tp} does not divide the {} heads and {} key/value heads",
                cfg.heads, cfg.kv_heads
            ));
        }
        None
    }

    fn prepare(&self, cell: &Cell, opts: &FrameworkOpts, files: &AttemptFiles) -> Prepared {
        let p = &cell.params;
        let cfg = super::llama_preset(cell, NAME).unwrap_or_else(|_| {
            crate::workload::models::presets::get("llama-tiny").expect("built-in preset")
        });
        let tp = super::degree(cell, "tp");
        let dp = cell.gpus() / tp.max(1);
        let (replicate, shard) = match cell.parallel().name() {
            "ddp" => (dp, 1),
            _ => (1, dp),
        };
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
        let mut argv = super::torchrun(&files.python, cell.gpus());
        argv.push(
            files
                .scripts
                .join("torchtitan_train.py")
                .display()
                .to_string(),
        );
        argv.push("--job.config_file".into());
        argv.push("{config}".into());
        argv.extend(opts.args.iter().cloned());
        Prepared {
            config_ext: "toml",
            config_text: text,
            argv,
            env: vec![("BENCH_TT_MODEL".into(), model.to_string())],
            files: vec![(
                data_dir.join("data.json"),
                synthetic_text(p.seed, 2000, 200),
            )],
        }
    }

    fn parser(&self, cell: &Cell) -> Box<dyn LogParser> {
        Box::new(TitanLog {
            steps_expected: cell.params.steps,
            ..TitanLog::default()
        })
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
pub struct TitanLog {
    steps_expected: u32,
    info: Option<DriverInfo>,
    order: StepOrder,
    last_ms: Option<i64>,
    mem: std::collections::BTreeMap<u32, u64>,
    /// Tokens per step per data-parallel rank, from torchtitan's own config line.
    local_tokens: Option<u64>,
}

impl LogParser for TitanLog {
    fn line(&mut self, line_no: usize, raw: &str) -> Result<Vec<LoggedStep>, ParseError> {
        let (rank, text) = log::split_rank(raw);
        if let Some(info) = log::driver_info(NAME, line_no, &text) {
            self.info = Some(info?);
            return Ok(vec![]);
        }
        if let Some(c) = CONFIG.captures(&text) {
            let n = |i: usize| c[i].parse::<u64>().unwrap_or(0);
            self.local_tokens = Some(n(1) * n(3) * n(4));
            if n(5) != u64::from(self.steps_expected) {
                return Err(ParseError::new(
                    NAME,
                    line_no,
                    raw,
                    format!(
                        "torchtitan says it runs {} steps, the cell asked for {}: the config did not take",
                        n(5),
                        self.steps_expected
                    ),
                ));
            }
            return Ok(vec![]);
        }
        if !text.contains(" - INFO - step:") {
            return Ok(vec![]);
        }
        let bad = |msg: &str| ParseError::new(NAME, line_no, raw, msg.to_string());
        let c = STEP
            .captures(&text)
            .ok_or_else(|| bad("a step line that does not read as torchtitan 0.2's `step: .. loss: .. grad_norm: .. memory: ..GiB(..%) tps: .. tflops: .. mfu: ..%`"))?;
        let step: u64 = c[2].parse().map_err(|_| bad("step number out of range"))?;
        let mem_gib = log::number(&c[5]).ok_or_else(|| bad("unreadable memory"))?;
        let r = rank.unwrap_or(0);
        let e = self.mem.entry(r).or_default();
        *e = (*e).max((mem_gib * (1u64 << 30) as f64).round() as u64);
        self.order.check(rank, step).map_err(|m| bad(&m))?;
        if r != 0 {
            // Other ranks' lines give their memory; rank 0 (or an unprefixed one-rank log)
            // gives the steps, whichever rank's line torchrun printed first.
            return Ok(vec![]);
        }
        let ms = millis(&c[1]).ok_or_else(|| bad("unreadable timestamp"))?;
        let tps = log::number(&c[7]).ok_or_else(|| bad("unreadable tps"))?;
        let step_time_s = match self.last_ms {
            Some(prev) if ms > prev => (ms - prev) as f64 / 1000.0,
            Some(_) => return Err(bad("timestamps do not advance between steps; the step time cannot be read from them")),
            // The first step has no previous line: its time is the tokens over torchtitan's
            // own throughput (it is a warm-up step, never measured).
            None => match (self.local_tokens, tps > 0.0) {
                (Some(t), true) => t as f64 / tps,
                _ => return Err(bad("the first step line came before torchtitan's `Trainer is initialized with ...` line, or with no throughput")),
            },
        };
        self.last_ms = Some(ms);
        let logged = LoggedStep {
            step,
            step_time_s,
            loss: log::number(&c[3]).ok_or_else(|| bad("unreadable loss"))?,
            tokens_per_s_per_gpu: Some(tps),
            tflops_per_gpu: log::number(&c[8]),
            mfu: log::number(&c[9]).map(|m| m / 100.0),
        };
        Ok(vec![logged])
    }

    fn finish(&mut self, exited_ok: bool) -> Result<(Vec<LoggedStep>, LogEnd), ParseError> {
        let info = log::check_complete(
            NAME,
            &self.info,
            self.order.last_step(),
            self.steps_expected,
            exited_ok,
        )?;
        let world = info.world_size.max(1);
        let peak: Vec<u64> = self.mem.values().copied().collect();
        if peak.len() > 1 && peak.len() != world as usize {
            return Err(ParseError::new(
                NAME,
                0,
                "",
                format!("memory lines of {} ranks in a {world}-rank run", peak.len()),
            ));
        }
        Ok((
            vec![],
            LogEnd {
                info,
                peak_mem_bytes: peak,
                run_tokens_per_s_per_gpu: None,
                method: "torchtitan 0.2 per-step log (log_freq 1): tps and tflops per GPU, MFU against torchtitan's own bf16 peak table; medians over the measured steps".into(),
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::external::Adapter;

    #[test]
    fn ffn_width_is_exact() {
        for name in [
            "llama-3.1-8b-proxy",
            "llama-3.1-70b",
            "llama-3.1-405b",
            "llama-tiny",
        ] {
            let cfg = crate::workload::models::presets::get(name).unwrap();
            let a = model_args(&cfg);
            // torchtitan's FeedForward: int(2*4*dim/3), times the multiplier, rounded up to
            // a multiple of `multiple_of`.
            let mut h = (2 * 4 * cfg.hidden) / 3;
            if let Some(m) = a["ffn_dim_multiplier"].as_f64() {
                h = (m * h as f64) as i64;
            }
            let m = a["multiple_of"].as_i64().unwrap();
            assert_eq!(m * ((h + m - 1) / m), cfg.ffn, "{name}");
        }
    }

    #[test]
    fn mapping_of_a_fsdp_fp8_cell() {
        let mut c = crate::external::tests::cell(
            "llama-3.1-8b-proxy",
            "fp8",
            2,
            "fsdp",
            &["compile", "sac"],
        );
        c.params.sac_every = 2;
        assert_eq!(Torchtitan.unexpressible(&c), None);
        let files = AttemptFiles {
            dir: "/run/frameworks/x".into(),
            scripts: "/s".into(),
            python: "py".into(),
        };
        let p = Torchtitan.prepare(&c, &FrameworkOpts::default(), &files);
        for want in [
            "data_parallel_shard_degree = 2",
            "data_parallel_replicate_degree = 1",
            "converters = [\"quantize.linear.float8\"]",
            "selective_ac_option = \"2\"",
            "[compile]\nenable = true",
            "global_batch_size = 4",
            "seq_len = 256",
            "log_freq = 1",
        ] {
            assert!(
                p.config_text.contains(want),
                "{want} missing in\n{}",
                p.config_text
            );
        }
        assert_eq!(
            &p.argv[..6],
            &[
                "py",
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                "2"
            ]
        );
        let gpt = crate::external::tests::cell("gpt2-125m", "bf16", 1, "single", &[]);
        assert!(Torchtitan.unexpressible(&gpt).unwrap().contains("Llama"));
    }

    #[test]
    fn synthetic_text_is_json_lines_and_seeded() {
        let a = synthetic_text(1, 3, 5);
        assert_eq!(a, synthetic_text(1, 3, 5));
        assert_ne!(a, synthetic_text(2, 3, 5));
        for l in a.lines() {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert_eq!(v["text"].as_str().unwrap().split(' ').count(), 5);
        }
    }

    #[test]
    fn timestamps_to_millis() {
        assert_eq!(
            millis("2026-11-22 10:00:01,250").unwrap() - millis("2026-11-22 10:00:00,000").unwrap(),
            1250
        );
        assert_eq!(millis("yesterday"), None);
    }

    fn fixture(name: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/frameworks")
            .join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    fn parser(steps: u32) -> TitanLog {
        TitanLog {
            steps_expected: steps,
            ..TitanLog::default()
        }
    }

    const SOURCE_2RANK: &str = "torchtitan-0.2.2-2rank-from-source.log";

    #[test]
    fn two_rank_log_from_torchtitans_logging_code() {
        let (steps, end) = log::read_all(&mut parser(8), &fixture(SOURCE_2RANK), true).unwrap();
        assert_eq!(steps.len(), 8, "rank 0's steps only");
        assert!(
            (steps[0].step_time_s - 4.0).abs() < 1e-9,
            "2048 tokens at 512 tps"
        );
        for s in &steps[1..] {
            assert!((s.step_time_s - 0.5).abs() < 1e-9, "{s:?}");
            assert_eq!(s.tokens_per_s_per_gpu, Some(4096.0));
        }
        assert!((steps[7].loss - 9.2).abs() < 1e-9);
        let gib = (1u64 << 30) as f64;
        assert_eq!(
            end.peak_mem_bytes,
            vec![(10.08 * gib).round() as u64, (10.58 * gib).round() as u64]
        );
        assert_eq!(end.info.version, "0.2.2");
        assert_eq!(end.info.world_size, 2);
    }

    #[test]
    fn interleaved_ranks_without_prefixes_are_refused() {
        let text: String = fixture(SOURCE_2RANK)
            .lines()
            .map(|l| log::split_rank(l).1 + "\n")
            .collect();
        let e = log::read_all(&mut parser(8), &text, true).unwrap_err();
        assert!(e.message.contains("mixed"), "{e}");
        assert!(e.line.contains("step:  1"), "{e}");
    }

    #[test]
    fn truncated_logs_are_refused() {
        let text = fixture(SOURCE_2RANK);
        let lines: Vec<&str> = text.lines().collect();
        // The tail cut after step 7: the framework "exited 0" but step 8 never came.
        let cut = lines.iter().position(|l| l.contains("step:  8")).unwrap();
        let head = lines[..cut].join("\n");
        let e = log::read_all(&mut parser(8), &head, true).unwrap_err();
        assert!(e.message.contains("ends after step 7 of 8"), "{e}");
        // A cut inside a step line is a malformed line, not a short number.
        let partial = format!("{}\n{}", head, &lines[cut][..lines[cut].len() - 12]);
        let e = log::read_all(&mut parser(8), &partial, true).unwrap_err();
        assert_eq!(e.line_no, cut + 1);
        // The head lost: no driver line.
        let tail = lines[6..].join("\n");
        let e = log::read_all(&mut parser(8), &tail, true).unwrap_err();
        assert!(e.message.contains("bench-framework"), "{e}");
        // A lost line in the middle.
        let mut gap: Vec<&str> = lines.clone();
        gap.retain(|l| !l.starts_with("[rank0]") || !l.contains("step:  4"));
        let e = log::read_all(&mut parser(8), &gap.join("\n"), true).unwrap_err();
        assert!(e.message.contains("step 5 follows step 3"), "{e}");
    }

    #[test]
    fn malformed_step_lines_are_refused() {
        let text = fixture(SOURCE_2RANK).replacen("tps: 4,096", "tps: fast", 1);
        let e = log::read_all(&mut parser(8), &text, true).unwrap_err();
        assert!(e.to_string().contains("tps: fast"), "{e}");
        let text = fixture(SOURCE_2RANK).replacen("total steps 8", "total steps 9", 1);
        let e = log::read_all(&mut parser(8), &text, true).unwrap_err();
        assert!(e.message.contains("did not take"), "{e}");
    }

    #[test]
    fn captured_two_rank_h200_log() {
        let text = fixture("torchtitan-0.2.2-h200x2-fsdp.log");
        let (steps, end) = log::read_all(&mut parser(12), &text, true).unwrap();
        assert_eq!(steps.len(), 12);
        // Rank 0's timestamps 01:30:09,724 and 01:30:09,914 (rank 1 printed first).
        assert!(
            (steps[11].step_time_s - 0.190).abs() < 1e-9,
            "{:?}",
            steps[11]
        );
        assert_eq!(steps[11].tokens_per_s_per_gpu, Some(43315.0));
        assert!((steps[11].loss - 3.45591).abs() < 1e-12);
        let gib = (1u64 << 30) as f64;
        assert_eq!(end.peak_mem_bytes, vec![(25.67 * gib).round() as u64; 2]);
        assert_eq!(end.info.device, "NVIDIA H200");
        // The same lines without torchrun's prefixes cannot be attributed: refused.
        let bare: String = text.lines().map(|l| log::split_rank(l).1 + "\n").collect();
        assert!(log::read_all(&mut parser(12), &bare, true).is_err());
    }
}
