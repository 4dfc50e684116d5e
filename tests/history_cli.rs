//! The history end to end through the built binary, with the deterministic command
//! workload (tests/fixtures/fake_worker.sh): nights recorded with `bench matrix --history`,
//! a slower night found suspect, re-run by `--confirm` and failed with the run and commit
//! it started at; `bench history CELL` shows the trend and its change point; `bench
//! baseline accept` starts a new segment; `bench history import` back-fills; bad input
//! exits 2.

use std::path::Path;
use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(args)
        .env("CUDA_VISIBLE_DEVICES", "")
        .env_remove("GITHUB_STEP_SUMMARY")
        .env_remove("BENCH_HISTORY")
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

fn matrix(dir: &Path, name: &str, step_time: &str) -> String {
    let worker = std::fs::canonicalize("tests/fixtures/fake_worker.sh").unwrap();
    let text = format!(
        "name: hist\naxes:\n  model: [small]\n  gpus: [1]\ndefaults:\n  steps: 5\n  warmup: 1\n  repeats: 2\n  timeout: 60s\n  extra: {{step_time: \"{step_time}\"}}\n  workload:\n    kind: command\n    argv: [sh, \"{}\", paced, \"{{step_time}}\"]\n",
        worker.display()
    );
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

fn night(dir: &Path, matrix: &str, id: &str, history: &str, extra: &[&str]) -> Output {
    let results = dir.join("results");
    let baselines = dir.join("baselines");
    let mut args = vec![
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
        "--history",
        history,
    ];
    args.extend(extra);
    bench(&args)
}

#[test]
fn a_slower_night_is_confirmed_named_and_accepted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let db = dir.join("h.sqlite");
    let db = db.to_str().unwrap();
    let same = matrix(dir, "same.yaml", "0.5");
    let slower = matrix(dir, "slower.yaml", "0.55");
    for i in 0..8 {
        let o = night(dir, &same, &format!("n{i:02}"), db, &[]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    let run_dir = dir.join("results/n07");
    assert!(run_dir.join("history.json").exists());
    // No GPU here: the telemetry is recorded as absent.
    assert_eq!(
        std::fs::read_to_string(run_dir.join("telemetry.json"))
            .unwrap()
            .trim(),
        "null"
    );

    let o = night(dir, &slower, "n08", db, &["--confirm"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("re-running 1 cell(s) to confirm: small.1gpu"),
        "{out}"
    );
    // The history's verdict is the run's: in summary.md, not in a file of its own.
    assert!(!dir.join("results/n08/history.md").exists());
    let md = std::fs::read_to_string(dir.join("results/n08/summary.md")).unwrap();
    assert!(md.contains("`small.1gpu`: `regressed -9.1%"), "{md}");
    assert!(md.contains("around the median of its last 8 runs"), "{md}");
    // The eight nights are identical (the paced worker): a zero spread is said as such,
    // never as an infinite distance (issue 42: "-23.1% (-inf sigma; band +-1.0%").
    assert!(
        md.contains("(no spread in the history; band +-1.0%") && !md.contains("inf sigma"),
        "{md}"
    );
    assert!(md.contains("since run n08"), "{md}");
    assert!(md.contains("last good run n07"), "{md}");
    assert!(dir.join("results/n08-confirm/results.json").exists());

    // The next slow night is confirmed again: the night before breached too, but three
    // repeats against three can never say "same level", so it is re-run (issue 31: a
    // confirmation is never borrowed).
    let o = night(dir, &slower, "n09", db, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));

    let o = bench(&["history", "small.1gpu", "--history", db]);
    let trend = text(&o);
    assert_eq!(o.status.code(), Some(0), "{trend}");
    assert!(trend.contains("small.1gpu on cpu-"), "{trend}");
    assert!(trend.contains("▇") || trend.contains("█"), "{trend}");
    assert!(trend.contains("-9.1%"), "{trend}");

    let o = bench(&[
        "baseline",
        "accept",
        "small.1gpu",
        "--reason",
        "slower on purpose",
        "--history",
        db,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("from run n09 ("), "{}", text(&o));
    // The new segment has one run: its repeats alone cannot tell (2 against 2, and 6
    // against 2 after the re-run), so the cell is unknown, which does not fail the job.
    let o = night(dir, &slower, "n10", db, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let md = std::fs::read_to_string(dir.join("results/n10/summary.md")).unwrap();
    assert!(md.contains("1 unknown"), "{md}");

    // Back-fill a second store from the run folders.
    let db2 = dir.join("h2.sqlite");
    let o = bench(&[
        "history",
        "import",
        dir.join("results/n00").to_str().unwrap(),
        dir.join("results/n08").to_str().unwrap(),
        "--history",
        db2.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("imported n08 (1 cells"), "{}", text(&o));
}

#[test]
fn bad_input_exits_2_with_the_place_named() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("h.sqlite");
    let db = db.to_str().unwrap();
    let o = bench(&[
        "history",
        "import",
        tmp.path().join("nope").to_str().unwrap(),
        "--history",
        db,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("nope"), "{}", text(&o));
    // Every run folder is checked before the store is opened: a refused import creates
    // nothing (issue 34). A real run creates the store the next commands read.
    assert!(!tmp.path().join("h.sqlite").exists());
    let run = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/runs/cpu-ok");
    let o = bench(&["history", "import", run, "--history", db]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = bench(&["history", "no.such.cell", "--history", db]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("no.such.cell"), "{}", text(&o));
    let o = bench(&["baseline", "accept", "x", "--reason", " ", "--history", db]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = bench(&[
        "history",
        "x",
        "--history",
        "postgres://nobody@127.0.0.1:1/none",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("postgres://nobody@127.0.0.1:1/none"),
        "{}",
        text(&o)
    );
    let o = bench(&["matrix", "matrix/smoke.yaml", "--confirm", "--dry-run"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    // A study's run folder given twice (issue 42) would count its runs twice: refused,
    // naming both; so is one run copied into a second folder.
    let o = bench(&["history", "study", run, run]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("given twice"), "{}", text(&o));
    let copy = tmp.path().join("copy");
    std::fs::create_dir_all(&copy).unwrap();
    std::fs::copy(
        std::path::Path::new(run).join("results.json"),
        copy.join("results.json"),
    )
    .unwrap();
    let o = bench(&["history", "study", run, copy.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("each run counts once"), "{}", text(&o));
    // A cell id carrying a terminal title sequence is named without it (issue 42).
    let o = bench(&["history", "a\u{1b}]0;pwn\u{7}b", "--history", db]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        !text(&o).contains('\u{1b}') && !text(&o).contains('\u{7}'),
        "{:?}",
        text(&o)
    );
}

/// `BENCH_HOST` names the host in the history where a pool's machines share one hostname
/// (lent VMs all called `vm`): two runners' nights at the same hostname are two hosts in
/// `bench history CELL`, and a name no host can have is refused before anything runs.
#[test]
fn bench_host_tells_the_runners_of_one_hostname_apart() {
    let dir = tempfile::tempdir().unwrap();
    let m = matrix(dir.path(), "m.yaml", "0.01");
    let history = dir.path().join("h.sqlite");
    let history = history.to_str().unwrap();
    let on = |host: &str, id: &str| {
        let results = dir.path().join("results");
        let o = Command::new(env!("CARGO_BIN_EXE_bench"))
            .args(["matrix", &m, "--results-dir"])
            .arg(&results)
            .args([
                "--run-id",
                id,
                "--no-progress",
                "--gpus",
                "0",
                "--history",
                history,
            ])
            .env("CUDA_VISIBLE_DEVICES", "")
            .env_remove("GITHUB_STEP_SUMMARY")
            .env("BENCH_HOST", host)
            .output()
            .unwrap();
        (o, results.join(id))
    };
    for (host, id) in [("runner-a", "n1"), ("runner-a", "n2"), ("runner-b", "n3")] {
        let (o, run) = on(host, id);
        assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
        let results = std::fs::read_to_string(run.join("results.json")).unwrap();
        assert!(
            results.contains(&format!("\"host\": \"{host}\"")),
            "{results}"
        );
    }
    let o = bench(&["history", "small.1gpu", "--history", history]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let shown = text(&o);
    let hosts = shown
        .lines()
        .find(|l| l.trim_start().starts_with("hosts: "))
        .unwrap_or_else(|| panic!("no hosts line: {shown}"));
    assert!(
        hosts.contains("runner-a 2 runs") && hosts.contains("runner-b 1 run"),
        "{hosts}"
    );

    for bad in ["", "a b", "tab\there", "esc\u{1b}]0;x\u{7}"] {
        let (o, run) = on(bad, "bad");
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", text(&o));
        let said = text(&o);
        assert!(said.contains("BENCH_HOST"), "{said}");
        assert!(!said.contains('\u{1b}'), "{said:?}");
        assert!(!run.exists(), "nothing ran for {bad:?}");
    }
}
