//! Issue 42 ("Hostile input, round 4"), the exit codes: every output of a run states the one
//! exit code the process returns, through the built binary. A run Ctrl-C stopped says 130 in
//! summary.txt, report.json, summary.md, JUnit and the terminal, and so does `bench report`
//! of its folder later (report.json said 0 or 1 before); a run `--fail-fast` stopped exits 1
//! and says 1 everywhere (its summary said `INTERRUPTED (exit 130)` before). The Ctrl-C
//! during a triage setup is in tests/triage_e2e.rs, which has the repository it needs.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::cli::text;
use common::fixture;

fn bench() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bench"));
    // Hermetic: plain progress, and no appending to a CI job summary.
    c.env_remove("CI").env_remove("GITHUB_STEP_SUMMARY");
    c
}

/// A matrix of cells `model: [names...]`, each running `fake_worker.sh {model}` (the model
/// names the fake worker's mode), with `extra` appended.
fn write_matrix(dir: &Path, models: &[&str], extra: &str) -> std::path::PathBuf {
    let text = format!(
        "name: exits\naxes:\n  model: [{}]\ndefaults:\n  steps: 5\n  warmup: 1\n  timeout: 60s\n  retries: 0\n  workload:\n    kind: command\n    argv: [sh, '{}', '{{model}}']\n{extra}",
        models.join(", "),
        fixture().display(),
    );
    let path = dir.join("matrix.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The last `result:` line of `text`.
fn result_line(text: &str) -> &str {
    text.lines()
        .rev()
        .find(|l| l.starts_with("result:"))
        .unwrap_or_else(|| panic!("no result line in:\n{text}"))
}

/// The numbers that follow "exit " in `text`: every exit code it states.
fn codes_in(text: &str) -> Vec<i32> {
    text.match_indices("exit ")
        .filter_map(|(i, m)| {
            let digits: String = text[i + m.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .collect()
}

/// Asserts that every report in `dir` states exit `code` and no other: summary.txt's last
/// line, report.json's `exit_code`, summary.md and junit.xml.
fn reports_say(dir: &Path, code: i32) {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    let txt = read("summary.txt");
    let last = txt.lines().last().unwrap_or_default();
    assert!(
        last.contains(&format!("(exit {code})")),
        "summary.txt: {txt}"
    );
    let report: serde_json::Value = serde_json::from_str(&read("report.json")).unwrap();
    assert_eq!(report["exit_code"], code, "report.json: {report:#}");
    let md = read("summary.md");
    let headline = md.lines().next().unwrap_or_default();
    assert!(!headline.contains("no regressions"), "summary.md: {md}");
    if code == 130 {
        assert!(headline.contains("(exit 130)"), "summary.md: {md}");
    }
    let junit = read("junit.xml");
    assert!(
        junit.contains(&format!("exit {code}")),
        "junit.xml: {junit}"
    );
    for (name, text) in [
        ("summary.txt", &txt),
        ("summary.md", &md),
        ("junit.xml", &junit),
    ] {
        let codes = codes_in(text);
        assert!(
            codes.iter().all(|c| *c == code),
            "{name} states {codes:?}: {text}"
        );
    }
}

/// `bench report DIR`: its exit code must be the run's, and the reports it writes again
/// must say so.
fn report_again(dir: &Path, baselines: &Path, code: i32) {
    let o = bench()
        .arg("report")
        .arg(dir)
        .arg("--baselines")
        .arg(baselines)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(code), "bench report: {}", text(&o));
    assert!(
        result_line(&String::from_utf8_lossy(&o.stdout)).contains(&format!("(exit {code})")),
        "{}",
        text(&o)
    );
    reports_say(dir, code);
}

#[test]
fn ctrl_c_in_a_plain_run_gives_130_in_every_report_and_in_bench_report_later() {
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("slow-ran");
    let started = tmp.path().join("slow-started");
    // `first` is quick; `slow` hangs the first time it runs; `last` never starts then.
    let extra = format!(
        "overrides:\n  model:\n    slow: {{workload: {{kind: command, argv: [sh, '{}', slow-once, '{}', '{}']}}}}\n",
        fixture().display(),
        marker.display(),
        started.display(),
    );
    let m = write_matrix(tmp.path(), &["ok", "slow", "last"], &extra);
    let baselines = tmp.path().join("baselines");
    let results = tmp.path().join("results");
    let child = bench()
        .arg("matrix")
        .arg(&m)
        .arg("--baselines")
        .arg(&baselines)
        .args(["--gpus", "0", "--no-progress", "--run-id", "r1"])
        .args(["--kill-grace", "5", "--results-dir"])
        .arg(&results)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !started.exists() {
        assert!(Instant::now() < deadline, "the slow cell never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    assert!(
        result_line(&String::from_utf8_lossy(&out.stdout))
            .starts_with("result: INTERRUPTED (exit 130)"),
        "{}",
        text(&out)
    );
    let dir = results.join("r1");
    reports_say(&dir, 130);
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    assert_eq!(r["interrupted_in"], "cells", "{r:#}");
    // Rendered again later, against the same baselines: still the run's 130, from the
    // process as from every file.
    report_again(&dir, &baselines, 130);
}

#[test]
fn a_fail_fast_stop_gives_exit_1_in_every_output() {
    let tmp = tempfile::tempdir().unwrap();
    // `crash` fails, so --fail-fast starts no `ok` after it.
    let m = write_matrix(tmp.path(), &["crash", "ok"], "");
    let baselines = tmp.path().join("baselines");
    let results = tmp.path().join("results");
    let out = bench()
        .arg("matrix")
        .arg(&m)
        .arg("--baselines")
        .arg(&baselines)
        .args([
            "--gpus",
            "0",
            "--no-progress",
            "--run-id",
            "r1",
            "--fail-fast",
        ])
        .args(["--jobs", "1", "--results-dir"])
        .arg(&results)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        result_line(&String::from_utf8_lossy(&out.stdout)).starts_with("result: FAILED (exit 1)"),
        "{}",
        text(&out)
    );
    let dir = results.join("r1");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    // Stopped before every cell ran, by the limit of failures and not by a signal.
    assert_eq!(r["interrupted"], true, "{r:#}");
    assert!(r["interrupted_in"].is_null(), "{r:#}");
    reports_say(&dir, 1);
    let txt = std::fs::read_to_string(dir.join("summary.txt")).unwrap();
    assert!(txt.contains("stopped before every cell ran"), "{txt}");
    report_again(&dir, &baselines, 1);
}

/// A closed standard output ends every command that prints a listing with 141, as SIGPIPE
/// would end a program and as the reference's exit-code table says: `bench matrix
/// --dry-run`, `bench completions`, `bench man` and `--help` exited 0, so under `set -o pipefail` a
/// listing cut by its reader passed for whole, while `bench history` exited 141.
#[test]
fn a_closed_standard_output_ends_every_listing_with_141() {
    let tmp = tempfile::tempdir().unwrap();
    let matrix = write_matrix(tmp.path(), &["ok"], "");
    let m = matrix.to_str().unwrap();
    for args in [
        vec!["matrix", m, "--dry-run"],
        vec!["matrix", m, "--dry-run", "--format", "json"],
        vec!["completions", "bash"],
        vec!["man"],
        vec!["--help"],
        vec!["matrix", "--help"],
        vec!["--version"],
    ] {
        // A pipe whose reader is gone before bench writes: the first write fails with EPIPE.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let o = bench()
            .args(&args)
            .current_dir(tmp.path())
            .stdout(writer)
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert_eq!(o.code(), Some(141), "{args:?}: {o:?}");
    }
}
