//! Automatic triage end to end through the built binary, in a generated nightly repository
//! (issue 30's CI case): a command workload whose step time is the sum of the kernels its
//! model's file lists (`kernels.<model>.txt`), and which writes those kernels as a Chrome
//! trace of one step when bench sets `BENCH_PROFILE`. Clean nights at five commits, then
//! one night after a range of commits of which two are causes: one adds a copy kernel to
//! model `a` (+8%), another makes model `b`'s attention 80% longer (+20%); model `c` never
//! changes. `bench matrix --history` as the CI template runs it must give exactly two
//! findings, each naming its axis value and, bisected by bench alone within the matrix's
//! budget, its first bad commit and the kernels that moved, in summary.md, JUnit,
//! report.json and report.html (checked in chromium when BENCH_CHROMIUM is set). A clean
//! night triggers no triage; a pull request's run does not bisect; a later job resumes from
//! the probes the history holds.

mod common;
mod publish_server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use publish_server::{FakeApi, Flavor};

/// The workload: the kernels of `kernels.$1.txt` (`name microseconds` per line) make one
/// step; 6 steps (1 warm-up) with one +-0.2% jitter per run.
const WORK_SH: &str = r#"#!/bin/sh
set -eu
model=$1
# A probe's run (in the bisection's worktree) can be made slow, so a test can spend a budget.
case $PWD in "${TRIAGE_SLOW_UNDER:-/nonexistent}"*) sleep 1 ;; esac
us=0
while read -r name dur; do us=$((us + dur)); done < "kernels.$model.txt"
if [ -n "${BENCH_PROFILE:-}" ]; then
  {
    printf '{"schemaVersion":1,"traceEvents":[{"ph":"X","cat":"cpu_op","name":"step","ts":0,"dur":%d}' "$us"
    ts=0
    while read -r name dur; do
      printf ',{"ph":"X","cat":"kernel","name":"%s","pid":0,"tid":7,"ts":%d,"dur":%d}' "$name" "$ts" "$dur"
      ts=$((ts + dur))
    done < "kernels.$model.txt"
    printf ']}\n'
  } > "$BENCH_PROFILE"
fi
seed=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
t=$(( us * (100000 + seed % 401 - 200) / 100000 ))
printf '{"event":"start","model":"%s","world_size":1}\n' "$model"
i=0
while [ $i -lt 6 ]; do
  w=false; [ $i -eq 0 ] && w=true
  printf '{"event":"step","step":%d,"step_time_s":0.%06d,"tokens":1024,"loss":2.5,"warmup":%s}\n' $i $t $w
  i=$((i + 1))
done
printf '{"event":"summary","peak_mem_bytes":[1000]}\n'
"#;

const MATRIX: &str = "name: nightly-toy
axes:
  model: [a, b, c]
  dtype: [bf16, fp8]
defaults:
  steps: 6
  warmup: 1
  repeats: 5
  timeout: 60s
  retries: 0
  workload:
    kind: command
    argv: [sh, work.sh, '{model}']
triage:
  budget_gpu_s: 600
";

const KERNELS: &str = "gemm_main_kernel 3000\nflash_attention_kernel 1000\n";

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
    results: PathBuf,
    history: PathBuf,
    baselines: PathBuf,
}

impl Lab {
    fn new() -> Lab {
        Lab::with_matrix(MATRIX)
    }

    fn with_matrix(matrix: &str) -> Lab {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        git(&repo, &["init", "-q", "-b", "main"]);
        std::fs::write(repo.join("work.sh"), WORK_SH).unwrap();
        std::fs::write(repo.join("matrix.yaml"), matrix).unwrap();
        for m in ["a", "b", "c"] {
            std::fs::write(repo.join(format!("kernels.{m}.txt")), KERNELS).unwrap();
        }
        commit(&repo, "initial");
        let tmpdir = tmp.path().join("tmp");
        std::fs::create_dir_all(&tmpdir).unwrap();
        Lab {
            results: tmp.path().join("results"),
            history: tmp.path().join("history.sqlite"),
            baselines: tmp.path().join("baselines"),
            repo,
            _tmp: tmp,
        }
    }

    /// `bench matrix matrix.yaml --history` in the repository, as the nightly template
    /// runs it (on branch main, not a pull request).
    fn night(&self, id: &str, extra: &[&str], env: &[(&str, &str)]) -> Output {
        self.night_command(id, extra, env).output().unwrap()
    }

