//! `bench report merge` as a reader of untrusted folders (issue 42, round 4), through the
//! built binary: every shard is checked as results are checked at every other door (one
//! plan, one matrix and build, each cell once and only in the shard that planned it,
//! measurements and durations within their bounds) and refused with exit 2 naming the file
//! and field before anything is written; the output is written fresh; a shard that did not
//! finish and an expected hardware kind that never uploaded fail the run with one exit code
//! that every output states.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use common::cli::{bench, read_json, text, write_json};
use common::shards::{copy_shard, judged_night, merge, night, shard};

/// Exit 2 with `says` in the message, and no output written
/// ([`common::shards::refused`]), nor the merge's staging folder beside the output.
fn refused(o: &Output, out: &Path, says: &[&str]) {
    common::shards::refused(o, out, says);
    let parent = out.parent().unwrap();
    let left: Vec<_> = std::fs::read_dir(parent)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".merging-"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn shards_whose_plans_disagree_are_refused_naming_both_plans() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (s1, s2) = night(dir);
    let other = copy_shard(&s2, dir, "other");
    let mut plan = read_json(&other.join("shard.json"));
    // The history moved a cell to the other shard between the shards' starts.
    let s = plan["cells"][0]["shard"].as_u64().unwrap();
    plan["cells"][0]["shard"] = (3 - s).into();
    write_json(&other.join("shard.json"), &plan);
    let out = dir.join("out");
    let o = merge(dir, &[&s1, &other], &out, &[]);
    refused(
        &o,
        &out,
        &["other/night/shard.json: cells[0]", "different plans"],
    );
    // The same cells in the same shards, one of them planned at other steps: a plan was
    // edited, and it was merged with exit 0 before.
    let edited = copy_shard(&s2, dir, "edited");
    let mut plan = read_json(&edited.join("shard.json"));
    plan["cells"][0]["cell"]["params"]["steps"] = 999.into();
    write_json(&edited.join("shard.json"), &plan);
    let o = merge(dir, &[&s1, &edited], &out, &[]);
    refused(
        &o,
        &out,
        &[
            "edited/night/shard.json: cells[0]",
            "planned with other parameters",
        ],
    );
}

#[test]
fn a_cell_twice_in_a_shard_in_another_shard_or_in_no_plan_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (s1, s2) = night(dir);
    let out = dir.join("out");
    let edit = |name: &str, f: &dyn Fn(&mut Value)| {
        let d = copy_shard(&s1, dir, name);
        let mut r = read_json(&d.join("results.json"));
        f(&mut r);
        write_json(&d.join("results.json"), &r);
        d
    };

    let twice = edit("twice", &|r| {
        let c = r["cells"][0].clone();
        r["cells"].as_array_mut().unwrap().push(c);
    });
    refused(
        &merge(dir, &[&twice, &s2], &out, &[]),
        &out,
        &["twice/night/results.json: cells[3]", "listed twice"],
    );

    // A cell shard 2/2 planned, also in shard 1/2's folder.
    let theirs = read_json(&s2.join("results.json"))["cells"][0].clone();
    let stolen = edit("stolen", &|r| {
        r["cells"].as_array_mut().unwrap().push(theirs.clone())
    });
    refused(
        &merge(dir, &[&stolen, &s2], &out, &[]),
        &out,
        &["stolen/night/results.json: cells[3]", "a cell of shard 2/2"],
    );

    // A cell no plan names (not a cell of the matrix at all).
    let foreign = edit("foreign", &|r| {
        let mut c = r["cells"][0].clone();
        c["id"] = "zzz.1gpu".into();
        r["cells"].as_array_mut().unwrap().push(c);
    });
    refused(
        &merge(dir, &[&foreign, &s2], &out, &[]),
        &out,
        &[
            "foreign/night/results.json: cells[3] (zzz.1gpu)",
            "no shard's plan",
        ],
    );
}

