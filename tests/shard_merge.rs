//! A sharded run end to end through the built binary, with the deterministic command
//! workload of tests/gate_e2e.rs (tests/fixtures/fake_worker.sh reports fixed step times):
//! shards 1/2 and 2/2 of one run id run at once against one history (a SQLite file, and a
//! real PostgreSQL server with `BENCH_PG_TESTS=1`, as a fleet's runners share one), `bench
//! report merge` joins their folders, and the merged folder holds the same cells with the same
//! verdicts as one unsharded run of the same matrix, with one finding for a slowdown whose
//! cells ran on both shards. A shard left out of the merge, and a shard killed halfway, are
//! named in the merged summary and fail the exit code.

use std::path::Path;
use std::process::{Command, Output};

fn bench_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bench"));
    c.args(args)
        .env("CUDA_VISIBLE_DEVICES", "")
        .env_remove("GITHUB_STEP_SUMMARY");
    c
}

fn bench(args: &[&str]) -> Output {
    bench_cmd(args).output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Five cells of equal nominal cost (a command workload of no known model).
fn matrix(dir: &Path, name: &str, step_time: &str) -> String {
    let worker = std::fs::canonicalize("tests/fixtures/fake_worker.sh").unwrap();
    let text = format!(
        "name: shards\naxes:\n  model: [a, b, c, d, e]\n  gpus: [1]\ndefaults:\n  steps: 5\n  warmup: 1\n  repeats: 1\n  timeout: 60s\n  tolerance: 0.1\n  extra: {{step_time: \"{step_time}\"}}\n  workload:\n    kind: command\n    argv: [sh, \"{}\", paced, \"{{step_time}}\"]\n",
        worker.display()
    );
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

/// `bench matrix` arguments of one run into `results` (relative to `dir`).
fn run_args(dir: &Path, matrix: &str, results: &str, id: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "matrix",
        matrix,
        "--results-dir",
        dir.join(results).to_str().unwrap(),
        "--run-id",
        id,
        "--baselines",
        dir.join("baselines").to_str().unwrap(),
        "--no-progress",
        "--gpus",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn report(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap()
}

/// Each cell's id and status, sorted by id.
fn verdicts(r: &serde_json::Value) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = r["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_string(),
                c["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

/// The PostgreSQL server of `BENCH_PG_URL` when `BENCH_PG_TESTS=1`; CI sets both (a run
/// with `CI` set and no server fails rather than skip).
fn pg_url() -> Option<String> {
    if std::env::var("BENCH_PG_TESTS").is_ok_and(|v| v == "1") {
        return Some(std::env::var("BENCH_PG_URL").expect("BENCH_PG_TESTS=1 needs BENCH_PG_URL"));
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must run the PostgreSQL shard test (BENCH_PG_TESTS=1, scripts/postgres-ci-setup.sh)"
    );
    eprintln!("BENCH_PG_TESTS is not 1: the PostgreSQL shard test is not run");
    None
}

/// A fresh schema `name` of the test database, as a store URL whose tables live there.
fn pg_store(url: &str, name: &str) -> String {
    let mut admin = postgres::Client::connect(url, postgres::NoTls)
        .unwrap_or_else(|e| panic!("BENCH_PG_TESTS=1 but {url} does not answer: {e}"));
    admin
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name};"
        ))
        .unwrap();
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-c%20search_path%3D{name}")
}

#[test]
fn shards_run_at_once_and_merge_into_the_unsharded_runs_cells_and_verdicts() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("fleet.sqlite");
    sharded_run(tmp.path(), store.to_str().unwrap());
}

#[test]
fn shards_sharing_one_postgresql_store_merge_into_the_unsharded_run() {
    let Some(url) = pg_url() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    sharded_run(tmp.path(), &pg_store(&url, "t_shard_merge"));
}

/// Two shards of one run at once against the history `store_s`, merged, against one
/// unsharded run (judged against a SQLite history of its own); then a shard left out and a
/// shard killed halfway.
fn sharded_run(dir: &Path, store_s: &str) {
    let store_s = store_s.to_string();
    let fast = matrix(dir, "fast.yaml", "0.5");
    let slow = matrix(dir, "slow.yaml", "0.6");

    // Baselines from a first run at 0.5 s a step; the runs below are 20% slower.
    let first = bench(&strs(&run_args(dir, &fast, "results", "base", &[])));
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    let update = bench(&[
        "baseline",
        "update",
        dir.join("results/base").to_str().unwrap(),
        "--baselines",
        dir.join("baselines").to_str().unwrap(),
    ]);
    assert_eq!(update.status.code(), Some(0), "{}", text(&update));

    // The unsharded run, judged against a history of its own.
    let whole_store = dir.join("whole.sqlite");
    let whole_history = ["--history", whole_store.to_str().unwrap(), "--no-confirm"];
    let whole = bench(&strs(&run_args(
        dir,
        &slow,
        "results",
        "whole",
        &whole_history,
    )));
    assert_eq!(whole.status.code(), Some(1), "{}", text(&whole));

    // Two shards at once, one run id, one store.
    let shard = |n: &str, results: &str| {
        bench_cmd(&strs(&run_args(
            dir,
            &slow,
            results,
            "nightly",
            &["--history", &store_s, "--no-confirm", "--shard", n],
        )))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
    };
    let (one, two) = (shard("1/2", "s1"), shard("2/2", "s2"));
    let (one, two) = (
        one.wait_with_output().unwrap(),
        two.wait_with_output().unwrap(),
    );
    assert_eq!(one.status.code(), Some(1), "{}", text(&one));
    assert_eq!(two.status.code(), Some(1), "{}", text(&two));
    // Equal costs go round the shards: a, c, e and b, d.
    assert!(
        text(&one).contains("shard 1/2: 3 of 5 cells"),
        "{}",
        text(&one)
    );
    assert!(
        text(&two).contains("shard 2/2: 2 of 5 cells"),
        "{}",
        text(&two)
    );
    let s1 = dir.join("s1/nightly");
    let s2 = dir.join("s2/nightly");
    // Each folder holds its own cells; the other shard's are dropped like a filter's
    // (not "missing" from the baseline).
    let ran = |d: &Path| {
        verdicts(&report(d))
            .into_iter()
            .filter(|(_, s)| s != "dropped")
            .count()
    };
    assert_eq!((ran(&s1), ran(&s2)), (3, 2));
    assert!(verdicts(&report(&s1)).iter().all(|(_, s)| s != "missing"));

    // Both shards' cells are in the shared store under the one run id: the second
    // shard's end-of-run write kept the first one's cells.
    let hw = report(&s1)["hardware_key"].as_str().unwrap().to_string();
    let mut history = bench::history::open(&store_s).unwrap();
    for (id, _) in verdicts(&report(&dir.join("results/whole"))) {
        let trend = history.trend(&id, &hw, "step_time_s").unwrap();
        assert!(
            trend.iter().any(|p| p.run_id == "nightly"),
            "{id} not recorded: {trend:?}"
        );
    }
    // What the run's verdict cost: each shard recorded its share under the one run id, and
    // the store holds their sum, each part as the shards' report.json state it.
    let kept = history.costs().unwrap().remove("nightly").unwrap();
    let cost = kept.total;
    let share = |d: &Path, part: &str| report(d)["cost"][part].as_f64().unwrap();
    for (part, stored) in [
        ("measuring_gpu_s", cost.measuring_gpu_s),
        ("pairs_gpu_s", cost.pairs_gpu_s),
        ("reruns_gpu_s", cost.reruns_gpu_s),
        ("triage_gpu_s", cost.triage_gpu_s),
    ] {
        let sum = share(&s1, part) + share(&s2, part);
        assert!(
            (stored - sum).abs() < 1e-9,
            "{part}: stored {stored}, shards {sum}"
        );
    }
    assert!(cost.measuring_gpu_s > 0.0, "{cost:?}");
    drop(history);

    let merged = dir.join("merged");
    let out = bench(&[
        "report",
        "merge",
        s1.to_str().unwrap(),
        s2.to_str().unwrap(),
        "-o",
        merged.to_str().unwrap(),
        "--baselines",
        dir.join("baselines").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    for f in [
        "results.json",
        "junit.xml",
        "summary.md",
        "report.json",
        "report.html",
        "history.json",
    ] {
        assert!(merged.join(f).exists(), "missing {f}");
    }
    let whole_report = report(&dir.join("results/whole"));
    let merged_report = report(&merged);
    assert_eq!(verdicts(&merged_report), verdicts(&whole_report));
    assert!(verdicts(&merged_report)
        .iter()
        .all(|(_, s)| s == "regression"));
    assert_eq!(merged_report["exit_code"], whole_report["exit_code"]);
    // The merge opens no store: the shards' recorded cost is not counted again, and the
    // merged report states the same measuring as the store's sum.
    let mut history = bench::history::open(&store_s).unwrap();
    assert_eq!(history.costs().unwrap()["nightly"].total, cost);
    drop(history);
    let merged_measuring = merged_report["cost"]["measuring_gpu_s"].as_f64().unwrap();
    assert!(
        (merged_measuring - cost.measuring_gpu_s).abs() < 1e-9,
        "merged {merged_measuring}, stored {}",
        cost.measuring_gpu_s
    );
    // One cause, one finding, although its cells ran on two shards.
    assert_eq!(
        merged_report["findings"].as_array().unwrap().len(),
        whole_report["findings"].as_array().unwrap().len(),
        "{merged_report}"
    );
    assert_eq!(merged_report["findings"].as_array().unwrap().len(), 1);
    let summary = std::fs::read_to_string(merged.join("summary.md")).unwrap();
    assert!(summary.contains("2 of 2 shards finished"), "{summary}");
    let junit = std::fs::read_to_string(merged.join("junit.xml")).unwrap();
    assert_eq!(junit.matches("<testcase").count(), 5, "{junit}");

    // A shard left out is named, and its cells are failed cells that name it.
    let partial = dir.join("partial");
    let out = bench(&[
        "report",
        "merge",
        s1.to_str().unwrap(),
        "-o",
        partial.to_str().unwrap(),
        "--baselines",
        dir.join("baselines").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("shard 2/2: missing"), "{}", text(&out));
    let summary = std::fs::read_to_string(partial.join("summary.md")).unwrap();
    assert!(summary.contains("shard 2/2: missing"), "{summary}");
    let r = report(&partial);
    assert_eq!(verdicts(&r).len(), 5);
    let failed: Vec<_> = verdicts(&r)
        .into_iter()
        .filter(|(_, s)| s == "failed")
        .collect();
    assert_eq!(failed.len(), 2, "{r}");
    assert!(r.to_string().contains("not run: shard 2/2 missing"), "{r}");

    // A shard killed after its first cell: results.json holds what it finished (written
    // after every cell) and no end time, as SIGKILL leaves it.
    let killed = dir.join("killed/nightly");
    std::fs::create_dir_all(&killed).unwrap();
    std::fs::copy(s2.join("shard.json"), killed.join("shard.json")).unwrap();
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(s2.join("results.json")).unwrap()).unwrap();
    doc["cells"].as_array_mut().unwrap().truncate(1);
    doc["finished_at"] = serde_json::Value::Null;
    std::fs::write(killed.join("results.json"), doc.to_string()).unwrap();
    let out_dir = dir.join("with-killed");
    let out = bench(&[
        "report",
        "merge",
        s1.to_str().unwrap(),
        killed.to_str().unwrap(),
        "-o",
        out_dir.to_str().unwrap(),
        "--baselines",
        dir.join("baselines").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let summary = std::fs::read_to_string(out_dir.join("summary.md")).unwrap();
    assert!(
        summary.contains("shard 2/2: interrupted, 1 of 2 planned cells"),
        "{summary}"
    );
    assert!(
        report(&out_dir)
            .to_string()
            .contains("not run: shard 2/2 interrupted"),
        "{}",
        report(&out_dir)
    );
}

#[test]
fn a_bad_shard_is_bad_input() {
    for (flags, says) in [
        (&["--run-id", "r", "--shard", "0/2"][..], "between 1 and 2"),
        (&["--run-id", "r", "--shard", "3/2"][..], "between 1 and 2"),
        (&["--run-id", "r", "--shard", "1/0"][..], "at least 1"),
        (&["--run-id", "r", "--shard", "x"][..], "expected I/N"),
        (&["--shard", "1/2"][..], "--run-id"),
    ] {
        let mut a = vec![
            "matrix",
            "matrix/smoke.yaml",
            "--gpus",
            "0",
            "--no-progress",
        ];
        a.extend_from_slice(flags);
        let o = bench(&a);
        assert_eq!(o.status.code(), Some(2), "{flags:?}: {}", text(&o));
        assert!(text(&o).contains(says), "{flags:?}: {}", text(&o));
    }
    // A folder that is not a shard's is bad input for the merge too.
    let tmp = tempfile::tempdir().unwrap();
    let o = bench(&[
        "report",
        "merge",
        tmp.path().to_str().unwrap(),
        "-o",
        tmp.path().join("out").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("shard.json"), "{}", text(&o));
}

/// `bench matrix` of `matrix` as run id `id` into `results`, on a host whose `nvidia-smi`
/// (tests/fixtures/fake_nvidia_smi.sh, on PATH) reports one H100: the run's hardware key is
/// then the H100's, as on a fleet's GPU pool.
fn on_h100(dir: &Path, matrix: &str, results: &str, id: &str) -> Output {
    let bin = dir.join("bin");
    if !bin.exists() {
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(
            std::fs::canonicalize("tests/fixtures/fake_nvidia_smi.sh").unwrap(),
            bin.join("nvidia-smi"),
        )
        .unwrap();
        std::fs::create_dir_all(dir.join("smi")).unwrap();
        std::fs::write(
            dir.join("smi/gpu"),
            "0, GPU-fake-0000, 1755, 1980, 300.00, 700.00, 62, 100, 0x0000000000000000\n",
        )
        .unwrap();
    }
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut a = run_args(dir, matrix, results, id, &[]);
    // The stand-in's GPU is the cell's.
    let gpus = a.iter().position(|s| s == "--gpus").unwrap();
    a.drain(gpus..gpus + 2);
    bench_cmd(&strs(&a))
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env("PATH", path)
        .env("FAKE_SMI", dir.join("smi"))
        .output()
        .unwrap()
}

/// A fleet's night: the CPU pool's run in two shards and the H100 pool's run whole, merged
/// in one command into one fleet folder. Each run is judged against its own hardware key's
/// baselines (the CPU run regressed, the H100 run did not), and the fleet has one summary,
/// one JUnit with a suite per run, one report.json, one report.html, one PR comment and
/// the worst run's exit code.
#[test]
fn runs_of_two_hardware_kinds_merge_into_one_fleet_each_judged_against_its_own_key() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let fast = matrix(dir, "fast.yaml", "0.5");
    let slow = matrix(dir, "slow.yaml", "0.6");
    let baselines = dir.join("baselines");
    let update = |run: &str| {
        let o = bench(&[
            "baseline",
            "update",
            dir.join(run).to_str().unwrap(),
            "--baselines",
            baselines.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    };
    // Baselines of both keys at 0.5 s a step.
    let o = bench(&strs(&run_args(dir, &fast, "results", "base-cpu", &[])));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    update("results/base-cpu");
    let o = on_h100(dir, &fast, "results", "base-h100");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    update("results/base-h100");
    let cpu_key = report(&dir.join("results/base-cpu"))["hardware_key"]
        .as_str()
        .unwrap()
        .to_string();
    let gpu_key = report(&dir.join("results/base-h100"))["hardware_key"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(gpu_key, "h100-sxm-80gb");
    assert_ne!(cpu_key, gpu_key);

    // The night: the CPU pool 20% slower in two shards, the H100 pool unchanged and whole.
    for n in ["1/2", "2/2"] {
        let o = bench(&strs(&run_args(
            dir,
            &slow,
            &format!("s{}", &n[..1]),
            "night-cpu",
            &["--shard", n],
        )));
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    }
    let o = on_h100(dir, &fast, "h", "night-h100");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    let out = dir.join("fleet");
    let o = bench(&[
        "report",
        "merge",
        dir.join("s1/night-cpu").to_str().unwrap(),
        dir.join("h/night-h100").to_str().unwrap(),
        dir.join("s2/night-cpu").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--baselines",
        baselines.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));

    // Each run in its own folder, judged against its own key.
    let cpu = report(&out.join(&cpu_key));
    assert_eq!(cpu["hardware_key"], cpu_key.as_str());
    assert!(
        verdicts(&cpu).iter().all(|(_, s)| s == "regression"),
        "{cpu}"
    );
    assert_eq!(verdicts(&cpu).len(), 5);
    let gpu = report(&out.join(&gpu_key));
    assert_eq!(gpu["hardware_key"], "h100-sxm-80gb");
    assert!(
        verdicts(&gpu).iter().all(|(_, s)| s == "unchanged"),
        "{gpu}"
    );
    assert_eq!(gpu["exit_code"], 0);

    // One of each for the fleet.
    let fleet: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(fleet["fleet"], true);
    assert_eq!(fleet["exit_code"], 1);
    let runs = fleet["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{fleet}");
    // In the order the command line first named each run.
    assert_eq!(runs[0]["hardware_key"], cpu_key.as_str());
    assert_eq!(runs[0]["exit_code"], 1);
    assert_eq!(runs[1]["hardware_key"], "h100-sxm-80gb");
    assert_eq!(runs[1]["exit_code"], 0);
    assert_eq!(runs[0]["report"]["findings"].as_array().unwrap().len(), 1);
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(
        summary.contains("2 hardware kinds, 1 of 2 runs failed"),
        "{summary}"
    );
    assert!(summary.contains("shard 2/2: finished"), "{summary}");
    assert!(summary.contains("`h100-sxm-80gb`"), "{summary}");
    let junit = std::fs::read_to_string(out.join("junit.xml")).unwrap();
    assert_eq!(junit.matches("<testsuite ").count(), 2, "{junit}");
    assert_eq!(junit.matches("<testcase").count(), 10, "{junit}");
    assert!(junit.contains("shards on h100-sxm-80gb"), "{junit}");
    assert_eq!(junit.matches("<failure").count(), 5, "{junit}");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("h100-sxm-80gb/report.html"), "{html}");
    assert!(out.join(&gpu_key).join("report.html").exists());

    // One PR comment for the fleet.
    let o = bench(&[
        "report",
        "post",
        out.to_str().unwrap(),
        "--dry-run",
        "--baselines",
        baselines.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let body = String::from_utf8_lossy(&o.stdout);
    assert!(
        body.starts_with("### bench fleet: 2 hardware kinds"),
        "{body}"
    );
    assert!(body.contains(&format!("`{cpu_key}`")), "{body}");
    assert!(body.contains("5 regressions"), "{body}");

    // `bench report` of the fleet folder says what it is.
    let o = bench(&["report", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("the folder of a fleet"), "{}", text(&o));

    if let Some(chromium) = std::env::var_os("BENCH_CHROMIUM") {
        let o = Command::new("node")
            .arg("tests/browser/check-fleet.mjs")
            .arg(&out)
            .env("BENCH_CHROMIUM", chromium)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
    } else {
        assert!(
            std::env::var_os("CI").is_none(),
            "BENCH_CHROMIUM must name Debian's chromium when CI is set"
        );
    }
}

/// What a hostile or careless merge meets: refused with exit 2 and the file or field named,
/// before anything is written, or, for a run that never started, named as failed cells.
#[test]
fn a_careless_or_hostile_merge_is_refused_or_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let fast = matrix(dir, "fast.yaml", "0.5");
    for n in ["1/2", "2/2"] {
        let o = bench(&strs(&run_args(
            dir,
            &fast,
            &format!("s{}", &n[..1]),
            "night",
            &["--shard", n],
        )));
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    let (s1, s2) = (dir.join("s1/night"), dir.join("s2/night"));
    let merge = |inputs: &[&Path], out: &Path| {
        let mut a: Vec<String> = vec!["report".into(), "merge".into()];
        a.extend(inputs.iter().map(|p| p.display().to_string()));
        a.extend([
            "-o".into(),
            out.display().to_string(),
            "--baselines".into(),
            dir.join("baselines").display().to_string(),
        ]);
        bench(&strs(&a))
    };
    let refused = |o: &Output, says: &str| {
        assert_eq!(o.status.code(), Some(2), "{}", text(o));
        assert!(text(o).contains(says), "{says:?} not in {}", text(o));
    };

    // The output is one of the inputs (or holds one): refused, the shard's logs intact.
    let log = std::fs::read_dir(s1.join("logs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "log"))
        .expect("a cell's log in the shard's folder");
    let before = std::fs::read(&log).unwrap();
    assert!(!before.is_empty());
    refused(
        &merge(&[&s1, &s2], &s1),
        "one folder or one holds the other",
    );
    refused(
        &merge(&[&s1, &s2], dir),
        "one folder or one holds the other",
    );
    assert_eq!(
        std::fs::read(&log).unwrap(),
        before,
        "{} changed",
        log.display()
    );
    // An output that is a file.
    std::fs::write(dir.join("a-file"), "x").unwrap();
    refused(&merge(&[&s1, &s2], &dir.join("a-file")), "not a folder");

    // A damaged plan: a cell in shard 0, a count beyond the limit.
    let edit = |name: &str, f: &dyn Fn(&mut serde_json::Value)| {
        let d = dir.join(name).join("night");
        std::fs::create_dir_all(&d).unwrap();
        for file in ["results.json", "shard.json"] {
            std::fs::copy(s2.join(file), d.join(file)).unwrap();
        }
        let mut plan: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.join("shard.json")).unwrap()).unwrap();
        f(&mut plan);
        std::fs::write(d.join("shard.json"), plan.to_string()).unwrap();
        d
    };
    let zero = edit("zero", &|p| p["cells"][0]["shard"] = 0.into());
    refused(&merge(&[&s1, &zero], &dir.join("o")), "cells[0].shard 0");
    let huge = edit("huge", &|p| p["shard"]["count"] = 4_000_000_000u64.into());
    refused(&merge(&[&huge], &dir.join("o")), "shard.count 4000000000");
    // A history.json that does not read is not skipped in silence.
    let hist = edit("hist", &|_| {});
    std::fs::write(
        hist.join("history.json"),
        "{\"run_id\":\"night\",\"cells\":[",
    )
    .unwrap();
    refused(
        &merge(&[&s1, &hist], &dir.join("o")),
        "history.json: line 1",
    );
    // Shards of one run measured on two hardware kinds.
    let other = edit("other", &|_| {});
    let mut r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(other.join("results.json")).unwrap())
            .unwrap();
    r["environment"]["hardware_key"] = "h100-sxm-80gb".into();
    std::fs::write(other.join("results.json"), r.to_string()).unwrap();
    refused(
        &merge(&[&s1, &other], &dir.join("o")),
        "must run on one hardware kind",
    );
    assert!(!dir.join("o").exists(), "a refused merge wrote its output");
    // A shard count beyond the limit is refused when the run starts.
    let o = bench(&strs(&run_args(
        dir,
        &fast,
        "sx",
        "sx",
        &["--shard", "1/100000000"],
    )));
    refused(&o, "at most 4096 shards");

    // A run of the fleet none of whose shards wrote results: its cells are failed cells
    // naming their shards, and the fleet is written with exit 1.
    let dead = dir.join("dead");
    std::fs::create_dir_all(&dead).unwrap();
    let mut plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(s1.join("shard.json")).unwrap()).unwrap();
    plan["run_id"] = "dead".into();
    plan["hardware_key"] = "mi300x-192gb".into();
    std::fs::write(dead.join("shard.json"), plan.to_string()).unwrap();
    let fleet = dir.join("fleet");
    let o = merge(&[&s1, &s2, &dead], &fleet);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fleet.join("fleet.json")).unwrap()).unwrap();
    assert_eq!(index["runs"][1]["hardware_key"], "mi300x-192gb", "{index}");
    assert_eq!(index["runs"][1]["exit_code"], 1, "{index}");
    let dead_report = report(&fleet.join("mi300x-192gb"));
    assert!(
        verdicts(&dead_report).iter().all(|(_, s)| s == "failed"),
        "{dead_report}"
    );
    assert!(
        dead_report
            .to_string()
            .contains("not run: shard 1/2 no results"),
        "{dead_report}"
    );
    // Merging one run into the same folder afterwards leaves no fleet behind.
    let o = merge(&[&s1, &s2], &fleet);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!fleet.join("fleet.json").exists());
    let o = bench(&[
        "report",
        "post",
        fleet.to_str().unwrap(),
        "--dry-run",
        "--baselines",
        dir.join("baselines").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("bench fleet"));
}
