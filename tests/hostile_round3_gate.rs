//! Issue 34 ("Hostile input, round 3") through the built binary, the history store's
//! part: a run id another hardware's job already recorded, and a store missing a table,
//! are both refused (exit 2) before the first cell runs, and nothing recorded is lost.
//! (Forged telemetry is tests/history_verdict_e2e.rs's `forged_telemetry_excuses_no_regression`;
//! an interrupted run's reports, tests/run_cli.rs's Ctrl-C test.)

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A one-cell matrix of the fake worker; `ran` records each start of the worker.
fn matrix(dir: &Path) -> PathBuf {
    let worker = std::fs::canonicalize("tests/fixtures/fake_worker.sh").unwrap();
    let path = dir.join("m.yaml");
    std::fs::write(
        &path,
        format!(
            "name: ids\naxes:\n  model: [tiny]\n  gpus: [1]\ndefaults:\n  steps: 5\n  warmup: 1\n  timeout: 60s\n  retries: 0\n  workload:\n    kind: command\n    argv: [sh, '{}', ok]\n    env: {{RECORD: '{}'}}\n",
            worker.display(),
            dir.join("ran").display()
        ),
    )
    .unwrap();
    path
}

/// `bench matrix` with a stand-in nvidia-smi (one H100) on PATH when `gpu`, else on a CPU.
fn run(dir: &Path, id: &str, gpu: bool) -> Output {
    let bin = dir.join("bin");
    if gpu && !bin.exists() {
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(
            std::fs::canonicalize("tests/fixtures/fake_nvidia_smi.sh").unwrap(),
            bin.join("nvidia-smi"),
        )
        .unwrap();
    }
    let mut c = Command::new(env!("CARGO_BIN_EXE_bench"));
    c.current_dir(dir)
        .args(["matrix", matrix(dir).to_str().unwrap(), "--no-progress"])
        .args(["--run-id", id])
        .args(["--results-dir", dir.join("results").to_str().unwrap()])
        .args(["--baselines", dir.join("baselines").to_str().unwrap()])
        .args(["--history", dir.join("h.sqlite").to_str().unwrap()])
        .env("FAKE_SMI", dir.join("smi"))
        .env("BENCH_TELEMETRY", "0")
        .env_remove("CI")
        .env_remove("GITHUB_STEP_SUMMARY")
        .env_remove("CUDA_VISIBLE_DEVICES");
    if gpu {
        c.env(
            "PATH",
            format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()),
        );
    } else {
        c.args(["--gpus", "0"]).env("PATH", "/usr/bin:/bin");
    }
    c.output().unwrap()
}

fn runs(dir: &Path) -> Vec<(String, String)> {
    let db = rusqlite::Connection::open(dir.join("h.sqlite")).unwrap();
    let mut st = db
        .prepare("SELECT run_id, hardware_key FROM bench_runs ORDER BY run_id")
        .unwrap();
    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn starts(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("ran"))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

#[test]
fn a_run_id_of_another_hardware_is_refused_before_the_first_cell() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let o = run(dir, "nightly-1", false);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let cpu = runs(dir);
    assert_eq!(cpu.len(), 1, "{cpu:?}");
    assert!(cpu[0].1.starts_with("cpu-"), "{cpu:?}");
    let before = starts(dir);
    // The same run id from an H100 job: refused, naming both keys, before any cell.
    let o = run(dir, "nightly-1", true);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("run id nightly-1 is already in the history for hardware cpu-"),
        "{out}"
    );
    assert!(out.contains("h100-sxm-80gb"), "{out}");
    assert_eq!(starts(dir), before, "a cell ran: {out}");
    assert_eq!(runs(dir), cpu, "the CPU run must stay");
    // Its own id goes through, beside it.
    let o = run(dir, "nightly-1-h100-sxm-80gb", true);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(runs(dir).len(), 2);
}

#[test]
fn a_store_missing_a_table_is_refused_before_the_first_cell() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let o = run(dir, "r1", false);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    rusqlite::Connection::open(dir.join("h.sqlite"))
        .unwrap()
        .execute_batch("DROP TABLE bench_segments;")
        .unwrap();
    let before = starts(dir);
    let o = run(dir, "r2", false);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains("bench_segments"), "{out}");
    assert_eq!(starts(dir), before, "a cell ran: {out}");
    assert!(!dir.join("results/r2/results.json").exists());
    // A dropped column is refused the same way.
    let tmp2 = tempfile::tempdir().unwrap();
    let d2 = tmp2.path();
    assert_eq!(run(d2, "r1", false).status.code(), Some(0));
    rusqlite::Connection::open(d2.join("h.sqlite"))
        .unwrap()
        .execute_batch("ALTER TABLE bench_cells DROP COLUMN verdict;")
        .unwrap();
    let o = run(d2, "r2", false);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("bench_cells"), "{}", text(&o));
}
