//! `bench bisect` end to end through the built binary, in generated git repositories: a
//! matrix with one command-workload cell whose script (in the repository) prints worker
//! events with the step time the commit's `speed.txt` holds, with +-0.2% jitter per run.
//! One commit of the range makes it 3% slower; the bisection must name exactly that commit
//! within ceil(log2(N)) + 2 measured commits, resume after Ctrl-C without measuring the
//! recorded commits again, say when good and bad are the same, and refuse bad input with
//! exit 2. The script appends the commit's index to `$BISECT_COUNT` on every run, which is
//! how the tests count measurements.

mod common;

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The workload: 6 steps (1 warm-up) of `speed.txt` microseconds, one jitter per run.
const WORK_SH: &str = r#"#!/bin/sh
set -eu
us=$(cat speed.txt)
[ -n "${BISECT_COUNT:-}" ] && cat index.txt >> "$BISECT_COUNT"
[ -n "${BISECT_SLEEP:-}" ] && sleep "$BISECT_SLEEP"
seed=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
t=$(( us * (100000 + seed % 401 - 200) / 100000 ))
printf '{"event":"start","model":"toy","world_size":1}\n'
i=0
while [ $i -lt 6 ]; do
  w=false; [ $i -eq 0 ] && w=true
  printf '{"event":"step","step":%d,"step_time_s":0.%06d,"tokens":1024,"loss":2.5,"warmup":%s}\n' $i $t $w
  i=$((i + 1))
done
printf '{"event":"summary","peak_mem_bytes":[1000]}\n'
"#;

const MATRIX: &str = "name: bisect-toy
axes:
  model: [toy]
defaults:
  steps: 6
  warmup: 1
  repeats: 5
  timeout: 60s
  retries: 0
  workload:
    kind: command
    argv: [sh, work.sh]
";

/// Step time of the good commits and of the slow ones (3% longer), in microseconds.
const FAST_US: u32 = 4000;
const SLOW_US: u32 = 4120;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "commit.gpgsign=false"])
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "Bisect Test")
        .env("GIT_AUTHOR_EMAIL", "bisect@example.com")
        .env("GIT_COMMITTER_NAME", "Bisect Test")
        .env("GIT_COMMITTER_EMAIL", "bisect@example.com")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A repository whose commit 0 ("initial") is good, followed by commits 1..=n ("commit
/// i", each writing its index to index.txt); commit `slow_at` makes the step 3% slower
/// (never, when it is past n). Returns the commits' shas, index order.
fn make_repo(dir: &Path, n: usize, slow_at: usize) -> Vec<String> {
    make_repo_with(dir, n, slow_at, MATRIX)
}

/// [`make_repo`] with another matrix file.
fn make_repo_with(dir: &Path, n: usize, slow_at: usize, matrix: &str) -> Vec<String> {
    git(dir, &["init", "-q", "-b", "main"]);
    std::fs::write(dir.join("work.sh"), WORK_SH).unwrap();
    std::fs::write(dir.join("matrix.yaml"), matrix).unwrap();
    std::fs::write(dir.join("speed.txt"), format!("{FAST_US}\n")).unwrap();
    std::fs::write(dir.join("index.txt"), "0\n").unwrap();
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "initial"]);
    let mut shas = vec![git(dir, &["rev-parse", "HEAD"])];
    for i in 1..=n {
        std::fs::write(dir.join("index.txt"), format!("{i}\n")).unwrap();
        if i == slow_at {
            std::fs::write(dir.join("speed.txt"), format!("{SLOW_US}\n")).unwrap();
        }
        git(dir, &["commit", "-q", "-a", "-m", &format!("commit {i}")]);
        shas.push(git(dir, &["rev-parse", "HEAD"]));
    }
    shas
}

