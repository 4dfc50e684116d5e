//! `bench site` at a fleet's scale: generates a history store of CELLS cells x RUNS runs
//! (default 1,000 x 365, one hardware key, through the store's own API:
//! `bench::site::synthetic`), then times `bench site` over it with the built binary three
//! times, and prints a table (cells, runs, seconds, pages, MB). Run by
//! scripts/site-bench.sh (`cargo bench --bench site_fleet`), which CI runs and which then
//! opens the site in chromium. A plain program, not a timed test (the project's speed
//! targets live in benchmarks): it exits 1 when the median build is over
//! SITE_BENCH_LIMIT_S seconds (the 10 s on the CI machine), so CI fails on a site
//! that got slow, and says so in its last line.
//!
//! Environment: SITE_BENCH_CELLS, SITE_BENCH_RUNS, SITE_BENCH_KEYS, SITE_BENCH_OUT (the
//! folder for the store and the site; default target/site-bench), SITE_BENCH_LIMIT_S
//! (default 10; 0 turns the check off).

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
    let (pages, bytes) = pages(&site);
    println!("{line}");
    println!();
    println!("| cells | runs | keys | values | CPUs | generate store | store size | bench site (min / median / max of 3) | pages | site size |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|");
    println!(
        "| {} | {} | {} | {} | {threads} | {generation:.1} s | {store_mb:.0} MB | {:.2} / {:.2} / {:.2} s | {pages} | {:.1} MB |",
        spec.cells,
        spec.runs,
        spec.keys,
        spec.cells * spec.runs,
        builds[0],
        builds[1],
        builds[2],
        bytes as f64 / 1e6
    );
    println!();
    println!("site: {}", site.display());
    let limit = std::env::var("SITE_BENCH_LIMIT_S")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(10.0);
    if limit > 0.0 && builds[1] > limit {
        println!(
            "site-bench: FAILED: the median build took {:.2} s, over the {limit} s limit (SITE_BENCH_LIMIT_S)",
            builds[1]
        );
        std::process::exit(1);
    }
    if limit > 0.0 {
        println!(
            "site-bench: ok: the median build took {:.2} s, within the {limit} s limit",
            builds[1]
        );
    }
}

/// The site's pages (`.html` files) and the bytes of every file it holds.
fn pages(dir: &std::path::Path) -> (usize, u64) {
    let (mut pages, mut bytes) = (0, 0);
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            match e.metadata() {
                Ok(m) if m.is_dir() => todo.push(p),
                Ok(m) => {
                    bytes += m.len();
                    if p.extension().is_some_and(|x| x == "html") {
                        pages += 1;
                    }
                }
                Err(_) => {}
            }
        }
    }
    (pages, bytes)
}
