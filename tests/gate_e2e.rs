//! The gate end to end through the built binary, with a deterministic command workload
//! (tests/fixtures/fake_worker.sh reports fixed step times, so no CPU noise): a first run
//! reports every cell as new; its measurements become the baselines; a second identical run
//! reports no regression and exits 0; a run whose cell is slower under the same cell id is
//! a regression in JUnit and exits 1.

use std::path::Path;
use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(args)
        .env("CUDA_VISIBLE_DEVICES", "")
        .env_remove("GITHUB_STEP_SUMMARY")
        .output()
        .unwrap()
}

fn matrix(dir: &Path, name: &str, step_time: &str) -> String {
    let worker = std::fs::canonicalize("tests/fixtures/fake_worker.sh").unwrap();
    let text = format!(
        "name: gate\naxes:\n  model: [small, large]\n  gpus: [1]\ndefaults:\n  steps: 5\n  warmup: 1\n  repeats: 2\n  timeout: 60s\n  tolerance: 0.1\n  extra: {{step_time: \"{step_time}\"}}\n  workload:\n    kind: command\n    argv: [sh, \"{}\", paced, \"{{step_time}}\"]\n",
        worker.display()
    );
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

fn run(dir: &Path, matrix: &str, id: &str) -> Output {
    let results = dir.join("results");
    let baselines = dir.join("baselines");
    bench(&[
        "matrix",
        matrix,
        "--results-dir",
        results.to_str().unwrap(),
        "--run-id",
        id,
        "--baselines",
        baselines.to_str().unwrap(),
        "--no-progress",
        "--gpus",
        "0",
    ])
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn baseline_then_no_regression_then_regression() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let same = matrix(dir, "same.yaml", "0.5");
    let slower = matrix(dir, "slower.yaml", "0.6");

    let first = run(dir, &same, "first");
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    for f in ["results.json", "junit.xml", "summary.md", "report.json"] {
        assert!(dir.join("results/first").join(f).exists(), "missing {f}");
    }
    assert!(text(&first).contains("new"), "{}", text(&first));

    let update = bench(&[
        "baseline",
        "update",
        dir.join("results/first").to_str().unwrap(),
        "--baselines",
        dir.join("baselines").to_str().unwrap(),
    ]);
    assert_eq!(update.status.code(), Some(0), "{}", text(&update));
    // The matrix's per-cell tolerance is recorded in the baselines, for review.
    let file = std::fs::read_to_string(dir.join("baselines/cpu-x86_64.yaml"))
        .or_else(|_| {
            let entry = std::fs::read_dir(dir.join("baselines"))
                .unwrap()
                .next()
                .unwrap();
            std::fs::read_to_string(entry.unwrap().path())
        })
        .unwrap();
    assert!(file.contains("tolerance: 0.1"), "{file}");

    let second = run(dir, &same, "second");
    assert_eq!(second.status.code(), Some(0), "{}", text(&second));
    let junit = std::fs::read_to_string(dir.join("results/second/junit.xml")).unwrap();
    assert!(!junit.contains("<failure"), "{junit}");

    let third = run(dir, &slower, "third");
    assert_eq!(third.status.code(), Some(1), "{}", text(&third));
    let junit = std::fs::read_to_string(dir.join("results/third/junit.xml")).unwrap();
    assert!(junit.contains("<failure"), "{junit}");
    assert!(junit.contains("small.1gpu"), "{junit}");
    let md = std::fs::read_to_string(dir.join("results/third/summary.md")).unwrap();
    assert!(md.contains("regression"), "{md}");
}