/// The temporary folder the bisection's worktree goes in: `tmp` beside the repository, so
/// a test can see that it is removed.
fn tmpdir(repo: &Path) -> PathBuf {
    let dir = repo.parent().unwrap().join("tmp");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `bench bisect toy --good <good> --bad <bad> --matrix matrix.yaml` in `repo`, recording
/// into `history`, counting runs into `count`.
fn bisect(repo: &Path, history: &Path, count: &Path, good: &str, bad: &str) -> Command {
    bisect_cell("toy", repo, history, count, good, bad)
}

/// [`bisect`] of another cell.
fn bisect_cell(
    cell: &str,
    repo: &Path,
    history: &Path,
    count: &Path,
    good: &str,
    bad: &str,
) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bench"));
    cmd.current_dir(repo)
        .env("TMPDIR", tmpdir(repo))
        .args(["bisect", cell, "--good", good, "--bad", bad])
        .args(["--matrix", "matrix.yaml", "--history"])
        .arg(history)
        .env("BISECT_COUNT", count)
        .env("CUDA_VISIBLE_DEVICES", "")
        .env_remove("BENCH_HISTORY")
        .env_remove("BENCH_BUILD_CACHE")
        .env_remove("BISECT_SLEEP");
    cmd
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(o)))
}

/// Runs of the workload per commit index, from the count file.
fn runs(count: &Path) -> BTreeMap<usize, usize> {
    let mut m = BTreeMap::new();
    for line in std::fs::read_to_string(count).unwrap_or_default().lines() {
        *m.entry(line.trim().parse().unwrap()).or_insert(0) += 1;
    }
    m
}

/// The index of a commit named by its subject ("initial" or "commit i").
fn index(commit: &serde_json::Value) -> usize {
    let s = commit["subject"].as_str().unwrap();
    s.strip_prefix("commit ").map_or(0, |i| i.parse().unwrap())
}

/// The repository has no worktree left and no file the bisection wrote in its tree, and the
/// worktree's temporary folder is gone.
fn assert_clean(repo: &Path, stderr: &str) {
    let list = git(repo, &["worktree", "list", "--porcelain"]);
    let trees: Vec<&str> = list
        .lines()
        .filter(|l| l.starts_with("worktree "))
        .collect();
    assert_eq!(trees.len(), 1, "{list}");
    assert_eq!(git(repo, &["status", "--porcelain"]), "", "{stderr}");
    let left: Vec<_> = std::fs::read_dir(tmpdir(repo))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}: {stderr}");
}

fn ceil_log2(n: usize) -> usize {
    (usize::BITS - (n - 1).leading_zeros()) as usize
}

#[test]
fn finds_the_commit_that_slowed_the_cell_within_the_probe_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    let n = 16;
    let shas = make_repo(&repo, n, 9);
    let count = tmp.path().join("count");
    let setups = tmp.path().join("setups");
    let history = tmp.path().join("h.sqlite");
    let started = Instant::now();
    let o = bisect(&repo, &history, &count, &shas[0], "HEAD")
        .args(["--format", "json", "--setup"])
        .arg(format!(
            "echo \"$BENCH_BISECT_COMMIT $(cat index.txt)\" >> {}",
            setups.display()
        ))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let d = json(&o);
    assert_eq!(d["outcome"], "found", "{d:#}");
    assert_eq!(d["first_bad"]["sha"], shas[9].as_str(), "{d:#}");
    assert_eq!(d["first_bad"]["subject"], "commit 9");
    assert_eq!(d["first_bad"]["author"], "Bisect Test <bisect@example.com>");
    assert_eq!(d["last_good"]["sha"], shas[8].as_str());
    assert_eq!(d["commits"], n);
    let bound = ceil_log2(n) + 2;
    assert_eq!(d["max_probes"], bound);
    let probes = d["probes"].as_array().unwrap();
    assert!(probes.len() <= bound, "{} probes: {d:#}", probes.len());
    assert_eq!(probes[0]["role"], "good");
    assert_eq!(probes[1]["role"], "bad");
    // The evidence: about 3% slower than good, its interval excluding zero.
    let shift = d["evidence"]["shift_rel"].as_f64().unwrap();
    assert!((-0.035..-0.025).contains(&shift), "{shift}");
    assert!(d["evidence"]["ci_rel"][1].as_f64().unwrap() < 0.0);
    assert_eq!(d["evidence"]["answer"], "different");
    // Each measured commit was measured by one round of the cell's 5 repeats, after its
    // setup ran once in the worktree at that commit.
    let measured: BTreeMap<usize, usize> =
        probes.iter().map(|p| (index(&p["commit"]), 5)).collect();
    assert_eq!(runs(&count), measured);
    let setup_lines = std::fs::read_to_string(&setups).unwrap();
    assert_eq!(setup_lines.lines().count(), probes.len(), "{setup_lines}");
    for line in setup_lines.lines() {
        let (sha, i) = line.split_once(' ').unwrap();
        assert_eq!(sha, shas[i.parse::<usize>().unwrap()], "{setup_lines}");
    }
    for p in probes {
        assert_eq!(p["reused_rounds"], 0);
        assert_eq!(p["samples"].as_array().unwrap().len(), 5);
    }
    assert_clean(&repo, &String::from_utf8_lossy(&o.stderr));
    // Every probe's run is in the history, under the branch `bisect`.
    let h = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["history", "toy", "--history"])
        .arg(&history)
        .output()
        .unwrap();
    let trend = text(&h);
    assert_eq!(trend.matches(" bisect ").count(), probes.len(), "{trend}");
    eprintln!(
        "bisected {n} commits in {:.1} s with {} probes",
        started.elapsed().as_secs_f64(),
        probes.len()
    );
}

