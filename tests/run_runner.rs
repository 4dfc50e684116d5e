//! The runner driven through `bench::run::run_with` with hand-built cells whose workload
//! is the fake worker (tests/fixtures/fake_worker.sh) started as a `command` workload.

mod common;

use bench::cell::Workload;
use bench::matrix::Dropped;
use bench::results::{Outcome, RunResults};
use bench::run::launch::LaunchError;
use bench::run::RunError;
use common::*;

fn outcome_of<'a>(r: &'a RunResults, name: &str) -> &'a bench::results::CellResult {
    r.cells
        .iter()
        .find(|c| c.id.as_str() == name)
        .unwrap_or_else(|| panic!("no cell {name} in {:?}", r.cells))
}

#[test]
fn hung_worker_and_its_sigterm_ignoring_child_are_killed_at_the_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let pidfile = tmp.path().join("pids");
    let mut c = cell("hang", &["hang", pidfile.to_str().unwrap()]);
    // Long enough for the script to install its SIGTERM trap on a loaded machine.
    c.params.timeout_s = 2;
    c.params.retries = 2;
    let (res, lines) = run(&config(tmp.path()), expansion(vec![c]));
    let out = res.unwrap();
    let r = outcome_of(&out.results, "hang");
    assert!(
        matches!(&r.outcome, Outcome::TimedOut { reason } if reason.contains("SIGKILL")),
        "{:?}\n{lines}",
        r.outcome
    );
    // A timeout is the cell's fault, not infrastructure: no retry.
    assert_eq!(r.attempts.len(), 1);
    let pids: Vec<i32> = std::fs::read_to_string(&pidfile)
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2);
    for pid in pids {
        assert!(wait_gone(pid), "process {pid} survived the timeout");
    }
    // The log holds the worker's stderr.
    let log = std::fs::read_to_string(out.run_dir.join("logs/hang.r0.log")).unwrap();
    assert!(log.contains("hanging now"), "{log}");
    assert_eq!(out.exit_code(), 1);
}

