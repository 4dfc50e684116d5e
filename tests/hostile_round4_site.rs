//! Issue 42, hostile round 4, at `bench site`'s door: the output is written fresh (no page
//! of a cell or run the store no longer holds survives a rebuild), a folder bench did not
//! write is never replaced, `-o` naming a dangling link or a file is bad input (exit 2, not
//! exit 3's "File exists"), and one 50 MB text in the store cannot make a 100 MB page.
//!
//! And the same at every other door that writes: each command's folder (or file) to write
//! is checked before any work, `bench report merge` writes nothing when a baseline file is
//! damaged, and one 50 MB text in a run folder makes no 50 MB report.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use bench::site::synthetic::{generate, Spec};
use common::cli::{bench_in as bench, text};

fn site(dir: &Path, store: &Path, out: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bench"))
        .current_dir(dir)
        .args(["site", "--history"])
        .arg(store)
        .args(["-o", out])
        .env_remove("BENCH_HISTORY")
        .output()
        .unwrap()
}

fn store(dir: &Path, name: &str, cells: usize, runs: usize) -> std::path::PathBuf {
    let p = dir.join(name);
    generate(
        p.to_str().unwrap(),
        &Spec {
            cells,
            runs,
            keys: 1,
            hostile: false,
        },
    )
    .unwrap();
    p
}

fn pages(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

fn size(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        total += if m.is_dir() { size(&e.path()) } else { m.len() };
    }
    total
}

#[test]
fn a_rebuilt_site_holds_only_the_pages_of_the_store_it_was_built_from() {
    let tmp = tempfile::tempdir().unwrap();
    let big = store(tmp.path(), "big.sqlite", 12, 10);
    let small = store(tmp.path(), "small.sqlite", 4, 6);
    let o = site(tmp.path(), &big, "site");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = tmp.path().join("site");
    assert_eq!(pages(&out.join("cells")), 12);
    assert_eq!(pages(&out.join("runs")), 10);
    // The pages of the cells and runs the smaller store does not have go: the site is
    // replaced (a page put there by hand is refused instead, by name: see below).
    let o = site(tmp.path(), &small, "site");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(pages(&out.join("cells")), 4, "stale cell pages stay");
    assert_eq!(pages(&out.join("runs")), 6, "stale run pages stay");
    assert!(out.join(".bench-site").is_file());
    // Nothing of the swap is left beside it.
    let beside: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".bench-site"))
        .collect();
    assert!(beside.is_empty(), "{beside:?}");
    // Through a link to the site, the link stays and the site it names is rebuilt.
    std::os::unix::fs::symlink(&out, tmp.path().join("published")).unwrap();
    let o = site(tmp.path(), &big, "published");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(std::fs::symlink_metadata(tmp.path().join("published"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(pages(&out.join("cells")), 12);
}

#[test]
fn an_output_that_is_not_a_site_folder_is_refused_and_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let db = store(tmp.path(), "h.sqlite", 4, 6);
    // A folder of the user's own files: the site would replace them.
    std::fs::create_dir(tmp.path().join("docs")).unwrap();
    std::fs::write(tmp.path().join("docs/notes.md"), "mine").unwrap();
    let o = site(tmp.path(), &db, "docs");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("-o docs: a folder holding files bench site did not write"),
        "{}",
        text(&o)
    );
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("docs/notes.md")).unwrap(),
        "mine"
    );
    assert_eq!(pages(&tmp.path().join("docs")), 1);
    // An empty marker bench site did not write is no site either.
    std::fs::write(tmp.path().join("docs/.bench-site"), "").unwrap();
    let o = site(tmp.path(), &db, "docs");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("docs/notes.md")).unwrap(),
        "mine"
    );
    // A dangling link: exit 2 naming it (it was exit 3, "File exists").
    std::os::unix::fs::symlink(tmp.path().join("gone"), tmp.path().join("dangling")).unwrap();
    let o = site(tmp.path(), &db, "dangling");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("-o dangling: a symbolic link to ")
            && text(&o).contains("does not exist"),
        "{}",
        text(&o)
    );
    // A file.
    std::fs::write(tmp.path().join("file"), "x").unwrap();
    let o = site(tmp.path(), &db, "file");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("-o file: not a folder"), "{}", text(&o));
    // An empty folder is taken.
    std::fs::create_dir(tmp.path().join("empty")).unwrap();
    let o = site(tmp.path(), &db, "empty");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn a_50_mb_text_in_the_store_makes_no_50_mb_page() {
    let tmp = tempfile::tempdir().unwrap();
    let db = store(tmp.path(), "h.sqlite", 4, 6);
    let o = site(tmp.path(), &db, "clean");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let clean = size(&tmp.path().join("clean"));
    // A host name, a matrix name and an accepted shift's reason of 50 MB each, as a store
    // shared with another tool may hold.
    let c = rusqlite::Connection::open(&db).unwrap();
    let huge = "x".repeat(50 << 20);
    c.execute("UPDATE bench_runs SET host = ?1, matrix_name = ?1", [&huge])
        .unwrap();
    c.execute("UPDATE bench_segments SET reason = ?1", [&huge])
        .unwrap();
    drop(c);
    let o = site(tmp.path(), &db, "hostile");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let hostile = size(&tmp.path().join("hostile"));
    assert!(
        hostile < clean + 2_000_000,
        "the site grew from {clean} to {hostile} bytes"
    );
    let runs = std::fs::read_to_string(tmp.path().join("hostile/assets/runs.js")).unwrap();
    assert!(runs.contains("more characters)"), "the cut says so");
}

