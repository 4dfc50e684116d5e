//! One history test suite, run against every backend: SQLite (a file in a temporary
//! folder, always) and PostgreSQL (a real server, when `BENCH_PG_TESTS=1`; then
//! `BENCH_PG_URL` must reach it, or the tests fail instead of skipping: see
//! scripts/postgres-ci-setup.sh). Each PostgreSQL test works in a schema of its own, so the
//! tests can run in parallel against one database.
//!
//! Also `kill -9` of the real binary in the middle of importing a big run: no earlier run
//! is lost and the big run is either absent or complete.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use bench::baseline::Baselines;
use bench::cell::CellId;
use bench::events::StepEvent;
use bench::history::cost::Cost;
use bench::history::detect::{HistoryVerdict, NumericsVerdict, Policy};
use bench::history::gate::{judge_run, record};
use bench::history::record::RunRecord;
use bench::history::store::current_segment;
use bench::history::{open, HistoryError};
use bench::results::{CellResult, Environment, MetricValue, Outcome, Repeat, RunResults};

/// A store for one test: `(location, guard)`; the guard keeps the temporary folder alive.
struct Store {
    location: String,
    _dir: Option<tempfile::TempDir>,
}

fn pg_enabled() -> bool {
    std::env::var("BENCH_PG_TESTS").is_ok_and(|v| v == "1")
}

/// A fresh, empty store of `backend` for the test `name`.
fn store(backend: &str, name: &str) -> Store {
    match backend {
        "sqlite" => {
            let dir = tempfile::tempdir().unwrap();
            let location = dir.path().join("history.sqlite").display().to_string();
            Store {
                location,
                _dir: Some(dir),
            }
        }
        "postgres" => {
            let url = std::env::var("BENCH_PG_URL").expect(
                "BENCH_PG_TESTS=1 needs BENCH_PG_URL (scripts/postgres-ci-setup.sh prints it)",
            );
            let schema = format!("t_{name}");
            let mut admin = ::postgres::Client::connect(&url, ::postgres::NoTls)
                .unwrap_or_else(|e| panic!("BENCH_PG_TESTS=1 but {url} does not answer: {e}"));
            admin
                .batch_execute(&format!(
                    "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};"
                ))
                .unwrap();
            let sep = if url.contains('?') { '&' } else { '?' };
            Store {
                location: format!("{url}{sep}options=-c%20search_path%3D{schema}"),
                _dir: None,
            }
        }
        other => unreachable!("{other}"),
    }
}

fn env(key: &str, commit: &str) -> Environment {
    Environment {
        hardware_key: key.into(),
        host: "gpu01".into(),
        git_commit: Some(commit.into()),
        bench_version: "0.1.0".into(),
        ..Default::default()
    }
}

/// A run whose one cell `cell` measured `tps` tokens/s (three repeats, 0.2% apart) with a
/// loss curve `loss`.
fn run(id: &str, minute: u32, commit: &str, cells: &[(&str, f64)], loss: &[f64]) -> RunResults {
    RunResults {
        schema_version: 1,
        matrix_sha256: None,
        run_id: id.into(),
        matrix: "m.yaml".into(),
        matrix_name: "m".into(),
        filters: vec![],
        started_at: format!("2026-11-22T10:{minute:02}:00Z"),
        finished_at: Some(format!("2026-11-22T10:{minute:02}:30Z")),
        interrupted: false,
        interrupted_in: None,
        environment: env("h100-sxm-80gb", commit),
        environment_source: None,
        launcher: None,
        cells: cells
            .iter()
            .map(|(c, tps)| {
                let mut metrics = indexmap::IndexMap::new();
                metrics.insert(
                    "tokens_per_s".to_string(),
                    MetricValue {
                        value: *tps,
                        samples: vec![tps * 0.998, *tps, tps * 1.002],
                        rel_spread: 0.002,
                    },
                );
                CellResult {
                    id: CellId(c.to_string()),
                    values: Default::default(),
                    params: Default::default(),
                    outcome: Outcome::Passed,
                    flaky: false,
                    attempts: vec![],
                    repeats: vec![Repeat {
                        steps: loss
                            .iter()
                            .enumerate()
                            .map(|(i, l)| StepEvent {
                                step: i as u64,
                                step_time_s: 0.1,
                                tokens: 1024,
                                loss: *l,
                                warmup: None,
                                rank: None,
                            })
                            .collect(),
                        summary: Default::default(),
                        notices: vec![],
                    }],
                    metrics,
                    logs: vec![],
                    duration_s: 1.0,
                    telemetry: None,
                }
            })
            .collect(),
        dropped: vec![],
    }
}