#[test]
fn crashing_worker_is_retried_then_failed_as_infrastructure() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = cell("crash", &["crash"]);
    c.params.retries = 2;
    let (res, _) = run(&config(tmp.path()), expansion(vec![c]));
    let out = res.unwrap();
    let r = outcome_of(&out.results, "crash");
    match &r.outcome {
        Outcome::Failed { reason } => {
            assert!(
                reason.contains("infrastructure failure in 3 attempt(s)"),
                "{reason}"
            );
            assert!(reason.contains("segfault-like crash"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(r.attempts.len(), 3);
    assert!(!r.flaky);
    for log in ["crash.r0.log", "crash.r0.a1.log", "crash.r0.a2.log"] {
        assert!(out.run_dir.join("logs").join(log).exists(), "{log}");
    }
    assert_eq!(
        r.logs,
        vec![
            std::path::PathBuf::from("logs/crash.r0.log"),
            "logs/crash.r0.a1.log".into(),
            "logs/crash.r0.a2.log".into()
        ]
    );
}

#[test]
fn success_after_a_retry_is_flaky() {
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("failed-once");
    let mut c = cell("flaky", &["flaky", "{marker}"]);
    c.params.retries = 1;
    c.params.extra.insert(
        "marker".into(),
        serde_json::Value::String(marker.display().to_string()),
    );
    let (res, lines) = run(&config(tmp.path()), expansion(vec![c]));
    let out = res.unwrap();
    let r = outcome_of(&out.results, "flaky");
    assert_eq!(r.outcome, Outcome::Passed, "{lines}");
    assert!(r.flaky);
    assert_eq!(r.attempts.len(), 2);
    assert!(lines.contains("RETRY"), "{lines}");
    assert!(lines.contains("FLAKY"), "{lines}");
    assert_eq!(out.exit_code(), 0);
}

#[test]
fn worker_exit_codes_skip_or_fail_without_retry() {
    let tmp = tempfile::tempdir().unwrap();
    let mut unsupported = cell(
        "fp8",
        &["exit", "3", "unsupported", "no fp8 on this device"],
    );
    unsupported.params.retries = 2;
    let mut oom = cell("oom", &["exit", "4", "oom", "CUDA out of memory"]);
    oom.params.retries = 2;
    let mut nan = cell("nan", &["exit", "5", "nan_loss", "loss is nan"]);
    nan.params.retries = 2;
    let (res, _) = run(&config(tmp.path()), expansion(vec![unsupported, oom, nan]));
    let out = res.unwrap();
    let r = outcome_of(&out.results, "fp8");
    assert!(
        matches!(&r.outcome, Outcome::Skipped { reason } if reason.contains("no fp8 on this device")),
        "{:?}",
        r.outcome
    );
    for (name, words) in [("oom", "out of memory"), ("nan", "NaN")] {
        let r = outcome_of(&out.results, name);
        assert!(
            matches!(&r.outcome, Outcome::Failed { reason } if reason.contains(words)),
            "{:?}",
            r.outcome
        );
        assert_eq!(r.attempts.len(), 1, "{name} was retried");
        assert_eq!(
            r.attempts[0].exit_code,
            Some(if name == "oom" { 4 } else { 5 })
        );
    }
}

#[test]
fn shell_metacharacters_in_matrix_values_reach_the_program_as_one_literal_argument() {
    let tmp = tempfile::tempdir().unwrap();
    let pwned = tmp.path().join("pwned");
    let pwned2 = tmp.path().join("pwned2");
    let argsfile = tmp.path().join("args");
    let evil = format!("x; touch {}", pwned.display());
    let evil2 = format!("$(touch {})", pwned2.display());
    let mut c = cell(
        &evil,
        &[
            "args",
            argsfile.to_str().unwrap(),
            "{model}",
            "--flag={evil2}",
            "`id`",
        ],
    );
    c.params
        .extra
        .insert("evil2".into(), serde_json::Value::String(evil2.clone()));
    let (res, lines) = run(&config(tmp.path()), expansion(vec![c]));
    let out = res.unwrap();
    assert_eq!(out.results.cells[0].outcome, Outcome::Passed, "{lines}");
    let got = std::fs::read_to_string(&argsfile).unwrap();
    let got: Vec<&str> = got.lines().collect();
    assert_eq!(got, vec![evil.as_str(), &format!("--flag={evil2}"), "`id`"]);
    assert!(!pwned.exists(), "a matrix value was executed");
    assert!(!pwned2.exists(), "a matrix value was executed");
}

#[test]
fn unknown_placeholder_is_bad_input_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let good = cell("good", &["ok"]);
    let bad = cell("bad", &["ok", "{no_such_param}"]);
    let (res, _) = run(&config(tmp.path()), expansion(vec![good, bad]));
    match res {
        Err(RunError::Launch(e @ LaunchError::UnknownPlaceholder { .. })) => {
            let msg = e.to_string();
            assert!(
                msg.contains("cell bad") && msg.contains("{no_such_param}"),
                "{msg}"
            );
            let cli: bench::error::CliError = RunError::Launch(e).into();
            assert_eq!(cli.exit_code(), 2);
        }
        other => panic!("{other:?}"),
    }
    assert!(
        !tmp.path().join("test-run").exists(),
        "the run started anyway"
    );
}

#[test]
fn repeats_give_metrics_and_results_are_saved_after_every_cell() {
    let tmp = tempfile::tempdir().unwrap();
    let snaps = tmp.path().join("snaps");
    std::fs::create_dir(&snaps).unwrap();
    let dir = snaps.to_str().unwrap();
    let mut first = cell("first", &["snapshot", dir]);
    first.params.repeats = 3;
    let second = cell("second", &["snapshot", dir]);
    let third = cell("third", &["snapshot", dir]);
    let dropped = Dropped {
        cell: cell("dropped", &["ok"]),
        by: "rules[0] (incompatible)".into(),
        reason: "test".into(),
    };
    let (res, _) = run(
        &config(tmp.path()),
        expansion_with_dropped(vec![first, second, third], vec![dropped]),
    );
    let out = res.unwrap();
    // Each cell saw the document as the previous cells left it: saved after every cell,
    // and every snapshot is a whole, valid document.
    for (name, before) in [("first", 0), ("second", 1), ("third", 2)] {
        let snap = RunResults::load(&snaps.join(format!("snap-{name}.json"))).unwrap();
        assert_eq!(snap.cells.len(), before, "{name}");
        assert!(snap.finished_at.is_none());
    }
    let r = outcome_of(&out.results, "first");
    assert_eq!(r.repeats.len(), 3);
    assert_eq!(r.attempts.len(), 3);
    // Fixture steps: 1.0 s warm-up, then 0.5 s x 4, 1024 tokens each.
    let m = &r.metrics;
    assert_eq!(m["step_time_s"].value, 0.5);
    assert_eq!(m["step_time_s"].samples, vec![0.5, 0.5, 0.5]);
    assert_eq!(m["step_time_s"].rel_spread, 0.0);
    assert_eq!(m["tokens_per_s"].value, 2048.0);
    assert_eq!(m["tokens_per_s_per_gpu"].value, 2048.0);
    // 1e6 FLOPs/token x 2048 tok/s = 2.048e9 FLOP/s = 0.002048 TFLOP/s.
    assert!((m["tflops_per_gpu"].value - 0.002048).abs() < 1e-12);
    assert_eq!(m["peak_mem_bytes"].value, 1000.0);
    // The saved file is the returned document.
    let saved = RunResults::load(&out.run_dir).unwrap();
    assert_eq!(saved, out.results);
    assert_eq!(saved.dropped.len(), 1);
    assert_eq!(saved.dropped[0].by, "rules[0] (incompatible)");
    assert!(saved.finished_at.is_some() && !saved.interrupted);
    assert_eq!(
        saved.environment.hardware_key,
        format!("cpu-{}", std::env::consts::ARCH)
    );
    assert_eq!(saved.run_id, "test-run");
    // A second run with the same id refuses to overwrite it.
    let (again, _) = run(&config(tmp.path()), expansion(vec![cell("x", &["ok"])]));
    assert!(matches!(again, Err(RunError::Exists { .. })), "{again:?}");
}

#[test]
fn gpu_slots_run_fitting_cells_side_by_side_and_skip_oversized_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let devfile = tmp.path().join("devices");
    let d = devfile.to_str().unwrap();
    let gpus = |c: &mut bench::cell::Cell, n: i64| {
        c.values.insert("gpus".into(), bench::cell::Value::Int(n));
        c.id = bench::cell::CellId::from_values(&c.values);
    };
    let mut a = cell("a", &["devices", d]);
    gpus(&mut a, 1);
    let mut b = cell("b", &["devices", d]);
    gpus(&mut b, 1);
    let mut both = cell("both", &["devices", d]);
    gpus(&mut both, 2);
    let mut big = cell("big", &["devices", d]);
    gpus(&mut big, 3);
    let mut cfg = config(tmp.path());
    cfg.gpus = Some(2);
    let (res, lines) = run(&cfg, expansion(vec![a, b, both, big]));
    let out = res.unwrap();
    let seen = std::fs::read_to_string(&devfile).unwrap();
    let mut seen: Vec<&str> = seen.lines().collect();
    seen.sort();
    // a and b started together on the two free GPUs; `both` waited for both of them.
    assert_eq!(
        seen,
        vec!["a.1gpu=0", "b.1gpu=1", "both.2gpu=0,1"],
        "{lines}"
    );
    let r = outcome_of(&out.results, "big.3gpu");
    assert!(
        matches!(&r.outcome, Outcome::Skipped { reason } if reason.contains("needs 3 GPUs")),
        "{:?}",
        r.outcome
    );
    assert_eq!(out.results.environment.gpu_count, 2);
}

#[test]
fn cpu_host_skips_multi_gpu_builtin_cells_but_runs_commands() {
    let tmp = tempfile::tempdir().unwrap();
    let mut builtin = cell("builtin", &[]);
    builtin.params.workload = Workload::Builtin;
    builtin
        .values
        .insert("gpus".into(), bench::cell::Value::Int(2));
    builtin.id = bench::cell::CellId::from_values(&builtin.values);
    let mut cmd = cell("cmd", &["ok"]);
    cmd.values.insert("gpus".into(), bench::cell::Value::Int(2));
    cmd.id = bench::cell::CellId::from_values(&cmd.values);
    let (res, _) = run(&config(tmp.path()), expansion(vec![builtin, cmd]));
    let out = res.unwrap();
    assert!(matches!(
        &outcome_of(&out.results, "builtin.2gpu").outcome,
        Outcome::Skipped { reason } if reason.contains("has none")
    ));
    assert_eq!(
        outcome_of(&out.results, "cmd.2gpu").outcome,
        Outcome::Passed
    );
}

#[test]
fn fail_fast_and_max_fail_stop_new_cells() {
    let tmp = tempfile::tempdir().unwrap();
    let fail = |n: &str| cell(n, &["exit", "4", "oom", "boom"]);
    let mut cfg = config(tmp.path());
    cfg.fail_fast = true;
    let (res, lines) = run(&cfg, expansion(vec![fail("f1"), cell("later", &["ok"])]));
    let out = res.unwrap();
    assert!(
        matches!(
            &outcome_of(&out.results, "later").outcome,
            Outcome::Skipped { reason } if reason.contains("--fail-fast")
        ),
        "{lines}"
    );
    assert!(out.results.interrupted && !out.interrupted);
    assert_eq!(out.exit_code(), 1);

    let mut cfg = config(tmp.path());
    cfg.run_id = Some("max-fail".into());
    cfg.max_fail = Some(2);
    let (res, _) = run(
        &cfg,
        expansion(vec![
            fail("f1"),
            cell("ok1", &["ok"]),
            fail("f2"),
            cell("ok2", &["ok"]),
        ]),
    );
    let out = res.unwrap();
    assert_eq!(outcome_of(&out.results, "ok1").outcome, Outcome::Passed);
    assert!(matches!(
        &outcome_of(&out.results, "ok2").outcome,
        Outcome::Skipped { reason } if reason.contains("--max-fail")
    ));
}

#[test]
fn worker_that_stops_on_sigterm_needs_no_sigkill() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, s) = (tmp.path().join("m"), tmp.path().join("s"));
    let mut c = cell(
        "sleepy",
        &["slow-once", m.to_str().unwrap(), s.to_str().unwrap()],
    );
    c.params.timeout_s = 1;
    let mut cfg = config(tmp.path());
    // A grace period far longer than the test: SIGTERM alone must end the cell.
    cfg.grace = std::time::Duration::from_secs(600);
    let (res, _) = run(&cfg, expansion(vec![c]));
    let out = res.unwrap();
    let r = outcome_of(&out.results, "sleepy");
    assert!(
        matches!(&r.outcome, Outcome::TimedOut { reason } if reason.contains("stopped on SIGTERM")),
        "{:?}",
        r.outcome
    );
}