#[test]
fn shards_of_another_matrix_commit_libtorch_or_driver_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (s1, s2) = night(dir);
    let out = dir.join("out");
    for (i, (path, value, field)) in [
        (&["matrix_sha256"][..], "0".repeat(64), "matrix_sha256"),
        (
            &["environment", "git_commit"][..],
            "f".repeat(40),
            "environment.git_commit",
        ),
        (
            &["environment", "libtorch"][..],
            "9.9.9".into(),
            "environment.libtorch",
        ),
        (
            &["environment", "driver"][..],
            "999.1".into(),
            "environment.driver",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let d = copy_shard(&s2, dir, &format!("build{i}"));
        let mut r = read_json(&d.join("results.json"));
        let mut at = &mut r;
        for k in &path[..path.len() - 1] {
            at = &mut at[*k];
        }
        at[path[path.len() - 1]] = value.into();
        write_json(&d.join("results.json"), &r);
        refused(
            &merge(dir, &[&s1, &d], &out, &[]),
            &out,
            &[
                &format!("build{i}/night/results.json: {field} is"),
                "one matrix built from one commit",
            ],
        );
    }
}

#[test]
fn impossible_metrics_in_a_shard_are_refused_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (s1, s2) = night(dir);
    let out = dir.join("out");
    for (name, v) in [("huge", 1e308), ("negative", -5.0)] {
        let d = copy_shard(&s1, dir, name);
        let mut r = read_json(&d.join("results.json"));
        r["cells"][1]["metrics"]["tokens_per_s"]["value"] = v.into();
        write_json(&d.join("results.json"), &r);
        let o = merge(dir, &[&d, &s2], &out, &[]);
        refused(
            &o,
            &out,
            &[
                &format!("{name}/night/results.json: cells[1]"),
                ".metrics.tokens_per_s.value: tokens_per_s is",
            ],
        );
        assert!(!text(&o).contains("improved"), "{}", text(&o));
    }
}

/// A duration no cell takes (1e20 s) is refused with exit 2 naming the file and field by
/// `bench report`, `bench report merge` and `bench history import` alike: it made the
/// first two panic (exit 101) converting it to a time.
#[test]
fn an_impossible_duration_is_refused_by_every_reader_without_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (s1, s2) = night(dir);
    let out = dir.join("out");
    for (name, key, field) in [
        ("cell", None, "cells[0] (a.1gpu).duration_s is 1e20"),
        (
            "attempt",
            Some(0),
            "cells[0] (a.1gpu).attempts[0].duration_s is 1e20",
        ),
    ] {
        let d = copy_shard(&s1, dir, name);
        let mut r = read_json(&d.join("results.json"));
        match key {
            None => r["cells"][0]["duration_s"] = 1e20.into(),
            Some(j) => r["cells"][0]["attempts"][j]["duration_s"] = 1e20.into(),
        }
        write_json(&d.join("results.json"), &r);
        let file = format!("{name}/night/results.json: {field}");
        refused(&merge(dir, &[&d, &s2], &out, &[]), &out, &[&file]);
        let o = bench(&[
            "report",
            d.to_str().unwrap(),
            "--baselines",
            dir.join("baselines").to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains(&file), "{}", text(&o));
        let store = dir.join(format!("{name}.sqlite"));
        let o = bench(&[
            "history",
            "import",
            d.to_str().unwrap(),
            "--history",
            store.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains(&file), "{}", text(&o));
    }
}

/// A store written before imports checked values holds a step time of 1e308: the shards'
/// plans ignore it (their costs stay numbers, never `null`) and the night merges.
#[test]
fn an_impossible_stored_step_time_does_not_break_the_shards_plans() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let store = dir.join("h.sqlite");
    let store_s = store.to_str().unwrap();
    // A night recorded into the store, then damaged as an old store could be.
    shard(dir, "first", "1/2", &["--history", store_s, "--no-confirm"]);
    shard(dir, "first", "2/2", &["--history", store_s, "--no-confirm"]);
    let db = rusqlite::Connection::open(&store).unwrap();
    let n = db
        .execute(
            "UPDATE bench_metrics SET value = 1e308 WHERE metric = 'step_time_s'",
            [],
        )
        .unwrap();
    assert!(n > 0);
    drop(db);
    let s1 = shard(
        dir,
        "second",
        "1/2",
        &["--history", store_s, "--no-confirm"],
    );
    let s2 = shard(
        dir,
        "second",
        "2/2",
        &["--history", store_s, "--no-confirm"],
    );
    for s in [&s1, &s2] {
        let plan = std::fs::read_to_string(s.join("shard.json")).unwrap();
        assert!(!plan.contains("null"), "{plan}");
        let plan: Value = serde_json::from_str(&plan).unwrap();
        for c in plan["cells"].as_array().unwrap() {
            let g = c["expected_gpu_s"].as_f64().unwrap();
            assert!(g.is_finite() && g < 1e6, "{c}");
        }
    }
    let out = dir.join("out");
    let o = merge(dir, &[&s1, &s2], &out, &[]);
    assert_ne!(o.status.code(), Some(2), "{}", text(&o));
    assert!(out.join("results.json").exists());
}