const CELL: &str = "gpt2-125m.bf16.1gpu.single.compile";
const KEY: &str = "h100-sxm-80gb";
const LOSS: [f64; 4] = [10.0, 9.0, 8.5, 8.2];

/// Six clean nights around 500K tokens/s.
fn clean_history(h: &mut bench::history::History) {
    for (i, v) in [
        500_000.0, 501_000.0, 499_000.0, 500_500.0, 499_500.0, 500_200.0,
    ]
    .iter()
    .enumerate()
    {
        let r = run(
            &format!("night{i}"),
            i as u32,
            &format!("c{i}"),
            &[(CELL, *v)],
            &LOSS,
        );
        record(h, &r, None).unwrap();
    }
}

fn migrations_are_versioned_and_a_newer_store_is_refused(backend: &str) {
    let s = store(backend, &format!("{backend}_migrations"));
    let mut h = open(&s.location).unwrap();
    assert_eq!(
        h.kind(),
        if backend == "sqlite" {
            "sqlite"
        } else {
            "postgresql"
        }
    );
    assert_eq!(
        h.schema_version().unwrap(),
        bench::history::store::schema_version_known()
    );
    drop(h);
    // Opening again applies nothing twice.
    let mut h = open(&s.location).unwrap();
    assert_eq!(
        h.schema_version().unwrap(),
        bench::history::store::schema_version_known()
    );
    drop(h);
    // A store written by a newer bench.
    match backend {
        "sqlite" => {
            let c = rusqlite::Connection::open(&s.location).unwrap();
            c.execute(
                "INSERT INTO bench_schema_migrations VALUES (99, 'future', 'x')",
                [],
            )
            .unwrap();
        }
        _ => {
            let mut c = ::postgres::Client::connect(&s.location, ::postgres::NoTls).unwrap();
            c.batch_execute("INSERT INTO bench_schema_migrations VALUES (99, 'future', 'x')")
                .unwrap();
        }
    }
    match open(&s.location) {
        Err(e @ HistoryError::Newer { found: 99, .. }) => {
            assert!(e.to_string().contains("upgrade bench"), "{e}")
        }
        other => panic!("{:?}", other.map(|h| h.location)),
    }
}

/// The shards of a fleet open a new store at once (their first night, or the first after an
/// upgrade that adds a migration): every one succeeds and the schema is migrated once.
fn connections_opening_a_new_store_at_once_all_succeed(backend: &str) {
    for round in 0..4 {
        let s = store(backend, &format!("{backend}_at_once_{round}"));
        let n = 6;
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(n));
        let handles: Vec<_> = (0..n)
            .map(|_| {
                let (barrier, location) = (barrier.clone(), s.location.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    open(&location).map(|mut h| h.schema_version().unwrap())
                })
            })
            .collect();
        for h in handles {
            match h.join().unwrap() {
                Ok(v) => assert_eq!(v, bench::history::store::schema_version_known()),
                Err(e) => panic!("round {round}: {e}"),
            }
        }
    }
}

