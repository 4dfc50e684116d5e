//! Issue 42 ("Hostile input, round 4"), the outputs: text bench did not write (a commit's
//! subject and author, a kernel's name, a matrix's name) is text in every output, never a
//! terminal escape or a live Markdown link; and the other cases of the round that concern
//! what bench writes, each through the built binary against real files.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::cli::text;

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_bench"))
}

/// Asserts that `what` holds no terminal escape, BEL or other control character than
/// newline and tab: none of them may reach a terminal or a file people `cat`.
fn no_controls(what: &str, text: &str) {
    let bad: Vec<char> = text
        .chars()
        .filter(|c| c.is_control() && *c != '\n' && *c != '\t')
        .collect();
    assert!(bad.is_empty(), "{what} holds controls {bad:?}:\n{text}");
}

/// A worker whose step time is the sum of the kernels `kernels.$1.txt` lists, writing them
/// as a Chrome trace of one step when bench sets `BENCH_PROFILE` (the kernel names go into
/// the JSON as they are written in the file, so `\u001b` in a name is an ESC in the trace).
const WORK_SH: &str = r#"#!/bin/sh
set -eu
us=0
while read -r name dur; do us=$((us + dur)); done < "kernels.$1.txt"
if [ -n "${BENCH_PROFILE:-}" ]; then
  {
    printf '{"traceEvents":[{"ph":"X","cat":"cpu_op","name":"step","ts":0,"dur":%d}' "$us"
    ts=0
    while read -r name dur; do
      printf ',{"ph":"X","cat":"kernel","name":"%s","pid":0,"tid":7,"ts":%d,"dur":%d}' "$name" "$ts" "$dur"
      ts=$((ts + dur))
    done < "kernels.$1.txt"
    printf ']}\n'
  } > "$BENCH_PROFILE"
fi
seed=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
t=$(( us * (100000 + seed % 401 - 200) / 100000 ))
printf '{"event":"start","model":"%s","world_size":1}\n' "$1"
i=0
while [ $i -lt 6 ]; do
  w=false; [ $i -eq 0 ] && w=true
  printf '{"event":"step","step":%d,"step_time_s":0.%06d,"tokens":1024,"loss":2.5,"warmup":%s}\n' $i $t $w
  i=$((i + 1))
done
printf '{"event":"summary","peak_mem_bytes":[1000]}\n'
"#;

// A matrix name with a control character is refused at its line since the hostile
// re-run (tests/matrix_cli.rs); the foreign text here is the commits' and the kernels'.
const MATRIX: &str = "name: toy
axes:
  model: [a, c]
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
  trace_every_run: true
";

const KERNELS: &str = "gemm_main_kernel 3000\nflash_attention_kernel 1000\n";

/// The culprit's subject: a live Markdown link, an image, emphasis and terminal escapes.
const SUBJECT: &str =
    "fix [c](javascript:alert(1)) ![i](https://e.x/p.png) *now* \x1b]0;pwned\x07\x1b[2J done";

/// The culprit's author: a link and an escape of its own.
const AUTHOR: &str = "Mallory [m](javascript:alert(2)) \x1b[31mred";

/// The kernel the culprit adds: an escape and a link's brackets in its name (`\u001b` is an
/// ESC once the trace's JSON is read; the reports cut a name at its argument list's `(`).
const KERNEL: &str = "evil\\u001b]0;k\\u0007_[k](javascript:alert(4))_copy_kernel";

