//! Issue 13 through the built binary: one test per class of hostile input. Each bad input
//! exits 2 with its location (within a second where the issue says so); a worker whose
//! figures are not measurements fails its cell instead of passing it; untrusted text never
//! reaches junit.xml, summary.md or the terminal raw; posting gives up at its deadline.

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use bench::results::{Outcome, RunResults};

fn bench() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bench"));
    // Hermetic: plain progress, and no appending to a CI job summary.
    c.env_remove("CI")
        .env_remove("GITHUB_STEP_SUMMARY")
        .env_remove("BENCH_MAX_CELLS");
    c
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Runs `cmd`, and returns its output, its wall time and its CPU time. One child runs at a
/// time in this test binary, so that the children's CPU time read around it is its own.
fn timed(cmd: &mut Command) -> (Output, Duration, Duration) {
    let guard = TIMED.lock().unwrap_or_else(|p| p.into_inner());
    let before = children_cpu();
    let t = Instant::now();
    let out = cmd.output().unwrap();
    let wall = t.elapsed();
    let cpu = children_cpu().saturating_sub(before);
    drop(guard);
    (out, wall, cpu)
}

/// [`timed`]'s output alone.
fn run(cmd: &mut Command) -> Output {
    timed(cmd).0
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// CPU time of this process's reaped children (`cutime + cstime` of /proc/self/stat, in
/// clock ticks of 10 ms).
fn children_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    let ticks: u64 = rest[13].parse::<u64>().unwrap() + rest[14].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

static TIMED: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Asserts exit 2 using at most `limit` of CPU time, with `needles` in the message; returns
/// the message. CPU time, not wall time: this machine and CI's run builds beside the
/// tests, and a debug build's start (loading libtorch) alone can take seconds of wall time
/// there; the CPU time counts start-up too.
fn refused(cmd: &mut Command, limit: Duration, needles: &[&str]) -> String {
    let (out, wall, cpu) = timed(cmd);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        cpu < limit,
        "took {cpu:?} of CPU ({wall:?} of wall time), limit {limit:?}: {err}"
    );
    for n in needles {
        assert!(err.contains(n), "`{n}` not in: {err}");
    }
    err
}

fn dry_run(matrix: &Path) -> Command {
    let mut c = bench();
    c.arg("matrix").arg(matrix).arg("--dry-run");
    c
}

const SECOND: Duration = Duration::from_secs(1);

// ------------------------------------------------------------------ 1. filter nesting