fn runs_round_trip_in_time_order_and_reimport_replaces(backend: &str) {
    let s = store(backend, &format!("{backend}_roundtrip"));
    let mut h = open(&s.location).unwrap();
    let mut loss = LOSS.to_vec();
    loss[2] = f64::NAN;
    let mut late = run(
        "b-late",
        30,
        "bbbbbbb",
        &[(CELL, 490_000.0), ("other", 1.0)],
        &loss,
    );
    late.environment
        .switches
        .insert("BENCH_FUSED_ADAMW".into(), "0".into());
    let early = run("a-early", 10, "aaaaaaa", &[(CELL, 500_000.0)], &LOSS);
    // Recorded out of order: the trend is ordered by start time.
    record(&mut h, &late, None).unwrap();
    record(&mut h, &early, None).unwrap();
    record(&mut h, &early, None).unwrap();
    let t = h.trend(CELL, KEY, "tokens_per_s").unwrap();
    let ids: Vec<&str> = t.iter().map(|p| p.run_id.as_str()).collect();
    assert_eq!(ids, ["a-early", "b-late"]);
    assert_eq!(t[0].commit.as_deref(), Some("aaaaaaa"));
    assert_eq!(t[0].samples, vec![499_000.0, 500_000.0, 501_000.0]);
    assert_eq!(t[0].loss_curve, LOSS);
    assert!(t[1].loss_curve[2].is_nan());
    assert_eq!(t[1].value, 490_000.0);
    let runs = h.runs().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1].cells, 2);
    assert_eq!(h.hardware_keys(CELL, "tokens_per_s").unwrap(), [KEY]);
    assert!(h
        .trend(CELL, "mi300x-192gb", "tokens_per_s")
        .unwrap()
        .is_empty());
    // The record keeps the switches and versions.
    let rec = RunRecord::from_results(&late, Some("main".into()), None);
    assert_eq!(rec.switches["BENCH_FUSED_ADAMW"], "0");
}

fn accept_starts_a_new_segment(backend: &str) {
    let s = store(backend, &format!("{backend}_segments"));
    let mut h = open(&s.location).unwrap();
    clean_history(&mut h);
    let faster = run("night6", 6, "c6", &[(CELL, 530_000.0)], &LOSS);
    record(&mut h, &faster, None).unwrap();
    let seg = h.accept(CELL, KEY, "night6", "new fused kernel").unwrap();
    assert_eq!(seg.starts_at, "2026-11-22T10:06:00Z");
    let trend = h.trend(CELL, KEY, "tokens_per_s").unwrap();
    let segments = h.segments(CELL, KEY).unwrap();
    assert_eq!(segments.len(), 1);
    assert_eq!(segments[0].reason, "new fused kernel");
    let cur = current_segment(&trend, &segments);
    assert_eq!(cur.len(), 1);
    assert_eq!(cur[0].run_id, "night6");
    match h.accept(CELL, KEY, "no-such-run", "x") {
        Err(HistoryError::Input { message, .. }) => assert!(message.contains("no-such-run")),
        other => panic!("{other:?}"),
    }
}

