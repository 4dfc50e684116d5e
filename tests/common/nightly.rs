//! A generated 300-cell nightly (5 models x 3 dtypes x 4 GPU counts x 3 parallelisms x 4
//! feature sets, minus the combinations three rules drop and a few a filter removes), with
//! regressions, improvements, failed and timed-out cells, and its baselines: the run a
//! report must stay short for. Figures follow DESIGN.md's formulas from a per-model
//! throughput; nothing here is measured.

#![allow(dead_code)]

use std::path::PathBuf;

use bench::baseline::store::merge_run;
use bench::baseline::Baselines;
use bench::cell::{CellId, Value};
use bench::results::RunResults;
use indexmap::IndexMap;
use serde_json::{json, Value as Json};

/// The generated run, its baselines, and which cells the comparison must flag.
pub struct Nightly {
    pub results: RunResults,
    pub baselines: Baselines,
    pub regressed: Vec<String>,
    pub improved: Vec<String>,
    pub failed: Vec<String>,
    pub filtered: Vec<String>,
}

const MODELS: [(&str, f64, f64); 5] = [
    // name, tokens/s per GPU at bf16, parameters
    ("gpt2-125m", 340_000.0, 124e6),
    ("gpt2-350m", 150_000.0, 355e6),
    ("gpt2-1.5b", 43_000.0, 1.56e9),
    ("llama-3.1-8b-proxy", 55_000.0, 1.9e9),
    ("llama-3.1-70b-proxy", 9_000.0, 9.6e9),
];

fn metrics(tokens_per_step: f64, step_time: f64, gpus: u32, n_params: f64) -> Json {
    let tps = tokens_per_step / step_time;
    let per_gpu = tps / f64::from(gpus);
    let tflops = per_gpu * 6.0 * n_params / 1e12;
    let m = |v: f64| json!({"value": v, "samples": [v], "rel_spread": 0.0});
    json!({
        "tokens_per_s": m(tps),
        "tokens_per_s_per_gpu": m(per_gpu),
        "step_time_s": m(step_time),
        "mfu": m(tflops / 989.4),
        "tflops_per_gpu": m(tflops),
        "peak_mem_bytes": m((n_params * 16.0 / f64::from(gpus)).round() + 4e9),
        "time_to_1t_tokens_days": m(1e12 / tps / 86400.0),
    })
}

fn run(id: &str, cells: Vec<Json>, dropped: Vec<Json>, filters: &[&str]) -> RunResults {
    serde_json::from_value(json!({
        "schema_version": 1,
        "run_id": id,
        "matrix": "matrix/nightly-h100.yaml",
        "matrix_name": "nightly-h100",
        "filters": filters,
        "started_at": "2026-11-22T02:00:00Z",
        "finished_at": "2026-11-22T05:10:00Z",
        "environment": {
            "gpu_model": "NVIDIA H100 80GB HBM3", "gpu_count": 8, "gpu_memory_mib": 81559,
            "driver": "570.86.15", "cuda": "12.8", "libtorch": "2.11.0", "nccl": "2.27.3",
            "cpu": "Intel Xeon Platinum 8480+", "host": "gpu-runner-07", "os": "Linux 6.8",
            "git_commit": "5e6f7a8b9c0d", "git_dirty": false, "bench_version": "0.1.0",
            "hardware_key": "h100-sxm-80gb"
        },
        "cells": cells,
        "dropped": dropped,
    }))
    .expect("the generated run is a valid results document")
}

