//! Issue 34 ("Hostile input, round 3") through the built binary: a run id another
//! hardware's job already recorded, and a store missing a table, are both refused (exit 2)
//! before the first cell runs, and nothing recorded is lost; and the cases the hostile
//! re-test of the fixes found (a FIFO as the job summary, as a baseline file or as the
//! store's journal, a results folder that is a file, an empty program, `kill -9` of bench
//! with a worker's detached children, `bench history study` under a shell that ignores
//! Ctrl-C).
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
    // Each damage, on a store one clean run made: the next run is refused (exit 2), naming
    // what is missing, before its cell starts and before its run folder is written.
    for (damage, named) in [
        ("DROP TABLE bench_segments;", "bench_segments"),
        (
            "ALTER TABLE bench_cells DROP COLUMN verdict;",
            "bench_cells",
        ),
        // The record of its migrations: refused, not half-migrated.
        (
            "DROP TABLE bench_schema_migrations;",
            "bench_schema_migrations",
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let o = run(dir, "r1", false);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        rusqlite::Connection::open(dir.join("h.sqlite"))
            .unwrap()
            .execute_batch(damage)
            .unwrap();
        let before = starts(dir);
        let o = run(dir, "r2", false);
        let out = text(&o);
        assert_eq!(o.status.code(), Some(2), "{damage}: {out}");
        assert!(out.contains(named), "{damage}: {out}");
        assert_eq!(starts(dir), before, "{damage}: a cell ran: {out}");
        assert!(!dir.join("results/r2/results.json").exists(), "{damage}");
    }
}

fn bench_cmd(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bench"));
    c.current_dir(dir)
        .env("BENCH_TELEMETRY", "0")
        .env_remove("CI")
        .env_remove("GITHUB_STEP_SUMMARY")
        .env_remove("CUDA_VISIBLE_DEVICES");
    c
}

/// Runs `c` with a deadline: it must end within `secs` (else it is killed and the test
/// fails, naming what hung).
fn within(mut c: Command, secs: u64, what: &str) -> Output {
    use std::io::Read;
    let mut child = c
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut out = Vec::new();
            let mut err = Vec::new();
            child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
            child.stderr.take().unwrap().read_to_end(&mut err).unwrap();
            return Output {
                status,
                stdout: out,
                stderr: err,
            };
        }
        if t0.elapsed().as_secs() > secs {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} hung past {secs} s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn mkfifo(p: &Path) {
    let o = Command::new("mkfifo").arg(p).output().unwrap();
    assert!(o.status.success(), "mkfifo {}: {}", p.display(), text(&o));
}

#[test]
fn a_fifo_as_the_job_summary_or_a_baseline_file_hangs_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let fifo = dir.join("summary.fifo");
    mkfifo(&fifo);
    let mut c = bench_cmd(dir);
    c.args([
        "matrix",
        matrix(dir).to_str().unwrap(),
        "--gpus",
        "0",
        "--no-progress",
    ])
    .args([
        "--run-id",
        "s1",
        "--results-dir",
        dir.join("results").to_str().unwrap(),
    ])
    .env("GITHUB_STEP_SUMMARY", &fifo);
    let o = within(c, 60, "bench matrix with a FIFO as GITHUB_STEP_SUMMARY");
    assert!(dir.join("results/s1/summary.md").exists(), "{}", text(&o));
    assert!(text(&o).contains("summary.fifo"), "{}", text(&o));
    // A FIFO among the baseline files is refused before the first cell.
    let bl = dir.join("bl");
    std::fs::create_dir_all(&bl).unwrap();
    mkfifo(&bl.join("cpu-x86_64.yaml"));
    let before = starts(dir);
    let mut c = bench_cmd(dir);
    c.args([
        "matrix",
        matrix(dir).to_str().unwrap(),
        "--gpus",
        "0",
        "--no-progress",
    ])
    .args([
        "--run-id",
        "s2",
        "--results-dir",
        dir.join("results").to_str().unwrap(),
    ])
    .args(["--baselines", bl.to_str().unwrap()]);
    let o = within(c, 60, "bench matrix with a FIFO baseline file");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert_eq!(starts(dir), before, "a cell ran: {}", text(&o));
}

#[test]
fn a_results_folder_that_is_a_file_and_an_empty_program_are_bad_input() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("afile"), "").unwrap();
    let mut c = bench_cmd(dir);
    c.args([
        "matrix",
        matrix(dir).to_str().unwrap(),
        "--gpus",
        "0",
        "--no-progress",
    ])
    .args([
        "--run-id",
        "x",
        "--results-dir",
        dir.join("afile").to_str().unwrap(),
    ]);
    let o = within(c, 60, "bench matrix into a file");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let m = dir.join("empty.yaml");
    std::fs::write(
        &m,
        "name: e\naxes:\n  model: [tiny]\ndefaults:\n  steps: 5\n  warmup: 1\n  workload:\n    kind: command\n    argv: [\"\"]\n",
    )
    .unwrap();
    for dry in [true, false] {
        let mut c = bench_cmd(dir);
        c.args([
            "matrix",
            m.to_str().unwrap(),
            "--gpus",
            "0",
            "--no-progress",
        ])
        .args(["--results-dir", dir.join("results").to_str().unwrap()]);
        if dry {
            c.arg("--dry-run");
        }
        let o = within(c, 60, "bench matrix with an empty program");
        assert_eq!(o.status.code(), Some(2), "dry run {dry}: {}", text(&o));
        assert!(text(&o).contains("names no program"), "{}", text(&o));
    }
}

