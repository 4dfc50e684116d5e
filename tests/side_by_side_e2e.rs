//! Side-by-side confirmation end to end through the built binary (issue 40's CI case), in a
//! generated nightly repository with the CI template's exact commands: `bench matrix
//! bench.yaml --run-id RUN --shard 1/1 --results-dir shards --no-progress --history H
//! --triage-budget 3600`, then `bench report merge shards/RUN/ -o results/RUN`, from the
//! repository's root with relative folders.
//!
//! The workload is a team's own script reduced to what a gate sees: each repeat a fresh
//! process that starts slowly (1 s, as an interpreter's imports and a CUDA context do) and
//! lands at its own level (+-0.5% per process), over `opt` (fused or foreach). Two clean
//! nights; then three commits of which the middle one slows the fused path by 4%: that night
//! is `regressed` (exit 1) with the first bad commit found by bench alone; the next night at
//! the same code is `regressed` again; the revert is clean; a host 2% slower at clean code is
//! `environment` (exit 0); a pull request 3% slower than its base shows the paired ratio in
//! its comment. A second test runs the README's plain call (`bench matrix FILE --history H`,
//! the default `results/` folder) and bisects too; a third runs the GitLab template's call
//! (`--results-dir shards/$CI_NODE_INDEX`, the merge over `shards/*/$RUN_ID`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const WORK_SH: &str = r#"#!/bin/sh
set -eu
opt=$1
# A fresh process starts slowly (imports, a CUDA context).
sleep 1
us=$(cat "speed.$opt.txt")
# A host of the pool that runs everything slower.
if [ -n "${HOST_SLOWDOWN_PPM:-}" ]; then us=$(( us * (1000000 + HOST_SLOWDOWN_PPM) / 1000000 )); fi
rnd() { od -An -N2 -tu2 /dev/urandom | tr -d ' '; }
# Each process lands at its own level, +-0.5%.
level=$(( 100000 + $(rnd) % 1001 - 500 ))
printf '{"event":"start","model":"%s","world_size":1}\n' "$opt"
i=0
while [ $i -lt 8 ]; do
  t=$(( us * level / 100000 * (100000 + $(rnd) % 201 - 100) / 100000 ))
  w=false; [ $i -eq 0 ] && w=true
  printf '{"event":"step","step":%d,"step_time_s":0.%06d,"tokens":4096,"loss":2.5,"warmup":%s}\n' $i $t $w
  i=$((i + 1))
done
printf '{"event":"summary","peak_mem_bytes":[1000]}\n'
"#;

const MATRIX: &str = "name: team-nightly
axes:
  opt: [fused, foreach]
defaults:
  steps: 8
  warmup: 1
  repeats: 3
  timeout: 60s
  retries: 0
  workload:
    kind: command
    argv: [sh, work.sh, '{opt}']
";

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "commit.gpgsign=false"])
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "Nightly Dev")
        .env("GIT_AUTHOR_EMAIL", "dev@example.com")
        .env("GIT_COMMITTER_NAME", "Nightly Dev")
        .env("GIT_COMMITTER_EMAIL", "dev@example.com")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn commit(dir: &Path, subject: &str) -> String {
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "--allow-empty", "-m", subject]);
    git(dir, &["rev-parse", "HEAD"])
}

struct Lab {
    _tmp: tempfile::TempDir,
    repo: PathBuf,
    history: PathBuf,
}

impl Lab {
    fn new() -> Lab {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        git(&repo, &["init", "-q", "-b", "main"]);
        std::fs::write(repo.join("work.sh"), WORK_SH).unwrap();
        std::fs::write(repo.join("bench.yaml"), MATRIX).unwrap();
        // The job's own outputs are not the code under test.
        std::fs::write(repo.join(".gitignore"), "shards/\nresults/\n").unwrap();
        for opt in ["fused", "foreach"] {
            std::fs::write(repo.join(format!("speed.{opt}.txt")), "20000\n").unwrap();
        }
        commit(&repo, "initial");
        std::fs::create_dir_all(tmp.path().join("tmp")).unwrap();
        Lab {
            history: tmp.path().join("bench-history.sqlite"),
            repo,
            _tmp: tmp,
        }
    }