/// A merge with an interrupted shard exits 1, and every output says exit 1 (not the 130
/// an interrupted run returns, nor "ok"): summary.md, summary.txt, report.json, JUnit, the
/// terminal, and `bench report` of the merged folder later.
#[test]
fn an_unfinished_shard_gives_one_exit_code_in_every_output() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (s1, s2) = night(dir);
    // Killed after its last cell, before it finished: every cell is there, and only the
    // missing end time tells. Then killed halfway: a cell is missing too.
    for (name, keep) in [("late", None), ("half", Some(1))] {
        let d = copy_shard(&s2, dir, name);
        let mut r = read_json(&d.join("results.json"));
        r["finished_at"] = Value::Null;
        r["interrupted"] = true.into();
        if let Some(k) = keep {
            r["cells"].as_array_mut().unwrap().truncate(k);
        }
        write_json(&d.join("results.json"), &r);
        let out = dir.join(format!("out-{name}"));
        let o = merge(dir, &[&s1, &d], &out, &[]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        let said = text(&o);
        assert!(said.contains("result: FAILED (exit 1)"), "{said}");
        assert!(said.contains("shard 2/2: interrupted"), "{said}");
        assert!(!said.contains("exit 130"), "{said}");
        let txt = std::fs::read_to_string(out.join("summary.txt")).unwrap();
        assert!(txt.contains("result: FAILED (exit 1)"), "{txt}");
        assert!(
            !txt.contains("exit 130") && !txt.contains("result: ok"),
            "{txt}"
        );
        let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
        assert!(
            md.contains("exit 1") && !md.contains("no regressions"),
            "{md}"
        );
        assert!(!md.contains("exit 130"), "{md}");
        let report = read_json(&out.join("report.json"));
        assert_eq!(report["exit_code"], 1, "{report}");
        assert!(
            report["run_failures"][0]
                .as_str()
                .unwrap()
                .contains("shard 2/2: interrupted"),
            "{report}"
        );
        let junit = std::fs::read_to_string(out.join("junit.xml")).unwrap();
        assert!(
            junit.contains("<failure") && junit.contains("exit 1"),
            "{junit}"
        );
        assert!(!junit.contains("exit 130"), "{junit}");
        // Judged again later, the merged folder keeps its exit code.
        let o = bench(&[
            "report",
            out.to_str().unwrap(),
            "--baselines",
            dir.join("baselines").to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(text(&o).contains("result: FAILED (exit 1)"), "{}", text(&o));
    }
}

/// A reused output folder holds this merge's files alone; a folder of other files, a
/// dangling link as `-o` and a damaged baseline file are refused before anything is written.
#[test]
fn the_output_is_written_fresh_and_checked_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (s1, s2) = night(dir);
    let out = dir.join("out");
    let o = merge(dir, &[&s1, &s2], &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // What an earlier merge of another night (a fleet, a judged run) left there.
    std::fs::write(out.join("history.json"), "{\"run_id\": \"old\"").unwrap();
    std::fs::write(out.join("triage.json"), "[").unwrap();
    std::fs::write(out.join("fleet.json"), "{\"runs\": []}").unwrap();
    std::fs::create_dir_all(out.join("old-kind")).unwrap();
    // ... and listed as its own, as that merge's `.bench-written` would.
    let mut list = std::fs::read_to_string(out.join(".bench-written")).unwrap();
    list.push_str("history.json\ntriage.json\nfleet.json\nold-kind\n");
    std::fs::write(out.join(".bench-written"), list).unwrap();
    let o = merge(dir, &[&s1, &s2], &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    for stale in ["history.json", "triage.json", "fleet.json", "old-kind"] {
        assert!(!out.join(stale).exists(), "{stale} was kept");
    }
    let o = bench(&[
        "report",
        out.to_str().unwrap(),
        "--baselines",
        dir.join("baselines").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // A folder of someone else's files is not replaced.
    let busy = dir.join("busy");
    std::fs::create_dir_all(&busy).unwrap();
    std::fs::write(busy.join("notes.txt"), "mine").unwrap();
    let o = merge(dir, &[&s1, &s2], &busy, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("not an earlier merge's output"),
        "{}",
        text(&o)
    );
    assert_eq!(
        std::fs::read_to_string(busy.join("notes.txt")).unwrap(),
        "mine"
    );
    // Nor is one whose `shards.json` or `fleet.json` no merge wrote (`{}`): it deleted the
    // user's files.
    for (forged, body) in [("shards.json", "{}"), ("fleet.json", "{\"runs\": []}")] {
        let f = dir.join(format!("forged-{forged}"));
        std::fs::create_dir_all(&f).unwrap();
        std::fs::write(f.join(forged), body).unwrap();
        std::fs::write(f.join("thesis.tex"), "mine").unwrap();
        let o = merge(dir, &[&s1, &s2], &f, &[]);
        assert_eq!(o.status.code(), Some(2), "{forged}: {}", text(&o));
        assert_eq!(
            std::fs::read_to_string(f.join("thesis.tex")).unwrap(),
            "mine"
        );
    }

    // A link that leads nowhere.
    let dangling = dir.join("dangling");
    std::os::unix::fs::symlink(dir.join("nowhere"), &dangling).unwrap();
    let o = merge(dir, &[&s1, &s2], &dangling, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("-o ") && text(&o).contains("a symbolic link to "),
        "{}",
        text(&o)
    );
    assert!(!dir.join("nowhere").exists());

    // A damaged baseline file: refused, and neither logs/ nor results.json written.
    let key = read_json(&s1.join("results.json"))["environment"]["hardware_key"]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::create_dir_all(dir.join("baselines")).unwrap();
    std::fs::write(
        dir.join("baselines").join(format!("{key}.yaml")),
        "cells: [damaged",
    )
    .unwrap();
    let fresh = dir.join("fresh");
    let o = merge(dir, &[&s1, &s2], &fresh, &[]);
    refused(&o, &fresh, &[&format!("{key}.yaml")]);
}

/// A link in a shard's `logs/` (to a file, or `logs/` itself a link) is not followed: the
/// merged folder never holds a copy of what it points at.
#[test]
fn links_in_a_shards_logs_are_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (s1, s2) = night(dir);
    let secret = dir.join("secret.txt");
    std::fs::write(&secret, "SECRET-CONTENT").unwrap();
    let logs: Vec<String> = read_json(&s1.join("results.json"))["cells"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["logs"].as_array().unwrap().clone())
        .map(|l| l.as_str().unwrap().to_string())
        .collect();
    assert!(!logs.is_empty());
    let victim = s1.join(&logs[0]);
    std::fs::remove_file(&victim).unwrap();
    std::os::unix::fs::symlink(&secret, &victim).unwrap();
    // And shard 2's whole logs/ a link to a folder holding the secret.
    let elsewhere = dir.join("elsewhere");
    std::fs::rename(s2.join("logs"), &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, s2.join("logs")).unwrap();

    let out = dir.join("out");
    let o = merge(dir, &[&s1, &s2], &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!out.join(&logs[0]).exists(), "the link's target was copied");
    let copied = walk(&out.join("logs"));
    for f in &copied {
        let meta = std::fs::symlink_metadata(f).unwrap();
        assert!(!meta.file_type().is_symlink(), "{}", f.display());
        assert_ne!(std::fs::read_to_string(f).unwrap(), "SECRET-CONTENT");
    }
    // Shard 1's other logs, plain files, are there; none of shard 2's (behind a link).
    assert!(copied.len() >= logs.len() - 1, "{copied:?}");
    assert!(text(&o).contains("not a plain file"), "{}", text(&o));
}

fn walk(d: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(d) else {
        return out;
    };
    for e in rd {
        let p = e.unwrap().path();
        if std::fs::symlink_metadata(&p).unwrap().is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// `--expect-kinds`: a hardware kind no run was given for (its runner never uploaded) is
/// named in the summary, the JUnit, the comment and the terminal, and fails the exit code;
/// a kind whose run has another shard count too. Every kind there: exit 0.
#[test]
fn an_expected_hardware_kind_that_never_uploaded_is_named_and_fails_the_fleet() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (s1, s2) = night(dir);
    let key = read_json(&s1.join("results.json"))["environment"]["hardware_key"]
        .as_str()
        .unwrap()
        .to_string();
    let kind = key.split('-').next().unwrap().to_string();

    let out = dir.join("fleet");
    let expect = format!("{kind}=2,mi300x");
    let o = merge(dir, &[&s1, &s2], &out, &["--expect-kinds", &expect]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("missing: hardware kind mi300x: no run was given"),
        "{}",
        text(&o)
    );
    // Stdout's last verdict is the fleet's, the exit code returned (the run's own summary
    // above it said `result: ok (exit 0)` last), and in JSON stdout is the fleet's report.
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    let last = stdout.lines().rev().find(|l| l.starts_with("result:"));
    assert_eq!(last, Some("result: FAILED (exit 1)"), "{stdout}");
    assert!(
        stdout.contains("expected, never merged: hardware kind mi300x"),
        "{stdout}"
    );
    let o = merge(
        dir,
        &[&s1, &s2],
        &dir.join("fleet-json"),
        &["--expect-kinds", &expect, "--format", "json"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let doc: Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    assert_eq!(doc["exit_code"], 1, "{doc:#}");
    assert_eq!(doc["missing"].as_array().unwrap().len(), 1, "{doc:#}");
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("hardware kind mi300x"), "{summary}");
    assert!(summary.contains("1 missing"), "{summary}");
    let junit = std::fs::read_to_string(out.join("junit.xml")).unwrap();
    assert!(
        junit.contains("fleet.missing.1") && junit.contains("mi300x"),
        "{junit}"
    );
    let report = read_json(&out.join("report.json"));
    assert_eq!(report["exit_code"], 1, "{report}");
    assert_eq!(report["missing"].as_array().unwrap().len(), 1, "{report}");
    let o = bench(&[
        "report",
        "post",
        out.to_str().unwrap(),
        "--dry-run",
        "--baselines",
        dir.join("baselines").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let body = String::from_utf8_lossy(&o.stdout);
    assert!(body.contains("hardware kind mi300x"), "{body}");

    // The wrong shard count for a kind that is there.
    let o = merge(
        dir,
        &[&s1, &s2],
        &out,
        &["--expect-kinds", &format!("{kind}=3")],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("has 2 shards, 3 expected"),
        "{}",
        text(&o)
    );

    // Every kind there, by its whole key: a fleet folder of one run, exit 0.
    let o = merge(
        dir,
        &[&s1, &s2],
        &out,
        &["--expect-kinds", &format!("{key}=2")],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(out.join("fleet.json").exists());
    assert!(read_json(&out.join("report.json"))["missing"]
        .as_array()
        .unwrap()
        .is_empty());

    // The fleet template's case: each kind's merged run folder, whose shard count is the
    // one its merge named; a merged run whose shard never finished still fails the fleet.
    let merged = dir.join("merged");
    let o = merge(dir, &[&s1, &s2], &merged, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = merge(
        dir,
        &[&merged],
        &out,
        &["--expect-kinds", &format!("{kind}=2")],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let late = copy_shard(&s2, dir, "late");
    let mut r = read_json(&late.join("results.json"));
    r["finished_at"] = Value::Null;
    write_json(&late.join("results.json"), &r);
    let o = merge(dir, &[&s1, &late], &merged, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let o = merge(
        dir,
        &[&merged],
        &out,
        &["--expect-kinds", &format!("{kind}=2")],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let fleet = read_json(&out.join("fleet.json"));
    assert_eq!(fleet["runs"][0]["exit_code"], 1, "{fleet}");

    // A kind that is not a hardware key is bad input.
    let o = merge(
        dir,
        &[&s1, &s2],
        &dir.join("x"),
        &["--expect-kinds", "../h100"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = merge(
        dir,
        &[&s1, &s2],
        &dir.join("x"),
        &["--expect-kinds", "h100=0"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

/// Generated shard folders of run `big` holding `per_shard` cells each, each carrying
/// `bulk` bytes in a field no report renders (its attempt's Slurm job id), so that the test
/// times the merge's reading and writing of a large document, not the reports' rendering.
fn big_shards(dir: &Path, template: &Path, per_shard: usize, bulk: usize) -> [PathBuf; 2] {
    const MARK: &str = "@@BULK@@";
    let src = read_json(&template.join("results.json"));
    let plan = read_json(&template.join("shard.json"));
    let bulk = "x".repeat(bulk);
    let mut planned = Vec::new();
    for i in 0..2 * per_shard {
        let mut p = plan["cells"][0].clone();
        p["shard"] = (1 + i % 2).into();
        p["cell"]["id"] = format!("big{i}.1gpu").into();
        planned.push(p);
    }
    [1usize, 2].map(|k| {
        let d = dir.join(format!("big{k}")).join("big");
        std::fs::create_dir_all(&d).unwrap();
        let mut r = src.clone();
        r["run_id"] = "big".into();
        r["dropped"] = Value::Array(Vec::new());
        let cells: Vec<Value> = (k - 1..2 * per_shard)
            .step_by(2)
            .map(|i| {
                let mut c = src["cells"][0].clone();
                c["id"] = format!("big{i}.1gpu").into();
                c["logs"] = Value::Array(Vec::new());
                c["attempts"][0]["slurm_job_id"] = MARK.into();
                c
            })
            .collect();
        r["cells"] = Value::Array(cells);
        let mut p = plan.clone();
        p["run_id"] = "big".into();
        p["shard"] = serde_json::json!({"index": k, "count": 2});
        p["cells"] = Value::Array(planned.clone());
        // The bulk goes in as text: serializing it through serde_json in a debug build
        // takes longer than the merge itself.
        std::fs::write(d.join("results.json"), r.to_string().replace(MARK, &bulk)).unwrap();
        write_json(&d.join("shard.json"), &p);
        d
    })
}

/// What the merge writes, `bench report` reads: a large merged document is written compact
/// (indentation doubled its size past the readers' 256 MiB), and one that would still be
/// larger than readers accept is refused up front, naming the size, with nothing written.
#[test]
fn a_large_merge_writes_what_bench_report_reads_or_is_refused_up_front() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (s1, _) = night(dir);

    // 18 MiB of results: written compact, and read back by `bench report`.
    let [a, b] = big_shards(dir, &s1, 1, 9 << 20);
    let out = dir.join("out");
    let o = merge(dir, &[&a, &b], &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let doc = std::fs::read(out.join("results.json")).unwrap();
    assert!(doc.len() > 18 << 20);
    assert!(!doc[..200].contains(&b'\n'), "not compact");
    let o = bench(&[
        "report",
        out.to_str().unwrap(),
        "--baselines",
        dir.join("baselines").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    std::fs::remove_dir_all(dir.join("big1")).unwrap();
    std::fs::remove_dir_all(dir.join("big2")).unwrap();

    // Two shards of 130 MiB each: each reads, their merge would not.
    let [a, b] = big_shards(dir, &s1, 1, 130 << 20);
    let out = dir.join("too-big");
    let o = merge(dir, &[&a, &b], &out, &[]);
    refused(&o, &out, &["would be 260 MiB", "more than the 256 MiB"]);
}

/// The merged cost is the shards' sum, re-runs included, and each cell's share is its
/// shard's (report.json's `cell_costs` add up to `cost`); a shard's `history.json` with
/// GPU-seconds no run spends is refused naming the file and field. The merge kept only
/// the first shard's re-runs before, and took any figure.
#[test]
fn the_shards_costs_add_up_and_a_forged_one_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (s1, s2) = judged_night(dir);
    let out = dir.join("out");
    let mut shards = Vec::new();
    for (i, (from, gpu_s)) in [(&s1, 2.0), (&s2, 3.0)].into_iter().enumerate() {
        let d = copy_shard(from, dir, &format!("c{i}"));
        let mut h = read_json(&from.join("history.json"));
        let cell = read_json(&from.join("results.json"))["cells"][0]["id"]
            .as_str()
            .unwrap()
            .to_string();
        h["reruns_gpu_s"] = gpu_s.into();
        h["reruns_gpu_s_by_cell"] = serde_json::json!({ cell.clone(): gpu_s });
        write_json(&d.join("history.json"), &h);
        shards.push((d, cell, gpu_s));
    }
    let o = merge(dir, &[&shards[0].0, &shards[1].0], &out, &[]);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
    let r = read_json(&out.join("report.json"));
    assert_eq!(r["cost"]["reruns_gpu_s"].as_f64(), Some(5.0), "{r:#}");
    let cells = r["cell_costs"].as_array().unwrap();
    assert_eq!(cells.len(), 5, "{r:#}");
    for (_, cell, gpu_s) in &shards {
        let c = cells
            .iter()
            .find(|c| c["cell_id"] == cell.as_str())
            .unwrap();
        assert_eq!(c["reruns_gpu_s"].as_f64(), Some(*gpu_s), "{c:#}");
    }
    for part in [
        "measuring_gpu_s",
        "pairs_gpu_s",
        "reruns_gpu_s",
        "triage_gpu_s",
    ] {
        let sum: f64 = cells.iter().map(|c| c[part].as_f64().unwrap()).sum();
        let total = r["cost"][part].as_f64().unwrap();
        assert!(
            (sum - total).abs() <= 1e-9 * total.max(1.0),
            "{part}: {r:#}"
        );
    }
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(
        summary.contains("The cells whose verdict took more than measuring them"),
        "{summary}"
    );

    let forged = &shards[1].0;
    let mut h = read_json(&forged.join("history.json"));
    h["reruns_gpu_s"] = 1e308.into();
    write_json(&forged.join("history.json"), &h);
    let out = dir.join("out2");
    let o = merge(dir, &[&shards[0].0, forged], &out, &[]);
    refused(
        &o,
        &out,
        &["c1/night/history.json", "reruns_gpu_s is 1e308"],
    );
}

/// `bench report merge -o` over an earlier merge replaces only what that merge wrote: a
/// note a person put there, or the `--baselines` it reads from inside it, is refused with
/// exit 2 naming it, and nothing is deleted; both were deleted with exit 0 before.
#[test]
fn a_merge_never_deletes_what_it_did_not_write_or_what_it_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (s1, s2) = night(dir);
    let out = dir.join("merged");
    let o = merge(dir, &[&s1, &s2], &out, &[]);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
    assert!(out.join(".bench-written").is_file());
    // Again over its own output: fine.
    let o = merge(dir, &[&s1, &s2], &out, &[]);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));

    std::fs::write(out.join("notes.txt"), "keep me\n").unwrap();
    let o = merge(dir, &[&s1, &s2], &out, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("it holds notes.txt, which bench report merge did not write"),
        "{}",
        text(&o)
    );
    assert!(out.join("notes.txt").is_file());
    std::fs::remove_file(out.join("notes.txt")).unwrap();

    std::fs::create_dir_all(out.join("bl")).unwrap();
    let o = bench(&[
        "report",
        "merge",
        s1.to_str().unwrap(),
        s2.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--baselines",
        out.join("bl").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--baselines"), "{}", text(&o));
    assert!(text(&o).contains("is inside -o"), "{}", text(&o));
    assert!(out.join("bl").is_dir());
}

/// A `.bench-written` that is a symbolic link is no list and is never followed: a link to
/// a list that names a person's note is refused as an output without a readable list, and
/// the note survives. The rebuild followed such a link and deleted the note with exit 0
/// (round C of the hostile re-run).
#[test]
fn a_written_list_that_is_a_link_is_not_trusted_and_the_note_it_names_survives() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (s1, s2) = night(dir);
    let out = dir.join("merged");
    let o = merge(dir, &[&s1, &s2], &out, &[]);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
    // The list the merge wrote, naming the note too, kept outside and linked in its place.
    let mut list = std::fs::read_to_string(out.join(".bench-written")).unwrap();
    list.push_str("notes.txt\n");
    std::fs::write(dir.join("list"), &list).unwrap();
    std::fs::remove_file(out.join(".bench-written")).unwrap();
    std::os::unix::fs::symlink("../list", out.join(".bench-written")).unwrap();
    std::fs::write(out.join("notes.txt"), "keep me\n").unwrap();

    let o = merge(dir, &[&s1, &s2], &out, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("holds no readable .bench-written"),
        "{}",
        text(&o)
    );
    assert_eq!(
        std::fs::read_to_string(out.join("notes.txt")).unwrap(),
        "keep me\n"
    );
    assert!(out.join(".bench-written").is_symlink());
    assert_eq!(std::fs::read_to_string(dir.join("list")).unwrap(), list);
}

/// A run folder's `history.json` that does not read (a string or `NaN` where a number
/// belongs, a number out of range, a cut document) is refused with exit 2 naming it, line
/// and column, by `bench report` as by `bench report merge`, and no report is written again.
/// `bench report` read such a file as absent: it judged the run against the baselines
/// instead, changed its verdict without a word and rewrote the reports (exit 0), while the
/// merge of the same file refused it.
#[test]
fn a_history_json_that_does_not_read_is_refused_by_report_as_by_merge() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (s1, s2) = judged_night(dir);
    let out = dir.join("merged");
    let o = merge(dir, &[&s1, &s2], &out, &[]);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
    let path = out.join("history.json");
    let original = std::fs::read(&path).unwrap();
    // The document with reruns_gpu_s set to 0.5, as one line, for the text edits below.
    let mut h = read_json(&path);
    h["reruns_gpu_s"] = 0.5.into();
    let doc = h.to_string();
    assert!(doc.contains("\"reruns_gpu_s\":0.5"), "{doc}");
    let report_again = || {
        bench(&[
            "report",
            out.to_str().unwrap(),
            "--baselines",
            dir.join("baselines").to_str().unwrap(),
        ])
    };
    for (name, forged, says) in [
        (
            "string",
            doc.replace("\"reruns_gpu_s\":0.5", "\"reruns_gpu_s\":\"NaN\""),
            "invalid type: string \"NaN\"",
        ),
        (
            "nan",
            doc.replace("\"reruns_gpu_s\":0.5", "\"reruns_gpu_s\":NaN"),
            "expected value",
        ),
        (
            "range",
            doc.replace("\"reruns_gpu_s\":0.5", "\"reruns_gpu_s\":1e999"),
            "number out of range",
        ),
        ("cut", doc[..doc.len() / 2].to_string(), "EOF"),
    ] {
        std::fs::write(&path, &forged).unwrap();
        let before = std::fs::read(out.join("report.json")).unwrap();
        let o = report_again();
        assert_eq!(o.status.code(), Some(2), "{name}: {}", text(&o));
        for s in [&format!("{}: line 1 column", path.display()), says] {
            assert!(text(&o).contains(s), "{name}: {s:?} not in {}", text(&o));
        }
        assert_eq!(
            std::fs::read(out.join("report.json")).unwrap(),
            before,
            "{name}: report.json was written again"
        );

        // The merge refuses the same file in a shard.
        let d = copy_shard(&s1, dir, name);
        std::fs::write(d.join("history.json"), &forged).unwrap();
        let merged = dir.join(format!("out-{name}"));
        refused(
            &merge(dir, &[&d, &s2], &merged, &[]),
            &merged,
            &[&format!("{name}/night/history.json: line 1 column"), says],
        );
    }
    // The file as the merge wrote it reads again.
    std::fs::write(&path, &original).unwrap();
    let o = report_again();
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
}

/// The figures a merged or re-rendered run's cost is summed from are checked like every
/// other figure: re-runs by cell that do not add up to their total, a cell judged twice, a
/// bisection's GPU-seconds no run spends or of a cell not in the run are refused with exit
/// 2 by `bench report merge` and `bench report`, naming the file; they were summed into a
/// cost its cells did not add up to (or 1e308 GPU-s).
#[test]
fn a_forged_cost_in_a_run_folder_is_refused_by_merge_and_report() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (s1, s2) = judged_night(dir);
    /// A case: its name, the edit of the shard's history.json, what the refusal says.
    type Case = (&'static str, Box<dyn Fn(&mut Value)>, &'static str);
    let cases: Vec<Case> = vec![
        (
            "sum",
            Box::new(|h: &mut Value| {
                h["reruns_gpu_s"] = 5.0.into();
                h["reruns_gpu_s_by_cell"] = serde_json::json!({ "x": 100.0 });
            }),
            "reruns_gpu_s_by_cell names x",
        ),
        (
            "twice",
            Box::new(|h: &mut Value| {
                let c = h["cells"][0].clone();
                h["cells"].as_array_mut().unwrap().push(c);
            }),
            "is judged twice",
        ),
    ];
    for (name, edit, says) in cases {
        let d = copy_shard(&s1, dir, name);
        let mut h = read_json(&s1.join("history.json"));
        edit(&mut h);
        write_json(&d.join("history.json"), &h);
        let out = dir.join(format!("out-{name}"));
        let o = merge(dir, &[&d, &s2], &out, &[]);
        refused(&o, &out, &[says]);
    }
    // A merged folder edited afterwards: `bench report` refuses it too.
    let out = dir.join("merged");
    let o = merge(dir, &[&s1, &s2], &out, &[]);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
    let mut h = read_json(&out.join("history.json"));
    h["reruns_gpu_s"] = 1e308.into();
    write_json(&out.join("history.json"), &h);
    let o = bench(&[
        "report",
        out.to_str().unwrap(),
        "--baselines",
        dir.join("baselines").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("reruns_gpu_s is 1e308"), "{}", text(&o));
}
