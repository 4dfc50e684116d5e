//! Helpers for the runner's integration tests: hand-built cells whose workload is the
//! fake worker in tests/fixtures, started through `Workload::Command` (no shell).

#![allow(dead_code)]

pub mod cli;
pub mod shards;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use bench::cell::{Cell, CellId, Params, Value, Workload};
use bench::matrix::{Dropped, Expansion};
use bench::run::progress::LineReporter;
use bench::run::{run_with, RunConfig, RunError, RunOutcome};
use indexmap::IndexMap;

pub fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_worker.sh")
}

/// A cell named `name` whose workload is `sh fake_worker.sh ARGS...` (ARGS may hold
/// `{placeholders}`), with 5 steps of which 1 is warm-up.
pub fn cell(name: &str, args: &[&str]) -> Cell {
    let mut values = IndexMap::new();
    values.insert("model".to_string(), Value::Str(name.to_string()));
    let mut argv = vec!["sh".to_string(), fixture().display().to_string()];
    argv.extend(args.iter().map(|a| a.to_string()));
    Cell {
        id: CellId::from_values(&values),
        values,
        params: Params {
            steps: 5,
            warmup: 1,
            seq_len: 256,
            micro_batch: 4,
            global_batch: 4,
            timeout_s: 60,
            retries: 0,
            workload: Workload::Command {
                argv,
                env: Default::default(),
            },
            ..Params::default()
        },
    }
}

pub fn expansion(cells: Vec<Cell>) -> Expansion {
    Expansion {
        name: "runner-test".into(),
        file: "tests/runner.yaml".into(),
        spec: Default::default(),
        combinations: cells.len(),
        cells,
        dropped: vec![],
        warnings: vec![],
        vocab: Default::default(),
    }
}

pub fn expansion_with_dropped(cells: Vec<Cell>, dropped: Vec<Dropped>) -> Expansion {
    Expansion {
        dropped,
        ..expansion(cells)
    }
}

/// Settings for a CPU run (`--gpus 0`) into `results`, with a 1 s grace period.
pub fn config(results: &Path) -> RunConfig {
    RunConfig {
        results_dir: results.to_path_buf(),
        run_id: Some("test-run".into()),
        resume: None,
        fail_fast: false,
        max_fail: None,
        gpus: Some(0),
        grace: Duration::from_secs(1),
        matrix: "tests/runner.yaml".into(),
        filters: vec![],
        no_progress: true,
        bench_exe: None,
        launcher: bench::run::Launch::Local,
        jobs: None,
        trace_kernels: false,
    }
}

/// Runs and returns the outcome and the plain progress lines.
pub fn run(config: &RunConfig, exp: Expansion) -> (Result<RunOutcome, RunError>, String) {
    let mut buf = Vec::new();
    let res = {
        let mut rep = LineReporter::new(&mut buf);
        run_with(config, exp, &mut rep)
    };
    (res, String::from_utf8_lossy(&buf).into_owned())
}

/// Whether process `pid` no longer runs (absent, or a zombie nobody reaped yet: a
/// container's init may not reap re-parented children).
pub fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// Waits (bounded) until `pid` is gone; SIGKILL takes effect asynchronously.
pub fn wait_gone(pid: i32) -> bool {
    for _ in 0..100 {
        if gone(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    gone(pid)
}

/// Holds an exclusive lock shared by every Slurm test (in any test process: nextest runs
/// each test in its own) until dropped. The CI node has few CPUs, and some tests need to
/// know which of their jobs can run side by side, so Slurm tests take turns.
pub fn slurm_turn() -> std::fs::File {
    let path = std::env::temp_dir().join("bench-slurm-tests.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.lock()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f
}

/// Whether the Slurm tests run: only with `BENCH_SLURM_TESTS=1` (CI sets it after
/// scripts/slurm-ci-setup.sh has started the daemons). Set but broken is a failure, not a
/// skip.
pub fn slurm_enabled() -> bool {
    match std::env::var("BENCH_SLURM_TESTS").as_deref() {
        Ok("1") => {
            let ok = std::process::Command::new("sinfo")
                .arg("-h")
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            assert!(
                ok,
                "BENCH_SLURM_TESTS=1 but `sinfo` fails: run scripts/slurm-ci-setup.sh"
            );
            true
        }
        _ => {
            eprintln!("skipping: set BENCH_SLURM_TESTS=1 after scripts/slurm-ci-setup.sh");
            false
        }
    }
}

/// Starts `bench` (or any command), returning it and a channel of its stderr lines, so a
/// test can wait for a line (a job's submission, say) before it signals the process.
pub fn spawn_bench(cmd: &mut Command) -> (Child, Receiver<String>) {
    let mut child = cmd.stderr(Stdio::piped()).spawn().unwrap();
    let err = child.stderr.take().unwrap();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Whether `squeue` still lists Slurm job `id` (in any state).
pub fn squeue_lists(id: &str) -> bool {
    let o = Command::new("squeue")
        .args(["-h", "-j", id, "-o", "%T"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .any(|l| !l.trim().is_empty())
}

/// Slurm's state of a job it still remembers (MinJobAge keeps finished jobs for minutes).
pub fn job_state(id: &str) -> String {
    let o = Command::new("scontrol")
        .args(["show", "job", "-o", id])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    text.split_whitespace()
        .find_map(|kv| kv.strip_prefix("JobState="))
        .unwrap_or("?")
        .to_string()
}

/// Sends SIGINT to `child`'s whole process group, as a terminal's Ctrl-C does (bench keeps
/// its own Slurm commands out of that group, so a half-done sbatch or scancel is not cut
/// short), waits for it, adds its last stderr lines to `seen` and checks it exited 130.
pub fn ctrl_c_exits_130(child: &mut Child, lines: &Receiver<String>, seen: &mut Vec<String>) {
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = child.wait().unwrap();
    seen.extend(lines.try_iter());
    assert_eq!(status.code(), Some(130), "{seen:#?}");
}

/// `bench matrix MATRIX --resume RUN_DIR` on CPU (`--gpus 0`, no progress, baselines in
/// `baselines`), as the runner's CLI tests resume a run they stopped; asserts exit 0 and
/// returns stderr.
pub fn resume_run(matrix: &Path, baselines: &Path, run_dir: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .env_remove("CI")
        .env_remove("GITHUB_STEP_SUMMARY")
        .arg("matrix")
        .arg(matrix)
        .arg("--baselines")
        .arg(baselines)
        .args(["--gpus", "0", "--no-progress", "--resume"])
        .arg(run_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    stderr
}