/// A commit subject of 50 MB in the triage the history keeps (`bench_triage`: the
/// bisection's last good and first bad commits), as a store shared with another tool, or a
/// commit message pasted whole, may hold: the site shows it cut, and grows by no 50 MB.
#[test]
fn a_50_mb_commit_subject_in_the_kept_triage_makes_no_50_mb_page() {
    let tmp = tempfile::tempdir().unwrap();
    let db = store(tmp.path(), "h.sqlite", 40, 8);
    let o = site(tmp.path(), &db, "clean");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let clean = size(&tmp.path().join("clean"));
    let c = rusqlite::Connection::open(&db).unwrap();
    let kept: String = c
        .query_row("SELECT group_concat(findings) FROM bench_triage", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert!(
        kept.contains("\"subject\""),
        "the generated store keeps a bisection with its commits' subjects: {kept}"
    );
    let huge = format!("fix: {}", "y".repeat(50 << 20));
    c.execute(
        "UPDATE bench_triage SET findings = replace(findings, 'docs: night notes', ?1)",
        [&huge],
    )
    .unwrap();
    // The subject is in the store: the kept triage grew by the 50 MB.
    let grown: i64 = c
        .query_row("SELECT sum(length(findings)) FROM bench_triage", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert!(
        grown > 50 << 20,
        "the subject was not replaced: {grown} bytes"
    );
    drop(c);
    let o = site(tmp.path(), &db, "hostile");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let hostile = size(&tmp.path().join("hostile"));
    assert!(
        hostile < clean + 2_000_000,
        "the site grew from {clean} to {hostile} bytes"
    );
    // The site shows the triage, the subject cut: it is not simply left out.
    let shown = grep_dir(&tmp.path().join("hostile"), "fix: yyyy");
    assert!(shown, "no page shows the (cut) subject of the kept triage");
}

/// Whether any file under `dir` holds `needle`.
fn grep_dir(dir: &Path, needle: &str) -> bool {
    std::fs::read_dir(dir).unwrap().any(|e| {
        let p = e.unwrap().path();
        if p.is_dir() {
            grep_dir(&p, needle)
        } else {
            std::fs::read(&p).is_ok_and(|b| String::from_utf8_lossy(&b).contains(needle))
        }
    })
}

/// A copy of the fixture run folder `tests/fixtures/runs/NAME` as `dir/runs/NAME`.
fn fixture_run(dir: &Path, name: &str) -> std::path::PathBuf {
    let to = dir.join("runs").join(name);
    std::fs::create_dir_all(&to).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/fixtures/runs/{name}/results.json")),
        to.join("results.json"),
    )
    .unwrap();
    to
}

/// Every command with a folder (or file) to write refuses, as bad input naming the flag and
/// the path, a dangling link (creating through one was exit 3, "File exists"), a file where
/// the folder must be or above it, and a place nobody can write (`/proc`, whose refusal was
/// exit 3 too): before any work, and without creating the link's target.
#[test]
fn every_output_flag_refuses_a_dangling_link_a_file_or_an_unwritable_path() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let db = store(d, "h.sqlite", 2, 2);
    let run = fixture_run(d, "cpu-ok");
    let worker = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_worker.sh");
    std::fs::write(
        d.join("m.yaml"),
        format!(
            "name: m\naxes:\n  model: [a]\n  gpus: [1]\ndefaults:\n  steps: 5\n  warmup: 1\n  repeats: 1\n  timeout: 60s\n  workload:\n    kind: command\n    argv: [sh, \"{}\", paced, \"0.01\"]\n",
            worker.display()
        ),
    )
    .unwrap();
    let log = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/ingest/nemo-24.09-llama31-405b-576gpu-fp8.log");
    std::os::unix::fs::symlink(d.join("nowhere"), d.join("dangling")).unwrap();
    std::fs::write(d.join("file"), "x").unwrap();
    let (run, db, log) = (
        run.to_str().unwrap().to_string(),
        db.to_str().unwrap().to_string(),
        log.to_str().unwrap().to_string(),
    );
    // (flag, the command with the path to write last).
    let commands: Vec<(&str, Vec<&str>)> = vec![
        (
            "--results-dir",
            vec![
                "matrix",
                "m.yaml",
                "--no-progress",
                "--gpus",
                "0",
                "--results-dir",
            ],
        ),
        (
            "--results-dir",
            vec![
                "ingest",
                &log,
                "--model",
                "llama-3.1-405b",
                "--global-batch",
                "252",
                "--seq-len",
                "8192",
                "--gpus",
                "576",
                "--dtype",
                "fp8",
                "--skip-steps",
                "0",
                "--results-dir",
            ],
        ),
        (
            "--work-dir",
            vec![
                "bisect",
                "a.cell",
                "--good",
                "HEAD~1",
                "--bad",
                "HEAD",
                "--matrix",
                "m.yaml",
                "--work-dir",
            ],
        ),
        (
            "--baselines",
            vec!["baseline", "update", &run, "--baselines"],
        ),
        ("-o", vec!["report", "merge", &run, "-o"]),
        ("-o", vec!["site", "--history", &db, "-o"]),
    ];
    let mut bad = vec![
        ("dangling", "dangling: a symbolic link to "),
        ("dangling/sub", "dangling is a symbolic link to "),
        ("file", "file: not a folder but a file"),
        (
            "file/sub",
            "file is not a folder but a file, so nothing can be made under it",
        ),
    ];
    if Path::new("/proc/self").is_dir() {
        bad.push(("/proc/bench-nowhere", "cannot write in /proc"));
    }
    for (flag, args) in &commands {
        for (path, says) in &bad {
            let mut a = args.clone();
            a.push(path);
            let o = bench(d, &a);
            let what = format!("bench {}", a.join(" "));
            assert_eq!(o.status.code(), Some(2), "{what}: {}", text(&o));
            assert!(
                text(&o).contains(&format!("{flag} {path}: ")) && text(&o).contains(says),
                "{what}: {says:?} not in {}",
                text(&o)
            );
            assert!(
                !d.join("nowhere").exists(),
                "{what} created the link's target"
            );
        }
    }
    // The page of `bench report html -o FILE`: a folder, or a file in no writable folder.
    for (path, says) in [
        ("runs", "-o runs: a folder, where bench writes a file"),
        ("file/r.html", "-o file/r.html: file is not a folder"),
    ] {
        let o = bench(d, &["report", "html", &run, "-o", path]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains(says), "{says:?} not in {}", text(&o));
    }
    // Nothing was written where the commands' work would have gone.
    for made in ["results", "baselines", "r.html"] {
        assert!(!d.join(made).exists(), "{made} was written");
    }
}