#[test]
fn an_interrupted_bisection_resumes_from_the_recorded_probes() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    let n = 12;
    let shas = make_repo(&repo, n, 9);
    let count = tmp.path().join("count");
    let history = tmp.path().join("h.sqlite");
    let good = shas[0].clone();

    // Slow runs, so that Ctrl-C after the first probe lands while the second is measured.
    let mut cmd = bisect(&repo, &history, &count, &good, "HEAD");
    cmd.env("BISECT_SLEEP", "0.2").process_group(0);
    let (mut child, lines) = common::spawn_bench(&mut cmd);
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !seen
        .iter()
        .any(|l: &String| l.starts_with("bisect: probe 1/"))
    {
        assert!(Instant::now() < deadline, "no probe decided: {seen:#?}");
        if let Ok(l) = lines.recv_timeout(Duration::from_secs(1)) {
            seen.push(l);
        }
    }
    common::ctrl_c_exits_130(&mut child, &lines, &mut seen);
    assert!(
        seen.iter()
            .any(|l| l.contains("run the same command again")),
        "{seen:#?}"
    );
    assert_clean(&repo, &seen.join("\n"));
    let first = runs(&count);
    std::fs::remove_file(&count).unwrap();

    // The same command again: good, bad and the first probe come from the history.
    let o = bisect(&repo, &history, &count, &good, "HEAD")
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let d = json(&o);
    assert_eq!(d["first_bad"]["sha"], shas[9].as_str(), "{d:#}");
    let probes = d["probes"].as_array().unwrap();
    assert!(probes.len() <= ceil_log2(n) + 2, "{d:#}");
    let second = runs(&count);
    let reused: Vec<usize> = probes
        .iter()
        .filter(|p| p["reused_rounds"].as_u64().unwrap() > 0)
        .map(|p| index(&p["commit"]))
        .collect();
    assert!(
        reused.len() >= 3,
        "good, bad and probe 1 are recorded: {d:#}"
    );
    for p in probes {
        let i = index(&p["commit"]);
        if p["reused_rounds"] == p["rounds"] {
            // Decided from the history alone: not run again.
            assert_eq!(second.get(&i), None, "commit {i}: {second:?} {d:#}");
            assert_eq!(first.get(&i), Some(&5), "commit {i}: {first:?}");
        } else {
            assert_eq!(second.get(&i), Some(&5), "commit {i}: {second:?} {d:#}");
        }
    }

    // Once more, in human form: everything is in the history, nothing runs.
    std::fs::remove_file(&count).unwrap();
    let o = bisect(&repo, &history, &count, &good, "HEAD")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.starts_with(&format!("first bad commit: {}\n", shas[9])),
        "{out}"
    );
    assert!(out.contains("  subject: commit 9\n"), "{out}");
    assert!(out.contains("tokens_per_s: "), "{out}");
    assert!(out.contains("% interval "), "{out}");
    assert!(!count.exists(), "{:?}", runs(&count));
}

