//! A generated history store of a fleet's nightly (cells x nights), written through the
//! store's own API (one transaction per run, as a nightly records it, and its verdicts in
//! another), for `bench site`'s tests and for `scripts/site-bench.sh`, which times the
//! site over 1,000 cells x 365 runs. The figures are made up, and deterministic.
//!
//! What it holds, so the site has something of each kind to show: every cell's
//! tokens/s with 3 repeats and 0.4% noise; a 5% slowdown of every `compile` cell two
//! thirds of the way in, accepted (`bench baseline accept`) on the gpt2-125m cells; a 4%
//! regression of every `fp8` cell in the last three runs, still open (verdict
//! `regressed`, the switch `BENCH_FUSED_ADAMW` changed); an `environment` verdict now and
//! then; every seventh run on branch `release`; runs spread over `keys` hardware keys; and,
//! when asked, a cell whose id is markup (`<script>...`), which every page must show as
//! text.
//!
//! And the open fp8 regression's triage, as `bench matrix --history` keeps it (see
//! [`triage`]): on `main`, each regressed run's bisection (out of budget, the newest found,
//! with a first bad commit whose subject and author hold markup), its kernel diff and the
//! rounds it measured (runs on branch `bisect`); on `release`, a bisection skipped for a
//! pull request's run, whose kernels come from the history's `bench_kernels`.
//!
//! And what each night's verdict cost (`bench_costs`): a minute of the cell's GPUs per
//! cell measured, four side-by-side pairs of each regressed cell, a re-run of each cell
//! an environment verdict named, and the night's bisection, except the first night, which
//! stands for a run recorded before the store kept costs and shows none.

use indexmap::IndexMap;

use crate::history::cost::{CellCost, Cost};
use crate::history::record::{CellRecord, MetricRecord, RunRecord, Versions};
use crate::history::{History, HistoryError};
use crate::triage::culprit::{BisectStatus, Bisected, CommitRef};
use crate::triage::kernels::{KernelDiff, KernelSummary, StepTrace};

/// What to generate.
#[derive(Debug, Clone)]
pub struct Spec {
    pub cells: usize,
    pub runs: usize,
    /// Hardware keys; run `i` is on key `i % keys`.
    pub keys: usize,
    /// Replace the first cell's id with one that is markup.
    pub hostile: bool,
}

/// The id of the hostile cell ([`Spec::hostile`]).
pub const HOSTILE_CELL: &str =
    "<script>window.pwned=1</script><img src=x onerror=alert(1)>.bf16.1gpu.single.base";

/// The generated cell ids, in axis order (model, dtype, GPUs, parallelism, features).
pub fn cell_ids(spec: &Spec) -> Vec<String> {
    const MODELS: [&str; 5] = [
        "gpt2-125m",
        "gpt2-350m",
        "gpt2-1.5b",
        "llama-3.1-8b-proxy",
        "qwen2.5-7b-proxy",
    ];
    const DTYPES: [&str; 3] = ["bf16", "fp8", "fp32"];
    const GPUS: [&str; 4] = ["1gpu", "2gpu", "4gpu", "8gpu"];
    const PARALLEL: [&str; 3] = ["single", "ddp", "fsdp"];
    const FEATURES: [&str; 6] = [
        "base",
        "compile",
        "sac",
        "compile+sac",
        "fused",
        "compile+fused",
    ];
    let per = MODELS.len() * DTYPES.len() * GPUS.len() * PARALLEL.len() * FEATURES.len();
    (0..spec.cells)
        .map(|i| {
            if spec.hostile && i == 0 {
                return HOSTILE_CELL.to_string();
            }
            let mut k = i % per;
            let mut pick = |n: usize| {
                let v = k % n;
                k /= n;
                v
            };
            // The dtype varies fastest, so a few dozen cells already hold every dtype.
            let d = DTYPES[pick(DTYPES.len())];
            let f = FEATURES[pick(FEATURES.len())];
            let p = PARALLEL[pick(PARALLEL.len())];
            let g = GPUS[pick(GPUS.len())];
            let m = MODELS[pick(MODELS.len())];
            // Past every combination, a numbered variant of the model keeps ids unique.
            let m = if i >= per {
                format!("{m}-v{}", i / per)
            } else {
                m.to_string()
            };
            format!("{m}.{d}.{g}.{p}.{f}")
        })
        .collect()
}