/// The names and bytes of every file under `dir`.
fn contents(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(contents(&p));
        } else {
            out.push((p.clone(), std::fs::read(&p).unwrap()));
        }
    }
    out.sort();
    out
}

/// A damaged baseline file is found before `bench report merge` writes anything: an earlier
/// merge in `-o` stays byte for byte, a new `-o` is not made, nothing is left beside it,
/// and a fleet whose last run's key has the damaged file prints no run as merged (it used
/// to merge the first run, and append its summary to the job's page, before finding it).
#[test]
fn a_merge_refused_for_a_damaged_baseline_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let cpu = fixture_run(d, "cpu-ok");
    let h100 = fixture_run(d, "mixed");
    let (cpu, h100) = (cpu.to_str().unwrap(), h100.to_str().unwrap());
    std::fs::create_dir(d.join("bl")).unwrap();
    let merge = |inputs: &[&str], out: &str| {
        let mut a = vec!["report", "merge"];
        a.extend(inputs);
        a.extend(["-o", out, "--baselines", "bl"]);
        bench(d, &a)
    };
    let o = merge(&[cpu], "out");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = merge(&[cpu, h100], "fleet");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let (before, fleet_before) = (contents(&d.join("out")), contents(&d.join("fleet")));
    for key in ["cpu-x86_64", "h100-sxm-80gb"] {
        std::fs::write(d.join(format!("bl/{key}.yaml")), "cells: [damaged").unwrap();
    }
    let refused = |o: &Output, key: &str| {
        assert_eq!(o.status.code(), Some(2), "{}", text(o));
        assert!(text(o).contains(&format!("bl/{key}.yaml")), "{}", text(o));
        assert!(
            !text(o).contains("merged into"),
            "a run was merged: {}",
            text(o)
        );
    };
    refused(&merge(&[cpu], "out"), "cpu-x86_64");
    assert!(
        contents(&d.join("out")) == before,
        "the earlier merge changed"
    );
    refused(&merge(&[cpu], "new"), "cpu-x86_64");
    assert!(!d.join("new").exists());
    // Only the fleet's second key is damaged now.
    std::fs::remove_file(d.join("bl/cpu-x86_64.yaml")).unwrap();
    refused(&merge(&[cpu, h100], "fleet"), "h100-sxm-80gb");
    assert!(
        contents(&d.join("fleet")) == fleet_before,
        "the earlier fleet changed"
    );
    refused(&merge(&[cpu, h100], "new-fleet"), "h100-sxm-80gb");
    assert!(!d.join("new-fleet").exists());
    let left: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".merging-"))
        .collect();
    assert!(left.is_empty(), "left beside the output: {left:?}");
}

