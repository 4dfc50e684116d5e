//! One Slurm job's life against real Slurm daemons (slurmctld + slurmd on this host),
//! through the path a run takes: the built binary's `bench matrix FILE --launcher slurm`,
//! whose job loop (src/run/slurm) submits, watches, stops and reads back each job.
//!
//! These run only when `BENCH_SLURM_TESTS=1`, which CI sets after
//! `scripts/slurm-ci-setup.sh` has started the cluster; with the variable set, a Slurm
//! that does not work fails the tests loudly. Each matrix has one CPU cell running a
//! command workload, a small shell script printing worker events. tests/slurm_run.rs
//! covers the run around the jobs (repeats, retries, resume, fail-fast); this file covers
//! what one job carries: arguments and variables byte for byte, the rank contract, each
//! rank's events and log, a failing rank's own status, and the stops.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use bench::results::{CellResult, Outcome, RunResults};

mod common;

const WORKER: &str = r#"#!/bin/sh
# A command workload: records what it was given, prints worker events and a log line.
out="$2"
printf '%s' "$1" > "$out/arg-$RANK"
printf '%s' "$BENCH_TEST_NOTE" > "$out/env-$RANK"
printf '{"event":"notice","message":"rank=%s world=%s local=%s lws=%s nvls=%s port=%s"}\n' \
  "$RANK" "$WORLD_SIZE" "$LOCAL_RANK" "$LOCAL_WORLD_SIZE" "$NCCL_NVLS_ENABLE" "$MASTER_PORT"
i=0
while [ $i -lt 3 ]; do
  printf '{"event":"step","step":%d,"step_time_s":0.01,"tokens":64,"loss":%d.5,"rank":%s}\n' $i $((3 - i)) "$RANK"
  i=$((i + 1))
done
printf '{"event":"summary","tokens_per_s":6400,"world_size":%s}\n' "$WORLD_SIZE"
echo "log line from rank $RANK" >&2
if [ "$RANK" = "$FAIL_RANK" ]; then exit 6; fi
"#;