/// SplitMix64: a small, seeded generator (the figures are the same every time).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

/// Writes the fleet of `spec` into the store at `location` (created when missing).
pub fn generate(location: &str, spec: &Spec) -> Result<(), HistoryError> {
    let mut store = crate::history::open(location)?;
    let cells = cell_ids(spec);
    let mut rng = Rng(0x5eed);
    let keys: Vec<String> = (0..spec.keys.max(1))
        .map(|k| ["h100-sxm-80gb-x8", "h200-141gb-x8", "mi300x-192gb-x8"][k % 3].to_string())
        .collect();
    let shift_at = spec.runs * 2 / 3;
    let open_from = spec.runs.saturating_sub(3);
    let start = time::macros::datetime!(2026-01-01 02:00 UTC);
    let mut recorded: Vec<Night> = Vec::with_capacity(spec.runs);
    for i in 0..spec.runs {
        let key = &keys[i % keys.len()];
        let slow_switch = i >= open_from;
        let mut switches = IndexMap::new();
        if slow_switch {
            switches.insert("BENCH_FUSED_ADAMW".to_string(), "0".to_string());
        }
        let started = start + time::Duration::days(i as i64);
        let started_at = started
            .format(&time::format_description::well_known::Rfc3339)
            .expect("a date formats");
        let mut verdicts = Vec::with_capacity(cells.len());
        let mut cost = Cost::default();
        let mut cell_costs = Vec::new();
        let records = cells
            .iter()
            .enumerate()
            .map(|(c, id)| {
                let base = 50_000.0 + 1_000.0 * (c % 97) as f64;
                let mut v = base;
                if id.contains(".compile") && i >= shift_at {
                    v *= 0.95;
                }
                let fp8 = id.contains(".fp8.");
                if fp8 && slow_switch {
                    v *= 0.96;
                }
                let samples: Vec<f64> = (0..3).map(|_| v * (1.0 + 0.004 * rng.unit())).collect();
                let verdict = if fp8 && slow_switch {
                    "regressed"
                } else if rng.unit() > 0.996 {
                    "environment"
                } else if i < 5 {
                    "insufficient_history"
                } else {
                    "unchanged"
                };
                verdicts.push((id.clone(), verdict.to_string()));
                let gpu_s = 60.0 * gpus_of(id);
                let mut own = Cost {
                    measuring_gpu_s: gpu_s,
                    ..Cost::default()
                };
                match verdict {
                    "regressed" => own.pairs_gpu_s = 8.0 * gpu_s,
                    "environment" => own.reruns_gpu_s = gpu_s,
                    _ => {}
                }
                cost = cost.plus(own);
                cell_costs.push(CellCost {
                    cell_id: id.clone(),
                    cost: own,
                });
                passed_cell(id, samples)
            })
            .collect();
        let run = RunRecord {
            run_id: format!("night-{i:04}-{key}"),
            started_at: started_at.clone(),
            finished_at: Some(started_at),
            commit: Some(format!(
                "{:016x}{:016x}{:08x}",
                rng.next(),
                rng.next(),
                rng.next() as u32
            )),
            git_dirty: false,
            branch: Some(if i % 7 == 6 { "release" } else { "main" }.into()),
            hardware_key: key.clone(),
            // Two runners of the key take the nights in turn, as a CI pool's would.
            host: format!("{key}-runner-{}", 1 + (i / keys.len()) % 2),
            matrix_name: "nightly".into(),
            versions: Versions {
                bench: "0.1.0".into(),
                ..Versions::default()
            },
            switches,
            telemetry: None,
            cells: records,
        };
        store.record_run(&run)?;
        store.set_verdicts(&run.run_id, &verdicts)?;
        recorded.push(Night {
            run_id: run.run_id.clone(),
            started_at: run.started_at.clone(),
            commit: run.commit.clone().unwrap_or_default(),
            key: key.clone(),
            branch: run.branch.clone().unwrap_or_default(),
            cost,
            cell_costs,
        });
    }
    accept_compile_shift(&mut store, &cells, &keys, spec, shift_at)?;
    triage(&mut store, &cells, &mut recorded, open_from)?;
    for night in recorded.iter().skip(1) {
        store.record_cost(&night.run_id, None, night.cost, &night.cell_costs)?;
    }
    Ok(())
}

