//! The README's main job, end to end on the CPU: `bench matrix matrix/smoke.yaml` trains the
//! tiny GPT-2 and Llama presets with the built-in workload and writes the results, JUnit and
//! Markdown. (Verdicts against baselines are tested deterministically in gate_e2e.rs: CPU
//! timings of tiny models are too noisy for a unit test to assert "no regression".)

use std::process::Command;

use bench::results::{Outcome, RunResults};

#[test]
fn smoke_matrix_runs_on_cpu_and_writes_every_report() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args([
            "matrix",
            "matrix/smoke.yaml",
            "--gpus",
            "0",
            "--no-progress",
            "--run-id",
            "smoke",
        ])
        .arg("--results-dir")
        .arg(tmp.path())
        .arg("--baselines")
        .arg(tmp.path().join("no-baselines"))
        .env_remove("GITHUB_STEP_SUMMARY")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    let run = tmp.path().join("smoke");
    for f in ["results.json", "junit.xml", "summary.md", "report.json"] {
        assert!(run.join(f).exists(), "missing {f}: {text}");
    }
    let results = RunResults::load(&run).unwrap();
    assert_eq!(results.cells.len(), 6, "{text}");
    assert_eq!(results.dropped.len(), 2);
    for c in &results.cells {
        assert_eq!(c.outcome, Outcome::Passed, "{}: {text}", c.id);
        let tps = c.metrics.get("tokens_per_s").expect("tokens/s").value;
        assert!(tps.is_finite() && tps > 0.0, "{}", c.id);
        // Two repeats of 20 steps, 5 of them warm-up.
        assert_eq!(c.repeats.len(), 2);
        for r in &c.repeats {
            assert_eq!(r.steps.len(), 20);
            assert!(r.steps.iter().all(|s| s.loss.is_finite()));
        }
        assert!(!c.logs.is_empty());
    }
    let junit = std::fs::read_to_string(run.join("junit.xml")).unwrap();
    assert!(junit.contains("gpt2-tiny.fp32.1gpu.single.sac"), "{junit}");
}