    /// The command [`Lab::night`] runs, to start it and signal it.
    fn night_command(&self, id: &str, extra: &[&str], env: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_bench"));
        cmd.current_dir(&self.repo)
            .args(["matrix", "matrix.yaml", "--no-progress", "--run-id", id])
            .arg("--results-dir")
            .arg(&self.results)
            .arg("--baselines")
            .arg(&self.baselines)
            .arg("--history")
            .arg(&self.history)
            .args(extra)
            .env("CUDA_VISIBLE_DEVICES", "")
            .env("TMPDIR", self.repo.parent().unwrap().join("tmp"))
            .env("GITHUB_REF_NAME", "main");
        for k in [
            "GITHUB_BASE_REF",
            "CI_MERGE_REQUEST_TARGET_BRANCH_NAME",
            "GITHUB_STEP_SUMMARY",
            "BENCH_PROFILE",
            "BENCH_HISTORY",
        ] {
            cmd.env_remove(k);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }

    fn file(&self, id: &str, name: &str) -> String {
        std::fs::read_to_string(self.results.join(id).join(name))
            .unwrap_or_else(|e| panic!("{id}/{name}: {e}"))
    }

    fn report(&self, id: &str) -> serde_json::Value {
        serde_json::from_str(&self.file(id, "report.json")).unwrap()
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The finding of `report.json` whose line names `value`.
fn finding<'a>(report: &'a serde_json::Value, value: &str) -> &'a serde_json::Value {
    let all = report["findings"].as_array().expect("findings");
    let hits: Vec<&serde_json::Value> = all
        .iter()
        .filter(|f| {
            f["separates"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s.as_str().unwrap().contains(&format!("every {value} cell")))
        })
        .collect();
    assert_eq!(hits.len(), 1, "one finding for {value}: {all:#?}");
    hits[0]
}

#[test]
fn two_causes_give_two_findings_each_bisected_to_its_commit_with_its_kernels() {
    let lab = Lab::new();
    // Five clean nights, each at a commit of its own.
    for n in 1..=5 {
        std::fs::write(lab.repo.join("NOTES"), format!("night {n}\n")).unwrap();
        commit(&lab.repo, &format!("docs: night {n}"));
        let id = format!("night{n}");
        let o = lab.night(&id, &[], &[]);
        assert_eq!(o.status.code(), Some(0), "{id}: {}", text(&o));
        assert!(
            !text(&o).contains("triage:"),
            "a clean night triggers no triage: {}",
            text(&o)
        );
        let r = lab.report(&id);
        assert_eq!(r["findings"].as_array().map_or(0, Vec::len), 0, "{id}");
    }
    // The range: nine commits, two of them causes.
    let mut shas = Vec::new();
    let mut step = |lab: &Lab, subject: &str, change: &dyn Fn(&Path)| {
        change(&lab.repo);
        shas.push((commit(&lab.repo, subject), subject.to_string()));
    };
    step(&lab, "refactor: rename a helper", &|r| {
        std::fs::write(r.join("NOTES"), "refactor\n").unwrap()
    });
    step(&lab, "docs: explain the loader", &|r| {
        std::fs::write(r.join("NOTES"), "loader\n").unwrap()
    });
    step(&lab, "model a: copy the activations", &|r| {
        std::fs::write(
            r.join("kernels.a.txt"),
            format!("{KERNELS}elementwise_copy_kernel 320\n"),
        )
        .unwrap()
    });
    step(&lab, "ci: cache the venv", &|r| {
        std::fs::write(r.join("NOTES"), "ci\n").unwrap()
    });
    step(&lab, "tests: more cases", &|r| {
        std::fs::write(r.join("NOTES"), "tests\n").unwrap()
    });
    step(&lab, "model b: unfused attention", &|r| {
        std::fs::write(
            r.join("kernels.b.txt"),
            "gemm_main_kernel 3000\nflash_attention_kernel 1800\n",
        )
        .unwrap()
    });
    step(&lab, "docs: changelog", &|r| {
        std::fs::write(r.join("NOTES"), "changelog\n").unwrap()
    });
    step(&lab, "style: fmt", &|r| {
        std::fs::write(r.join("NOTES"), "fmt\n").unwrap()
    });
    let culprit_a = &shas[2];
    let culprit_b = &shas[5];

    let o = lab.night("night6", &[], &[]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let r = lab.report("night6");
    assert_eq!(
        r["findings"].as_array().unwrap().len(),
        2,
        "exactly two findings: {:#?}",
        r["findings"]
    );
    let mut total_gpu_s = 0.0;
    for (value, (sha, subject), kind, kernel) in [
        ("model=a", culprit_a, "copies", "elementwise_copy_kernel"),
        ("model=b", culprit_b, "attention", "flash_attention_kernel"),
    ] {
        let f = finding(&r, value);
        let b = &f["bisected"];
        assert_eq!(b["status"], "found", "{value}: {b:#}\n{out}");
        assert_eq!(b["first_bad"]["sha"], sha.as_str(), "{value}: {b:#}");
        assert_eq!(b["first_bad"]["subject"], subject.as_str());
        assert_eq!(b["first_bad"]["author"], "Nightly Dev <dev@example.com>");
        let commits = b["commits"].as_u64().unwrap();
        assert_eq!(commits, 8);
        // Binary search over 8 commits: good, bad and at most ceil(log2 8) probes.
        assert!(b["measured"].as_u64().unwrap() <= 3 + 2, "{b:#}");
        let gpu_s = b["gpu_s"].as_f64().unwrap();
        assert!(
            gpu_s > 0.0 && gpu_s <= b["budget_gpu_s"].as_f64().unwrap(),
            "{b:#}"
        );
        total_gpu_s += gpu_s;
        let k = &f["kernels"];
        assert_eq!(k["kinds"][0]["name"], kind, "{value}: {k:#}");
        assert_eq!(k["kernels"][0]["name"], kernel, "{value}: {k:#}");
        for t in k["traces"].as_array().unwrap() {
            assert!(
                lab.results
                    .join("night6")
                    .join(t.as_str().unwrap())
                    .is_file(),
                "trace kept in the run folder: {t}"
            );
        }
    }
    assert!(
        total_gpu_s <= 600.0,
        "both within the one budget: {total_gpu_s}"
    );
    let a = finding(&r, "model=a");
    assert!((a["kernels"]["kinds"][0]["after_ms"].as_f64().unwrap() - 0.32).abs() < 1e-9);
    // summary.md: two findings, each with its first bad commit and its kernels.
    let md = lab.file("night6", "summary.md");
    assert!(md.contains("#### Findings"), "{md}");
    for (sha, subject) in [culprit_a, culprit_b] {
        assert!(
            md.contains(&format!("**first bad commit** `{}` {subject}", &sha[..12])),
            "{subject}: {md}"
        );
    }
    assert!(md.contains("new 0.32 ms"), "{md}");
    assert!(md.contains("+0.80 ms attention"), "{md}");
    // JUnit: every regressed cell's failure names its finding and that finding's commit.
    let junit = lab.file("night6", "junit.xml");
    for (cell_model, (sha, _)) in [("a", culprit_a), ("b", culprit_b)] {
        for dtype in ["bf16", "fp8"] {
            let case = junit
                .split("<testcase")
                .find(|c| {
                    c.contains(&format!("name=\"{cell_model}-{dtype}\""))
                        || c.contains(&format!("model={cell_model}")) && c.contains(dtype)
                })
                .unwrap_or_else(|| panic!("{cell_model}-{dtype} in {junit}"));
            assert!(case.contains("[finding F"), "{case}");
            assert!(
                case.contains(&format!("first bad commit {}", &sha[..7])),
                "{case}"
            );
        }
    }
    // The terminal says it too.
    assert!(
        out.contains(&format!("first bad commit {}", &culprit_b.0[..7])),
        "{out}"
    );
    // report.html, in a real browser when one is at hand.
    if let Some(seen) = check_in_chromium(&lab.results.join("night6").join("report.html")) {
        assert_eq!(seen["findings"], 2, "{seen}");
        assert_eq!(seen["bisected"], 2, "{seen}");
        assert!(seen["kernel_rows"].as_u64().unwrap() >= 4, "{seen}");
    }

    // The PR comment body, rendered again from the run folder by `bench report post`: the
    // findings keep their first bad commits and kernels (the folder's triage.json).
    let api = FakeApi::start(Flavor::GitHub, "ghs_triage0123456789", 30);
    let posted = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["report", "post"])
        .arg(lab.results.join("night6"))
        .arg("--baselines")
        .arg(&lab.baselines)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("GITHUB_API_URL", &api.base)
        .env("GITHUB_REPOSITORY", "o/r")
        .env("GITHUB_REF", "refs/pull/42/merge")
        .env("GITHUB_SHA", "feedbeef")
        .env("GITHUB_TOKEN", "ghs_triage0123456789")
        .output()
        .unwrap();
    assert_eq!(posted.status.code(), Some(1), "{}", text(&posted));
    let comments = api.comments();
    assert_eq!(comments.len(), 1, "{}", text(&posted));
    let body = &comments[0].body;
    assert!(body.contains("#### Findings"), "{body}");
    for (sha, subject) in [culprit_a, culprit_b] {
        assert!(
            body.contains(&format!("**first bad commit** `{}` {subject}", &sha[..12])),
            "{subject}: {body}"
        );
    }
    assert!(body.contains("+0.80 ms attention"), "{body}");

    // A pull request's run with the same change: it fails as the nightly did, with the same
    // two findings, and bisects neither (the change is the pull request's own): each says
    // why, and no probe runs.
    let o = lab.night("pr1", &[], &[("GITHUB_BASE_REF", "main")]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let r = lab.report("pr1");
    assert_eq!(r["exit_code"], 1, "{out}");
    assert_eq!(
        r["findings"].as_array().unwrap().len(),
        2,
        "{:#}\n{out}",
        r["findings"]
    );
    for value in ["model=a", "model=b"] {
        let f = finding(&r, value);
        let b = &f["bisected"];
        assert_eq!(b["status"], "skipped", "{value}: {f:#}\n{out}");
        assert!(
            b["evidence"].as_str().unwrap().contains("pull request"),
            "{value}: {b:#}"
        );
        assert!(b["first_bad"].is_null(), "{value}: {b:#}");
        assert_eq!(b["measured"], 0, "{value}: {b:#}");
    }
    assert!(
        !out.contains("bisect: measuring") && !out.contains(": bisecting "),
        "{out}"
    );

    // A later job over the same range resumes from the probes the history holds: with a
    // budget of 0.001 GPU-s it still names both commits, running no round; the traced steps do
    // not fit, and the finding says so.
    let o = lab.night("night7", &["--triage-budget", "0.001"], &[]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let r = lab.report("night7");
    for (value, (sha, _)) in [("model=a", culprit_a), ("model=b", culprit_b)] {
        let f = finding(&r, value);
        let b = &f["bisected"];
        assert_eq!(b["status"], "found", "{value}: {b:#}\n{out}");
        assert_eq!(b["first_bad"]["sha"], sha.as_str());
        assert_eq!(b["rounds_run"], 0, "{b:#}");
        assert!(b["rounds_reused"].as_u64().unwrap() >= 2, "{b:#}");
        assert!(f["kernels"].is_null());
        assert!(
            f["kernels_missing"].as_str().unwrap().contains("budget"),
            "{f:#}"
        );
    }
}

/// tests/browser/check-report.mjs on `page`: its JSON line, or `None` when no browser is
/// configured (outside CI).
fn check_in_chromium(page: &Path) -> Option<serde_json::Value> {
    if std::env::var_os("BENCH_CHROMIUM").is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "BENCH_CHROMIUM must name Debian's chromium when CI is set"
        );
        eprintln!("BENCH_CHROMIUM not set: report.html not opened in a browser");
        return None;
    }
    let out = Command::new("node")
        .arg("tests/browser/check-report.mjs")
        .arg(page)
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "check-report.mjs:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout.lines().find(|l| l.starts_with('{')).unwrap();
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert!(v["problems"].as_array().unwrap().is_empty(), "{v}");
    Some(v)
}

#[test]
fn a_bisection_out_of_budget_says_so_and_the_next_job_finishes_it() {
    let lab = Lab::new();
    for n in 1..=5 {
        std::fs::write(lab.repo.join("NOTES"), format!("night {n}\n")).unwrap();
        commit(&lab.repo, &format!("docs: night {n}"));
        let o = lab.night(&format!("night{n}"), &[], &[]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    let mut culprit = String::new();
    for i in 1..=6 {
        if i == 4 {
            std::fs::write(
                lab.repo.join("kernels.a.txt"),
                format!("{KERNELS}elementwise_copy_kernel 320\n"),
            )
            .unwrap();
            culprit = commit(&lab.repo, "model a: copy the activations");
        } else {
            std::fs::write(lab.repo.join("NOTES"), format!("change {i}\n")).unwrap();
            commit(&lab.repo, &format!("change {i}"));
        }
    }
    // Every probe round sleeps 5 s (1 s per repeat), so 4 GPU-s hold no round: the two ends
    // come from the side-by-side pairs (recorded as the bisection's ends), and the binary
    // search inside the range does not fit.
    let slow_under = lab.repo.parent().unwrap().join("tmp");
    let slow = [("TRIAGE_SLOW_UNDER", slow_under.to_str().unwrap())];
    let o = lab.night("night6", &["--triage-budget", "4"], &slow);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let r = lab.report("night6");
    let f = finding(&r, "model=a");
    let b = &f["bisected"];
    assert_eq!(b["status"], "out_of_budget", "{b:#}\n{out}");
    assert!(b["first_bad"].is_null());
    assert!(
        b["rounds_reused"].as_u64().unwrap() >= 2,
        "the pairs' ends: {b:#}\n{out}"
    );
    let rounds = b["rounds_run"].as_u64().unwrap() + b["rounds_reused"].as_u64().unwrap();
    // Stopped when the budget ran out (the stop itself takes a moment).
    assert!(b["gpu_s"].as_f64().unwrap() <= 4.5, "{b:#}");
    assert!(
        b["evidence"].as_str().unwrap().contains("GPU-s budget"),
        "{b:#}"
    );
    let finish = b["command"].as_str().unwrap();
    assert!(finish.starts_with("bench bisect a."), "{finish}");
    let md = lab.file("night6", "summary.md");
    assert!(md.contains("bisection out of budget"), "{md}");
    assert!(md.contains("finish it with `bench bisect"), "{md}");
    // The next night's job resumes: the two ends come from the history.
    let o = lab.night("night7", &["--triage-budget", "600"], &slow);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let r = lab.report("night7");
    let b = &finding(&r, "model=a")["bisected"];
    assert_eq!(b["status"], "found", "{b:#}\n{out}");
    assert_eq!(b["first_bad"]["sha"], culprit.as_str());
    assert!(b["rounds_reused"].as_u64().unwrap() >= rounds, "{b:#}");
}

#[test]
fn a_regression_no_bisection_chases_gets_its_kernels_from_the_history() {
    // Every run keeps its cells' kernels; no budget, so nothing is bisected. A pull request
    // that slows model a still gets the kernels that moved since its last good run.
    let matrix = MATRIX.replace(
        "triage:\n  budget_gpu_s: 600\n",
        "triage:\n  trace_every_run: true\n",
    );
    assert!(matrix.contains("trace_every_run"));
    let lab = Lab::with_matrix(&matrix);
    for n in 1..=5 {
        std::fs::write(lab.repo.join("NOTES"), format!("night {n}\n")).unwrap();
        commit(&lab.repo, &format!("docs: night {n}"));
        let o = lab.night(&format!("night{n}"), &[], &[]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        assert!(lab
            .results
            .join(format!("night{n}/kernels/a.bf16.trace.json"))
            .is_file());
    }
    std::fs::write(
        lab.repo.join("kernels.a.txt"),
        format!("{KERNELS}elementwise_copy_kernel 320\n"),
    )
    .unwrap();
    commit(&lab.repo, "model a: copy the activations");
    let o = lab.night("pr1", &[], &[("GITHUB_BASE_REF", "main")]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let r = lab.report("pr1");
    let f = finding(&r, "model=a");
    assert!(f["bisected"].is_null(), "{f:#}");
    let k = &f["kernels"];
    assert!(
        k["before"]
            .as_str()
            .unwrap()
            .starts_with("last good run night5"),
        "{k:#}"
    );
    assert_eq!(k["after"], "this run");
    assert_eq!(k["kinds"][0]["name"], "copies", "{k:#}");
    assert!((k["kinds"][0]["after_ms"].as_f64().unwrap() - 0.32).abs() < 1e-9);
    assert_eq!(k["kernels"][0]["name"], "elementwise_copy_kernel");
    let md = lab.file("pr1", "summary.md");
    assert!(md.contains("(last good run night5 -> this run)"), "{md}");
    // A kernel's name is text bench did not write: its Markdown specials are escaped
    // (issue 42), so the source says `elementwise\_copy\_kernel` where a reader sees the name.
    assert!(
        md.contains("elementwise\\_copy\\_kernel new 0.32 ms"),
        "{md}"
    );
    // The PR comment, rendered again from the folder, keeps them (triage.json).
    let again = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["report", "post", "--dry-run"])
        .arg(lab.results.join("pr1"))
        .arg("--baselines")
        .arg(&lab.baselines)
        .output()
        .unwrap();
    let body = String::from_utf8_lossy(&again.stdout);
    assert!(
        body.contains("elementwise\\_copy\\_kernel new 0.32 ms"),
        "{body}"
    );
}

#[test]
fn a_setup_that_hangs_is_stopped_when_the_budget_runs_out_and_the_reports_stay() {
    let lab = Lab::new();
    for n in 1..=5 {
        std::fs::write(lab.repo.join("NOTES"), format!("night {n}\n")).unwrap();
        commit(&lab.repo, &format!("docs: night {n}"));
        let o = lab.night(&format!("night{n}"), &[], &[]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    for i in 1..=3 {
        if i == 2 {
            std::fs::write(
                lab.repo.join("kernels.a.txt"),
                format!("{KERNELS}elementwise_copy_kernel 320\n"),
            )
            .unwrap();
        } else {
            std::fs::write(lab.repo.join("NOTES"), format!("change {i}\n")).unwrap();
        }
        commit(&lab.repo, &format!("change {i}"));
    }
    let started = std::time::Instant::now();
    let o = lab.night(
        "night6",
        &["--triage-setup", "sleep 600", "--triage-budget", "3"],
        &[],
    );
    let out = text(&o);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(120),
        "the hung setup held the nightly: {out}"
    );
    assert_eq!(o.status.code(), Some(1), "{out}");
    let r = lab.report("night6");
    let b = &finding(&r, "model=a")["bisected"];
    assert_eq!(b["status"], "out_of_budget", "{b:#}");
    let why = b["evidence"].as_str().unwrap();
    assert!(
        why.contains("the setup at") && why.contains("was stopped after"),
        "{why}"
    );
    assert!(
        b["command"]
            .as_str()
            .unwrap()
            .contains("--setup 'sleep 600'"),
        "{b:#}"
    );
}

/// Runs night6 with `--triage-setup setup`, waits until the setup has created `started`
/// (`what` names it in the failure), sends Ctrl-C to the night's process group, asserts exit
/// 130 and that stdout's last `result:` line says 130; returns that line and all the
/// night printed.
fn interrupt_night6(lab: &Lab, setup: &str, started: &Path, what: &str) -> (String, String) {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};

    let mut cmd = lab.night_command("night6", &["--triage-setup", setup], &[]);
    cmd.stdout(std::process::Stdio::piped()).process_group(0);
    let (mut child, lines) = common::spawn_bench(&mut cmd);
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(600);
    while !started.exists() {
        seen.extend(lines.try_iter());
        assert!(Instant::now() < deadline, "{what} never started: {seen:#?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut stdout = child.stdout.take().unwrap();
    common::ctrl_c_exits_130(&mut child, &lines, &mut seen);
    let mut shown = String::new();
    stdout.read_to_string(&mut shown).unwrap();
    let all = format!("{shown}\n{}", seen.join("\n"));
    let last = shown
        .lines()
        .rev()
        .find(|l| l.starts_with("result:"))
        .unwrap_or_else(|| panic!("no result line: {all}"))
        .to_string();
    assert!(last.starts_with("result: INTERRUPTED (exit 130)"), "{all}");
    (last, all)
}

/// Issue 42: Ctrl-C while a triage setup hangs stops the nightly with 130, and every output
/// says 130: the terminal's last line, summary.txt, report.json, summary.md and JUnit
/// (written before the bisection began, saying exit 1, and written again after it), and
/// `bench report` of the folder later.
#[test]
fn ctrl_c_during_a_triage_setup_gives_130_in_every_output() {
    let lab = Lab::new();
    for n in 1..=5 {
        std::fs::write(lab.repo.join("NOTES"), format!("night {n}\n")).unwrap();
        commit(&lab.repo, &format!("docs: night {n}"));
        let o = lab.night(&format!("night{n}"), &[], &[]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    let base = git(&lab.repo, &["rev-parse", "HEAD"]);
    for i in 1..=3 {
        if i == 2 {
            std::fs::write(
                lab.repo.join("kernels.a.txt"),
                format!("{KERNELS}elementwise_copy_kernel 320\n"),
            )
            .unwrap();
        } else {
            std::fs::write(lab.repo.join("NOTES"), format!("change {i}\n")).unwrap();
        }
        commit(&lab.repo, &format!("change {i}"));
    }
    // The side-by-side pairs set up the last good commit (quickly); the bisection's setup of
    // a commit inside the range says it started, then hangs.
    let started = lab.repo.parent().unwrap().join("setup-started");
    let setup = format!(
        "[ \"$BENCH_BISECT_COMMIT\" = {base} ] || {{ touch '{}'; sleep 600; }}",
        started.display()
    );
    let (last, all) = interrupt_night6(&lab, &setup, &started, "the bisection's setup");
    let last = last.as_str();
    assert!(last.contains("during triage"), "{all}");

    let says_130 = |what: &str| {
        let txt = lab.file("night6", "summary.txt");
        assert_eq!(txt.lines().last(), Some(last), "{what}: summary.txt: {txt}");
        assert!(!txt.contains("FAILED (exit 1)"), "{what}: {txt}");
        let r = lab.report("night6");
        assert_eq!(r["exit_code"], 130, "{what}: report.json: {r:#}");
        assert_eq!(r["interrupted_in"], "triage", "{what}: {r:#}");
        let b = &finding(&r, "model=a")["bisected"];
        assert_eq!(b["status"], "interrupted", "{what}: {b:#}\n{all}");
        let md = lab.file("night6", "summary.md");
        let headline = md.lines().next().unwrap_or_default();
        assert!(headline.contains("(exit 130)"), "{what}: summary.md: {md}");
        assert!(!md.contains("(exit 1)"), "{what}: summary.md: {md}");
        let junit = lab.file("night6", "junit.xml");
        assert!(
            junit.contains("run.interrupted") && junit.contains("exit 130"),
            "{what}: junit.xml: {junit}"
        );
    };
    says_130("the interrupted nightly");
    let results: serde_json::Value =
        serde_json::from_str(&lab.file("night6", "results.json")).unwrap();
    assert_eq!(results["interrupted_in"], "triage", "{results:#}");
    // Rendered again from the folder: the same code, from the process as from the files.
    let again = Command::new(env!("CARGO_BIN_EXE_bench"))
        .arg("report")
        .arg(lab.results.join("night6"))
        .arg("--baselines")
        .arg(&lab.baselines)
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(130), "{}", text(&again));
    says_130("bench report");
}

/// Ctrl-C while the side-by-side confirmation's setup of the last good commit hangs stops
/// the nightly with 130, as it does in the triage's setup: the runner's handler, still
/// installed after the cells, counted the signal where nothing read it, and the night went
/// on through the whole triage to exit 1 (the same with SIGTERM, which CI sends).
#[test]
fn ctrl_c_during_the_pairs_setup_gives_130() {
    let lab = Lab::new();
    for n in 1..=5 {
        std::fs::write(lab.repo.join("NOTES"), format!("night {n}\n")).unwrap();
        commit(&lab.repo, &format!("docs: night {n}"));
        let o = lab.night(&format!("night{n}"), &[], &[]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    let base = git(&lab.repo, &["rev-parse", "HEAD"]);
    std::fs::write(
        lab.repo.join("kernels.a.txt"),
        format!("{KERNELS}elementwise_copy_kernel 320\n"),
    )
    .unwrap();
    commit(&lab.repo, "slow");
    // The pairs' setup of the last good commit says it started, then hangs.
    let started = lab.repo.parent().unwrap().join("pairs-setup-started");
    let setup = format!(
        "[ \"$BENCH_BISECT_COMMIT\" != {base} ] || {{ touch '{}'; sleep 600; }}",
        started.display()
    );
    let (last, _) = interrupt_night6(&lab, &setup, &started, "the pairs' setup");
    let last = last.as_str();
    let r = lab.report("night6");
    assert_eq!(r["exit_code"], 130, "{r:#}");
    let txt = lab.file("night6", "summary.txt");
    assert_eq!(txt.lines().last(), Some(last), "summary.txt: {txt}");
}
