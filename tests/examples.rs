//! The examples of examples/ run as a user runs them, from a copy of their folder: the own
//! script's nightly on a CPU (two nights against a history, then a traced step), the
//! torchtitan matrix's dry run (torchtitan needs a GPU). The GitLab pipeline is validated
//! by scripts/check-ci-templates.sh.

use std::path::{Path, PathBuf};
use std::process::Command;

use bench::results::{Outcome, RunResults};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Python with torch: `BENCH_PYTHON` (as CI sets it), else the checkout's venv; `None`
/// outside CI when there is neither.
fn torch_python() -> Option<PathBuf> {
    let candidates = std::env::var_os("BENCH_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([root().join(".venv/bin/python")]);
    for py in candidates {
        let ok = Command::new(&py)
            .args(["-c", "import torch"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Some(py);
        }
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must give a Python with torch (BENCH_PYTHON)"
    );
    None
}

fn copy_example(name: &str, to: &Path) {
    for entry in std::fs::read_dir(root().join("examples").join(name)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

fn bench(dir: &Path, path: &str, args: &[&str]) -> (Option<i32>, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(args)
        .current_dir(dir)
        .env("PATH", path)
        .env_remove("GITHUB_STEP_SUMMARY")
        .env_remove("BENCH_HISTORY")
        .output()
        .unwrap();
    (
        o.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn the_own_script_nightly_runs_two_nights_and_traces_a_step_on_cpu() {
    let Some(py) = torch_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    copy_example("own-script", dir);
    // `python3` in the matrix's argv is the one with torch, as on a runner whose PATH has it.
    let bin = py.parent().unwrap();
    let link = dir.join("bin");
    std::fs::create_dir(&link).unwrap();
    // A wrapper, not a link: a venv's interpreter finds its venv from the path it is
    // started by.
    let wrapper = link.join("python3");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nexec '{}' \"$@\"\n", py.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}:{}",
        link.display(),
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let night = |id: &str, extra: &[&str]| {
        let mut args = vec![
            "matrix",
            "nightly.yaml",
            "--filter",
            "model=tiny",
            "--history",
            "bench-history.sqlite",
            "--run-id",
            id,
            "--no-progress",
        ];
        args.extend_from_slice(extra);
        bench(dir, &path, &args)
    };
    let (code, out) = night("n1", &[]);
    assert_eq!(code, Some(0), "{out}");
    let r = RunResults::load(&dir.join("results/n1")).unwrap();
    assert_eq!(r.cells.len(), 1, "{out}");
    let cell = &r.cells[0];
    assert_eq!(cell.id.as_str(), "tiny.foreach");
    assert_eq!(cell.outcome, Outcome::Passed, "{out}");
    assert!(!cell.repeats.is_empty() && cell.repeats.iter().all(|rep| rep.steps.len() == 12));

    // The second night is judged against the first, and traces one step per cell.
    let (code, out) = night("n2", &["--trace-kernels"]);
    assert!(matches!(code, Some(0) | Some(1)), "{out}");
    let h = json(&dir.join("results/n2/history.json"));
    let verdict = h["cells"][0]["judgement"]["verdict"].as_str().unwrap_or("");
    assert!(!verdict.is_empty(), "{h:#}");
    let trace = dir.join("results/n2/kernels/tiny.foreach.trace.json");
    let t = json(&trace);
    assert!(
        t["traceEvents"].as_array().is_some_and(|e| !e.is_empty()),
        "{} holds no trace events",
        trace.display()
    );
    let r = RunResults::load(&dir.join("results/n2")).unwrap();
    assert_eq!(r.cells[0].outcome, Outcome::Passed, "{out}");
}

#[test]
fn the_torchtitan_example_lists_its_cells() {
    let tmp = tempfile::tempdir().unwrap();
    copy_example("torchtitan", tmp.path());
    let path = std::env::var("PATH").unwrap_or_default();
    let (code, out) = bench(tmp.path(), &path, &["matrix", "bench.yaml", "--dry-run"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("4 combinations -> 4 to run"), "{out}");
    assert!(
        out.contains("llama-3.1-8b-proxy.fp8.8gpu.fsdp.compile+sac") && out.contains("torchtitan"),
        "{out}"
    );
}