/// The 300-cell nightly. `current` false gives the earlier run the baselines come from.
fn generate(current: bool) -> Nightly {
    let mut cells = Vec::new();
    let mut dropped = Vec::new();
    let (mut regressed, mut improved, mut failed, mut filtered) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let features: [&[&str]; 4] = [&[], &["compile"], &["sac"], &["compile", "sac"]];
    for (model, tps, n_params) in MODELS {
        for dtype in ["fp32", "bf16", "fp8"] {
            for gpus in [1u32, 2, 4, 8] {
                for parallel in ["single", "ddp", "fsdp"] {
                    for feats in features {
                        let mut values: IndexMap<String, Value> = IndexMap::new();
                        values.insert("model".into(), Value::Str(model.into()));
                        values.insert("dtype".into(), Value::Str(dtype.into()));
                        values.insert("gpus".into(), Value::Int(i64::from(gpus)));
                        values.insert("parallel".into(), Value::Str(parallel.into()));
                        values.insert(
                            "features".into(),
                            Value::Set(feats.iter().map(|s| s.to_string()).collect()),
                        );
                        let id = CellId::from_values(&values).as_str().to_string();
                        let drop = |by: &str, reason: &str| json!({"id": id, "values": values, "by": by, "reason": reason});
                        if parallel == "single" && gpus > 1 {
                            dropped.push(drop(
                                "rules[0] (single-is-one-gpu)",
                                "single runs on one GPU",
                            ));
                            continue;
                        }
                        if dtype == "fp32" && model != "gpt2-125m" {
                            dropped.push(drop(
                                "rules[1] (fp32-small-only)",
                                "fp32 is measured on the smallest model only",
                            ));
                            continue;
                        }
                        if dtype == "fp8" && feats.contains(&"sac") {
                            dropped.push(drop(
                                "rules[2] (fp8-no-sac)",
                                "fp8 with selective activation checkpointing is not supported",
                            ));
                            continue;
                        }
                        if cells.len() == 300 {
                            dropped.push(drop("--filter 'gpus <= 8'", "did not match"));
                            filtered.push(id);
                            continue;
                        }
                        let i = cells.len();
                        let dtype_f = match dtype {
                            "fp32" => 0.3,
                            "fp8" => 1.3,
                            _ => 1.0,
                        };
                        let feat_f = 1.0 + 0.05 * f64::from(u8::from(feats.contains(&"compile")))
                            - 0.2 * f64::from(u8::from(feats.contains(&"sac")));
                        let scale_f = 1.0 - 0.01 * f64::from(gpus.trailing_zeros());
                        let mut per_gpu = tps * dtype_f * feat_f * scale_f;
                        let mut outcome = json!({"status": "passed"});
                        if current {
                            if i % 20 == 7 {
                                per_gpu *= 0.92;
                                regressed.push(id.clone());
                            } else if i % 30 == 11 {
                                per_gpu *= 1.07;
                                improved.push(id.clone());
                            } else if i % 50 == 3 {
                                outcome = json!({"status": "failed", "reason": "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB"});
                                failed.push(id.clone());
                            } else if i == 111 || i == 222 {
                                outcome = json!({"status": "timed_out", "reason": "no summary after 1800 s: killed"});
                                failed.push(id.clone());
                            }
                        }
                        let tokens = 8.0 * 1024.0 * f64::from(gpus);
                        let step_time = tokens / (per_gpu * f64::from(gpus));
                        let passed = outcome["status"] == "passed";
                        // Thirty steps, five of them warm-up (slower, the first much slower).
                        let steps: Vec<Json> = (0..30u32)
                            .map(|s| {
                                let t = match s {
                                    0 => step_time * 20.0,
                                    1..=4 => step_time * 1.3,
                                    _ => step_time * (1.0 + 0.004 * f64::from(s).sin()),
                                };
                                json!({"step": s, "step_time_s": t, "tokens": tokens as u64,
                                       "loss": 11.0 - 3.0 * (1.0 - (-f64::from(s) / 10.0).exp())})
                            })
                            .collect();
                        let mut cell = json!({
                            "id": id, "values": values,
                            "params": {"steps": 30, "warmup": 5, "seq_len": 1024, "micro_batch": 8,
                                "grad_accum": 1, "global_batch": 8 * gpus, "repeats": 1,
                                "timeout_s": 1800, "retries": 1, "sac_every": 1, "seed": 0,
                                "lr": 0.0003, "workload": {"kind": "builtin"}},
                            "flaky": false, "attempts": [], "repeats": [], "metrics": {},
                            "logs": [], "duration_s": 60.0 + i as f64,
                        });
                        for (k, v) in outcome.as_object().unwrap() {
                            cell[k] = v.clone();
                        }
                        if passed {
                            cell["repeats"] = json!([{"steps": steps, "summary": {
                                "mfu_policy": "H100 SXM bf16 dense 989.4 TFLOP/s"}}]);
                            cell["metrics"] = metrics(tokens, step_time, gpus, n_params);
                        }
                        cells.push(cell);
                    }
                }
            }
        }
    }
    let results = run(
        if current {
            "20261122T020000Z"
        } else {
            "20261121T020000Z"
        },
        cells,
        dropped,
        &["gpus <= 8"],
    );
    Nightly {
        results,
        baselines: Baselines::empty(
            PathBuf::from("baselines/h100-sxm-80gb.yaml"),
            "h100-sxm-80gb",
        ),
        regressed,
        improved,
        failed,
        filtered,
    }
}