    fn bench(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_bench"));
        cmd.current_dir(&self.repo)
            .args(args)
            .env("CUDA_VISIBLE_DEVICES", "")
            .env("TMPDIR", self.repo.parent().unwrap().join("tmp"));
        for k in [
            "GITHUB_BASE_REF",
            "GITHUB_HEAD_REF",
            "GITHUB_REF_NAME",
            "CI_MERGE_REQUEST_TARGET_BRANCH_NAME",
            "CI_MERGE_REQUEST_SOURCE_BRANCH_NAME",
            "GITHUB_STEP_SUMMARY",
            "BENCH_PROFILE",
            "BENCH_HISTORY",
            "HOST_SLOWDOWN_PPM",
        ] {
            cmd.env_remove(k);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    }

    /// One night as ci/github/bench.yml runs it: the shard's `bench matrix`, then the merge.
    /// Returns both exit codes and the matrix step's output.
    fn night(&self, id: &str, env: &[(&str, &str)]) -> (i32, i32, String) {
        let history = self.history.display().to_string();
        let m = self.bench(
            &[
                "matrix",
                "bench.yaml",
                "--run-id",
                id,
                "--shard",
                "1/1",
                "--results-dir",
                "shards",
                "--no-progress",
                "--history",
                &history,
                "--triage-budget",
                "3600",
            ],
            env,
        );
        let shard = format!("shards/{id}/");
        let out = format!("results/{id}");
        let merged = self.bench(&["report", "merge", &shard, "-o", &out], env);
        (
            m.status.code().unwrap_or(-1),
            merged.status.code().unwrap_or(-1),
            format!("{}\n--- merge ---\n{}", text(&m), text(&merged)),
        )
    }

    fn json(&self, rel: &str) -> serde_json::Value {
        let p = self.repo.join(rel);
        let s = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        serde_json::from_str(&s).unwrap()
    }

    fn status(&self, id: &str, cell: &str) -> (String, String) {
        let r = self.json(&format!("results/{id}/report.json"));
        let c = r["cells"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == cell)
            .unwrap_or_else(|| panic!("{id}: no cell {cell}: {r:#}"))
            .clone();
        (
            c["status"].as_str().unwrap().to_string(),
            c["reason"].as_str().unwrap_or("").to_string(),
        )
    }

    fn speed(&self, opt: &str, us: u32) {
        std::fs::write(
            self.repo.join(format!("speed.{opt}.txt")),
            format!("{us}\n"),
        )
        .unwrap();
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

const MAIN: &[(&str, &str)] = &[("GITHUB_REF_NAME", "main")];

#[test]
fn a_slowdown_is_regressed_the_night_it_lands_and_a_slower_host_is_environment() {
    let lab = Lab::new();
    for n in 1..=2 {
        commit(&lab.repo, &format!("night {n}: work"));
        let (m, g, log) = lab.night(&format!("n{n}"), MAIN);
        assert_eq!((m, g), (0, 0), "clean night {n}:\n{log}");
    }
    let last_good = git(&lab.repo, &["rev-parse", "HEAD"]);

    // Three commits land; the middle one slows the fused path by 4%.
    commit(&lab.repo, "docs: the README's new section");
    lab.speed("fused", 20800);
    let culprit = commit(&lab.repo, "clip gradients per parameter in the fused path");
    commit(&lab.repo, "tests: one more case");
    let (m, g, log) = lab.night("n3", MAIN);
    assert_eq!((m, g), (1, 1), "the night it lands fails the job:\n{log}");
    let (status, reason) = lab.status("n3", "fused");
    assert_eq!(status, "regression", "{reason}\n{log}");
    assert!(
        reason.contains("side by side against") && reason.contains("different"),
        "the verdict rests on the pairs: {reason}"
    );
    assert_eq!(lab.status("n3", "foreach").0, "unchanged", "{log}");
    // Measured against the last good commit, in this job.
    let h = lab.json("shards/n3/history.json");
    let fused = h["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["cell_id"] == "fused")
        .unwrap();
    assert_eq!(
        fused["pairs"]["base_commit"],
        last_good.as_str(),
        "{fused:#}"
    );
    let pairs = fused["pairs"]["result"]["pairs"].as_u64().unwrap();
    assert!((3..=12).contains(&pairs), "{fused:#}");
    let change = fused["pairs"]["result"]["change_rel"].as_f64().unwrap();
    assert!((-0.06..=-0.02).contains(&change), "{fused:#}");
    // Bench alone found the commit, with the relative results folder and the merge.
    let r = lab.json("results/n3/report.json");
    let findings = r["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 1, "{r:#}");
    assert_eq!(
        findings[0]["bisected"]["first_bad"]["sha"],
        culprit.as_str(),
        "{:#}\n{log}",
        findings[0]
    );
    // Its ends came from the pairs.
    assert!(log.contains("round(s) from the history"), "{log}");
    // The cost is stated.
    let cost = &r["cost"];
    assert!(cost["pairs_gpu_s"].as_f64().unwrap() > 0.0, "{r:#}");
    assert!(cost["triage_gpu_s"].as_f64().unwrap() > 0.0, "{r:#}");
    // And by cell: the slowed cell carries the pairs and the bisection, and the cells'
    // costs add up to the run's.
    let cells = r["cell_costs"].as_array().unwrap();
    let of = |id: &str| cells.iter().find(|c| c["cell_id"] == id).unwrap();
    assert!(of("fused")["pairs_gpu_s"].as_f64().unwrap() > 0.0, "{r:#}");
    assert!(of("fused")["triage_gpu_s"].as_f64().unwrap() > 0.0, "{r:#}");
    assert_eq!(of("foreach")["triage_gpu_s"].as_f64(), Some(0.0), "{r:#}");
    for part in [
        "measuring_gpu_s",
        "pairs_gpu_s",
        "reruns_gpu_s",
        "triage_gpu_s",
    ] {
        let sum: f64 = cells.iter().map(|c| c[part].as_f64().unwrap()).sum();
        let total = cost[part].as_f64().unwrap();
        assert!(
            (sum - total).abs() <= 1e-6 * total.max(1.0),
            "{part}: {r:#}"
        );
    }
    let summary = std::fs::read_to_string(lab.repo.join("results/n3/summary.md")).unwrap();
    assert!(
        summary.contains("Cost of this verdict: measuring"),
        "{summary}"
    );
    assert!(
        summary.contains("| `fused` |"),
        "the side-by-side table: {summary}"
    );
    assert!(
        summary.contains("The cells whose verdict took more than measuring them"),
        "the cost by cell: {summary}"
    );

    // The next night at the same code: regressed again, on the pairs whatever the screen
    // says (a regression not yet fixed is measured side by side every night), and its
    // bisection takes the rounds the first one recorded.
    let (m, _, log) = lab.night("n4", MAIN);
    assert_eq!(m, 1, "{log}");
    let (status, reason) = lab.status("n4", "fused");
    assert_eq!(status, "regression", "{reason}\n{log}");
    assert!(
        reason.contains("side by side against") && reason.contains("different"),
        "{reason}"
    );
    assert!(log.contains("round(s) from the history"), "{log}");

    // The revert: clean.
    lab.speed("fused", 20000);
    commit(
        &lab.repo,
        "Revert \"clip gradients per parameter in the fused path\"",
    );
    let (m, g, log) = lab.night("n5", MAIN);
    assert_eq!((m, g), (0, 0), "the revert is clean:\n{log}");
    let (status, reason) = lab.status("n5", "fused");
    assert_eq!(status, "unchanged", "{reason}\n{log}");
    // Closed by the screen (the same as the clean nights before the regression), or by the
    // pairs where the screen could not tell.
    assert!(
        reason.contains("same"),
        "the revert closes the regression: {reason}"
    );

    // A host 2% slower at clean code: the pairs say the code is the same.
    commit(&lab.repo, "docs: a typo");
    let mut slow_host = MAIN.to_vec();
    slow_host.push(("HOST_SLOWDOWN_PPM", "20000"));
    let (m, g, log) = lab.night("n6", &slow_host);
    assert_eq!((m, g), (0, 0), "a slower host is no regression:\n{log}");
    for cell in ["fused", "foreach"] {
        let (status, reason) = lab.status("n6", cell);
        assert!(
            status == "environment" || status == "unchanged",
            "{cell}: {status}: {reason}\n{log}"
        );
        if status == "environment" {
            assert!(
                reason.contains("side by side") && reason.contains("same"),
                "{reason}"
            );
        }
    }

    // A pull request 3% slower than its base: every cell measured against the merge-base.
    let base = git(&lab.repo, &["rev-parse", "HEAD"]);
    git(&lab.repo, &["checkout", "-q", "-b", "slower-update"]);
    lab.speed("foreach", 20600);
    commit(&lab.repo, "foreach: a slower update");
    let pr: &[(&str, &str)] = &[
        ("GITHUB_BASE_REF", "main"),
        ("GITHUB_HEAD_REF", "slower-update"),
    ];
    let (m, _, log) = lab.night("pr1", pr);
    assert_eq!(m, 1, "{log}");
    let comment = lab.bench(&["report", "post", "results/pr1", "--dry-run"], pr);
    let body = text(&comment);
    assert!(body.contains("Side by side"), "{body}");
    let row = body
        .lines()
        .find(|l| l.starts_with("| `foreach` |"))
        .unwrap_or_else(|| panic!("{body}"));
    let short = &base[..7];
    assert!(row.contains(short) && row.contains("different"), "{row}");
    let fused_row = body
        .lines()
        .find(|l| l.starts_with("| `fused` |"))
        .unwrap_or_else(|| panic!("every cell is measured: {body}"));
    assert!(!fused_row.contains("different"), "{fused_row}");
}

#[test]
fn the_readme_call_with_the_default_results_folder_bisects() {
    let lab = Lab::new();
    let history = lab.history.display().to_string();
    let call = |lab: &Lab| {
        let o = lab.bench(
            &[
                "matrix",
                "bench.yaml",
                "--history",
                &history,
                "--triage-budget",
                "3600",
            ],
            MAIN,
        );
        (o.status.code().unwrap_or(-1), text(&o))
    };
    for n in 1..=2 {
        commit(&lab.repo, &format!("night {n}"));
        let (code, log) = call(&lab);
        assert_eq!(code, 0, "{log}");
    }
    commit(&lab.repo, "refactor: names");
    lab.speed("foreach", 21000);
    let culprit = commit(&lab.repo, "foreach: recompute the norm every step");
    let (code, log) = call(&lab);
    assert_eq!(code, 1, "{log}");
    assert!(
        log.contains(&format!("first bad commit {}", &culprit[..7])),
        "bisected from the default results/ folder:\n{log}"
    );
    assert!(!log.contains("bisection failed"), "{log}");
}

/// The GitLab template's call (ci/gitlab/bench.gitlab-ci.yml): each parallel job's results
/// under `shards/$CI_NODE_INDEX`, the merge over `shards/*/$RUN_ID`, the branch from GitLab's
/// own variable. The slowed night bisects from that relative folder too.
#[test]
fn the_gitlab_template_call_bisects() {
    let lab = Lab::new();
    let history = lab.history.display().to_string();
    let gitlab: &[(&str, &str)] = &[("CI_COMMIT_REF_NAME", "main"), ("CI_NODE_INDEX", "1")];
    let night = |lab: &Lab, id: &str| {
        let m = lab.bench(
            &[
                "matrix",
                "bench.yaml",
                "--run-id",
                id,
                "--shard",
                "1/1",
                "--results-dir",
                "shards/1",
                "--no-progress",
                "--history",
                &history,
                "--triage-budget",
                "3600",
            ],
            gitlab,
        );
        // `shards/*/"$RUN_ID"` as the job's shell expands it: one parallel job here.
        let shard = format!("shards/1/{id}");
        let out = format!("results/{id}");
        let merged = lab.bench(&["report", "merge", &shard, "-o", &out], gitlab);
        (
            m.status.code().unwrap_or(-1),
            merged.status.code().unwrap_or(-1),
            format!("{}\n--- merge ---\n{}", text(&m), text(&merged)),
        )
    };
    for n in 1..=2 {
        commit(&lab.repo, &format!("night {n}"));
        let (code, merged, log) = night(&lab, &format!("gl-{n}"));
        assert_eq!((code, merged), (0, 0), "{log}");
    }
    commit(&lab.repo, "refactor: names");
    lab.speed("foreach", 21000);
    let culprit = commit(&lab.repo, "foreach: recompute the norm every step");
    let (code, merged, log) = night(&lab, "gl-3");
    assert_eq!((code, merged), (1, 1), "{log}");
    assert!(
        log.contains(&format!("first bad commit {}", &culprit[..7])),
        "bisected from shards/1:\n{log}"
    );
    assert!(!log.contains("bisection failed"), "{log}");
    assert_eq!(lab.status("gl-3", "foreach").0, "regression", "{log}");
    assert_eq!(lab.status("gl-3", "fused").0, "unchanged", "{log}");
}