#[test]
fn a_program_that_cannot_start_is_an_infrastructure_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = cell("missing", &[]);
    c.params.retries = 1;
    c.params.workload = Workload::Command {
        argv: vec![tmp.path().join("no-such-program").display().to_string()],
        env: Default::default(),
    };
    let (res, _) = run(&config(tmp.path()), expansion(vec![c]));
    let out = res.unwrap();
    let r = outcome_of(&out.results, "missing");
    assert!(
        matches!(&r.outcome, Outcome::Failed { reason } if reason.contains("infrastructure") && reason.contains("cannot start")),
        "{:?}",
        r.outcome
    );
    assert_eq!(r.attempts.len(), 2);
    assert_eq!(r.attempts[0].exit_code, None);
}

#[test]
fn jobs_caps_the_cells_in_flight_and_the_launcher_is_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let snaps = tmp.path().join("snaps");
    std::fs::create_dir(&snaps).unwrap();
    let dir = snaps.to_str().unwrap();
    let cells = ["first", "second", "third"]
        .iter()
        .map(|n| cell(n, &["snapshot", dir]))
        .collect();
    let mut cfg = config(tmp.path());
    // Three GPU slots would run the three one-GPU cells side by side; --jobs 1 does not.
    cfg.gpus = Some(3);
    cfg.jobs = Some(1);
    let (res, _) = run(&cfg, expansion(cells));
    let out = res.unwrap();
    for (name, before) in [("first", 0), ("second", 1), ("third", 2)] {
        let snap = RunResults::load(&snaps.join(format!("snap-{name}.json"))).unwrap();
        assert_eq!(snap.cells.len(), before, "{name}");
    }
    assert_eq!(out.results.launcher.as_deref(), Some("local"));
}

#[test]
fn a_local_run_records_this_hosts_environment_and_resumes_only_on_its_hardware() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(tmp.path());
    let (res, _) = run(&cfg, expansion(vec![cell("first", &["ok"])]));
    let out = res.unwrap();
    // Locally the environment is this host's, and says nothing of where it came from.
    assert_eq!(out.results.environment_source, None);
    let text = std::fs::read_to_string(out.run_dir.join("results.json")).unwrap();
    assert!(!text.contains("environment_source"), "{text}");
    let key = out.results.environment.hardware_key.clone();

    // The same run as if measured on H100s: a local resume here is refused, as before
    // Slurm runs learned their nodes' environment.
    let mut doc = out.results.clone();
    doc.environment.hardware_key = "h100-sxm-80gb".into();
    doc.save_atomic(&out.run_dir).unwrap();
    cfg.run_id = None;
    cfg.resume = Some(out.run_dir.clone());
    let (res, _) = run(&cfg, expansion(vec![cell("first", &["ok"])]));
    match res {
        Err(RunError::HardwareChanged { was, now, .. }) => {
            assert_eq!(
                (was.as_str(), now.as_str()),
                ("h100-sxm-80gb", key.as_str())
            );
        }
        other => panic!("{other:?}"),
    }
}
