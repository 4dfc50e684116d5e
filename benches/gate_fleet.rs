//! The gate at a fleet's scale: a 1,000-cell run judged against a year of its history.
//!
//! A `command` matrix of CELLS cells (default 1,000), each a shell worker that prints a few
//! steps at the cell's own speed, runs once without a history, to learn this host's
//! hardware key; then a store is generated with NIGHTS clean nights (default 365) of those
//! cells on that key at those speeds (`bench::site::synthetic::clean_history`); then the
//! built binary runs the matrix three times without `--history` and three times with it,
//! alternating, and the table gives the median of each and their difference: what judging
//! the run against the year costs (reading every cell's history, the band, the repeats'
//! test, change points, the verdicts written back). A plain program, not a timed test: it
//! exits 1 when that difference is over GATE_BENCH_LIMIT_S (default 30; 0 turns the check
//! off), so CI fails on a gate that got slow. Run by scripts/gate-bench.sh.
//!
//! Environment: GATE_BENCH_CELLS, GATE_BENCH_NIGHTS, GATE_BENCH_OUT (default
//! target/gate-bench), GATE_BENCH_LIMIT_S.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

fn var(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The tokens/s cell `i` runs at (and its history holds).
fn speed(i: usize) -> f64 {
    50_000.0 + 1_000.0 * (i % 97) as f64
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn run(dir: &Path, id: &str, history: Option<&Path>) -> f64 {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bench"));
    cmd.current_dir(dir)
        .args(["matrix", "m.yaml", "--no-progress", "--run-id", id])
        .env_remove("BENCH_HISTORY")
        .env_remove("GITHUB_STEP_SUMMARY");
    if let Some(h) = history {
        cmd.arg("--history").arg(h);
    }
    let t = Instant::now();
    let o = cmd.output().unwrap();
    let s = t.elapsed().as_secs_f64();
    if o.status.code() != Some(0) {
        eprintln!(
            "gate-bench: run {id} exited {:?}:\n{}{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        std::process::exit(1);
    }
    s
}

fn main() {
    let cells = var("GATE_BENCH_CELLS", 1000);
    let nights = var("GATE_BENCH_NIGHTS", 365);
    let limit = var("GATE_BENCH_LIMIT_S", 30) as f64;
    let out = std::env::var_os("GATE_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/gate-bench"));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let dir = std::fs::canonicalize(&out).unwrap();

    // Each cell's worker prints one warm-up step and three measured ones of 1,000 tokens at
    // its cell's speed, so the run's values sit in the middle of the history's band.
    std::fs::write(
        dir.join("worker.sh"),
        "#!/bin/sh\n\
         t=$(awk -v i=\"$1\" 'BEGIN { printf \"%.9f\", 1000 / (50000 + 1000 * (i % 97)) }')\n\
         echo '{\"event\":\"start\",\"model\":\"m\",\"world_size\":1}'\n\
         for s in 0 1 2 3; do\n\
           w=false; [ \"$s\" = 0 ] && w=true\n\
           echo \"{\\\"event\\\":\\\"step\\\",\\\"step\\\":$s,\\\"step_time_s\\\":$t,\\\"tokens\\\":1000,\\\"loss\\\":1.0,\\\"warmup\\\":$w}\"\n\
         done\n\
         echo '{\"event\":\"summary\",\"peak_mem_bytes\":[0]}'\n",
    )
    .unwrap();
    // The axis values are the cells' indices, so the cells' ids are those numbers; the
    // store is written under the same ids.
    let ids: Vec<String> = (0..cells).map(|i| i.to_string()).collect();
    let values: Vec<f64> = (0..cells).map(speed).collect();
    std::fs::write(
        dir.join("m.yaml"),
        format!(
            "name: gate-fleet\naxes:\n  cell: [{}]\ndefaults:\n  steps: 4\n  warmup: 1\n  repeats: 1\n  timeout: 1m\n  retries: 0\n  tolerance: 0.5\n  workload: {{kind: command, argv: [sh, worker.sh, '{{cell}}']}}\n",
            ids.join(", ")
        ),
    )
    .unwrap();

    let first = run(&dir, "probe", None);
    let results: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("results/probe/results.json")).unwrap(),
    )
    .unwrap();
    let key = results["environment"]["hardware_key"]
        .as_str()
        .unwrap()
        .to_string();
    let host = results["environment"]["host"]
        .as_str()
        .unwrap_or("host")
        .to_string();

    let store = dir.join("history.sqlite");
    let t = Instant::now();
    bench::site::synthetic::clean_history(
        store.to_str().unwrap(),
        &key,
        &host,
        &ids,
        &values,
        nights,
    )
    .unwrap();
    let generation = t.elapsed().as_secs_f64();
    let store_mb = std::fs::metadata(&store).map(|m| m.len()).unwrap_or(0) as f64 / 1e6;

    let (mut plain, mut judged) = (Vec::new(), Vec::new());
    for k in 0..3 {
        plain.push(run(&dir, &format!("plain-{k}"), None));
        judged.push(run(&dir, &format!("judged-{k}"), Some(&store)));
    }
    // Every judged run must have judged every cell against its history.
    let h: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("results/judged-2/history.json")).unwrap(),
    )
    .unwrap();
    let judged_cells = h["cells"].as_array().map_or(0, Vec::len);
    let unchanged = h["cells"].as_array().map_or(0, |c| {
        c.iter()
            .filter(|c| c["judgement"]["verdict"] == "unchanged")
            .count()
    });
    let (p, j) = (median(plain.clone()), median(judged.clone()));
    let cost = j - p;
    println!(
        "\nbench matrix over {cells} command cells, judged against {nights} nights ({} CPUs; store generated in {generation:.1} s, {store_mb:.0} MB; first run {first:.1} s)",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("| run | median s | runs (s) |\n|---|---:|---|");
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("| without --history | {p:.2} | {} |", fmt(&plain));
    println!("| with --history | {j:.2} | {} |", fmt(&judged));
    println!("| judging (the difference) | {cost:.2} | |");
    println!("cells judged in the last run: {judged_cells}, of which unchanged: {unchanged}");
    let mut failed = false;
    if judged_cells != cells || unchanged < cells * 99 / 100 {
        eprintln!("gate-bench: the last run judged {judged_cells} of {cells} cells, {unchanged} unchanged: the history did not match the run");
        failed = true;
    }
    if limit > 0.0 && cost > limit {
        eprintln!("gate-bench: judging took {cost:.2} s, over the limit of {limit} s");
        failed = true;
    }
    if failed {
        std::process::exit(1);
    }
    println!("gate-bench: judging within {limit} s");
}