/// A built-in cell runs `<worker-exe> worker ...`: with `--worker-exe`, the program the
/// setup built in the commit's worktree (here the workload script copied as `fakebench`,
/// which ignores the worker's arguments), so a change in bench's own workload is found.
#[test]
fn a_builtin_cell_runs_the_build_of_each_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    let matrix = "name: builtin\naxes:\n  model: [gpt2-tiny]\ndefaults: {steps: 6, warmup: 1, repeats: 5, timeout: 60s, retries: 0}\n";
    let shas = make_repo_with(&repo, 3, 2, matrix);
    let count = tmp.path().join("count");
    let history = tmp.path().join("h.sqlite");
    // The setup notes each commit it builds.
    let built = tmp.path().join("built");
    let setup = format!(
        "cp work.sh fakebench && chmod +x fakebench && echo $BENCH_BISECT_COMMIT >> {}",
        built.display()
    );
    let bisect = |history: &Path, cache: Option<&str>| {
        let mut cmd = bisect_cell("gpt2-tiny", &repo, history, &count, "HEAD~3", "HEAD");
        cmd.args(["--format", "json", "--worker-exe", "fakebench", "--setup"])
            .arg(&setup);
        if let Some(c) = cache {
            cmd.env("BENCH_BUILD_CACHE", c);
        }
        cmd.output().unwrap()
    };
    let builds = || {
        let b = std::fs::read_to_string(&built).unwrap_or_default();
        b.lines().map(str::to_string).collect::<Vec<_>>()
    };
    let o = bisect(&history, None);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let d = json(&o);
    assert_eq!(d["first_bad"]["sha"], shas[2].as_str(), "{d:#}");
    let probes = d["probes"].as_array().unwrap().len();
    assert_eq!(runs(&count).values().sum::<usize>(), 5 * probes);
    assert_clean(&repo, &text(&o));
    let first = builds();
    assert_eq!(
        first.len(),
        probes,
        "one build per probed commit: {first:?}"
    );

    // A later job (a new history, so every commit is measured again) runs the builds the
    // first one kept in the repository's git directory: no setup runs, the same answer.
    let o = bisect(&tmp.path().join("h2.sqlite"), None);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let d = json(&o);
    assert_eq!(d["first_bad"]["sha"], shas[2].as_str());
    let probes2 = d["probes"].as_array().unwrap().len();
    assert_eq!(builds(), first, "{}", text(&o));
    assert!(
        text(&o).contains("is built already: its kept build"),
        "{}",
        text(&o)
    );
    assert_eq!(runs(&count).values().sum::<usize>(), 5 * (probes + probes2));
    let kept = std::fs::read_dir(repo.join(".git/bench-builds"))
        .unwrap()
        .count();
    assert_eq!(kept, probes);
    assert_clean(&repo, &text(&o));

    // With the cache off, each commit is built again.
    let o = bisect(&tmp.path().join("h3.sqlite"), Some("off"));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let probes3 = json(&o)["probes"].as_array().unwrap().len();
    assert_eq!(builds().len(), probes + probes3, "{}", text(&o));
}

#[test]
fn good_and_bad_that_measure_the_same_end_the_bisection() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    make_repo(&repo, 3, 99);
    let count = tmp.path().join("count");
    let o = bisect(
        &repo,
        &tmp.path().join("h.sqlite"),
        &count,
        "HEAD~3",
        "HEAD",
    )
    .args(["--format", "json"])
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let d = json(&o);
    assert_eq!(d["outcome"], "same", "{d:#}");
    assert!(d["first_bad"].is_null());
    let msg = d["message"].as_str().unwrap();
    assert!(msg.starts_with("good and bad are the same"), "{msg}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("good and bad are the same"));
    assert_eq!(d["probes"].as_array().unwrap().len(), 2);
    assert_eq!(d["probes"][1]["vs_good"]["answer"], "same");
    assert_eq!(runs(&count).keys().copied().collect::<Vec<_>>(), [0, 3]);
    assert_clean(&repo, &text(&o));
}