/// A run folder whose results.json holds a 50 MB matrix name and a 50 MB failure reason (a
/// results file from another tool, or edited): `bench report` shows each cut to a few
/// thousand characters saying how many more there were, in the terminal, summary.txt,
/// summary.md, junit.xml (where the name was written once per cell: 545 MB) and report.html.
#[test]
fn a_50_mb_text_in_a_run_folder_makes_no_50_mb_report() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let run = fixture_run(d, "mixed");
    let file = run.join("results.json");
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let huge = "x".repeat(50 << 20);
    doc["matrix_name"] = huge.clone().into();
    let failed = doc["cells"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|c| c["status"] == "failed")
        .unwrap();
    failed["reason"] = huge.into();
    std::fs::write(&file, doc.to_string()).unwrap();
    let o = bench(d, &["report", run.to_str().unwrap(), "--baselines", "bl"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        &text(&o)[..2000.min(text(&o).len())]
    );
    assert!(
        o.stdout.len() < 100_000,
        "{} bytes on the terminal",
        o.stdout.len()
    );
    assert!(text(&o).contains("more characters)"), "the cut says so");
    for (f, most) in [
        ("summary.txt", 100_000),
        ("summary.md", 100_000),
        ("junit.xml", 200_000),
        ("report.html", 1_000_000),
    ] {
        let size = std::fs::metadata(run.join(f)).unwrap().len();
        assert!(size < most, "{f} is {size} bytes");
    }
    let md = std::fs::read_to_string(run.join("summary.md")).unwrap();
    assert!(
        md.contains("more characters\\)"),
        "summary.md says what was cut"
    );
}