fn a_slow_night_is_suspect_then_confirmed_with_its_first_run_named(backend: &str) {
    let s = store(backend, &format!("{backend}_judge"));
    let mut h = open(&s.location).unwrap();
    let baselines = Baselines::empty("b.yaml".into(), KEY);
    let p = Policy::default();
    // Too little history first.
    let first = run("night0", 0, "c0", &[(CELL, 500_000.0)], &LOSS);
    let r = judge_run(&mut h, &first, &[], &baselines, &p).unwrap();
    assert_eq!(r.cells[0].verdict(), HistoryVerdict::InsufficientHistory);
    clean_history(&mut h);
    let same = run("night6", 6, "c6", &[(CELL, 500_300.0)], &LOSS);
    let r = judge_run(&mut h, &same, &[], &baselines, &p).unwrap();
    assert_eq!(r.cells[0].verdict(), HistoryVerdict::Unchanged);
    assert_eq!(r.cells[0].numerics, NumericsVerdict::Unchanged);
    // 2.6% slower, as BENCH_FUSED_ADAMW=0 measured on an H100.
    let slow = run("night7", 7, "badc0de", &[(CELL, 487_000.0)], &LOSS);
    let r = judge_run(&mut h, &slow, &[], &baselines, &p).unwrap();
    assert_eq!(r.cells[0].verdict(), HistoryVerdict::Suspect);
    assert_eq!(r.to_confirm(), [CELL]);
    // Seven clean runs are too few to call the value rare: one re-run leaves it suspect,
    // two that breach too confirm it.
    let again = run("night7-confirm", 8, "badc0de", &[(CELL, 486_500.0)], &LOSS);
    let r = judge_run(&mut h, &slow, &[&again], &baselines, &p).unwrap();
    assert_eq!(r.cells[0].verdict(), HistoryVerdict::Suspect);
    assert_eq!(r.cells[0].judgement.reruns_needed, 2);
    let again2 = run(
        "night7-confirm-2",
        9,
        "badc0de",
        &[(CELL, 487_200.0)],
        &LOSS,
    );
    let r = judge_run(&mut h, &slow, &[&again, &again2], &baselines, &p).unwrap();
    let c = &r.cells[0];
    assert_eq!(c.verdict(), HistoryVerdict::Regressed);
    assert!(c.judgement.sigmas.unwrap() < -4.0);
    let since = c.since.as_ref().unwrap();
    assert_eq!(since.run_id, "night7");
    assert_eq!(since.commit.as_deref(), Some("badc0de"));
    assert_eq!(since.last_good_run_id.as_deref(), Some("night5"));
    assert_eq!(r.exit_code(), 1);
    let md = bench::report::history::markdown(&r);
    assert!(md.contains("since run night7 (commit badc0de)"), "{md}");
    // Changed numerics are their own verdict.
    let numerics = run(
        "night9",
        9,
        "c9",
        &[(CELL, 500_100.0)],
        &[10.0, 9.0, 8.9, 8.2],
    );
    let r = judge_run(&mut h, &numerics, &[], &baselines, &p).unwrap();
    assert_eq!(r.cells[0].verdict(), HistoryVerdict::Unchanged);
    assert!(matches!(
        r.cells[0].numerics,
        NumericsVerdict::Changed { step: 2, .. }
    ));
    assert_eq!(r.exit_code(), 1);
}

/// Runs `sql` on the store at `location` directly, as a hand or another tool would.
fn raw(backend: &str, location: &str, sql: &str) {
    match backend {
        "sqlite" => rusqlite::Connection::open(location)
            .unwrap()
            .execute_batch(sql)
            .unwrap(),
        _ => ::postgres::Client::connect(location, ::postgres::NoTls)
            .unwrap()
            .batch_execute(sql)
            .unwrap(),
    }
}

fn cost(m: f64, p: f64, r: f64, t: f64) -> Cost {
    Cost {
        measuring_gpu_s: m,
        pairs_gpu_s: p,
        reruns_gpu_s: r,
        triage_gpu_s: t,
    }
}

fn cell_cost(id: &str, cost: Cost) -> bench::history::cost::CellCost {
    bench::history::cost::CellCost {
        cell_id: id.into(),
        cost,
    }
}

