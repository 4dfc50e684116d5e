//! The runner-only build (`cargo build --no-default-features`: no libtorch, no C++ shim):
//! the binary runs a `command` matrix judged against its history, renders its reports again
//! and writes the site; a built-in cell, and `bench worker`, are refused before anything
//! runs, naming the build that has them. CI builds this binary in a target folder of its own
//! with no Python or libtorch on the machine's paths (scripts/runner-only.sh) and runs this
//! file there; in the default build it compiles to nothing.
#![cfg(not(feature = "builtin"))]

use std::path::Path;
use std::process::{Command, Output};

fn bench(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(args)
        .current_dir(dir)
        .env_remove("BENCH_HISTORY")
        .env_remove("GITHUB_STEP_SUMMARY")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

const WORKER: &str = r#"#!/bin/sh
# A team's own benchmark as bench sees it: step events on stdout.
echo '{"event":"start","model":"m","world_size":1}'
for s in 0 1 2 3 4; do
  w=false; [ "$s" = 0 ] && w=true
  echo "{\"event\":\"step\",\"step\":$s,\"step_time_s\":0.01,\"tokens\":1000,\"loss\":1.0,\"warmup\":$w}"
done
echo '{"event":"summary","peak_mem_bytes":[0]}'
"#;

#[test]
fn a_command_matrix_runs_is_judged_reported_and_published() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("worker.sh"), WORKER).unwrap();
    std::fs::write(
        dir.join("m.yaml"),
        "name: team\naxes:\n  opt: [fused, foreach]\ndefaults:\n  steps: 5\n  warmup: 1\n  repeats: 2\n  timeout: 1m\n  tolerance: 0.5\n  workload: {kind: command, argv: [sh, worker.sh, '{opt}']}\n",
    )
    .unwrap();
    for night in ["n1", "n2"] {
        let o = bench(
            dir,
            &[
                "matrix",
                "m.yaml",
                "--history",
                "h.sqlite",
                "--run-id",
                night,
                "--no-progress",
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    let h: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("results/n2/history.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(h["cells"].as_array().map(Vec::len), Some(2), "{h:#}");
    for f in ["summary.md", "junit.xml", "report.html", "report.json"] {
        assert!(dir.join("results/n2").join(f).is_file(), "{f}");
    }
    let o = bench(dir, &["report", "results/n2"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = bench(dir, &["site", "--history", "h.sqlite", "-o", "site"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(dir.join("site/index.html").is_file());
    let o = bench(dir, &["history", "fused", "--history", "h.sqlite"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("fused on "), "{}", text(&o));
}

#[test]
fn a_builtin_cell_is_refused_before_anything_runs_naming_the_full_build() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(
        dir.join("m.yaml"),
        "name: tiny\naxes:\n  model: [gpt2-tiny]\n  dtype: [fp32]\ndefaults: {steps: 5, warmup: 1}\n",
    )
    .unwrap();
    let o = bench(dir, &["matrix", "m.yaml", "--no-progress"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("gpt2-tiny")
            && out.contains("runner-only build")
            && out.contains("full build"),
        "{out}"
    );
    assert!(
        !dir.join("results").exists()
            || std::fs::read_dir(dir.join("results"))
                .unwrap()
                .next()
                .is_none(),
        "nothing ran"
    );
    let o = bench(dir, &["worker", "--model", "gpt2-tiny", "--steps", "3"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains("runner-only build"), "{out}");
    // Listing the presets needs no libtorch.
    let o = bench(dir, &["worker", "--list-models"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("gpt2-tiny"));
}
