//! `bench matrix FILE` (without --dry-run) end to end: the built binary, a real matrix file
//! whose cells run the fake worker (tests/fixtures/fake_worker.sh) as a `command` workload.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use bench::results::{Outcome, RunResults};
use common::fixture;

fn bench() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bench"));
    // Hermetic: plain progress, and no appending to a CI job summary.
    c.env_remove("CI").env_remove("GITHUB_STEP_SUMMARY");
    c
}

/// A matrix of cells `model: [names...]`, each running `fake_worker.sh <mode args>`.
fn write_matrix(dir: &Path, models: &[&str], args: &[&str], extra: &str) -> std::path::PathBuf {
    let quote = |s: &str| format!("'{}'", s.replace('\'', "''"));
    let models: Vec<String> = models.iter().map(|m| quote(m)).collect();
    let mut argv = vec![quote("sh"), quote(&fixture().display().to_string())];
    argv.extend(args.iter().map(|a| quote(a)));
    let text = format!(
        "name: runner-cli\naxes:\n  model: [{}]\ndefaults:\n  steps: 5\n  warmup: 1\n  timeout: 60s\n  retries: 0\n  workload:\n    kind: command\n    argv: [{}]\n    env: {{RECORD: {}}}\n{extra}",
        models.join(", "),
        argv.join(", "),
        quote(&dir.join("record").display().to_string()),
    );
    let path = dir.join("matrix.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

fn cell<'a>(r: &'a RunResults, id: &str) -> &'a bench::results::CellResult {
    r.cells.iter().find(|c| c.id.as_str() == id).unwrap()
}