/// What a verdict cost round-trips; a whole run recorded again replaces its row; the shards
/// of one run recording at once add up to the run's total (none lost to another's
/// read-then-write), and a shard recorded again (a retried job) replaces its own share
/// rather than counting twice; a forged or damaged row is skipped, the others still read.
fn costs_round_trip_and_shards_at_once_add_up(backend: &str) {
    let s = store(backend, &format!("{backend}_costs"));
    let mut h = open(&s.location).unwrap();
    assert!(h.costs().unwrap().is_empty());
    // Of a run's cells, the row keeps those whose verdict took more than measuring them.
    let cells = [
        cell_cost("a", cost(74.0, 61.0, 0.5, 22.0)),
        cell_cost("b", cost(74.0, 0.0, 0.0, 0.0)),
    ];
    h.record_cost("solo", None, cost(148.0, 61.0, 0.5, 22.0), &cells)
        .unwrap();
    let solo = &h.costs().unwrap()["solo"];
    assert_eq!(solo.total, cost(148.0, 61.0, 0.5, 22.0));
    assert_eq!(solo.cells, cells[..1]);
    h.record_cost("solo", None, cost(100.0, 0.0, 0.0, 0.0), &[])
        .unwrap();
    let solo = &h.costs().unwrap()["solo"];
    assert_eq!(solo.total, cost(100.0, 0.0, 0.0, 0.0));
    assert!(solo.cells.is_empty(), "{solo:?}");
    drop(h);

    let n = 6u32;
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(n as usize));
    let handles: Vec<_> = (1..=n)
        .map(|i| {
            let (barrier, location) = (barrier.clone(), s.location.clone());
            std::thread::spawn(move || {
                let mut h = open(&location).unwrap();
                barrier.wait();
                let shard = bench::shard::Shard { index: i, count: n };
                let f = f64::from(i);
                let cells = [cell_cost(
                    &format!("c{i}"),
                    cost(100.0 * f, 10.0 * f, f, 0.0),
                )];
                h.record_cost(
                    "nightly",
                    Some(shard),
                    cost(100.0 * f, 10.0 * f, f, 0.0),
                    &cells,
                )
            })
        })
        .collect();
    for t in handles {
        t.join().unwrap().unwrap();
    }
    let mut h = open(&s.location).unwrap();
    // 1 + ... + 6 = 21.
    let nightly = &h.costs().unwrap()["nightly"];
    assert_eq!(nightly.total, cost(2100.0, 210.0, 21.0, 0.0));
    // Every shard's cell is kept, the costliest first.
    let ids: Vec<&str> = nightly.cells.iter().map(|c| c.cell_id.as_str()).collect();
    assert_eq!(ids, ["c6", "c5", "c4", "c3", "c2", "c1"]);
    // Shard 3 retried, its cell now costing a bisection: its share and its cell replaced.
    let retried = bench::shard::Shard { index: 3, count: n };
    let again = [cell_cost("c3b", cost(0.0, 0.0, 0.0, 50.0))];
    h.record_cost("nightly", Some(retried), cost(0.0, 0.0, 0.0, 50.0), &again)
        .unwrap();
    let nightly = &h.costs().unwrap()["nightly"];
    assert_eq!(nightly.total, cost(1800.0, 180.0, 18.0, 50.0));
    let ids: Vec<&str> = nightly.cells.iter().map(|c| c.cell_id.as_str()).collect();
    assert_eq!(ids, ["c6", "c5", "c3b", "c4", "c2", "c1"]);

    raw(
        backend,
        &s.location,
        r#"INSERT INTO bench_costs (run_id, cost) VALUES
            ('negative', '{"measuring_gpu_s": -5, "pairs_gpu_s": 0, "reruns_gpu_s": 0, "triage_gpu_s": 0}'),
            ('huge', '{"measuring_gpu_s": 1, "pairs_gpu_s": 0, "reruns_gpu_s": 0, "triage_gpu_s": 1e308}'),
            ('overflow', '{"measuring_gpu_s": 1e999, "pairs_gpu_s": 0, "reruns_gpu_s": 0, "triage_gpu_s": 0}'),
            ('text', 'not a cost'),
            ('cell_negative', '{"measuring_gpu_s": 1, "pairs_gpu_s": 0, "reruns_gpu_s": 0, "triage_gpu_s": 0, "cells": {"a": {"measuring_gpu_s": 1, "pairs_gpu_s": -3, "reruns_gpu_s": 0, "triage_gpu_s": 0}}}'),
            ('cell_escape', '{"measuring_gpu_s": 1, "pairs_gpu_s": 0, "reruns_gpu_s": 0, "triage_gpu_s": 0, "cells": {"a\u001b]0;x\u0007": {"measuring_gpu_s": 1, "pairs_gpu_s": 3, "reruns_gpu_s": 0, "triage_gpu_s": 0}}}');"#,
    );
    let costs = h.costs().unwrap();
    let mut kept: Vec<&str> = costs.keys().map(String::as_str).collect();
    kept.sort();
    assert_eq!(kept, ["nightly", "solo"]);
}

macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[test] fn $name() { super::$name("sqlite"); })*
        }
        mod postgres {
            $(#[test] fn $name() {
                if super::pg_enabled() { super::$name("postgres"); }
            })*
        }
    };
}

suite!(
    migrations_are_versioned_and_a_newer_store_is_refused,
    connections_opening_a_new_store_at_once_all_succeed,
    runs_round_trip_in_time_order_and_reimport_replaces,
    accept_starts_a_new_segment,
    a_slow_night_is_suspect_then_confirmed_with_its_first_run_named,
    kill_9_during_an_import_loses_no_earlier_run,
    costs_round_trip_and_shards_at_once_add_up,
);