#[test]
fn deep_filters_are_refused_with_a_caret_not_a_stack_overflow() {
    let tmp = tempfile::tempdir().unwrap();
    // A command workload, whose models `a` and `b` are its own (the built-in workload
    // refuses model names it has no preset for).
    let m = write(
        tmp.path(),
        "m.yaml",
        "axes:\n  model: [a, b]\ndefaults:\n  workload: {kind: command, argv: ['true']}\n",
    );
    let deep = format!("{}model=a{}", "(".repeat(4500), ")".repeat(4500));
    let err = refused(
        dry_run(&m).args(["--filter", &deep]),
        SECOND,
        &["bad --filter", "parentheses nest more than 100 deep", "^"],
    );
    assert!(err.len() < 2000, "the caret line shows a window: {err}");
    // Long chains and runs of `not` are no error at all (one argument may hold 128 KiB).
    for f in [
        format!("{}model=a", "!".repeat(100_000)),
        vec!["b"; 40_000].join("||"),
    ] {
        let (out, _, _) = timed(dry_run(&m).args(["--filter", &f, "--format", "json"]));
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let chain = write(
        tmp.path(),
        "chain.yaml",
        &format!(
            "axes:\n  model: [a, b]\ndefaults:\n  workload: {{kind: command, argv: ['true']}}\nrules:\n  - when: \"{}\"\n    reason: r\n",
            vec!["model=b"; 40_000].join(" || ")
        ),
    );
    let (out, _, _) = timed(dry_run(&chain).args(["--format", "json"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Inside a rule's `when:`, the error is located in the file.
    let rule = write(
        tmp.path(),
        "rule.yaml",
        &format!("axes:\n  model: [a, b]\nrules:\n  - when: \"{deep}\"\n    reason: r\n"),
    );
    refused(
        &mut dry_run(&rule),
        SECOND,
        &["rule.yaml:4:", "rules[0].when", "nest more than 100 deep"],
    );
    // And in `bench baseline update --filter`.
    let run = tmp.path().join("run");
    copy_run("cpu-ok", &run);
    refused(
        bench()
            .args(["baseline", "update"])
            .arg(&run)
            .arg("--baselines")
            .arg(tmp.path().join("b"))
            .args(["--filter", &deep]),
        SECOND,
        &["nest more than 100 deep"],
    );
}

// -------------------------------------------------------------------- 2. cell budget

fn axes_of_two(n: usize) -> String {
    let mut y = String::from("axes:\n");
    for i in 0..n {
        y.push_str(&format!("  a{i}: [x, y]\n"));
    }
    y
}

#[test]
fn cell_bombs_are_refused_before_expansion_with_the_count() {
    let tmp = tempfile::tempdir().unwrap();
    let subsets = |n: usize| {
        let flags: Vec<String> = (0..n).map(|i| format!("f{i}")).collect();
        format!(
            "axes:\n  features: {{subsets_of: [{}]}}\n",
            flags.join(", ")
        )
    };
    for (name, yaml, count) in [
        (
            "a100.yaml",
            axes_of_two(100),
            "1267650600228229401496703205376 cells",
        ),
        ("a30.yaml", axes_of_two(30), "1073741824 cells"),
        ("s22.yaml", subsets(22), "4194304 cells"),
        ("s40.yaml", subsets(40), "1099511627776 cells"),
    ] {
        let m = write(tmp.path(), name, &yaml);
        let stem = name.trim_end_matches(".yaml");
        refused(
            &mut dry_run(&m),
            SECOND,
            &[
                &format!("{name}:"),
                &format!("matrix `{stem}` expands to {count}"),
                "--max-cells",
            ],
        );
    }
    // The limit is a flag (and a variable) away.
    let m = write(tmp.path(), "a17.yaml", &axes_of_two(17));
    refused(
        &mut dry_run(&m),
        SECOND,
        &["131072 cells", "limit of 100000"],
    );
    let out = run(dry_run(&m)
        .args(["--max-cells", "200000"])
        .stdout(std::process::Stdio::null()));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The variable sets the limit too (here lower than the matrix).
    let small = write(tmp.path(), "a4.yaml", &axes_of_two(4));
    refused(
        dry_run(&small).env("BENCH_MAX_CELLS", "8"),
        SECOND,
        &["16 cells", "limit of 8"],
    );
}

#[test]
fn one_long_axis_expands_in_linear_time() {
    let tmp = tempfile::tempdir().unwrap();
    let vals: Vec<String> = (0..200_000).map(|i| i.to_string()).collect();
    let m = write(
        tmp.path(),
        "long.yaml",
        &format!("axes:\n  seed_axis: [{}]\n", vals.join(", ")),
    );
    // Reading 200,000 values is most of this (two YAML passes in a debug build).
    refused(&mut dry_run(&m), SECOND * 30, &["200000 cells"]);
    let (out, took, _) = timed(
        dry_run(&m)
            .args(["--max-cells", "200000", "--format", "json"])
            .stdout(std::process::Stdio::null()),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // It took 44 s when the duplicate check compared every pair; this bound is for a debug
    // build on a loaded 2-core CI machine (a release build takes about a second).
    assert!(took < Duration::from_secs(40), "{took:?}");
}

// --------------------------------------------- 3. measurements checked at the boundary

/// A matrix of one cell whose command workload is `sh SCRIPT` (a file, so that the JSON's
/// braces are not taken for argv placeholders).
fn command_matrix(dir: &Path, script: &str) -> PathBuf {
    let file = write(dir, "worker.sh", script);
    write(
        dir,
        "cmd.yaml",
        &format!(
            "name: hostile\naxes:\n  model: [w]\ndefaults:\n  steps: 4\n  warmup: 1\n  timeout: 60s\n  retries: 0\n  workload:\n    kind: command\n    argv: [sh, '{}']\n",
            file.display()
        ),
    )
}

fn run_matrix(dir: &Path, matrix: &Path, baselines: &Path) -> Output {
    run(bench()
        .arg("matrix")
        .arg(matrix)
        .arg("--baselines")
        .arg(baselines)
        .args([
            "--gpus",
            "0",
            "--no-progress",
            "--run-id",
            "r",
            "--results-dir",
        ])
        .arg(dir.join("results")))
}

fn steps_script(times: &[&str], numbers: &[u32]) -> String {
    times
        .iter()
        .zip(numbers)
        .map(|(t, n)| {
            format!(
                "echo '{{\"event\":\"step\",\"step\":{n},\"step_time_s\":{t},\"tokens\":1024,\"loss\":2.5}}'; "
            )
        })
        .collect()
}

#[test]
fn a_cell_with_nothing_measured_fails_instead_of_passing() {
    for (script, why) in [
        (
            steps_script(&["0", "0", "0", "0"], &[0, 1, 2, 3]),
            "step_time_s 0: it must be a finite number above 0",
        ),
        (
            steps_script(&["-1", "-1", "-1", "-1"], &[0, 1, 2, 3]),
            "step_time_s -1",
        ),
        (
            steps_script(&["0.5", "0.5", "0.5", "0.5"], &[0, 0, 0, 0]),
            "numbered 0 after step 0: step numbers must increase",
        ),
        (
            // Valid steps, but all of them warm-up by number: nothing is measured.
            steps_script(&["0.5"], &[0]),
            "measured nothing in repeat 1: all 1 of its `step` events are warm-up",
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let m = command_matrix(tmp.path(), &script);
        // A baseline for the cell: a silent pass would have read "unchanged".
        let baselines = tmp.path().join("baselines");
        std::fs::create_dir_all(&baselines).unwrap();
        let out = run_matrix(tmp.path(), &m, &baselines);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{script}: {err}");
        let r = RunResults::load(&tmp.path().join("results/r")).unwrap();
        match &r.cells[0].outcome {
            Outcome::Failed { reason } => assert!(reason.contains(why), "{reason}"),
            other => panic!("{script}: {other:?}"),
        }
        assert!(r.cells[0].metrics.is_empty());
        let summary = std::fs::read_to_string(tmp.path().join("results/r/summary.md")).unwrap();
        assert!(!summary.contains("unchanged"), "{summary}");
    }
}

#[test]
fn a_line_of_many_megabytes_is_cut_not_kept() {
    let tmp = tempfile::tempdir().unwrap();
    // 24 MiB in one line, then a normal run.
    let script = format!(
        "head -c 25165824 /dev/zero | tr '\\000' x; echo; {}echo '{{\"event\":\"summary\"}}'",
        steps_script(&["1", "0.5", "0.5", "0.5"], &[0, 1, 2, 3])
    );
    let m = command_matrix(tmp.path(), &script);
    let out = run_matrix(tmp.path(), &m, &tmp.path().join("baselines"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let log = std::fs::read_to_string(tmp.path().join("results/r/logs/w.r0.log")).unwrap();
    let first = log.lines().next().unwrap();
    assert_eq!(first.len(), (1 << 20) + 35, "the line is cut at 1 MiB");
    assert!(first.ends_with("[bench: line cut at 1048576 bytes]"));
    assert!(log.len() < 2 << 20, "{} bytes of log", log.len());
}

// ------------------------------------------------------------------ 4. untrusted text

#[test]
fn escapes_and_nul_from_a_worker_never_reach_the_reports_raw() {
    let tmp = tempfile::tempdir().unwrap();
    // Coloured stderr with a NUL, an OSC title, then an error event whose message carries
    // escapes as JSON \u sequences, and a crash.
    let script = "printf '\\033[1;31mERROR\\033[0m bad\\000thing \\033]0;pwned\\007\\n' >&2; \
         printf '{\"event\":\"error\",\"kind\":\"oom\",\"message\":\"\\\\u001b[31mCUDA\\\\u0000 out of memory\\\\u001b[0m\"}\\n'; \
         exit 4";
    let m = command_matrix(tmp.path(), script);
    let out = run_matrix(tmp.path(), &m, &tmp.path().join("baselines"));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let dir = tmp.path().join("results/r");
    let r = RunResults::load(&dir).unwrap();
    let Outcome::Failed { reason } = &r.cells[0].outcome else {
        panic!("{:?}", r.cells[0].outcome)
    };
    assert!(reason.contains("CUDA out of memory"), "{reason}");
    let terminal = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    for (name, text) in [
        ("terminal", terminal),
        (
            "results.json",
            std::fs::read_to_string(dir.join("results.json")).unwrap(),
        ),
        (
            "junit.xml",
            std::fs::read_to_string(dir.join("junit.xml")).unwrap(),
        ),
        (
            "summary.md",
            std::fs::read_to_string(dir.join("summary.md")).unwrap(),
        ),
        (
            "log",
            std::fs::read_to_string(dir.join("logs/w.r0.log")).unwrap(),
        ),
    ] {
        assert!(
            !text.contains(['\x1b', '\0', '\x07']),
            "{name} holds a raw escape or NUL: {text:?}"
        );
        // Nor may the reports carry them JSON-escaped (the log keeps the worker's JSON
        // lines as printed, where `\u001b` is six harmless characters).
        assert!(
            name == "log" || (!text.contains("\\u001b") && !text.contains("\\u0000")),
            "{name}: {text}"
        );
    }
    // A real JUnit consumer reads the file (the same parser as tests/report_cli.rs).
    junit_parses(&dir.join("junit.xml"));
}

/// junitparser (scripts/test-requirements.txt) reads the file, when the venv has it.
fn junit_parses(path: &Path) {
    let python = std::env::var("BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let guard = TIMED.lock().unwrap_or_else(|p| p.into_inner());
    let out = Command::new(&python)
        .arg("tests/junit_check.py")
        .arg(path)
        .output();
    drop(guard);
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o)
            if String::from_utf8_lossy(&o.stderr).contains("No module named 'junitparser'")
                && std::env::var_os("CI").is_none() =>
        {
            eprintln!("skipping the junitparser check: {python} has no junitparser");
        }
        Ok(o) => panic!(
            "junit.xml is not well-formed for junitparser: {}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => assert!(std::env::var_os("CI").is_none(), "{python}: {e}"),
    }
}

// --------------------------------------------------------------- 5. checked arithmetic

#[test]
fn overflowing_batch_products_and_gpu_counts_are_located_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let m = write(
        tmp.path(),
        "batch.yaml",
        "axes:\n  gpus: [65536]\ndefaults:\n  micro_batch: 65536\n",
    );
    refused(
        &mut dry_run(&m),
        SECOND,
        &[
            "batch.yaml:",
            "gpus x micro_batch = 65536 x 65536 does not fit",
        ],
    );
    let m = write(tmp.path(), "gpus.yaml", "axes:\n  gpus: [1, 4294967296]\n");
    refused(
        &mut dry_run(&m),
        SECOND,
        &[
            "gpus.yaml:2:",
            "axes.gpus[1]",
            "an integer from 0 to 1048576",
        ],
    );
    let m = write(
        tmp.path(),
        "inc.yaml",
        "axes:\n  model: [a]\ninclude:\n  - gpus: 4294967296\n",
    );
    refused(&mut dry_run(&m), SECOND, &["inc.yaml:", "4294967296"]);
}

// -------------------------------------------------------------------------- 6. baselines

fn copy_run(name: &str, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    let from = Path::new("tests/fixtures/runs").join(name);
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn zero_negative_and_nan_baselines_are_refused_with_their_key_path() {
    for bad in ["0", "-350000", ".nan"] {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("run");
        copy_run("cpu-ok", &run);
        let dir = tmp.path().join("baselines");
        std::fs::create_dir_all(&dir).unwrap();
        write(
            &dir,
            "cpu-x86_64.yaml",
            &format!(
                "schema_version: 1\nhardware_key: cpu-x86_64\ncells:\n  gpt2-tiny.fp32.1gpu.single.base:\n    metrics:\n      tokens_per_s:\n        value: {bad}\n"
            ),
        );
        refused(
            bench().arg("report").arg(&run).arg("--baselines").arg(&dir),
            SECOND,
            &[
                "cpu-x86_64.yaml:7:",
                "cells.gpt2-tiny.fp32.1gpu.single.base.metrics.tokens_per_s.value",
                "must be a finite number above 0",
            ],
        );
    }
}

// ---------------------------------------------------------------------------- 7. posting

#[test]
fn a_server_that_never_answers_costs_the_deadline_not_minutes() {
    // Accepts connections, reads the request, and never answers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().flatten() {
            let mut s2 = s.try_clone().unwrap();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while matches!(s2.read(&mut buf), Ok(n) if n > 0) {}
            });
            held.push(s);
        }
    });
    let (out, took, _) = timed(
        bench()
            .args(["report", "post", "tests/fixtures/runs/cpu-ok"])
            .args(["--baselines", "tests/fixtures/baselines", "--timeout", "2"])
            .env("GITHUB_API_URL", format!("http://{addr}"))
            .env("GITHUB_REPOSITORY", "o/r")
            .env("GITHUB_REF", "refs/pull/42/merge")
            .env("GITHUB_SHA", "feedbeef")
            .env("GITHUB_TOKEN", "ghs_TESTtoken0123456789abcdef"),
    );
    let err = stderr(&out);
    assert!(took < Duration::from_secs(6), "took {took:?}: {err}");
    assert!(
        err.contains("posting may take at most 2 s in all (--timeout)"),
        "{err}"
    );
    assert!(err.contains("gave up after"), "{err}");
    // The verdict's exit code is kept (posting is best effort).
    assert!(matches!(out.status.code(), Some(0 | 1)), "{err}");
    refused(
        bench().args([
            "report",
            "post",
            "tests/fixtures/runs/cpu-ok",
            "--timeout",
            "0",
        ]),
        SECOND,
        &["--timeout 0: expected a positive number of seconds"],
    );
}

// ------------------------------------------------------------ resume, run ids, processes

#[test]
fn a_run_id_cannot_leave_the_results_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let matrix = command_matrix(tmp.path(), &steps_script(&["0.1", "0.1"], &[1, 2]));
    for bad in ["../x", "/tmp/escape", "a/b", "..", ".hidden"] {
        let out = run(bench()
            .arg("matrix")
            .arg(&matrix)
            .args([
                "--gpus",
                "0",
                "--no-progress",
                "--run-id",
                bad,
                "--results-dir",
            ])
            .arg(tmp.path().join("results")));
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", stderr(&out));
        assert!(stderr(&out).contains("--run-id"), "{bad}: {}", stderr(&out));
    }
    assert!(!tmp.path().join("x").exists());
    assert!(!Path::new("/tmp/escape").exists());
}

#[test]
fn resume_refuses_a_different_matrix_and_keeps_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let matrix = command_matrix(tmp.path(), &steps_script(&["0.1", "0.1"], &[1, 2]));
    let baselines = tmp.path().join("baselines");
    let out = run_matrix(tmp.path(), &matrix, &baselines);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let run_dir = tmp.path().join("results").join("r");
    let before = std::fs::read(run_dir.join(RunResults::FILE)).unwrap();
    // The same file name with other contents is another matrix.
    let text = std::fs::read_to_string(&matrix).unwrap();
    std::fs::write(&matrix, text.replace("model: [w]", "model: [w, v]")).unwrap();
    let out = run(bench()
        .arg("matrix")
        .arg(&matrix)
        .args(["--gpus", "0", "--no-progress", "--resume"])
        .arg(&run_dir)
        .arg("--baselines")
        .arg(&baselines));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("different matrix"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read(run_dir.join(RunResults::FILE)).unwrap(),
        before
    );
    // The matrix it started from resumes.
    std::fs::write(&matrix, text).unwrap();
    let out = run(bench()
        .arg("matrix")
        .arg(&matrix)
        .args(["--gpus", "0", "--no-progress", "--resume"])
        .arg(&run_dir)
        .arg("--baselines")
        .arg(&baselines));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn a_malformed_baseline_is_refused_before_the_first_cell() {
    let tmp = tempfile::tempdir().unwrap();
    // The worker leaves a mark when it runs: it must not.
    let mark = tmp.path().join("ran");
    let matrix = command_matrix(
        tmp.path(),
        &format!(
            "touch '{}'\n{}",
            mark.display(),
            steps_script(&["0.1", "0.1"], &[1, 2])
        ),
    );
    let baselines = tmp.path().join("baselines");
    std::fs::create_dir_all(&baselines).unwrap();
    write(
        &baselines,
        "some-gpu-host.yaml",
        "schema_version: 1\nhardware_key: some-gpu-host\ncells:\n  w:\n    metrics:\n      tokens_per_s:\n        value: -1\n",
    );
    let (out, _, cpu) = timed(
        bench()
            .arg("matrix")
            .arg(&matrix)
            .arg("--baselines")
            .arg(&baselines)
            .args(["--gpus", "0", "--no-progress", "--results-dir"])
            .arg(tmp.path().join("results")),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("some-gpu-host.yaml:7:"),
        "{}",
        stderr(&out)
    );
    assert!(cpu < SECOND, "{cpu:?}");
    assert!(
        !mark.exists(),
        "a cell ran before the baselines were checked"
    );
}

/// Whether a process `pid` is alive (not a zombie).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

fn wait_gone(pid: i32, limit: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    !alive(pid)
}

#[test]
fn a_setsid_child_does_not_outlive_its_cell_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let pidfile = tmp.path().join("daemon.pid");
    // The worker starts a process in a session of its own (out of the worker's group),
    // records its pid, then hangs past the cell's timeout.
    let script = format!(
        "setsid sh -c 'echo $$ > {p}; exec sleep 300' &\nsleep 300\n",
        p = pidfile.display()
    );
    let file = write(tmp.path(), "worker.sh", &script);
    let matrix = write(
        tmp.path(),
        "cmd.yaml",
        &format!(
            "name: hostile\naxes:\n  model: [w]\ndefaults:\n  timeout: 2s\n  retries: 0\n  workload:\n    kind: command\n    argv: [sh, '{}']\n",
            file.display()
        ),
    );
    let out = run(bench()
        .arg("matrix")
        .arg(&matrix)
        .args([
            "--gpus",
            "0",
            "--no-progress",
            "--kill-grace",
            "1",
            "--results-dir",
        ])
        .arg(tmp.path().join("results"))
        .arg("--baselines")
        .arg(tmp.path().join("baselines")));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        wait_gone(pid, Duration::from_secs(5)),
        "the setsid child {pid} outlived its cell"
    );
}

#[test]
fn a_worker_does_not_outlive_bench_killed_with_sigkill() {
    let tmp = tempfile::tempdir().unwrap();
    let pidfile = tmp.path().join("worker.pid");
    let script = format!("echo $$ > {}\nexec sleep 300\n", pidfile.display());
    let file = write(tmp.path(), "worker.sh", &script);
    let matrix = write(
        tmp.path(),
        "cmd.yaml",
        &format!(
            "name: hostile\naxes:\n  model: [w]\ndefaults:\n  timeout: 60s\n  retries: 0\n  workload:\n    kind: command\n    argv: [sh, '{}']\n",
            file.display()
        ),
    );
    let mut child = bench()
        .arg("matrix")
        .arg(&matrix)
        .args(["--gpus", "0", "--no-progress", "--results-dir"])
        .arg(tmp.path().join("results"))
        .arg("--baselines")
        .arg(tmp.path().join("baselines"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !pidfile.exists() || std::fs::read_to_string(&pidfile).unwrap().trim().is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the worker never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    child.kill().unwrap(); // SIGKILL: bench can do nothing itself.
    let _ = child.wait();
    assert!(
        wait_gone(pid, Duration::from_secs(5)),
        "the worker {pid} outlived bench"
    );
}