/// A YAML scalar holding `s` exactly (JSON strings are YAML's double-quoted scalars, which
/// keep newlines, quotes and dollars as they are).
fn y(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// A matrix of one cell, `case x ranks`, running `argv` with `env` as its workload.
fn write_matrix(
    dir: &Path,
    case: &str,
    ranks: u32,
    timeout: &str,
    argv: &[String],
    env: &BTreeMap<&str, &str>,
) -> PathBuf {
    let argv: Vec<String> = argv.iter().map(|a| y(a)).collect();
    let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}: {}", y(v))).collect();
    let text = format!(
        "name: slurm-real\naxes:\n  case: [{case}]\n  gpus: [{ranks}]\ndefaults:\n  steps: 3\n  warmup: 1\n  retries: 0\n  timeout: {timeout}\n  workload: {{kind: command, argv: [{}], env: {{{}}}}}\nslurm:\n  partition: debug\n  sbatch_args: [\"--oversubscribe\"]\n",
        argv.join(", "),
        env.join(", "),
    );
    let path = dir.join("matrix.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `bench matrix MATRIX --launcher slurm` writing run `r1` under `dir`.
fn bench(dir: &Path, matrix: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bench"));
    c.env_remove("CI")
        .env_remove("GITHUB_STEP_SUMMARY")
        .env_remove("BENCH_SLURM_PARTITION")
        .env_remove("BENCH_SLURM_ACCOUNT")
        // Poll the queue often: these jobs take seconds.
        .env("BENCH_SLURM_POLL_S", "0.3")
        .arg("matrix")
        .arg(matrix)
        .args(["--launcher", "slurm", "--no-progress", "--kill-grace", "2"])
        .args(["--run-id", "r1"])
        .arg("--baselines")
        .arg(dir.join("baselines"))
        .arg("--results-dir")
        .arg(dir.join("results"));
    c
}

/// The run's only cell and the text of its output, for failure messages.
fn only_cell(dir: &Path, out: &Output) -> (CellResult, String) {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let r = RunResults::load(&dir.join("results/r1"))
        .unwrap_or_else(|e| panic!("no results ({e}): {stderr}"));
    assert_eq!(r.cells.len(), 1, "{stderr}");
    (r.cells[0].clone(), stderr)
}

/// The Slurm job of the cell's first attempt.
fn job_id(c: &CellResult) -> String {
    c.attempts[0]
        .slurm_job_id
        .clone()
        .unwrap_or_else(|| panic!("no Slurm job: {:?}", c.attempts))
}

/// The worker script in `dir`, and the command line that runs it with `arg`, leaving what
/// it was given in `dir`.
fn worker_argv(dir: &Path, arg: &str) -> Vec<String> {
    let script = dir.join("worker.sh");
    std::fs::write(&script, WORKER).unwrap();
    vec![
        "/bin/sh".to_string(),
        script.display().to_string(),
        arg.to_string(),
        dir.display().to_string(),
    ]
}

#[test]
fn a_two_rank_cpu_cell_runs_and_its_events_come_back() {
    if !common::slurm_enabled() {
        return;
    }
    let _turn = common::slurm_turn();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let hostile = "a b 'q' \"d\" $(touch pwned) `id` ; rm -rf x\nline2 $HOME *";
    let argv = worker_argv(dir, hostile);
    let env = [("BENCH_TEST_NOTE", hostile)].into();
    let m = write_matrix(dir, "slurm-ok", 2, "120s", &argv, &env);
    let out = bench(dir, &m).current_dir(dir).output().unwrap();
    let (c, stderr) = only_cell(dir, &out);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(c.outcome, Outcome::Passed, "{c:#?}");
    let id = job_id(&c);
    assert_eq!(common::job_state(&id), "COMPLETED", "job {id}");
    assert_eq!(c.attempts[0].exit_code, Some(0));
    let rep = &c.repeats[0];
    // Every rank's steps come back, each marked with its rank.
    for rank in 0..2u32 {
        let steps = rep.steps.iter().filter(|s| s.rank == Some(rank)).count();
        assert!(steps >= 2, "rank {rank}: {:?}", rep.steps);
    }
    assert_eq!(rep.summary.world_size, Some(2), "{:?}", rep.summary);
    // The rank contract: each task is told its rank, the world, its place on the node.
    for rank in 0..2u32 {
        let want = format!("rank={rank} world=2 local={rank} lws=2 nvls=0 port=");
        assert!(
            rep.notices.iter().any(|n| n.starts_with(&want)),
            "rank {rank}: {:?}",
            rep.notices
        );
        // Each rank's own log holds its text, as a local cell's does.
        let log = dir.join(format!("results/r1/logs/{}.r0.rank{rank}.log", c.id));
        let log = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{log:?}: {e}"));
        assert!(log.contains(&format!("log line from rank {rank}")), "{log}");
        assert!(
            log.contains(&format!("bench: rank {rank} exited with status 0")),
            "{log}"
        );
        // The hostile value arrived as one argument and one variable, byte for byte.
        let arg = std::fs::read_to_string(dir.join(format!("arg-{rank}"))).unwrap();
        assert_eq!(arg, hostile);
        let envv = std::fs::read_to_string(dir.join(format!("env-{rank}"))).unwrap();
        assert_eq!(envv, hostile);
    }
    // No shell ever saw the value: nothing was touched, here or where the job ran.
    let job_dir = dir.join("results/r1/slurm");
    assert!(!dir.join("pwned").exists() && !Path::new("pwned").exists());
    assert!(!walk(&job_dir).iter().any(|p| p.ends_with("pwned")));
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn a_failing_rank_fails_the_job_with_its_own_exit_code() {
    if !common::slurm_enabled() {
        return;
    }
    let _turn = common::slurm_turn();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let argv = worker_argv(dir, "x");
    let env = [("FAIL_RANK", "1")].into();
    let m = write_matrix(dir, "slurm-fail", 2, "120s", &argv, &env);
    let out = bench(dir, &m).output().unwrap();
    let (c, stderr) = only_cell(dir, &out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(matches!(c.outcome, Outcome::Failed { .. }), "{c:#?}");
    let id = job_id(&c);
    assert_eq!(common::job_state(&id), "FAILED", "job {id}");
    // The cause is rank 1's own status, not the batch script's or a killed rank's.
    assert_eq!(c.attempts[0].exit_code, Some(6), "{:?}", c.attempts);
    let log = dir.join(format!("results/r1/logs/{}.r0.rank1.log", c.id));
    let log = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{log:?}: {e}"));
    assert!(log.contains("bench: rank 1 exited with status 6"), "{log}");
}

#[test]
fn sleeping_jobs_are_cancelled_on_timeout_and_on_ctrl_c() {
    if !common::slurm_enabled() {
        return;
    }
    let _turn = common::slurm_turn();
    let argv = vec!["sleep".to_string(), "300".to_string()];

    // Timeout: the runner gives up, scancels, and the job leaves the queue.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let m = write_matrix(dir, "slurm-sleep-a", 1, "3s", &argv, &BTreeMap::new());
    let started = Instant::now();
    let out = bench(dir, &m).output().unwrap();
    let (c, stderr) = only_cell(dir, &out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(90),
        "the job sleeps 300 s: only the timeout can end the run this soon"
    );
    assert!(matches!(c.outcome, Outcome::TimedOut { .. }), "{c:#?}");
    let id = job_id(&c);
    assert!(
        !common::squeue_lists(&id),
        "job {id} still queued after cancel"
    );
    assert_eq!(common::job_state(&id), "CANCELLED", "job {id}");

    // Ctrl-C while the job runs: the job is cancelled and leaves the queue.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let m = write_matrix(dir, "slurm-sleep-b", 1, "120s", &argv, &BTreeMap::new());
    let mut cmd = bench(dir, &m);
    cmd.process_group(0);
    let (mut child, lines) = common::spawn_bench(&mut cmd);
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !seen.iter().any(|l: &String| l.starts_with("RUNNING")) && Instant::now() < deadline {
        if let Ok(l) = lines.recv_timeout(Duration::from_millis(200)) {
            seen.push(l);
        }
    }
    let id = seen
        .iter()
        .find(|l| l.starts_with("SUBMIT"))
        .and_then(|l| l.split("Slurm job ").nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| panic!("the job never got going: {seen:#?}"));
    assert!(common::squeue_lists(&id), "job {id} not running: {seen:#?}");
    common::ctrl_c_exits_130(&mut child, &lines, &mut seen);
    assert!(
        !common::squeue_lists(&id),
        "job {id} still queued after Ctrl-C"
    );
    assert_eq!(common::job_state(&id), "CANCELLED", "job {id}");
}

/// A framework cell under `--launcher slurm`: one task (`bench adapt`) whose own launcher
/// (torchrun) starts the cell's two ranks on the node: DeepSpeed's engine, ZeRO over gloo on
/// the node's CPUs, from `BENCH_PYTHON` (CI builds DeepSpeed there).
#[test]
fn a_deepspeed_cell_runs_as_one_task_whose_torchrun_starts_its_ranks() {
    if !common::slurm_enabled() {
        return;
    }
    let Some(python) = std::env::var("BENCH_PYTHON").ok().filter(|py| {
        Command::new(py)
            .args(["-c", "import deepspeed, transformers"])
            .output()
            .is_ok_and(|o| o.status.success())
    }) else {
        panic!("BENCH_SLURM_TESTS=1 needs BENCH_PYTHON with deepspeed and transformers");
    };
    let _turn = common::slurm_turn();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/frameworks");
    let m = dir.join("matrix.yaml");
    std::fs::write(
        &m,
        format!(
            "name: slurm-framework\naxes:\n  model: [llama-tiny]\n  dtype: [fp32]\n  gpus: [2]\n  parallel: [ddp]\ndefaults:\n  steps: 6\n  warmup: 2\n  seq_len: 64\n  micro_batch: 2\n  retries: 0\n  timeout: 300s\n  workload: {{kind: deepspeed, python: {}}}\nslurm:\n  partition: debug\n  sbatch_args: [\"--oversubscribe\"]\n",
            y(&python)
        ),
    )
    .unwrap();
    let out = bench(dir, &m)
        .env("BENCH_FRAMEWORK_SCRIPTS", &scripts)
        .current_dir(dir)
        .output()
        .unwrap();
    let (c, stderr) = only_cell(dir, &out);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(c.outcome, Outcome::Passed, "{c:#?}");
    let id = job_id(&c);
    assert_eq!(common::job_state(&id), "COMPLETED", "job {id}");
    // One task: the script asked Slurm for one, and the ranks are torchrun's.
    let script = walk(&dir.join("results/r1/slurm"))
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "sbatch"))
        .expect("the job script");
    let text = std::fs::read_to_string(&script).unwrap();
    assert!(text.contains("--ntasks-per-node=1"), "{text}");
    let rep = &c.repeats[0];
    assert_eq!(rep.steps.len(), 6, "{:?}", rep.steps);
    let fw = rep.summary.framework.as_ref().expect("framework record");
    assert_eq!(fw.name, "deepspeed");
    assert_eq!(rep.summary.world_size, Some(2), "{:?}", rep.summary);
    assert!(fw.tokens_per_s_per_gpu.is_some_and(|t| t > 0.0), "{fw:?}");
}