#[test]
fn a_failing_setup_stops_the_bisection_at_its_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    make_repo(&repo, 3, 2);
    let count = tmp.path().join("count");
    let o = bisect(
        &repo,
        &tmp.path().join("h.sqlite"),
        &count,
        "HEAD~3",
        "HEAD",
    )
    .args(["--setup", "echo building; exit 3"])
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    // One line naming the log, which holds the setup's output.
    let line = out
        .lines()
        .find(|l| l.contains("the setup command failed at commit"))
        .unwrap_or_else(|| panic!("{out}"));
    let log = line.rsplit("log: ").next().unwrap().trim();
    let logged = std::fs::read_to_string(log).unwrap_or_else(|e| panic!("{log}: {e}\n{out}"));
    assert!(logged.contains("building"), "{logged}");
    assert!(!count.exists());
    assert_clean(&repo, &text(&o));
}

/// Issue 42: a setup that deletes its worktree's `.git` ends the bisection with the reason
/// (exit 1) at the next checkout, not as an internal failure of bench (exit 3).
#[test]
fn a_setup_that_removes_the_worktrees_git_stops_the_bisection_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    make_repo(&repo, 4, 2);
    let count = tmp.path().join("count");
    let o = bisect(
        &repo,
        &tmp.path().join("h.sqlite"),
        &count,
        "HEAD~4",
        "HEAD",
    )
    .args(["--setup", "rm -rf .git"])
    .output()
    .unwrap();
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("cannot check out commit") && out.contains("after a setup ran there"),
        "{out}"
    );
    assert!(!out.contains("internal"), "{out}");
}

#[test]
fn bad_input_exits_2_with_a_clear_message() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    let shas = make_repo(&repo, 3, 2);
    let plain = tmp.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let history = tmp.path().join("h.sqlite");
    let count = tmp.path().join("count");
    let cases: Vec<(PathBuf, Vec<&str>, String)> = vec![
        (
            plain.clone(),
            vec!["toy", "--good", "HEAD~1", "--bad", "HEAD"],
            "not in a git repository".into(),
        ),
        (
            repo.clone(),
            vec!["toy", "--good", "nope", "--bad", "HEAD"],
            "--good nope: not a commit of the repository".into(),
        ),
        (
            repo.clone(),
            vec!["toy", "--good", "HEAD~1", "--bad", "v9"],
            "--bad v9: not a commit of the repository".into(),
        ),
        (
            repo.clone(),
            vec!["toy", "--good", "HEAD", "--bad", "HEAD~2"],
            format!(
                "--good HEAD ({}) is not an ancestor of --bad HEAD~2 ({})",
                &shas[3][..10],
                &shas[1][..10]
            ),
        ),
        (
            repo.clone(),
            vec!["toy", "--good", "HEAD", "--bad", "main"],
            "--good and --bad are both commit".into(),
        ),
        (
            repo.clone(),
            vec!["gpt2", "--good", "HEAD~3", "--bad", "HEAD"],
            format!(
                "matrix.yaml at the --good commit {} has no cell gpt2 (cells: toy)",
                &shas[0][..10]
            ),
        ),
    ];
    for (dir, args, says) in cases {
        let o = Command::new(env!("CARGO_BIN_EXE_bench"))
            .current_dir(&dir)
            .env("TMPDIR", tmpdir(&repo))
            .arg("bisect")
            .args(&args)
            .args(["--matrix", "matrix.yaml", "--history"])
            .arg(&history)
            .env("BISECT_COUNT", &count)
            .env_remove("BENCH_HISTORY")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(&says), "{args:?}: want {says:?} in {err}");
    }
    // A matrix that is not in the tree, or not inside the repository.
    for (matrix, says) in [
        ("nope.yaml", "nope.yaml at the --good commit"),
        (
            "../matrix.yaml",
            "give the matrix file's path inside the repository",
        ),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_bench"))
            .current_dir(&repo)
            .env("TMPDIR", tmpdir(&repo))
            .args([
                "bisect", "toy", "--good", "HEAD~3", "--bad", "HEAD", "--matrix", matrix,
            ])
            .arg("--history")
            .arg(&history)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains(says), "{}", text(&o));
    }
    // None of them measured anything, opened the history or left a worktree.
    assert!(!count.exists());
    assert!(!history.exists());
    assert_clean(&repo, "");
}
