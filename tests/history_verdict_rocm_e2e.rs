//! The history's verdict end to end on a ROCm host, through the built binary: an MI300X
//! whose telemetry the test controls (tests/fixtures/fake_amd_smi.sh as `amd-smi` on PATH,
//! reporting PPT, the power cap, in every sample as a busy MI300X does; a `rocm-smi` that
//! answers only the inventory, so the cells get HIP_VISIBLE_DEVICES; an `nvidia-smi` that
//! fails, so nothing NVIDIA on the machine running the tests is read) and a command workload
//! whose speed the test controls (tests/fixtures/speed_worker.sh).
//!
//! What must hold as on NVIDIA: the power cap every clean run shows excuses nothing (a real
//! slowdown is regressed); a lower GFX clock that accounts for the loss, or a foreign process
//! on the cell's GPU, is the environment, named; an amd-smi that prints garbage costs the
//! telemetry and a warning, never the run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

struct Lab {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    smi: PathBuf,
    matrix: PathBuf,
    /// A git repository of its own on branch `main` where bench runs.
    repo: PathBuf,
}

fn link(fixture: &str, bin: &Path, name: &str) {
    std::os::unix::fs::symlink(std::fs::canonicalize(fixture).unwrap(), bin.join(name)).unwrap();
}

impl Lab {
    fn new() -> Lab {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        link("tests/fixtures/fake_amd_smi.sh", &bin, "amd-smi");
        link("tests/fixtures/fake_rocm_smi.sh", &bin, "rocm-smi");
        // No NVIDIA GPU here, whatever the machine running the tests has.
        let nv = bin.join("nvidia-smi");
        std::fs::write(&nv, "#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n").unwrap();
        std::fs::set_permissions(&nv, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let smi = dir.join("smi");
        std::fs::create_dir_all(&smi).unwrap();
        let worker = std::fs::canonicalize("tests/fixtures/speed_worker.sh").unwrap();
        let matrix = dir.join("m.yaml");
        std::fs::write(
            &matrix,
            format!(
                "name: verdict\naxes:\n  model: [tiny]\n  gpus: [1]\ndefaults:\n  steps: 8\n  warmup: 1\n  repeats: 3\n  timeout: 60s\n  workload:\n    kind: command\n    argv: [sh, \"{}\"]\n",
                worker.display()
            ),
        )
        .unwrap();
        let repo = dir.join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        for args in [
            &["init", "-q", "-b", "main"][..],
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-q",
                "--allow-empty",
                "-m",
                "main",
            ][..],
        ] {
            let o = Command::new("git")
                .args(args)
                .current_dir(&repo)
                .output()
                .unwrap();
            assert!(o.status.success(), "git {args:?}: {}", text(&o));
        }
        Lab {
            _tmp: tmp,
            dir,
            smi,
            matrix,
            repo,
        }
    }