/// A run folder with `cells` cells of seven metrics each (a big nightly's worth of rows).
fn big_run_dir(dir: &Path, id: &str, minute: u32, cells: usize) -> std::path::PathBuf {
    let names: Vec<String> = (0..cells).map(|i| format!("cell{i:05}")).collect();
    let pairs: Vec<(&str, f64)> = names.iter().map(|n| (n.as_str(), 1000.0)).collect();
    let mut r = run(id, minute, "big", &pairs, &LOSS);
    for c in &mut r.cells {
        let m = c.metrics["tokens_per_s"].clone();
        // Each metric inside its plausibility bound (`bench::bounds`), which an import
        // enforces: an MFU is a fraction, a step time a few seconds at most here.
        for (extra, value) in [
            ("tokens_per_s_per_gpu", m.value),
            ("step_time_s", 1.0),
            ("mfu", 0.4),
            ("tflops_per_gpu", 400.0),
            ("peak_mem_bytes", 4e10),
            ("time_to_1t_tokens_days", 1e12 / m.value / 86400.0),
        ] {
            let mut x = m.clone();
            x.value = value;
            x.samples = vec![value];
            c.metrics.insert(extra.into(), x);
        }
    }
    let d = dir.join(id);
    std::fs::create_dir_all(&d).unwrap();
    r.save_atomic(&d).unwrap();
    d
}

fn import(location: &str, dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bench"));
    c.args([
        "history",
        "import",
        dir.to_str().unwrap(),
        "--history",
        location,
    ]);
    c.env_remove("BENCH_HISTORY");
    c
}

fn kill_9_during_an_import_loses_no_earlier_run(backend: &str) {
    let s = store(backend, &format!("{backend}_kill9"));
    let tmp = tempfile::tempdir().unwrap();
    let small = big_run_dir(tmp.path(), "small", 1, 3);
    let cells = if backend == "sqlite" { 6000 } else { 2500 };
    let big = big_run_dir(tmp.path(), "big", 2, cells);
    let out = import(&s.location, &small).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    // How long a whole import of the big run takes here, on a scratch store of the same
    // backend, so the kills land inside it.
    let scratch = store(backend, &format!("{backend}_kill9_scratch"));
    let t0 = Instant::now();
    let out = import(&scratch.location, &big).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let full = t0.elapsed();
    let mut killed_mid_write = 0;
    for fraction in [0.5, 0.65, 0.8, 0.9] {
        let mut child = import(&s.location, &big).spawn().unwrap();
        std::thread::sleep(full.mul_f64(fraction));
        let alive = child.try_wait().unwrap().is_none();
        // SIGKILL: no destructor, no rollback by the process itself.
        let _ = child.kill();
        let _ = child.wait();
        let mut h = open(&s.location).unwrap();
        let runs = h.runs().unwrap();
        let small_run = runs
            .iter()
            .find(|r| r.run_id == "small")
            .expect("the earlier run is lost");
        assert_eq!(small_run.cells, 3);
        match runs.iter().find(|r| r.run_id == "big") {
            // Either the whole run committed before the kill, or nothing of it is there.
            Some(b) => assert_eq!(b.cells, cells as i64, "a partial run after kill -9"),
            None => {
                assert!(h
                    .trend("cell00005", KEY, "tokens_per_s")
                    .unwrap()
                    .is_empty());
                if alive {
                    killed_mid_write += 1;
                }
            }
        }
        if runs.iter().any(|r| r.run_id == "big") {
            // Start the next attempt from the state before the big run.
            h.clear().unwrap();
            drop(h);
            let out = import(&s.location, &small).output().unwrap();
            assert!(out.status.success());
        }
    }
    assert!(
        killed_mid_write > 0,
        "no kill landed inside the import (full import took {full:?})"
    );
    if backend == "sqlite" {
        let c = rusqlite::Connection::open(&s.location).unwrap();
        let ok: String = c
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(ok, "ok");
    }
}