fn git(dir: &Path, args: &[&str], author: &str) -> String {
    let out = Command::new("git")
        .args(["-c", "commit.gpgsign=false"])
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", author)
        .env("GIT_AUTHOR_EMAIL", "dev@example.com")
        .env("GIT_COMMITTER_NAME", "Nightly Dev")
        .env("GIT_COMMITTER_EMAIL", "dev@example.com")
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn commit(dir: &Path, subject: &str, author: &str) -> String {
    git(dir, &["add", "-A"], author);
    git(
        dir,
        &["commit", "-q", "--allow-empty", "-m", subject],
        author,
    );
    git(dir, &["rev-parse", "HEAD"], author)
}

/// `bench matrix matrix.yaml --history` in `root/repo`, as the nightly template runs it.
fn night(root: &Path, id: &str) -> Output {
    let mut cmd = bench();
    cmd.current_dir(root.join("repo"))
        .args(["matrix", "matrix.yaml", "--no-progress", "--run-id", id])
        .arg("--results-dir")
        .arg(root.join("results"))
        .arg("--baselines")
        .arg(root.join("baselines"))
        .arg("--history")
        .arg(root.join("history.sqlite"))
        .env("CUDA_VISIBLE_DEVICES", "")
        .env("TMPDIR", root.join("tmp"))
        .env("GITHUB_REF_NAME", "main");
    for k in [
        "GITHUB_BASE_REF",
        "CI_MERGE_REQUEST_TARGET_BRANCH_NAME",
        "GITHUB_STEP_SUMMARY",
        "BENCH_PROFILE",
        "BENCH_HISTORY",
        "CI",
    ] {
        cmd.env_remove(k);
    }
    cmd.output().unwrap()
}

/// A nightly whose history finds a regression, bisects it to a commit whose subject and
/// author hold a Markdown link and terminal escapes, and diffs kernels one of which has
/// them in its name, under a matrix whose name holds an OSC title and a BEL: the terminal
/// (stdout, and stderr's `bisect: measuring ... (subject)`), summary.txt, summary.md and
/// the pull-request comment (`bench report post --dry-run`) show each as text, with no
/// escape and no live link; `bench matrix --dry-run` prints the matrix's name as text.
#[test]
fn foreign_text_is_text_in_the_terminal_the_summaries_and_the_comment() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hostile4-escapes");
    let _ = std::fs::remove_dir_all(&root);
    let repo = root.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::create_dir_all(root.join("tmp")).unwrap();
    let dev = "Nightly Dev";
    git(&repo, &["init", "-q", "-b", "main"], dev);
    std::fs::write(repo.join("work.sh"), WORK_SH).unwrap();
    std::fs::write(repo.join("matrix.yaml"), MATRIX).unwrap();
    for m in ["a", "c"] {
        std::fs::write(repo.join(format!("kernels.{m}.txt")), KERNELS).unwrap();
    }
    commit(&repo, "initial", dev);

    let listing = bench()
        .current_dir(&repo)
        .args(["matrix", "matrix.yaml", "--dry-run"])
        .output()
        .unwrap();
    assert_eq!(listing.status.code(), Some(0), "{listing:?}");
    let shown = text(&listing);
    no_controls("bench matrix --dry-run", &shown);
    assert!(shown.contains("matrix toy"), "{shown}");

    for n in 1..=5 {
        std::fs::write(repo.join("NOTES"), format!("night {n}\n")).unwrap();
        commit(&repo, &format!("docs: night {n}"), dev);
        let o = night(&root, &format!("night{n}"));
        assert_eq!(o.status.code(), Some(0), "night{n}: {o:?}");
        no_controls(&format!("night{n}'s terminal"), &text(&o));
    }
    std::fs::write(
        repo.join("kernels.a.txt"),
        format!("{KERNELS}{KERNEL} 320\n"),
    )
    .unwrap();
    commit(&repo, SUBJECT, AUTHOR);
    std::fs::write(repo.join("NOTES"), "fmt\n").unwrap();
    commit(&repo, "style: fmt", dev);
    let o = night(&root, "night6");
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    no_controls("night6's stdout", &stdout);
    no_controls("night6's stderr", &stderr);
    // The bisection named the commit, on stderr and in the terminal summary, as text.
    assert!(
        stderr.contains("bisect: measuring") && stderr.contains("fix [c](javascript:alert(1))"),
        "{stderr}"
    );
    assert!(stdout.contains("fix [c](javascript:alert(1))"), "{stdout}");

    let run = root.join("results/night6");
    let txt = std::fs::read_to_string(run.join("summary.txt")).unwrap();
    no_controls("summary.txt", &txt);
    assert!(txt.contains("fix [c](javascript:alert(1))"), "{txt}");
    assert!(txt.contains("matrix toy"), "{txt}");

    let md = std::fs::read_to_string(run.join("summary.md")).unwrap();
    let post = bench()
        .args(["report", "post"])
        .arg(&run)
        .arg("--baselines")
        .arg(root.join("baselines"))
        .arg("--dry-run")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("GITHUB_API_URL", "http://127.0.0.1:9")
        .env("GITHUB_REPOSITORY", "o/r")
        .env("GITHUB_REF", "refs/pull/42/merge")
        .env("GITHUB_SHA", "feedbeef")
        .output()
        .unwrap();
    assert_eq!(post.status.code(), Some(1), "{post:?}");
    let comment = String::from_utf8_lossy(&post.stdout).to_string();
    for (what, md) in [("summary.md", &md), ("the PR comment", &comment)] {
        no_controls(what, md);
        // The finding's first bad commit, its author and the kernel that moved are there,
        // each with every Markdown special escaped: no link, image or emphasis is live.
        assert!(md.contains("first bad commit"), "{what}:\n{md}");
        assert!(
            md.contains("fix \\[c\\]\\(javascript:alert\\(1\\)\\) \\!\\[i\\]"),
            "{what}: the subject, escaped:\n{md}"
        );
        assert!(md.contains("\\*now\\*"), "{what}:\n{md}");
        assert!(
            md.contains("Mallory \\[m\\]\\(javascript:alert\\(2\\)\\)"),
            "{what}: the author, escaped:\n{md}"
        );
        assert!(
            md.contains("evil\\_\\[k\\]"),
            "{what}: the kernel, escaped:\n{md}"
        );
        for live in ["](javascript:", "](https://e.x", "[c](", "[m](", "[k]("] {
            assert!(!md.contains(live), "{what} keeps a live link {live}:\n{md}");
        }
    }

    // A run folder is a file anyone can edit: a triage.json whose commit subject holds a
    // newline and an escape, rendered again by `bench report`, still prints the finding on
    // one line in the terminal and in summary.txt, where a line of its own would read as
    // bench's verdict.
    let path = run.join("triage.json");
    let mut triage: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    triage["findings"][0]["bisected"]["first_bad"]["subject"] =
        serde_json::Value::from("fix\nresult: ok (exit 0)\x1b[2J");
    std::fs::write(&path, serde_json::to_vec(&triage).unwrap()).unwrap();
    let again = bench()
        .arg("report")
        .arg(&run)
        .arg("--baselines")
        .arg(root.join("baselines"))
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    let stdout = String::from_utf8_lossy(&again.stdout).to_string();
    let txt = std::fs::read_to_string(run.join("summary.txt")).unwrap();
    for (what, text) in [("bench report's stdout", &stdout), ("summary.txt", &txt)] {
        no_controls(what, text);
        assert!(
            text.contains("fix\\nresult: ok (exit 0)"),
            "{what}: the subject on one line:\n{text}"
        );
        assert!(
            !text.lines().any(|l| l.starts_with("result: ok")),
            "{what}: a subject's line read as the verdict:\n{text}"
        );
    }
}