#[test]
fn a_fifo_beside_the_store_and_an_import_of_another_hardwares_run_id_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    assert_eq!(run(dir, "shared", true).status.code(), Some(0));
    // A CPU run folder with the same id: the import is refused as bad input.
    let cpu = tempfile::tempdir().unwrap();
    let o = run(cpu.path(), "shared", false);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let mut c = bench_cmd(dir);
    c.args(["history", "import"])
        .arg(cpu.path().join("results/shared"))
        .args(["--history", dir.join("h.sqlite").to_str().unwrap()]);
    let o = within(c, 60, "bench history import");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("already in the history for hardware h100"),
        "{}",
        text(&o)
    );
    // SQLite's journal as a FIFO: refused at once, not waited on.
    mkfifo(&dir.join("h.sqlite-journal"));
    let mut c = bench_cmd(dir);
    c.args(["history", "import"])
        .arg(cpu.path().join("results/shared"))
        .args(["--history", dir.join("h.sqlite").to_str().unwrap()]);
    let o = within(c, 60, "bench history import beside a FIFO journal");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("sqlite-journal"), "{}", text(&o));
}

/// `kill -9` of bench: a worker's children that left its process group (a new session, a
/// daemonized grandchild, a group of their own) die with it too.
#[test]
fn kill_9_of_bench_takes_a_workers_detached_children_with_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pids = dir.join("pids");
    let worker = dir.join("w.sh");
    let script = r#"printf '{"event":"start","model":"toy","world_size":1}\n'
setsid sleep 1001 &
echo $! >> "$PIDFILE"
(setsid sh -c 'echo $$ >> "$PIDFILE"; exec sleep 1002' </dev/null >/dev/null 2>&1 &)
sh -c 'echo $$ >> "$PIDFILE"; exec sleep 1003' &
wait
"#;
    std::fs::write(&worker, script).unwrap();
    let m = dir.join("k.yaml");
    std::fs::write(
        &m,
        format!(
            "name: k\naxes:\n  model: [toy]\ndefaults:\n  steps: 3\n  warmup: 1\n  timeout: 120s\n  retries: 0\n  workload:\n    kind: command\n    argv: [sh, '{}']\n    env: {{PIDFILE: '{}'}}\n",
            worker.display(),
            pids.display()
        ),
    )
    .unwrap();
    let mut c = bench_cmd(dir);
    c.args([
        "matrix",
        m.to_str().unwrap(),
        "--gpus",
        "0",
        "--no-progress",
    ])
    .args([
        "--run-id",
        "k",
        "--results-dir",
        dir.join("results").to_str().unwrap(),
    ])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null());
    let mut bench = c.spawn().unwrap();
    let t0 = std::time::Instant::now();
    let listed = || {
        std::fs::read_to_string(&pids)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse::<i32>().ok())
            .collect::<Vec<_>>()
    };
    while listed().len() < 3 {
        assert!(
            t0.elapsed().as_secs() < 60,
            "the worker's children never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    bench.kill().unwrap();
    let _ = bench.wait();
    let alive = |pid: i32| {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .unwrap_or_default()
                .contains(") Z ")
    };
    let t1 = std::time::Instant::now();
    while listed().into_iter().any(alive) && t1.elapsed().as_secs() < 10 {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let left: Vec<i32> = listed().into_iter().filter(|p| alive(*p)).collect();
    for p in &left {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A script's background job has SIGINT ignored; `bench history study` still stops at
/// Ctrl-C (exit 130) instead of computing on.
#[test]
fn history_study_stops_at_ctrl_c_even_when_started_with_sigint_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    assert_eq!(run(dir, "r1", false).status.code(), Some(0));
    assert_eq!(run(dir, "r2", false).status.code(), Some(0));
    let script = format!(
        "trap '' INT; '{}' history study '{}' '{}' --alarm-trials 1000000 --detect-trials 1000000 & p=$!; sleep 2; kill -INT $p; wait $p",
        env!("CARGO_BIN_EXE_bench"),
        dir.join("results/r1").display(),
        dir.join("results/r2").display()
    );
    let mut c = Command::new("sh");
    c.args(["-c", &script]).env_remove("CI");
    let o = within(c, 30, "bench history study after Ctrl-C");
    assert_eq!(o.status.code(), Some(130), "{}", text(&o));
}