/// The GPUs of a generated cell (its third part, `8gpu`), 1 when it names none.
fn gpus_of(id: &str) -> f64 {
    id.split('.')
        .nth(2)
        .and_then(|g| g.strip_suffix("gpu"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(1.0)
}

/// A passed cell whose tokens/s are `samples` (three repeats): their median is the value and
/// half their range relative to it the spread, as a recorded run has them.
fn passed_cell(id: &str, samples: Vec<f64>) -> CellRecord {
    let mut sorted = samples.clone();
    sorted.sort_by(f64::total_cmp);
    CellRecord {
        cell_id: id.to_string(),
        status: "passed".into(),
        metrics: vec![MetricRecord {
            name: "tokens_per_s".into(),
            value: sorted[1],
            rel_spread: (sorted[2] - sorted[0]) / sorted[1] / 2.0,
            samples,
        }],
        loss_curve: Vec::new(),
        telemetry: None,
        context: IndexMap::new(),
    }
}

/// What [`triage`] needs of a generated run.
struct Night {
    run_id: String,
    started_at: String,
    commit: String,
    key: String,
    branch: String,
    /// What the night's verdict cost; [`triage`] adds its bisection's.
    cost: Cost,
    /// What each cell's cost (the bisection's goes to the cell it searched).
    cell_costs: Vec<CellCost>,
}

/// The subject of the generated first bad commit: markup, which every page must show as
/// text.
pub const HOSTILE_SUBJECT: &str =
    "optimizer: <img src=x onerror=alert(2)> fuse AdamW & drop the master weights";

/// A step of one traced kernel set: the master-weight AdamW kernel before, libtorch's fused
/// one and more copies after (the change the GPU triage of issue 30 found).
fn step(after: bool) -> KernelSummary {
    let mut k = StepTrace::default();
    k.kernels
        .insert("ampere_bf16_s16816gemm_bf16_128x128".into(), (21_000.0, 96));
    k.kernels.insert("flash_fwd_kernel".into(), (3_100.0, 12));
    if after {
        k.kernels
            .insert("multi_tensor_apply_kernel".into(), (1_330.0, 4));
        k.kernels
            .insert("elementwise_copy_kernel".into(), (1_480.0, 40));
    } else {
        k.kernels.insert("master_adamw".into(), (1_200.0, 1));
        k.kernels
            .insert("elementwise_copy_kernel".into(), (740.0, 20));
    }
    KernelSummary::of(&[k])
}

/// Keeps the fp8 regression's triage through the store's own API, as the nightly does
/// (`bench_triage`, `bench_kernels`, bisection rounds on branch `bisect`).
fn triage(
    store: &mut History,
    cells: &[String],
    nights: &mut [Night],
    open_from: usize,
) -> Result<(), HistoryError> {
    let fp8: Vec<String> = cells
        .iter()
        .filter(|c| c.contains(".fp8."))
        .cloned()
        .collect();
    let Some(cell) = fp8.first() else {
        return Ok(());
    };
    let mut spent = Vec::new();
    // The first bad commit: a commit of the range that no night ran at.
    let bad = |n: &Night| format!("{}f1a5bad0c0ffee000000000000000000", &n.commit[32..]);
    for (i, night) in nights.iter().enumerate().skip(open_from) {
        // The last good run: the newest before the regression on the same key and branch.
        let Some(good) = nights[..open_from]
            .iter()
            .rev()
            .find(|n| n.key == night.key && n.branch == night.branch)
        else {
            continue;
        };
        let newest = !nights[i + 1..]
            .iter()
            .any(|n| n.key == night.key && n.branch == night.branch);
        let range = [good.commit.as_str(), night.commit.as_str()];
        let mut b = Bisected::new(BisectStatus::OutOfBudget, cell, range, 600.0, String::new());
        b.commits = 12;
        b.measured = 3;
        b.rounds_run = 6;
        b.gpu_s = 598.0;
        let mut kernels = None;
        if night.branch != "main" {
            b.status = BisectStatus::Skipped;
            b.evidence = "a pull request's run (into main): the change is the pull request's own; bisection runs on branch runs".into();
            b.measured = 0;
            b.rounds_run = 0;
            b.gpu_s = 0.0;
            // Its kernels are diffed from the history's, as trace_every_run keeps them.
            store.record_kernels(&good.run_id, cell, &to_json(&step(false)))?;
            store.record_kernels(&night.run_id, cell, &to_json(&step(true)))?;
        } else if newest {
            b.status = BisectStatus::Found;
            b.measured = 5;
            b.rounds_run = 4;
            b.rounds_reused = 6;
            b.gpu_s = 410.0;
            b.first_bad = Some(CommitRef {
                sha: bad(night),
                subject: HOSTILE_SUBJECT.into(),
                author: "Nightly Dev <dev@example.com>".into(),
            });
            b.last_good = Some(CommitRef {
                sha: good.commit.clone(),
                subject: "docs: night notes".into(),
                author: "Nightly Dev <dev@example.com>".into(),
            });
            b.evidence = "tokens_per_s -4.0% against the good end, p=0.0079, 5 vs 5 repeats".into();
            kernels = Some(KernelDiff::of(
                cell,
                ["last good", "first bad"],
                &[step(false).step()],
                &[step(true).step()],
                vec![
                    "triage/F1/last-good.trace.json".into(),
                    "triage/F1/first-bad.trace.json".into(),
                ],
            ));
        } else {
            b.evidence = "the budget's 600 GPU-s ran out after 3 commits".into();
            b.command = format!(
                "bench bisect '{cell}' --good {} --bad {} --matrix matrix/nightly.yaml --history history.sqlite",
                good.commit, night.commit
            );
        }
        let chased = serde_json::json!({"findings": [{
            "cells": fp8,
            "commits": range,
            "bisected": b,
            "kernels": kernels,
        }]});
        store.record_triage(&night.run_id, &chased.to_string())?;
        spent.push((i, cell.to_string(), b.gpu_s));
        // The rounds the bisection measured, after the night: two at each end and one at
        // each of three probes, on branch `bisect` (the found bisection's only).
        if b.status == BisectStatus::Found {
            let mut n = 0;
            for (c, rounds) in [
                (good.commit.clone(), 2),
                (night.commit.clone(), 2),
                (bad(night), 2),
            ] {
                for _ in 0..rounds {
                    n += 1;
                    probe(store, cell, night, &c, n)?;
                }
            }
        }
    }
    // After the loop, whose nights are borrowed for the last good run.
    for (i, cell, gpu_s) in spent {
        nights[i].cost.triage_gpu_s += gpu_s;
        if let Some(c) = nights[i].cell_costs.iter_mut().find(|c| c.cell_id == cell) {
            c.cost.triage_gpu_s += gpu_s;
        }
    }
    Ok(())
}

fn to_json(s: &KernelSummary) -> String {
    serde_json::to_string(s).expect("a kernel summary serializes")
}

/// One bisection round of `cell` at `commit`, recorded as `bench bisect` records it.
fn probe(
    store: &mut History,
    cell: &str,
    night: &Night,
    commit: &str,
    n: usize,
) -> Result<(), HistoryError> {
    let value = if n <= 2 { 50_000.0 } else { 48_000.0 };
    let rfc = time::format_description::well_known::Rfc3339;
    let started = time::OffsetDateTime::parse(&night.started_at, &rfc).map_or(
        night.started_at.clone(),
        |t| {
            (t + time::Duration::minutes(30 + n as i64))
                .format(&rfc)
                .expect("a date formats")
        },
    );
    let run = RunRecord {
        run_id: format!("bisect-{}-{}-{n}", &commit[..12], night.key),
        started_at: started,
        finished_at: None,
        commit: Some(commit.to_string()),
        git_dirty: false,
        branch: Some("bisect".into()),
        hardware_key: night.key.clone(),
        host: format!("{}-runner-1", night.key),
        matrix_name: "nightly".into(),
        versions: Versions {
            bench: "0.1.0".into(),
            ..Versions::default()
        },
        switches: IndexMap::new(),
        telemetry: None,
        cells: vec![CellRecord {
            cell_id: cell.to_string(),
            status: "passed".into(),
            metrics: vec![MetricRecord {
                name: "tokens_per_s".into(),
                value,
                rel_spread: 0.002,
                samples: vec![value; 3],
            }],
            loss_curve: Vec::new(),
            telemetry: None,
            context: IndexMap::new(),
        }],
    };
    store.record_run(&run)
}

/// Accepts the `compile` slowdown on the gpt2-125m cells, as a team would after deciding
/// it was intended.
fn accept_compile_shift(
    store: &mut History,
    cells: &[String],
    keys: &[String],
    spec: &Spec,
    shift_at: usize,
) -> Result<(), HistoryError> {
    for (k, key) in keys.iter().enumerate() {
        // The first run on this key at or after the shift.
        let Some(first) = (shift_at..spec.runs).find(|i| i % keys.len() == k) else {
            continue;
        };
        let run = format!("night-{first:04}-{key}");
        for cell in cells
            .iter()
            .filter(|c| c.starts_with("gpt2-125m.") && c.contains(".compile"))
        {
            store.accept(cell, key, &run, "torch.compile mode changed on purpose")?;
        }
    }
    Ok(())
}

/// Writes `nights` clean nights of the cells `ids` on hardware key `key` (host `host`) into
/// the store at `location`, cell `i` at `values[i]` tokens/s with +-0.4% noise, each night's
/// verdicts `unchanged` (the first five `insufficient_history`), a day apart, ending
/// yesterday: the history a real run of those cells is judged against in
/// `benches/gate_fleet.rs` (issue 41's timed judgement of a 1,000-cell run against a year).
pub fn clean_history(
    location: &str,
    key: &str,
    host: &str,
    ids: &[String],
    values: &[f64],
    nights: usize,
) -> Result<(), HistoryError> {
    let mut store = crate::history::open(location)?;
    let mut rng = Rng(0x600d);
    let end = time::OffsetDateTime::now_utc() - time::Duration::days(1);
    for i in 0..nights {
        let started = end - time::Duration::days((nights - 1 - i) as i64);
        let started_at = started
            .format(&time::format_description::well_known::Rfc3339)
            .expect("a date formats");
        let verdict = if i < 5 {
            "insufficient_history"
        } else {
            "unchanged"
        };
        let cells = ids
            .iter()
            .zip(values)
            .map(|(id, &v)| {
                let samples: Vec<f64> = (0..3).map(|_| v * (1.0 + 0.004 * rng.unit())).collect();
                passed_cell(id, samples)
            })
            .collect();
        let run = RunRecord {
            run_id: format!("year-{i:04}"),
            started_at: started_at.clone(),
            finished_at: Some(started_at),
            commit: None,
            git_dirty: false,
            branch: None,
            hardware_key: key.to_string(),
            host: host.to_string(),
            matrix_name: "gate-fleet".into(),
            versions: Versions {
                bench: "0.1.0".into(),
                ..Versions::default()
            },
            switches: IndexMap::new(),
            telemetry: None,
            cells,
        };
        store.record_run(&run)?;
        let verdicts: Vec<(String, String)> = ids
            .iter()
            .map(|id| (id.clone(), verdict.to_string()))
            .collect();
        store.set_verdicts(&run.run_id, &verdicts)?;
    }
    Ok(())
}
