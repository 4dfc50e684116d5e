//! `bench report RUN_DIR`: runs the built binary on the fixture run folders and checks the
//! files it writes, its output and its exit code; and checks junit.xml with a real
//! consumer's parser (junitparser, through tests/junit_check.py).

#[path = "common/nightly.rs"]
mod nightly;

use std::path::{Path, PathBuf};
use std::process::Command;

use assert_cmd::prelude::*;

fn bench() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bench"));
    // The job-summary file of the CI running these tests must not receive test reports.
    cmd.env_remove("GITHUB_STEP_SUMMARY");
    cmd
}

/// Copies a fixture run folder into `dir` (reports are written into the run folder).
fn copy_run(name: &str, dir: &Path) -> PathBuf {
    let run = dir.join(name);
    std::fs::create_dir_all(&run).unwrap();
    std::fs::copy(
        Path::new("tests/fixtures/runs")
            .join(name)
            .join("results.json"),
        run.join("results.json"),
    )
    .unwrap();
    run
}

#[test]
fn report_writes_every_format_and_exits_1_on_regression() {
    let tmp = tempfile::tempdir().unwrap();
    let run = copy_run("mixed", tmp.path());
    let step_summary = tmp.path().join("step-summary.md");
    let out = bench()
        .args([
            "report",
            run.to_str().unwrap(),
            "--baselines",
            "tests/fixtures/baselines",
        ])
        .env("GITHUB_STEP_SUMMARY", &step_summary)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("REGRESSION"), "{stdout}");
    assert!(stdout.contains("1.06x slower"), "{stdout}");
    assert!(stdout.contains("result: FAILED (exit 1)"), "{stdout}");
    for f in ["junit.xml", "summary.md", "report.json", "summary.txt"] {
        assert!(run.join(f).is_file(), "{f} missing");
    }
    let junit = std::fs::read_to_string(run.join("junit.xml")).unwrap();
    assert!(
        junit.contains(r#"<failure message="tokens/s 465K tok/s vs baseline 495K tok/s (-6.0%"#),
        "{junit}"
    );
    assert!(junit.contains(r#" type="regression"/>"#), "{junit}");
    let summary = std::fs::read_to_string(run.join("summary.md")).unwrap();
    assert!(summary.starts_with("### bench: `nightly-h100` on `h100-sxm-80gb`: 1 regression"));
    // The job summary receives the Markdown, appended (a second render adds a second copy).
    assert_eq!(
        std::fs::read_to_string(&step_summary).unwrap(),
        format!("{summary}\n")
    );
    bench()
        .args([
            "report",
            run.to_str().unwrap(),
            "--baselines",
            "tests/fixtures/baselines",
        ])
        .env("GITHUB_STEP_SUMMARY", &step_summary)
        .assert()
        .code(1);
    assert_eq!(
        std::fs::read_to_string(&step_summary).unwrap(),
        format!("{summary}\n{summary}\n")
    );
}

#[test]
fn report_json_format_prints_the_comparison() {
    let tmp = tempfile::tempdir().unwrap();
    let run = copy_run("mixed", tmp.path());
    let out = bench()
        .args([
            "report",
            run.to_str().unwrap(),
            "--baselines",
            "tests/fixtures/baselines",
        ])
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["exit_code"], 1);
    assert_eq!(json["counts"]["regression"], 1);
    assert_eq!(json["counts"]["failed"], 1);
    // The same document is in the run folder.
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("report.json")).unwrap()).unwrap();
    assert_eq!(file, json);
}

#[test]
fn report_without_baselines_calls_every_cell_new_and_passes() {
    let tmp = tempfile::tempdir().unwrap();
    let run = copy_run("cpu-ok", tmp.path());
    let empty = tmp.path().join("no-baselines");
    let out = bench()
        .args([
            "report",
            run.to_str().unwrap(),
            "--baselines",
            empty.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("3 new"), "{stdout}");
}

#[test]
fn report_on_a_missing_run_is_bad_input() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope");
    let out = bench()
        .args(["report", missing.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));
}