/// The 300-cell nightly and baselines written from the run before it.
pub fn nightly() -> Nightly {
    let previous = generate(false);
    let mut now = generate(true);
    merge_run(
        &mut now.baselines,
        &previous.results,
        &|_| true,
        &|_| false,
        false,
    );
    now.baselines.existed = true;
    now
}

/// A small run with a `framework` axis (two frameworks at one and two GPUs), for the
/// framework comparison.
pub fn frameworks_run() -> RunResults {
    let mut cells = Vec::new();
    for (framework, tps) in [("bench", 45_000.0), ("torchtitan", 41_000.0)] {
        for gpus in [1u32, 2] {
            let mut values: IndexMap<String, Value> = IndexMap::new();
            values.insert("model".into(), Value::Str("gpt2-1.5b".into()));
            values.insert("framework".into(), Value::Str(framework.into()));
            values.insert("gpus".into(), Value::Int(i64::from(gpus)));
            values.insert("parallel".into(), Value::Str("fsdp".into()));
            let id = CellId::from_values(&values).as_str().to_string();
            let tokens = 8.0 * 1024.0 * f64::from(gpus);
            let step_time = tokens / (tps * f64::from(gpus) * (1.0 - 0.02 * f64::from(gpus - 1)));
            let steps: Vec<Json> = (0..20u32)
                .map(|s| {
                    let t = if s < 3 { step_time * 1.5 } else { step_time };
                    json!({"step": s, "step_time_s": t, "tokens": tokens as u64, "loss": 10.0 - 0.1 * f64::from(s)})
                })
                .collect();
            cells.push(json!({
                "id": id, "values": values,
                "params": {"steps": 20, "warmup": 3, "seq_len": 1024, "micro_batch": 8,
                    "grad_accum": 1, "global_batch": 8 * gpus, "repeats": 1, "timeout_s": 1800,
                    "retries": 0, "sac_every": 1, "seed": 0, "lr": 0.0003,
                    "workload": {"kind": "builtin"}},
                "status": "passed", "flaky": false, "attempts": [],
                "repeats": [{"steps": steps, "summary": {}}],
                "metrics": metrics(tokens, step_time, gpus, 1.56e9),
                "logs": [], "duration_s": 90.0,
            }));
        }
    }
    run("20261122T030000Z", cells, Vec::new(), &[])
}

/// Ten earlier nightlies of the regressed cells' tokens/s per GPU, with a change point at
/// the seventh, as the run history hands them to the reports.
pub fn history(n: &Nightly) -> bench::trend::Trends {
    use bench::trend::{TrendPoint, TrendSeries, Trends};
    let series = n
        .regressed
        .iter()
        .map(|id| {
            let base = n.baselines.cell(id).unwrap().metrics["tokens_per_s_per_gpu"].value;
            TrendSeries {
                cell: id.clone(),
                metric: "tokens_per_s_per_gpu".into(),
                points: (0..10u32)
                    .map(|k| TrendPoint {
                        time: format!("2026-11-{:02}T02:00:00Z", 12 + k),
                        commit: Some(format!("{:07x}", 0xabc0000 + k * 4099)),
                        value: base
                            * if k >= 6 { 0.93 } else { 1.0 }
                            * (1.0 + 0.002 * f64::from(k).sin()),
                        change_point: k == 6,
                    })
                    .collect(),
            }
        })
        .collect();
    Trends { series }
}