#[test]
fn runs_a_matrix_and_writes_results_and_logs() {
    let tmp = tempfile::tempdir().unwrap();
    let m = write_matrix(tmp.path(), &["a", "b"], &["ok"], "");
    let out = bench()
        .arg("matrix")
        .arg(&m)
        .arg("--baselines")
        .arg(tmp.path().join("baselines"))
        .args([
            "--gpus",
            "0",
            "--no-progress",
            "--run-id",
            "r1",
            "--results-dir",
        ])
        .arg(tmp.path().join("results"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("[2/2] PASS"), "{stderr}");
    let dir = tmp.path().join("results/r1");
    let r = RunResults::load(&dir).unwrap();
    assert_eq!(r.matrix_name, "runner-cli");
    assert_eq!(r.cells.len(), 2);
    assert_eq!(cell(&r, "a").outcome, Outcome::Passed);
    assert_eq!(cell(&r, "a").metrics["tokens_per_s"].value, 2048.0);
    let log = std::fs::read_to_string(dir.join("logs/a.r0.log")).unwrap();
    assert!(log.contains("starting fake training") && log.contains("\"event\":\"summary\""));
    // The reports follow the run: no baseline yet, so every cell is new (exit 0).
    for report in ["junit.xml", "summary.md", "report.json"] {
        assert!(dir.join(report).exists(), "{report}");
    }
    let junit = std::fs::read_to_string(dir.join("junit.xml")).unwrap();
    assert!(junit.contains("name=\"a\""), "{junit}");
}

#[test]
fn shell_injection_value_in_a_matrix_file_is_one_literal_argument() {
    let tmp = tempfile::tempdir().unwrap();
    let pwned = tmp.path().join("pwned");
    let evil = format!("x; touch {}", pwned.display());
    let evil2 = format!("$(touch {})", pwned.display());
    let argsfile = tmp.path().join("args");
    let m = write_matrix(
        tmp.path(),
        &[&evil, &evil2],
        &["args", argsfile.to_str().unwrap(), "{model}"],
        "",
    );
    let out = bench()
        .arg("matrix")
        .arg(&m)
        .arg("--baselines")
        .arg(tmp.path().join("baselines"))
        .args(["--gpus", "0", "--no-progress", "--results-dir"])
        .arg(tmp.path().join("results"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The second cell overwrote the file with its own single argument.
    assert_eq!(
        std::fs::read_to_string(&argsfile).unwrap(),
        format!("{evil2}\n")
    );
    assert!(!pwned.exists(), "a matrix value was executed by a shell");
}

#[test]
fn unknown_placeholder_exits_2_naming_cell_and_placeholder() {
    let tmp = tempfile::tempdir().unwrap();
    let m = write_matrix(tmp.path(), &["a"], &["ok", "{sequence_length}"], "");
    let out = bench()
        .arg("matrix")
        .arg(&m)
        .arg("--baselines")
        .arg(tmp.path().join("baselines"))
        .args(["--gpus", "0", "--no-progress", "--results-dir"])
        .arg(tmp.path().join("results"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cell a") && stderr.contains("{sequence_length}"),
        "{stderr}"
    );
    assert!(!tmp.path().join("results").exists());
}

#[test]
fn ctrl_c_keeps_finished_cells_exits_130_and_resume_completes_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("slow-ran");
    let started = tmp.path().join("slow-started");
    // `first` is quick; `slow` hangs the first time it runs; `last` never starts then.
    let extra = format!(
        "overrides:\n  model:\n    slow: {{workload: {{kind: command, argv: [sh, '{}', slow-once, '{}', '{}'], env: {{RECORD: '{}'}}}}}}\n",
        fixture().display(),
        marker.display(),
        started.display(),
        tmp.path().join("record").display()
    );
    let m = write_matrix(tmp.path(), &["first", "slow", "last"], &["ok"], &extra);
    let results = tmp.path().join("results");
    let child = bench()
        .arg("matrix")
        .arg(&m)
        .arg("--baselines")
        .arg(tmp.path().join("baselines"))
        .args([
            "--gpus",
            "0",
            "--no-progress",
            "--run-id",
            "r1",
            "--kill-grace",
            "5",
        ])
        .arg("--results-dir")
        .arg(&results)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut waited = 0;
    while !started.exists() {
        assert!(waited < 1200, "the slow cell never started");
        std::thread::sleep(Duration::from_millis(50));
        waited += 1;
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    let dir = results.join("r1");
    let r = RunResults::load(&dir).unwrap();
    assert!(r.interrupted);
    assert_eq!(cell(&r, "first").outcome, Outcome::Passed);
    assert!(matches!(cell(&r, "slow").outcome, Outcome::Skipped { .. }));
    assert!(matches!(cell(&r, "last").outcome, Outcome::Skipped { .. }));
    // Issue 34: an interrupted run never reads as a pass, in any report.
    let summary = std::fs::read_to_string(dir.join("summary.txt")).unwrap();
    let last = summary.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("result: INTERRUPTED (exit 130)"),
        "{summary}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let shown = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    assert!(
        shown.starts_with("result: INTERRUPTED (exit 130)"),
        "{stdout}"
    );
    let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    let headline = md.lines().next().unwrap_or_default();
    assert!(
        headline.contains("interrupted before every cell ran"),
        "{md}"
    );
    assert!(!headline.contains("no regressions"), "{md}");
    let junit = std::fs::read_to_string(dir.join("junit.xml")).unwrap();
    assert!(
        junit.contains("run.interrupted") && junit.contains("<error"),
        "{junit}"
    );

    common::resume_run(&m, &tmp.path().join("baselines"), &dir);
    let r = RunResults::load(&dir).unwrap();
    assert!(!r.interrupted);
    for id in ["first", "slow", "last"] {
        assert_eq!(cell(&r, id).outcome, Outcome::Passed, "{id}");
    }
    let record = std::fs::read_to_string(tmp.path().join("record")).unwrap();
    let runs = |id: &str| record.lines().filter(|l| *l == id).count();
    assert_eq!(
        (runs("first"), runs("slow"), runs("last")),
        (1, 2, 1),
        "{record}"
    );
}

#[test]
fn bench_env_prints_the_environment_as_json() {
    let out = bench().args(["env", "--format", "json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let env: bench::results::Environment = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(env.bench_version, env!("CARGO_PKG_VERSION"));
    assert!(!env.cpu.is_empty() && !env.os.is_empty());
    if env.gpu_count == 0 {
        assert_eq!(env.hardware_key, format!("cpu-{}", std::env::consts::ARCH));
    } else {
        assert!(env.gpu_model.is_some() && !env.hardware_key.starts_with("cpu-"));
    }
    // The libtorch this binary loaded comes from the torch wheel's version.py.
    assert!(env.libtorch.is_some(), "{env:?}");
    let human = bench().arg("env").output().unwrap();
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.starts_with(&format!("hardware key  {}", env.hardware_key)),
        "{text}"
    );
}

#[test]
fn a_grace_period_that_is_not_a_duration_is_bad_input() {
    let tmp = tempfile::tempdir().unwrap();
    let m = write_matrix(tmp.path(), &["a"], &["ok"], "");
    for bad in ["inf", "NaN"] {
        let out = bench()
            .arg("matrix")
            .arg(&m)
            .args(["--gpus", "0", "--kill-grace", bad, "--results-dir"])
            .arg(tmp.path().join("results"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("--kill-grace"), "{stderr}");
    }
    assert!(!tmp.path().join("results").exists());
}

/// Runs `bench ARGS...` under `umask` (through `sh -c 'umask U; exec bench ...'`, so that the
/// binary inherits it as it would from a CI runner's shell).
fn bench_under_umask(umask: u32, args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("umask {umask:03o} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_bench"))
        .args(args)
        .env_remove("CI")
        .env_remove("GITHUB_STEP_SUMMARY")
        .output()
        .unwrap()
}

/// Every regular file under `dir`, at any depth.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Every file a run writes in its folder (results, reports, logs) and the baseline file
/// `bench baseline update` writes get the mode a plain write gives, 0666 minus the umask,
/// so that on a shared runner other accounts can read them when the umask lets them; the
/// atomic writer's private temporary file used to leave them at 0600 whatever the umask.
#[test]
fn written_files_get_the_mode_the_umask_gives() {
    use std::os::unix::fs::PermissionsExt;
    for umask in [0o022, 0o027] {
        let tmp = tempfile::tempdir().unwrap();
        let m = write_matrix(tmp.path(), &["a", "b"], &["ok"], "");
        let results = tmp.path().join("results");
        let baselines = tmp.path().join("baselines");
        let out = bench_under_umask(
            umask,
            &[
                "matrix".as_ref(),
                m.as_os_str(),
                "--baselines".as_ref(),
                baselines.as_os_str(),
                "--gpus".as_ref(),
                "0".as_ref(),
                "--no-progress".as_ref(),
                "--run-id".as_ref(),
                "r1".as_ref(),
                "--results-dir".as_ref(),
                results.as_os_str(),
            ],
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let run = results.join("r1");
        let update = bench_under_umask(
            umask,
            &[
                "baseline".as_ref(),
                "update".as_ref(),
                run.as_os_str(),
                "--baselines".as_ref(),
                baselines.as_os_str(),
            ],
        );
        assert_eq!(
            update.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&update.stderr)
        );
        let mut files = files_under(&run);
        files.extend(files_under(&baselines));
        for want in [
            "results.json",
            "report.html",
            "junit.xml",
            "summary.md",
            "summary.txt",
        ] {
            assert!(run.join(want).is_file(), "{want} missing");
        }
        assert!(files.iter().any(|f| f.starts_with(&baselines)));
        // Nothing here is a framework cell: no framework comparison.
        assert!(!run.join("frameworks.md").exists());
        for f in &files {
            let mode = std::fs::metadata(f).unwrap().permissions().mode() & 0o7777;
            assert_eq!(
                mode,
                0o666 & !umask,
                "{} under umask {umask:03o}: mode {mode:o}",
                f.display()
            );
        }
    }
}

/// matrix/nightly-h100.yaml (288 combinations: its axes, overrides and rules as they are)
/// with every cell running the fake worker at 0.5 s a step, once.
fn nightly_with_fake_worker(dir: &Path) -> std::path::PathBuf {
    let mut text = std::fs::read_to_string("matrix/nightly-h100.yaml").unwrap();
    let worker = format!(
        "defaults:\n  workload: {{kind: command, argv: [sh, '{}', paced, '0.5']}}\n",
        fixture().display()
    );
    for (from, to) in [
        ("defaults:\n", worker.as_str()),
        ("  steps: 40\n", "  steps: 5\n"),
        ("  warmup: 10\n", "  warmup: 1\n"),
        ("  repeats: 3\n", "  repeats: 1\n"),
        ("  retries: 1\n", "  retries: 0\n"),
    ] {
        assert_eq!(
            text.matches(from).count(),
            1,
            "{from:?} in nightly-h100.yaml"
        );
        text = text.replacen(from, to, 1);
    }
    let path = dir.join("nightly.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The terminal summary of the nightly filtered to 4 cells: the 4 cells, then one line per
/// rule with its count and the filter's count, not a row of dashes and a reason for each of
/// the hundreds of dropped combinations; `bench report --verbose` lists their ids.
#[test]
fn summary_of_a_filtered_nightly_shows_the_cells_then_one_line_per_rule() {
    let tmp = tempfile::tempdir().unwrap();
    let m = nightly_with_fake_worker(tmp.path());
    let baselines = tmp.path().join("baselines");
    let out = bench()
        .arg("matrix")
        .arg(&m)
        .args([
            "--filter",
            "gpus=1 and dtype=bf16 and not has(sac) and model!=gpt2-125m",
            "--gpus",
            "0",
            "--no-progress",
            "--run-id",
            "nightly",
            "--results-dir",
        ])
        .arg(tmp.path().join("results"))
        .arg("--baselines")
        .arg(&baselines)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = tmp.path().join("results/nightly");
    let r = RunResults::load(&run).unwrap();
    assert_eq!(r.cells.len(), 4);
    // The file keeps what the terminal showed.
    assert_eq!(
        std::fs::read_to_string(run.join("summary.txt")).unwrap(),
        stdout
    );
    insta::with_settings!({filters => vec![
        // This host's hardware, commit and version; the temporary folder; the clock.
        (r"(?m)^bench nightly: .*$", "bench nightly: [this host]"),
        (regex_escape(&baselines.display().to_string()).as_str(), "[baselines]"),
        (r"\[baselines\]/\S+\.yaml", "[baselines]/[hardware key].yaml"),
        // The time column is right-aligned, so the padding before it depends on the
        // duration's width: both go.
        (r" +(\d+(\.\d+)? m?s|\d+m \d\ds|\d+h \d\dm)  new", " [dur]  new"),
        (r"took .*", "took [duration]"),
    ]}, {
        insta::assert_snapshot!(stdout);
    });

    let verbose = bench()
        .arg("report")
        .arg(&run)
        .arg("--baselines")
        .arg(&baselines)
        .arg("--verbose")
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&verbose.stdout);
    assert_eq!(verbose.status.code(), Some(0), "{listed}");
    let by_rules: Vec<_> = r
        .dropped
        .iter()
        .filter(|d| d.by.starts_with("rules["))
        .collect();
    assert!(by_rules.len() > 100, "{}", by_rules.len());
    for d in by_rules {
        assert!(
            listed.contains(&format!("\n      {}\n", d.id.as_str())),
            "{} not listed:\n{listed}",
            d.id.as_str()
        );
    }
    assert!(!listed.contains("(--verbose lists their ids)"), "{listed}");
}

/// `s` as a regular expression that matches it literally.
fn regex_escape(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '/' || c == '_' {
                c.to_string()
            } else {
                format!("\\{c}")
            }
        })
        .collect()
}