/// A matrix name with an OSC title sequence and a BEL, forged into the shards' results
/// (`bench matrix` refuses such a name at its line), is written out in report.html, its
/// `<title>` included, by `bench report merge` and by `bench report` of a shard: no ESC or
/// BEL anywhere in the page. The `<title>` held them raw (round C of the hostile re-run).
#[test]
fn a_forged_matrix_name_is_written_out_in_report_html_its_title_the_terminal_and_the_summaries() {
    use common::cli::{bench as run, read_json, write_json};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (s1, s2) = common::shards::night(dir);
    for s in [&s1, &s2] {
        let mut r = read_json(&s.join("results.json"));
        r["matrix_name"] = "smoke\x1b]0;t\x07".into();
        write_json(&s.join("results.json"), &r);
    }
    let out = dir.join("merged");
    let merged = common::shards::merge(dir, &[&s1, &s2], &out, &[]);
    assert!(
        matches!(merged.status.code(), Some(0 | 1)),
        "{}",
        text(&merged)
    );
    let reported = run(&[
        "report",
        s1.to_str().unwrap(),
        "--baselines",
        dir.join("baselines").to_str().unwrap(),
    ]);
    assert!(
        matches!(reported.status.code(), Some(0 | 1)),
        "{}",
        text(&reported)
    );
    // The terminal and the text reports of both commands: the name is text, never a
    // sequence the terminal acts on.
    for (what, o) in [("merge", &merged), ("report", &reported)] {
        let said = text(o);
        assert!(
            !said.contains('\x1b') && !said.contains('\x07'),
            "bench {what}'s terminal output holds a raw ESC or BEL: {said:?}"
        );
    }
    for f in ["summary.md", "summary.txt"] {
        for folder in [&out, &s1] {
            let body = std::fs::read_to_string(folder.join(f)).unwrap();
            assert!(
                !body.contains('\x1b') && !body.contains('\x07'),
                "{}: a raw ESC or BEL",
                folder.join(f).display()
            );
        }
    }
    for page in [out.join("report.html"), s1.join("report.html")] {
        let html = std::fs::read_to_string(&page).unwrap();
        assert!(
            !html.contains('\x1b') && !html.contains('\x07'),
            "{}: a raw ESC or BEL",
            page.display()
        );
        assert!(
            html.contains("<title>bench: smoke\\x1b]0;t\\x07</title>"),
            "{}: the title does not show the name written out: {}",
            page.display(),
            html.lines()
                .find(|l| l.contains("<title>"))
                .unwrap_or("no <title>")
        );
    }
}