/// `bench site -o` replaces only what it wrote: a rebuild over a site that holds a file a
/// person put there (a CNAME), its own store, or the run folders `--runs` reads is refused
/// with exit 2 naming it, and nothing is deleted; each was deleted with exit 0 before.
#[test]
fn a_site_rebuild_never_deletes_what_it_did_not_write_or_what_it_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s = store(dir, "h.sqlite", 3, 4);
    let o = site(dir, &s, "site");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(dir.join("site/.bench-written").is_file());
    // A rebuild over its own output alone is fine.
    let o = site(dir, &s, "site");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    std::fs::write(dir.join("site/CNAME"), "bench.example.org\n").unwrap();
    let o = site(dir, &s, "site");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("it holds CNAME, which bench site did not write"),
        "{}",
        text(&o)
    );
    assert!(dir.join("site/CNAME").is_file());
    std::fs::remove_file(dir.join("site/CNAME")).unwrap();

    // The store inside the site.
    std::fs::copy(&s, dir.join("site/store.sqlite")).unwrap();
    let o = site(dir, Path::new("site/store.sqlite"), "site");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("--history site/store.sqlite is inside -o"),
        "{}",
        text(&o)
    );
    assert!(dir.join("site/store.sqlite").is_file());
    std::fs::remove_file(dir.join("site/store.sqlite")).unwrap();

    // The run folders `--runs` reads, inside the site.
    std::fs::create_dir_all(dir.join("site/results/night-1")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_bench"))
        .current_dir(dir)
        .args(["site", "--history"])
        .arg(&s)
        .args(["--runs", "site/results", "-o", "site"])
        .env_remove("BENCH_HISTORY")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("--runs site/results is inside -o"),
        "{}",
        text(&o)
    );
    assert!(dir.join("site/results/night-1").is_dir());
}

/// The list protects what is below the top too (a file put in `cells/` or `assets/`), a
/// site whose list is gone or damaged is refused rather than deleted with what it holds,
/// and `-o site/cells/..` is the site itself (its rename failed with exit 3 after the
/// whole build).
#[test]
fn a_site_rebuild_checks_every_file_against_its_list() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s = store(dir, "h.sqlite", 3, 4);
    let o = site(dir, &s, "site");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = site(dir, &s, "site/cells/..");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    std::fs::write(dir.join("site/assets/custom.css"), "body{}").unwrap();
    let o = site(dir, &s, "site");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("it holds assets/custom.css"),
        "{}",
        text(&o)
    );
    assert!(dir.join("site/assets/custom.css").is_file());
    std::fs::remove_file(dir.join("site/assets/custom.css")).unwrap();

    std::fs::write(dir.join("site/.bench-written"), b"index.html\n\xff\n").unwrap();
    let o = site(dir, &s, "site");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("no readable .bench-written"),
        "{}",
        text(&o)
    );
    assert!(dir.join("site/index.html").is_file());
}

/// A `.bench-written` that is a symbolic link is no list and is never followed: a link to
/// a list that names a person's CNAME is refused as a site without a readable list, and
/// the CNAME survives. The rebuild followed such a link and deleted the CNAME with exit 0
/// (round C of the hostile re-run).
#[test]
fn a_written_list_that_is_a_link_is_not_trusted_and_the_file_it_names_survives() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s = store(dir, "h.sqlite", 3, 4);
    let o = site(dir, &s, "site");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // The list the site wrote, naming the CNAME too, kept outside and linked in its place.
    let mut list = std::fs::read_to_string(dir.join("site/.bench-written")).unwrap();
    list.push_str("CNAME\n");
    std::fs::write(dir.join("list"), &list).unwrap();
    std::fs::remove_file(dir.join("site/.bench-written")).unwrap();
    std::os::unix::fs::symlink("../list", dir.join("site/.bench-written")).unwrap();
    std::fs::write(dir.join("site/CNAME"), "bench.example.org\n").unwrap();

    let o = site(dir, &s, "site");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("holds no readable .bench-written"),
        "{}",
        text(&o)
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("site/CNAME")).unwrap(),
        "bench.example.org\n"
    );
    assert!(dir.join("site/index.html").is_file());
    assert_eq!(std::fs::read_to_string(dir.join("list")).unwrap(), list);
}