/// junit.xml as junitparser reads it. Set BENCH_PYTHON to a python that has junitparser
/// (`pip install junitparser`); CI must set it, so the check cannot silently not run there.
#[test]
fn junit_xml_is_accepted_by_junitparser() {
    let Some(python) = std::env::var_os("BENCH_PYTHON") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "BENCH_PYTHON must name a python with junitparser installed when CI is set"
        );
        eprintln!("BENCH_PYTHON not set: junitparser check not run");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let run = copy_run("mixed", tmp.path());
    bench()
        .args([
            "report",
            run.to_str().unwrap(),
            "--baselines",
            "tests/fixtures/baselines",
        ])
        .assert()
        .code(1);
    let out = Command::new(python)
        .arg("tests/junit_check.py")
        .arg(run.join("junit.xml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "junitparser rejected junit.xml: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let suites = seen["suites"].as_array().unwrap();
    assert_eq!(suites.len(), 1);
    let suite = &suites[0];
    assert_eq!(suite["name"], "nightly-h100");
    assert_eq!(suite["tests"], 9);
    assert_eq!(suite["failures"], 1);
    assert_eq!(suite["errors"], 2);
    assert_eq!(suite["hostname"], "gpu-runner-07");
    assert_eq!(suite["properties"]["hardware_key"], "h100-sxm-80gb");
    assert_eq!(suite["properties"]["commit"], "5e6f7a8b9c0d");
    let case = |name: &str| {
        suite["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no testcase {name}"))
            .clone()
    };
    let reg = case("gpt2-125m.bf16.1gpu.single.compile");
    assert_eq!(reg["result"], "failure");
    assert_eq!(reg["type"], "regression");
    assert!(reg["message"].as_str().unwrap().contains("-6.0%"));
    assert_eq!(reg["classname"], "nightly-h100");
    assert_eq!(reg["properties"]["tokens_per_s"], "465300");
    assert_eq!(reg["properties"]["tokens_per_s.baseline"], "495000");
    assert_eq!(case("gpt2-125m.bf16.1gpu.single.base")["result"], "passed");
    assert_eq!(case("gpt2-125m.fp8.1gpu.single.base")["result"], "passed");
    let failed = case("gpt2-1_5b.bf16.1gpu.single.base");
    assert_eq!(failed["result"], "error");
    assert!(failed["message"]
        .as_str()
        .unwrap()
        .contains("out of memory"));
    assert_eq!(failed["time"], 41.5);
    assert_eq!(case("gpt2-1_5b.bf16.2gpu.fsdp.base")["type"], "timeout");
    let skipped = case("llama-3_1-8b-proxy.bf16.8gpu.fsdp.base");
    assert_eq!(skipped["result"], "skipped");
    assert!(skipped["message"]
        .as_str()
        .unwrap()
        .contains("needs 8 GPUs"));
    // A cell a rule dropped is no testcase, but one property of the suite per rule.
    assert!(!suite["cases"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["name"] == "gpt2-125m.fp8.2gpu.ddp.sac"));
    assert_eq!(
        suite["properties"]["dropped rules[1] (fp8-single-only)"],
        "1 cell: fp8 is only measured on one GPU"
    );
    assert_eq!(
        case("gpt2-125m.bf16.1gpu.single.compile+sac")["type"],
        "missing"
    );
}

#[test]
fn report_html_puts_several_runs_on_one_page_and_locates_a_bad_history() {
    let tmp = tempfile::tempdir().unwrap();
    let mixed = copy_run("mixed", tmp.path());
    let cpu = copy_run("cpu-ok", tmp.path());
    let page = tmp.path().join("both.html");
    bench()
        .args(["report", "html"])
        .args([&mixed, &cpu])
        .args(["--baselines", "tests/fixtures/baselines", "-o"])
        .arg(&page)
        .assert()
        .success();
    let data = bench::report::html::embedded_data(&std::fs::read_to_string(&page).unwrap())
        .expect("the page embeds its data");
    let runs: Vec<&str> = data["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(runs.len(), 2);
    let cells = data["cells"].as_array().unwrap();
    for run in &runs {
        assert!(
            cells.iter().any(|c| c["run_id"] == *run),
            "no cell of {run}"
        );
    }

    let history = tmp.path().join("history.json");
    std::fs::write(&history, "{\"series\": [\n  {\"cell\": 1}\n]}").unwrap();
    let out = bench()
        .args(["report", "html"])
        .arg(&mixed)
        .arg("--history")
        .arg(&history)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("{}:2:", history.display())), "{err}");
}

/// `frameworks.md` is written only for a run with framework cells; rendering a run without
/// them again removes the note an earlier bench wrote into every folder, so the folder
/// holds what a fresh run writes.
#[test]
fn frameworks_md_only_for_runs_with_framework_cells() {
    let tmp = tempfile::tempdir().unwrap();
    let mixed = copy_run("mixed", tmp.path());
    std::fs::write(
        mixed.join("frameworks.md"),
        "No framework cells in this run.\n",
    )
    .unwrap();
    let out = bench()
        .arg("report")
        .arg(&mixed)
        .args(["--baselines", "tests/fixtures/baselines"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(mixed.join("report.html").is_file());
    assert!(!mixed.join("frameworks.md").exists());

    let fw = tmp.path().join("frameworks");
    std::fs::create_dir_all(&fw).unwrap();
    nightly::frameworks_run().save_atomic(&fw).unwrap();
    bench()
        .arg("report")
        .arg(&fw)
        .arg("--baselines")
        .arg(tmp.path().join("no-baselines"))
        .assert()
        .success();
    let table = std::fs::read_to_string(fw.join("frameworks.md")).unwrap();
    assert!(table.starts_with("## Framework comparison"), "{table}");

    // A real run on an H100 filtered to six cells (2026-11-25): the framework an adapter
    // cannot express keeps its reason; the combinations --filter left out are no columns.
    let real = tmp.path().join("h100-run2");
    std::fs::create_dir_all(&real).unwrap();
    std::fs::copy(
        "docs/results/frameworks-2026-11-25/h100-run2/results.json",
        real.join("results.json"),
    )
    .unwrap();
    bench()
        .arg("report")
        .arg(&real)
        .arg("--baselines")
        .arg(tmp.path().join("no-baselines"))
        .output()
        .unwrap();
    let table = std::fs::read_to_string(real.join("frameworks.md")).unwrap();
    assert!(
        table.contains("| llmc | dropped: llm.c builds GPT-2 of depth"),
        "{table}"
    );
    assert!(
        // Parentheses are escaped in every foreign string (issue 42: no live link).
        table.contains("| llmc \\(llm.c f1e2ace65149\\) | 321886 |"),
        "{table}"
    );
    assert!(!table.contains("not selected by the filter"), "{table}");
}
