//! `bench matrix FILE --launcher slurm` end to end: the built binary submits each cell as
//! a job to real Slurm daemons (slurmctld + slurmd on this host, started by
//! scripts/slurm-ci-setup.sh) and runs it through the same pipeline as a local cell.
//!
//! These run only when `BENCH_SLURM_TESTS=1` (CI sets it after starting the daemons); with
//! the variable set, a Slurm that does not work fails them loudly. The cells are CPU cells
//! running tests/fixtures/slurm_worker.sh (one copy per rank), plus one built-in gpt2-tiny
//! cell to show `bench worker` under srun. They take turns with every Slurm test (a file
//! lock, as nextest runs each test in its own process): the CI node has few CPUs, and the
//! fail-fast test needs to know which jobs can run side by side.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bench::results::{CellResult, Outcome, RunResults};

mod common;

fn worker() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/slurm_worker.sh")
}

fn bench() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bench"));
    c.env_remove("CI")
        .env_remove("GITHUB_STEP_SUMMARY")
        .env_remove("BENCH_SLURM_PARTITION")
        .env_remove("BENCH_SLURM_ACCOUNT")
        // Poll the queue often: these jobs take seconds.
        .env("BENCH_SLURM_POLL_S", "0.3");
    c
}

fn q(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A matrix whose cells are `case x gpus`; each case runs `slurm_worker.sh ARGS...`.
/// `params` (`  key: value` lines) set parameters in `defaults`; `sbatch_args` go into the
/// `slurm:` block.
fn write_matrix(
    dir: &Path,
    cases: &[(&str, &[&str])],
    gpus: &[u32],
    params: &str,
    sbatch_args: &[&str],
) -> PathBuf {
    let argv = |args: &[&str]| {
        let mut v = vec![q("sh"), q(&worker().display().to_string())];
        v.extend(args.iter().map(|a| q(a)));
        format!("{{kind: command, argv: [{}]}}", v.join(", "))
    };
    // Defaults, each replaced by a `key: value` of the same key in `params`.
    let mut defaults = vec![
        ("steps", "3"),
        ("warmup", "1"),
        ("retries", "0"),
        ("timeout", "120s"),
    ];
    for (k, v) in params.lines().filter_map(|l| l.trim().split_once(": ")) {
        match defaults.iter_mut().find(|(dk, _)| *dk == k) {
            Some(d) => d.1 = v,
            None => defaults.push((k, v)),
        }
    }
    let defaults: String = defaults
        .iter()
        .map(|(k, v)| format!("  {k}: {v}\n"))
        .collect();
    let mut text = format!(
        "name: slurm-run\naxes:\n  case: [{}]\n  gpus: [{}]\ndefaults:\n{defaults}  workload: {}\noverrides:\n  case:\n",
        cases.iter().map(|(c, _)| q(c)).collect::<Vec<_>>().join(", "),
        gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
        argv(&["ok"]),
    );
    for (case, args) in cases {
        text.push_str(&format!("    {}: {{workload: {}}}\n", q(case), argv(args)));
    }
    text.push_str(&format!(
        "slurm:\n  partition: debug\n  sbatch_args: [{}]\n",
        sbatch_args
            .iter()
            .map(|a| q(a))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let path = dir.join("matrix.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

fn run_args(cmd: &mut Command, dir: &Path, matrix: &Path) {
    cmd.arg("matrix")
        .arg(matrix)
        .args(["--launcher", "slurm", "--no-progress", "--kill-grace", "2"])
        .arg("--baselines")
        .arg(dir.join("baselines"))
        .arg("--results-dir")
        .arg(dir.join("results"));
}

fn by_case<'a>(r: &'a RunResults, case: &str, gpus: u32) -> &'a CellResult {
    r.cells
        .iter()
        .find(|c| {
            c.values.get("case").map(|v| v.id_fragment()).as_deref() == Some(case)
                && c.values.get("gpus").and_then(|v| v.as_f64()) == Some(f64::from(gpus))
        })
        .unwrap_or_else(|| panic!("no cell {case} x {gpus} in {:?}", r.cells))
}

fn job_ids(c: &CellResult) -> Vec<String> {
    c.attempts
        .iter()
        .filter_map(|a| a.slurm_job_id.clone())
        .collect()
}

#[test]
fn one_and_two_rank_cells_pass_with_metrics_logs_and_job_ids() {
    if !common::slurm_enabled() {
        return;
    }
    let _turn = common::slurm_turn();
    let tmp = tempfile::tempdir().unwrap();
    let m = write_matrix(
        tmp.path(),
        &[("ok", &["ok"])],
        &[1, 2],
        "  repeats: 2\n",
        &["--oversubscribe"],
    );
    let mut cmd = bench();
    run_args(&mut cmd, tmp.path(), &m);
    let out = cmd.args(["--run-id", "r1"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("Slurm: partition debug"), "{stderr}");
    assert!(stderr.contains("SUBMIT"), "{stderr}");
    let dir = tmp.path().join("results/r1");
    let r = RunResults::load(&dir).unwrap();
    assert_eq!(r.launcher.as_deref(), Some("slurm"));
    for gpus in [1u32, 2] {
        let c = by_case(&r, "ok", gpus);
        assert_eq!(c.outcome, Outcome::Passed, "{c:#?}");
        assert_eq!(c.repeats.len(), 2);
        // Step time is the slowest rank's: rank r's steps take 0.1 x (r + 1) s.
        let want = 0.1 * f64::from(gpus);
        let st = c.metrics["step_time_s"].value;
        assert!((st - want).abs() < 1e-9, "{gpus} rank(s): step time {st}");
        let tps = c.metrics["tokens_per_s"].value;
        assert!((tps - 1024.0 / want).abs() < 1e-6, "{tps}");
        let per_gpu = c.metrics["tokens_per_s_per_gpu"].value;
        assert!((per_gpu - 1024.0 / want / f64::from(gpus)).abs() < 1e-6);
        // Memory per rank, in rank order, whichever rank's summary came first.
        let mem: Vec<u64> = (1..=u64::from(gpus)).map(|r| 1000 * r).collect();
        for rep in &c.repeats {
            assert_eq!(rep.summary.peak_mem_bytes, mem);
        }
        assert_eq!(c.metrics["peak_mem_bytes"].value, 1000.0 * f64::from(gpus));
        // One job per repeat, each recorded and known to Slurm as completed.
        let ids = job_ids(c);
        assert_eq!(ids.len(), 2, "{:?}", c.attempts);
        assert_ne!(ids[0], ids[1]);
        for id in &ids {
            assert_eq!(common::job_state(id), "COMPLETED", "job {id}");
        }
        assert!(c.attempts.iter().all(|a| a.exit_code == Some(0)));
        // Each rank's log is kept, like a local cell's, and names its job.
        for (rep, id) in ids.iter().enumerate() {
            for rank in 0..gpus {
                let name = if gpus > 1 {
                    format!("logs/{}.r{rep}.rank{rank}.log", c.id)
                } else {
                    format!("logs/{}.r{rep}.log", c.id)
                };
                assert!(c.logs.contains(&PathBuf::from(&name)), "{:?}", c.logs);
                let log = std::fs::read_to_string(dir.join(&name)).unwrap();
                assert!(log.contains(&format!("Slurm job {id}")), "{name}: {log}");
                assert!(
                    log.contains(&format!("slurm_worker rank {rank} of {gpus}, job {id}")),
                    "{name}: {log}"
                );
                assert!(log.contains(&format!("rank {rank} done")), "{name}: {log}");
                assert!(log.contains("\"event\":\"summary\""), "{name}: {log}");
            }
        }
    }
    // The reports follow the run as for a local one.
    assert!(dir.join("junit.xml").exists() && dir.join("summary.md").exists());
}

#[test]
fn failing_ranks_are_classified_and_crashes_are_retried() {
    if !common::slurm_enabled() {
        return;
    }
    let _turn = common::slurm_turn();
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("flaky-marker");
    let marker = marker.to_str().unwrap();
    let m = write_matrix(
        tmp.path(),
        &[
            ("nan", &["fail-rank", "1", "5", "nan_loss"]),
            ("unsupported", &["fail-rank", "1", "3", "unsupported"]),
            ("flaky", &["flaky", marker]),
            ("crash", &["exit", "1"]),
        ],
        &[2],
        "  retries: 1\n",
        &["--oversubscribe"],
    );
    let mut cmd = bench();
    run_args(&mut cmd, tmp.path(), &m);
    let out = cmd.args(["--run-id", "r1"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let r = RunResults::load(&tmp.path().join("results/r1")).unwrap();

    // A NaN loss on rank 1 fails the cell, not retried, with rank 1's own words.
    let nan = by_case(&r, "nan", 2);
    match &nan.outcome {
        Outcome::Failed { reason } => {
            assert!(reason.contains("loss became NaN (exit 5)"), "{reason}");
            assert!(reason.contains("rank 1 gave up on purpose"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(nan.attempts.len(), 1);
    assert_eq!(nan.attempts[0].exit_code, Some(5));
    let id = nan.attempts[0].slurm_job_id.clone().unwrap();
    assert_eq!(common::job_state(&id), "FAILED");
    // Both ranks' logs are kept; rank 0 was stopped by srun after rank 1 failed.
    assert_eq!(
        nan.logs
            .iter()
            .filter(|l| l.to_string_lossy().contains(".rank"))
            .count(),
        2
    );

    // Exit 3 on a rank: unsupported here, a skip.
    let uns = by_case(&r, "unsupported", 2);
    assert!(
        matches!(&uns.outcome, Outcome::Skipped { reason } if reason.contains("unsupported")),
        "{:?}",
        uns.outcome
    );

    // A crash before the first step is infrastructure: retried in a new job; a pass after
    // it is flaky.
    let flaky = by_case(&r, "flaky", 2);
    assert_eq!(flaky.outcome, Outcome::Passed, "{:?}", flaky.attempts);
    assert!(flaky.flaky);
    let ids = job_ids(flaky);
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[0], ids[1]);
    assert!(flaky.attempts[0]
        .error
        .as_deref()
        .is_some_and(|e| e.contains("before its first step")));

    // A crash every time fails once retries run out, as an infrastructure failure.
    let crash = by_case(&r, "crash", 2);
    assert!(
        matches!(&crash.outcome, Outcome::Failed { reason } if reason.contains("infrastructure failure in 2 attempt(s)")),
        "{:?}",
        crash.outcome
    );
    assert!(stderr.contains("RETRY"), "{stderr}");
}

#[test]
fn a_cell_past_its_timeout_is_cancelled_and_leaves_the_queue() {
    if !common::slurm_enabled() {
        return;
    }
    let _turn = common::slurm_turn();
    let tmp = tempfile::tempdir().unwrap();
    let m = write_matrix(
        tmp.path(),
        &[("sleepy", &["sleep"])],
        &[2],
        "  timeout: 3s\n",
        &["--oversubscribe"],
    );
    let mut cmd = bench();
    run_args(&mut cmd, tmp.path(), &m);
    let started = Instant::now();
    let out = cmd.args(["--run-id", "r1"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(90),
        "the worker sleeps 300 s: only the timeout can end the run this soon"
    );
    let r = RunResults::load(&tmp.path().join("results/r1")).unwrap();
    let c = by_case(&r, "sleepy", 2);
    let id = c.attempts[0].slurm_job_id.clone().unwrap();
    match &c.outcome {
        Outcome::TimedOut { reason } => {
            assert!(reason.contains(&format!("Slurm job {id}")), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(!common::squeue_lists(&id), "job {id} still queued");
    assert_eq!(common::job_state(&id), "CANCELLED");
    // The time limit Slurm got is the cell's timeout plus the margin (1 minute minimum).
    let script = std::fs::read_dir(tmp.path().join("results/r1/slurm"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let sbatch = std::fs::read_dir(&script)
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| e.path().extension().is_some_and(|x| x == "sbatch"))
        .unwrap();
    let text = std::fs::read_to_string(sbatch.path()).unwrap();
    assert!(text.contains("--time=0-00:01:03"), "{text}");
}

#[test]
fn ctrl_c_cancels_every_job_and_resume_finishes_the_run() {
    if !common::slurm_enabled() {
        return;
    }
    let _turn = common::slurm_turn();
    let tmp = tempfile::tempdir().unwrap();
    let gate = tmp.path().join("gate");
    let gate_s = gate.to_str().unwrap();
    let m = write_matrix(
        tmp.path(),
        &[("a", &["gated", gate_s]), ("b", &["gated", gate_s])],
        &[1, 2],
        "",
        &["--oversubscribe"],
    );
    let mut cmd = bench();
    run_args(&mut cmd, tmp.path(), &m);
    cmd.args(["--run-id", "r1"]).process_group(0);
    let (mut child, lines) = common::spawn_bench(&mut cmd);
    // Wait until all four cells are submitted and one runs, then press Ctrl-C.
    let mut seen = Vec::new();
    let mut submitted = Vec::new();
    let mut running = false;
    let deadline = Instant::now() + Duration::from_secs(120);
    while (submitted.len() < 4 || !running) && Instant::now() < deadline {
        if let Ok(l) = lines.recv_timeout(Duration::from_millis(200)) {
            if let Some(id) = l
                .split("Slurm job ")
                .nth(1)
                .filter(|_| l.starts_with("SUBMIT"))
            {
                submitted.push(id.trim().to_string());
            }
            running |= l.starts_with("RUNNING");
            seen.push(l);
        }
    }
    assert!(
        submitted.len() == 4 && running,
        "jobs never got going: {seen:#?}"
    );
    common::ctrl_c_exits_130(&mut child, &lines, &mut seen);
    for id in &submitted {
        assert!(
            !common::squeue_lists(id),
            "job {id} survived Ctrl-C: {seen:#?}"
        );
        assert_eq!(common::job_state(id), "CANCELLED", "job {id}");
    }
    let dir = tmp.path().join("results/r1");
    let r = RunResults::load(&dir).unwrap();
    assert!(r.interrupted);
    assert_eq!(r.cells.len(), 4);
    for c in &r.cells {
        assert!(
            matches!(&c.outcome, Outcome::Skipped { reason } if reason.contains("interrupted")),
            "{:?}",
            c.outcome
        );
    }

    // Open the gate: --resume runs every cell the interrupted run did not finish.
    std::fs::write(&gate, "").unwrap();
    let mut cmd = bench();
    run_args(&mut cmd, tmp.path(), &m);
    let out = cmd.arg("--resume").arg(&dir).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let r = RunResults::load(&dir).unwrap();
    assert!(!r.interrupted);
    assert_eq!(r.cells.len(), 4);
    for c in &r.cells {
        assert_eq!(c.outcome, Outcome::Passed, "{}: {:?}", c.id, c.attempts);
        assert!(!job_ids(c).iter().any(|j| submitted.contains(j)));
    }

    // A local resume of a Slurm run would mix hardware: refused as bad input.
    let out = bench()
        .arg("matrix")
        .arg(&m)
        .args(["--no-progress", "--gpus", "0", "--resume"])
        .arg(&dir)
        .arg("--baselines")
        .arg(tmp.path().join("baselines"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--launcher slurm"), "{stderr}");
}

#[test]
fn fail_fast_withdraws_queued_jobs_and_lets_running_ones_finish() {
    if !common::slurm_enabled() {
        return;
    }
    let _turn = common::slurm_turn();
    let cpus: u32 = String::from_utf8_lossy(
        &Command::new("sinfo")
            .args(["-h", "-p", "debug", "-o", "%c"])
            .output()
            .unwrap()
            .stdout,
    )
    .trim()
    .parse()
    .unwrap_or(2);
    let tmp = tempfile::tempdir().unwrap();
    let gate = tmp.path().join("gate");
    let gate_s = gate.to_str().unwrap();
    // Without --oversubscribe every task takes a CPU: `bad` and `held` fill the node
    // (`held` takes every CPU but one), so `queued`, which needs every CPU, waits.
    let m2 = tmp.path().join("ff.yaml");
    let worker = worker().display().to_string();
    let wl = |args: &[&str]| {
        let mut v = vec![q("sh"), q(&worker)];
        v.extend(args.iter().map(|a| q(a)));
        format!("{{kind: command, argv: [{}]}}", v.join(", "))
    };
    std::fs::write(
        &m2,
        format!(
            "name: slurm-ff\naxes:\n  case: [bad, held, queued]\ndefaults:\n  steps: 3\n  warmup: 1\n  retries: 0\n  timeout: 120s\n  workload: {}\noverrides:\n  case:\n    bad: {{workload: {}}}\n    held: {{workload: {}}}\ninclude:\n  - {{case: held, gpus: {}}}\n  - {{case: queued, gpus: {cpus}}}\n  - {{case: bad, gpus: 1}}\nslurm:\n  partition: debug\n",
            wl(&["ok"]),
            wl(&["exit", "2"]),
            wl(&["gated", gate_s]),
            cpus.saturating_sub(1).max(1),
        ),
    )
    .unwrap();
    let mut cmd = bench();
    run_args(&mut cmd, tmp.path(), &m2);
    cmd.args(["--run-id", "r1", "--fail-fast"]);
    let (mut child, lines) = common::spawn_bench(&mut cmd);
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    // Once `bad` has failed and fail-fast has withdrawn `queued`, let `held` finish.
    while Instant::now() < deadline {
        if let Ok(l) = lines.recv_timeout(Duration::from_millis(200)) {
            let stop = l.starts_with("STOP");
            seen.push(l);
            if stop {
                break;
            }
        }
    }
    std::thread::sleep(Duration::from_secs(2));
    std::fs::write(&gate, "").unwrap();
    let status = child.wait().unwrap();
    seen.extend(lines.try_iter());
    assert_eq!(status.code(), Some(1), "{seen:#?}");
    let r = RunResults::load(&tmp.path().join("results/r1")).unwrap();
    let outcome = |case: &str| {
        r.cells
            .iter()
            .find(|c| c.values.get("case").map(|v| v.id_fragment()).as_deref() == Some(case))
            .unwrap()
    };
    assert!(
        matches!(&outcome("bad").outcome, Outcome::Failed { reason } if reason.contains("bad input (exit 2)")),
        "{:?}",
        outcome("bad").outcome
    );
    assert_eq!(outcome("held").outcome, Outcome::Passed, "{seen:#?}");
    let queued = outcome("queued");
    assert!(
        matches!(&queued.outcome, Outcome::Skipped { reason } if reason.contains("withdrawn")),
        "{:?} {seen:#?}",
        queued.outcome
    );
    let id = queued.attempts[0].slurm_job_id.clone().unwrap();
    assert!(!common::squeue_lists(&id));
    assert_eq!(common::job_state(&id), "CANCELLED");
}

#[test]
fn a_builtin_cpu_cell_runs_bench_worker_under_srun() {
    if !common::slurm_enabled() {
        return;
    }
    let _turn = common::slurm_turn();
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("tiny.yaml");
    std::fs::write(
        &m,
        "name: slurm-builtin\naxes:\n  model: [gpt2-tiny]\n  dtype: [fp32]\n  gpus: [1]\n  parallel: [single]\ndefaults:\n  steps: 6\n  warmup: 2\n  seq_len: 32\n  micro_batch: 2\n  timeout: 5m\n  retries: 0\nslurm:\n  partition: debug\n  sbatch_args: [--oversubscribe]\n",
    )
    .unwrap();
    let mut cmd = bench();
    run_args(&mut cmd, tmp.path(), &m);
    let out = cmd.args(["--run-id", "r1"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let dir = tmp.path().join("results/r1");
    let r = RunResults::load(&dir).unwrap();
    let c = &r.cells[0];
    assert_eq!(c.outcome, Outcome::Passed, "{c:#?}");
    assert_eq!(c.repeats[0].steps.len(), 6);
    assert!(c.metrics["tokens_per_s"].value > 0.0);
    assert!(c.metrics.contains_key("tflops_per_gpu"));
    let id = c.attempts[0].slurm_job_id.clone().unwrap();
    let log = std::fs::read_to_string(dir.join(&c.logs[0])).unwrap();
    assert!(log.contains(&format!("Slurm job {id}")), "{log}");
    assert!(log.contains("\"event\":\"summary\""), "{log}");
    // The script ran `bench worker` (this binary) through srun.
    let script = std::fs::read_to_string(
        std::fs::read_dir(dir.join("slurm").join(format!("{}.r0", c.id)))
            .unwrap()
            .filter_map(|e| e.ok())
            .find(|e| e.path().extension().is_some_and(|x| x == "sbatch"))
            .unwrap()
            .path(),
    )
    .unwrap();
    assert!(
        script.contains(&format!("{} worker --cell-id", env!("CARGO_BIN_EXE_bench"))),
        "{script}"
    );
}

#[test]
fn a_job_slurm_will_never_start_fails_its_cell_instead_of_waiting_forever() {
    if !common::slurm_enabled() {
        return;
    }
    let _turn = common::slurm_turn();
    // A job that depends on the success of a failed job pends with reason
    // DependencyNeverSatisfied for ever.
    let out = Command::new("sbatch")
        .args(["--parsable", "--output=/dev/null", "--wrap", "exit 1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let failed = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    while common::job_state(&failed) != "FAILED" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(common::job_state(&failed), "FAILED");
    let tmp = tempfile::tempdir().unwrap();
    let dep = format!("--dependency=afterok:{failed}");
    let m = write_matrix(
        tmp.path(),
        &[("blocked", &["ok"])],
        &[1],
        "",
        &["--oversubscribe", &dep],
    );
    let mut cmd = bench();
    run_args(&mut cmd, tmp.path(), &m);
    let out = cmd.args(["--run-id", "r1"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let r = RunResults::load(&tmp.path().join("results/r1")).unwrap();
    let c = by_case(&r, "blocked", 1);
    match &c.outcome {
        Outcome::Failed { reason } => {
            assert!(reason.contains("bad input (exit 2)"), "{reason}");
            assert!(reason.contains("DependencyNeverSatisfied"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let id = c.attempts[0].slurm_job_id.clone().unwrap();
    assert!(!common::squeue_lists(&id));
}
