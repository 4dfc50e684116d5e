//! `bench site` at a fleet's scale: generates a history store of CELLS cells x RUNS runs
//! (default 1,000 x 365, one hardware key, through the store's own API:
//! `bench::site::synthetic`), then times `bench site` over it with the built binary, and
//! prints a table. Run by scripts/site-bench.sh (`cargo bench --bench site_fleet`), which
//! then opens the site in chromium. A plain program, not a timed test: the time depends on
//! the machine, so it is measured and reported, never asserted in CI.
//!
//! Environment: SITE_BENCH_CELLS, SITE_BENCH_RUNS, SITE_BENCH_KEYS, SITE_BENCH_OUT (the
//! folder for the store and the site; default target/site-bench).

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use bench::site::synthetic::{generate, Spec};

fn var(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let spec = Spec {
        cells: var("SITE_BENCH_CELLS", 1000),
        runs: var("SITE_BENCH_RUNS", 365),
        keys: var("SITE_BENCH_KEYS", 1),
        hostile: true,
    };
    let out = std::env::var_os("SITE_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/site-bench"));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let store = out.join("history.sqlite");
    let site = out.join("site");

    let t = Instant::now();
    generate(store.to_str().unwrap(), &spec).unwrap();
    let generation = t.elapsed().as_secs_f64();
    let store_mb = std::fs::metadata(&store).map(|m| m.len()).unwrap_or(0) as f64 / 1e6;

    let mut builds = Vec::new();
    let mut line = String::new();
    for _ in 0..3 {
        let _ = std::fs::remove_dir_all(&site);
        let t = Instant::now();
        let o = Command::new(env!("CARGO_BIN_EXE_bench"))
            .arg("site")
            .arg("--history")
            .arg(&store)
            .arg("-o")
            .arg(&site)
            .output()
            .unwrap();
        builds.push(t.elapsed().as_secs_f64());
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        line = String::from_utf8_lossy(&o.stdout).trim().to_string();
    }
    builds.sort_by(f64::total_cmp);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("{line}");
    println!();
    println!("| cells | runs | keys | values | CPUs | generate store | store size | bench site (min / median / max of 3) |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---|");
    println!(
        "| {} | {} | {} | {} | {threads} | {generation:.1} s | {store_mb:.0} MB | {:.2} / {:.2} / {:.2} s |",
        spec.cells,
        spec.runs,
        spec.keys,
        spec.cells * spec.runs,
        builds[0],
        builds[1],
        builds[2]
    );
    println!();
    println!("site: {}", site.display());
}