    fn run(&self, id: &str, env: &[(&str, &str)]) -> Output {
        let path = format!(
            "{}:{}",
            self.dir.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_bench"));
        cmd.current_dir(&self.repo)
            .args(["matrix", self.matrix.to_str().unwrap()])
            .args(["--results-dir", self.dir.join("results").to_str().unwrap()])
            .args(["--run-id", id])
            .args(["--baselines", self.dir.join("baselines").to_str().unwrap()])
            .args(["--history", self.dir.join("h.sqlite").to_str().unwrap()])
            .arg("--no-progress")
            .env("PATH", path)
            .env("FAKE_SMI", &self.smi)
            .env("SPEED_COUNTER", self.dir.join("counter"))
            .env("SPEED_SLOW_FILE", self.dir.join("slow"))
            .env("GITHUB_REF_NAME", "main")
            .env_remove("GITHUB_BASE_REF")
            .env_remove("GITHUB_HEAD_REF")
            .env_remove("CI_MERGE_REQUEST_TARGET_BRANCH_NAME")
            .env_remove("GITHUB_STEP_SUMMARY")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env_remove("HIP_VISIBLE_DEVICES")
            .env_remove("ROCR_VISIBLE_DEVICES")
            .env_remove("BENCH_TELEMETRY")
            .env_remove("BENCH_FUSED_ADAMW");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    }

    fn file(&self, id: &str, name: &str) -> String {
        std::fs::read_to_string(self.dir.join("results").join(id).join(name))
            .unwrap_or_else(|e| panic!("{id}/{name}: {e}"))
    }

    fn verdict(&self, id: &str) -> String {
        let h: serde_json::Value = serde_json::from_str(&self.file(id, "history.json")).unwrap();
        h["cells"][0]["judgement"]["verdict"]
            .as_str()
            .unwrap()
            .to_string()
    }

    fn telemetry(&self, id: &str) -> serde_json::Value {
        let r: serde_json::Value = serde_json::from_str(&self.file(id, "results.json")).unwrap();
        r["cells"][0]["telemetry"].clone()
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn clean(lab: &Lab, id: &str) {
    let o = lab.run(id, &[]);
    assert_eq!(o.status.code(), Some(0), "{id}: {}", text(&o));
    let v = lab.verdict(id);
    // A second night's 3 repeats against 3 cannot say "same": unknown, with no shift,
    // is a clean night too.
    assert!(
        ["unchanged", "insufficient_history", "unknown"].contains(&v.as_str()),
        "{id}: a clean night came out {v}: {}",
        text(&o)
    );
}

#[test]
fn rocm_telemetry_power_cap_excuses_nothing_and_a_lower_gfx_clock_is_the_environment() {
    let lab = Lab::new();
    for n in 1..=5 {
        clean(&lab, &format!("n{n}"));
    }
    // Each cell carries the MI300X's own figures over its measured steps: the GFX clock, the
    // cap from `static --limit`, PPT under the SW power cap's name in every sample.
    let t = lab.telemetry("n5");
    assert_eq!(t["sm_clock_mhz"], 2100.0, "{t}");
    assert_eq!(t["max_sm_clock_mhz"], 2100.0, "{t}");
    assert_eq!(t["power_limit_w"], 750.0, "{t}");
    assert_eq!(t["power_w"], 748.0, "{t}");
    assert_eq!(t["temperature_c"], 71.0, "{t}");
    assert_eq!(t["utilization_pct"], 100.0, "{t}");
    assert_eq!(t["gpus"], serde_json::json!([0]), "{t}");
    assert_eq!(t["reasons"]["SW power cap"], 1.0, "{t}");
    assert_eq!(t["reasons"]["HBM thermal slowdown"], 0.0, "{t}");
    assert!(t["samples"].as_u64().unwrap() >= 2, "{t}");

    // A real 3% slowdown at the power cap every clean run also shows: regressed, the
    // switch named; the cap excuses nothing.
    let o = lab.run("s1", &[("BENCH_FUSED_ADAMW", "0")]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert_eq!(lab.verdict("s1"), "regressed", "{out}");
    assert!(out.contains("BENCH_FUSED_ADAMW (unset) -> 0"), "{out}");
    assert_eq!(lab.telemetry("s1")["reasons"]["SW power cap"], 1.0);

    // At the power cap, a GFX clock drop on a chip as cool as in the clean runs is what the
    // code's power allows: the code's, regressed.
    std::fs::write(lab.smi.join("amd_gfx"), "1500").unwrap();
    std::fs::write(lab.dir.join("slow"), "").unwrap();
    let o = lab.run("c1", &[("SPEED_SLOW_FACTOR", "1.25")]);
    std::fs::remove_file(lab.dir.join("slow")).unwrap();
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert_eq!(lab.verdict("c1"), "regressed", "{out}");
    assert!(out.contains("follows the power the code draws"), "{out}");

    // The same drop on a chip 24 C hotter than in its clean runs: the environment, with the
    // clocks and the temperature named, and the job does not fail.
    std::fs::write(lab.smi.join("amd_hotspot"), "95").unwrap();
    std::fs::write(lab.dir.join("slow"), "").unwrap();
    let o = lab.run("e1", &[("SPEED_SLOW_FACTOR", "1.25")]);
    std::fs::remove_file(lab.smi.join("amd_gfx")).unwrap();
    std::fs::remove_file(lab.smi.join("amd_hotspot")).unwrap();
    std::fs::remove_file(lab.dir.join("slow")).unwrap();
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert_eq!(lab.verdict("e1"), "environment", "{out}");
    assert!(out.contains("1500 MHz against 2100"), "{out}");
    assert!(out.contains("95 C against 71 C"), "{out}");
    assert_eq!(lab.telemetry("e1")["sm_clock_mhz"], 1500.0);

    // A process that is not bench's computes on the cell's GPU, as `amd-smi process` shows
    // it: the environment, naming it.
    let mut hog = Command::new("sleep").arg("300").spawn().unwrap();
    std::fs::write(
        lab.smi.join("amd_process"),
        format!("{} sleep 2147483648\n", hog.id()),
    )
    .unwrap();
    std::fs::write(lab.dir.join("slow"), "").unwrap();
    let o = lab.run("e2", &[]);
    let _ = hog.kill();
    let _ = hog.wait();
    std::fs::remove_file(lab.smi.join("amd_process")).unwrap();
    std::fs::remove_file(lab.dir.join("slow")).unwrap();
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert_eq!(lab.verdict("e2"), "environment", "{out}");
    assert!(out.contains("foreign process"), "{out}");
    assert!(out.contains("`sleep`, 2048 MiB"), "{out}");

    // And clean again.
    clean(&lab, "n6");
    assert_eq!(lab.verdict("n6"), "unchanged");
}

#[test]
fn rocm_telemetry_from_an_amd_smi_printing_garbage_is_absent_not_made_up() {
    let lab = Lab::new();
    std::fs::write(lab.smi.join("amd_garbage"), "").unwrap();
    let o = lab.run("g1", &[]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    // No GPU figure is made up; the host's figures (CPU, run queue) are real and stay.
    let t = lab.telemetry("g1");
    assert!(t.is_null() || t["samples"] == 0, "{t}");
    assert!(
        t["sm_clock_mhz"].is_null() && t["gpus"].as_array().is_none_or(Vec::is_empty),
        "{t}"
    );
    assert!(
        out.contains("warning: GPU telemetry: `amd-smi metric"),
        "{out}"
    );
    assert_eq!(lab.file("g1", "telemetry.json").trim(), "null");
    // BENCH_TELEMETRY=0 reads no tool at all: not even a warning.
    let o = lab.run("g2", &[("BENCH_TELEMETRY", "0")]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(!out.contains("GPU telemetry"), "{out}");
    assert!(lab.telemetry("g2").is_null());
}
