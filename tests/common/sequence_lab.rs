//! The lab of issue 31's ordered nights (tests/gate_trust_e2e.rs,
//! tests/gate_busy_host_e2e.rs): a repository whose every night is a commit of its own, a
//! command workload whose speed the test sets per commit and per repeat
//! (tests/fixtures/sequence_worker.sh), and `bench matrix --history` run as the CI
//! templates run it, on a host without GPUs (the host sampler is the telemetry).

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

pub struct Lab {
    _tmp: tempfile::TempDir,
    pub dir: PathBuf,
    pub seq: PathBuf,
    pub matrix: PathBuf,
    pub repo: PathBuf,
    /// Whether bench samples the host (off where tests running beside this one would be
    /// the "foreign" load of its nights).
    pub host_sampling: bool,
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

impl Lab {
    pub fn new() -> Lab {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let seq = dir.join("seq");
        std::fs::create_dir_all(&seq).unwrap();
        let worker = std::fs::canonicalize("tests/fixtures/sequence_worker.sh").unwrap();
        let matrix = dir.join("m.yaml");
        std::fs::write(
            &matrix,
            format!(
                "name: trust\naxes:\n  model: [tiny]\n  gpus: [1]\ndefaults:\n  steps: 8\n  warmup: 1\n  repeats: 3\n  timeout: 60s\n  workload:\n    kind: command\n    argv: [sh, \"{}\"]\n",
                worker.display()
            ),
        )
        .unwrap();
        let repo = dir.join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        let lab = Lab {
            _tmp: tmp,
            dir,
            seq,
            matrix,
            repo,
            host_sampling: false,
        };
        lab.git(&["init", "-q", "-b", "main"]);
        lab
    }

    pub fn git(&self, args: &[&str]) -> String {
        let o = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .current_dir(&self.repo)
            .output()
            .unwrap();
        assert!(o.status.success(), "git {args:?}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    /// A night: a commit of its own holding the commit's speed factor (`level`, which the
    /// worker reads from its working folder: a side-by-side repeat at another commit runs at
    /// that commit's speed), the disturbances of the next invocations (one line each, the
    /// host's: pairs' repeats consume them too), then `bench matrix --history`.
    pub fn night(&self, id: &str, level: f64, once: &[f64]) -> Output {
        std::fs::write(self.repo.join("level"), level.to_string()).unwrap();
        self.git(&["add", "-A"]);
        self.git(&["commit", "-q", "--allow-empty", "-m", id]);
        let lines: Vec<String> = once.iter().map(f64::to_string).collect();
        std::fs::write(self.seq.join("once"), lines.join("\n")).unwrap();
        Command::new(env!("CARGO_BIN_EXE_bench"))
            .current_dir(&self.repo)
            .args(["matrix", self.matrix.to_str().unwrap()])
            .args(["--results-dir", self.dir.join("results").to_str().unwrap()])
            .args(["--run-id", id])
            .args(["--baselines", self.dir.join("baselines").to_str().unwrap()])
            .args(["--history", self.dir.join("h.sqlite").to_str().unwrap()])
            .arg("--no-progress")
            // No GPU: the host sampler is the telemetry.
            .env("PATH", "/usr/bin:/bin")
            .env("SEQ_DIR", &self.seq)
            .env("GITHUB_REF_NAME", "main")
            .env_remove("GITHUB_BASE_REF")
            .env_remove("CI_MERGE_REQUEST_TARGET_BRANCH_NAME")
            .env_remove("GITHUB_STEP_SUMMARY")
            .env(
                "BENCH_TELEMETRY",
                if self.host_sampling { "1" } else { "0" },
            )
            .output()
            .unwrap()
    }

    pub fn history(&self, id: &str) -> serde_json::Value {
        let p = self.dir.join("results").join(id).join("history.json");
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
    }

    pub fn verdict(&self, id: &str) -> String {
        self.history(id)["cells"][0]["judgement"]["verdict"]
            .as_str()
            .unwrap()
            .to_string()
    }

    pub fn clean_nights(&self, n: usize) {
        for i in 0..n {
            let id = format!("c{i:02}");
            let o = self.night(&id, 1.0, &[]);
            assert_eq!(o.status.code(), Some(0), "{id}: {}", text(&o));
            let v = self.verdict(&id);
            // A second night's 3 repeats against 3 cannot say "same": unknown, with no shift,
            // is a clean night too (stored as insufficient history).
            assert!(
                ["unchanged", "insufficient_history", "unknown"].contains(&v.as_str()),
                "{id}: a clean night came out {v}: {}",
                text(&o)
            );
        }
    }
}
