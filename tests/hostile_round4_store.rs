//! Issue 42, hostile round 4: impossible values already in a history store (rows written
//! by hand, by another tool, or before `bench history import` checked its values) are held
//! to the same plausibility bounds on the way out as on the way in. Each such row is
//! skipped with one warning naming the store, run, cell and metric, so that it never makes
//! up a change point, a shift or a verdict (`20.03K -> infT (+inf%)`, `NaN%`, a real -10%
//! shown as -29.0%), and a row of a million samples no longer keeps `bench history study`
//! busy for minutes.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::cli::{bench_in as bench, text};

const CELL: &str = "gpt2-tiny.fp32.1gpu.single.base";

fn run_id(day: usize) -> String {
    format!("202611{day:02}T090000Z")
}

/// A store of 20 nights of one cell: ten at about 52,000 tok/s, then ten 10% slower, each
/// imported with `bench history import` from a copy of the committed fixture run.
fn store(dir: &Path) -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/runs/cpu-ok");
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture.join("results.json")).unwrap()).unwrap();
    for n in 0..20 {
        let day = n + 1;
        let mut d = doc.clone();
        let cells = d["cells"].as_array_mut().unwrap();
        cells.truncate(1);
        d["run_id"] = run_id(day).into();
        d["started_at"] = format!("2026-11-{day:02}T09:00:00Z").into();
        d["finished_at"] = format!("2026-11-{day:02}T09:10:00Z").into();
        let base = if n < 10 { 52_000.0 } else { 46_800.0 };
        // A fixed small spread around each night's level, different from night to night.
        let wobble = [0.998, 1.0, 1.002][n % 3] * (1.0 + 0.0005 * (n % 4) as f64);
        let samples: Vec<f64> = [0.997, 1.0, 1.003]
            .iter()
            .map(|f| base * wobble * f)
            .collect();
        let m = &mut d["cells"][0]["metrics"]["tokens_per_s"];
        m["value"] = (base * wobble).into();
        m["samples"] = serde_json::json!(samples);
        let folder = dir.join(run_id(day));
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("results.json"), d.to_string()).unwrap();
        let o = bench(
            dir,
            &[
                "history",
                "import",
                folder.to_str().unwrap(),
                "--history",
                "h.sqlite",
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    dir.join("h.sqlite")
}

/// Folder `name` in `dir`: the run folder [`store`] imported for `day`, as a new run with
/// `edit` applied to its cell's tokens_per_s, for the import door to judge.
fn new_night(dir: &Path, day: usize, name: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let from = dir.join(run_id(day)).join("results.json");
    let mut doc: serde_json::Value = serde_json::from_slice(&std::fs::read(from).unwrap()).unwrap();
    doc["run_id"] = "20261130T090000Z".into();
    edit(&mut doc["cells"][0]["metrics"]["tokens_per_s"]);
    let to = dir.join(name);
    std::fs::create_dir_all(&to).unwrap();
    std::fs::write(to.join("results.json"), doc.to_string()).unwrap();
}

/// A copy of `db` named `name` with `sql` applied to it.
fn edited(db: &Path, name: &str, sql: &str) -> PathBuf {
    let to = db.with_file_name(name);
    std::fs::copy(db, &to).unwrap();
    let c = rusqlite::Connection::open(&to).unwrap();
    c.execute_batch(sql).unwrap();
    to
}

fn history(dir: &Path, db: &Path) -> Output {
    bench(dir, &["history", CELL, "--history", db.to_str().unwrap()])
}

/// The change point of the clean store, as `bench history CELL` prints it.
fn change_point(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .find(|l| l.contains(" -> "))
        .unwrap_or_else(|| panic!("no change point: {}", text(o)))
        .to_string()
}

#[test]
fn an_impossible_stored_value_is_skipped_with_a_warning_and_changes_no_figure() {
    let tmp = tempfile::tempdir().unwrap();
    let db = store(tmp.path());
    let clean = history(tmp.path(), &db);
    assert_eq!(clean.status.code(), Some(0), "{}", text(&clean));
    let want = change_point(&clean);
    assert!(
        want.contains(&format!("from run {}", run_id(11))) && want.contains("(-10.0%, p="),
        "{want}"
    );
    let night = run_id(5);
    for (i, (value, why)) in [
        ("1e999", "inf: not a finite number"),
        ("-1e999", "-inf: not a finite number"),
        // One negative value turned the real -10% shift into -29.0%.
        ("-5", "outside its plausible range"),
        ("'fast'", "value is not a number"),
        ("0", "outside its plausible range"),
    ]
    .into_iter()
    .enumerate()
    {
        let db = edited(
            &db,
            &format!("v{i}.sqlite"),
            &format!(
                "UPDATE bench_metrics SET value = {value} WHERE run_id = '{night}' AND metric = 'tokens_per_s'"
            ),
        );
        let o = history(tmp.path(), &db);
        let all = text(&o);
        assert_eq!(o.status.code(), Some(0), "{value}: {all}");
        // The row's night leaves the mean before the change a little different, never the
        // change's run or its size.
        let got = change_point(&o);
        assert!(
            got.contains(&format!("from run {}", run_id(11))) && got.contains("(-10.0%, p="),
            "{value}: {got} (the clean store: {want})"
        );
        // The warning names the value; what the history shows holds no trace of it.
        let shown = String::from_utf8_lossy(&o.stdout);
        assert!(
            shown.contains("19 runs") && !shown.contains("inf") && !shown.contains("NaN"),
            "{value}: {all}"
        );
        let warning = String::from_utf8_lossy(&o.stderr);
        assert_eq!(warning.matches("warning:").count(), 1, "{value}: {warning}");
        assert!(
            warning.contains(&format!("run {night} cell {CELL} metric tokens_per_s: "))
                && warning.contains(why)
                && warning.contains("the row is skipped, not used"),
            "{value}: {warning}"
        );
    }
}

#[test]
fn a_store_of_zero_speeds_judges_nothing_instead_of_an_infinite_improvement() {
    let tmp = tempfile::tempdir().unwrap();
    let db = store(tmp.path());
    // Every night before the slowdown stored as 0 tok/s: the verdicts read "improved
    // +inf% (+inf sigma; band +-0.0%)".
    let db = edited(
        &db,
        "zero.sqlite",
        &format!(
            "UPDATE bench_metrics SET value = 0, samples = '[0,0,0]' WHERE metric = 'tokens_per_s' AND run_id < '{}'",
            run_id(11)
        ),
    );
    let o = history(tmp.path(), &db);
    let all = text(&o);
    assert_eq!(o.status.code(), Some(0), "{all}");
    assert!(
        all.contains("10 runs") && !all.contains("inf") && !all.contains("NaN"),
        "{all}"
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stderr)
            .matches("warning:")
            .count(),
        10,
        "{all}"
    );
    // The site, which reads every value of the store, leaves them out too.
    let o = bench(
        tmp.path(),
        &["site", "--history", db.to_str().unwrap(), "-o", "site"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let index = std::fs::read_to_string(tmp.path().join("site/index.html")).unwrap();
    assert!(!index.contains("inf%") && !index.contains("NaN"));
}

#[test]
fn samples_that_overflow_or_number_a_million_are_skipped_and_the_study_stays_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let db = store(tmp.path());
    // A sample JSON cannot hold (1e999) made every reader of the store exit 2.
    let overflow = edited(
        &db,
        "overflow.sqlite",
        &format!(
            "UPDATE bench_metrics SET samples = '[52000, 1e999, 52001]' WHERE run_id = '{}' AND metric = 'tokens_per_s'",
            run_id(6)
        ),
    );
    let o = history(tmp.path(), &overflow);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("samples do not read as numbers") && text(&o).contains("19 runs"),
        "{}",
        text(&o)
    );
    // A row of a million samples (9 MB of text) kept `bench history study` busy for more
    // than 300 s; it is skipped unparsed. The trials are few so that the test measures the
    // reading of the store, not the bootstrap.
    let million: Vec<String> = (0..1_000_000)
        .map(|i| format!("{}", 52_000 + i % 7))
        .collect();
    let big = edited(
        &db,
        "big.sqlite",
        &format!(
            "UPDATE bench_metrics SET samples = '[{}]' WHERE run_id = '{}' AND metric = 'tokens_per_s'",
            million.join(","),
            run_id(7)
        ),
    );
    let started = Instant::now();
    let o = bench(
        tmp.path(),
        &[
            "history",
            "study",
            "--history",
            big.to_str().unwrap(),
            "--detect-trials",
            "20",
            "--alarm-trials",
            "20",
        ],
    );
    let took = started.elapsed();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("more than 10000 samples hold; the row is skipped"),
        "{}",
        text(&o)
    );
    assert!(took < Duration::from_secs(120), "study took {took:?}");
    // The import door refuses the same count, naming the key path.
    new_night(tmp.path(), 8, "many", |m| {
        m["samples"] = serde_json::json!(vec![52_000.0; 10_001]);
    });
    let o = bench(
        tmp.path(),
        &["history", "import", "many", "--history", "h.sqlite"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "cells[0] ({CELL}).metrics.tokens_per_s.samples: 10001 samples, more than the 10000 one value may hold"
        )),
        "{}",
        text(&o)
    );
}

#[test]
fn an_impossible_stored_spread_is_skipped_and_refused_at_import() {
    let tmp = tempfile::tempdir().unwrap();
    let db = store(tmp.path());
    let night = run_id(5);
    for (i, spread) in ["1e999", "-3", "1e300", "'wide'"].into_iter().enumerate() {
        let db = edited(
            &db,
            &format!("s{i}.sqlite"),
            &format!(
                "UPDATE bench_metrics SET rel_spread = {spread} WHERE run_id = '{night}' AND metric = 'tokens_per_s'"
            ),
        );
        let o = history(tmp.path(), &db);
        assert_eq!(o.status.code(), Some(0), "{spread}: {}", text(&o));
        let shown = String::from_utf8_lossy(&o.stdout);
        assert!(
            shown.contains("19 runs") && !shown.contains("inf%") && !shown.contains("-300"),
            "{spread}: {}",
            text(&o)
        );
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(&format!("run {night} cell {CELL}")),
            "{spread}: {}",
            text(&o)
        );
    }
    new_night(tmp.path(), 9, "wide", |m| {
        m["rel_spread"] = serde_json::json!(1e300);
    });
    let o = bench(
        tmp.path(),
        &["history", "import", "wide", "--history", "h.sqlite"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "cells[0] ({CELL}).metrics.tokens_per_s.rel_spread"
        )),
        "{}",
        text(&o)
    );
}

#[test]
fn many_samples_in_every_row_keep_the_study_bounded() {
    // Each row under the import's cap of 10,000 samples, all of them large: 20 rows of
    // 10,000 ran for more than 400 s. The study resamples at most 20 repeats of a run.
    let tmp = tempfile::tempdir().unwrap();
    let db = store(tmp.path());
    let c = rusqlite::Connection::open(&db).unwrap();
    let many: Vec<String> = (0..10_000).map(|i| format!("{}", 52_000 + i % 7)).collect();
    c.execute(
        "UPDATE bench_metrics SET samples = ?1 WHERE metric = 'tokens_per_s'",
        [format!("[{}]", many.join(","))],
    )
    .unwrap();
    drop(c);
    let started = Instant::now();
    let o = bench(
        tmp.path(),
        &[
            "history",
            "study",
            "--history",
            db.to_str().unwrap(),
            "--detect-trials",
            "20",
            "--alarm-trials",
            "20",
        ],
    );
    let took = started.elapsed();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(took < Duration::from_secs(120), "study took {took:?}");
}

#[test]
fn bidirectional_controls_are_shown_not_acted_on() {
    let tmp = tempfile::tempdir().unwrap();
    let db = store(tmp.path());
    let o = bench(
        tmp.path(),
        &[
            "history",
            "a\u{202e}evil",
            "--history",
            db.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let all = text(&o);
    assert!(!all.contains('\u{202e}'), "{all}");
    assert!(all.contains("a\\u{202e}evil"), "{all}");
    // Every other argument an error echoes (a branch, a path) is shown the same way.
    for args in [
        vec![
            "site",
            "--history",
            db.to_str().unwrap(),
            "-o",
            "s",
            "--branch",
            "x\u{1b}]0;pwned\u{7}",
        ],
        vec![
            "history",
            "import",
            "x\u{1b}]0;pwned\u{7}",
            "--history",
            "h.sqlite",
        ],
    ] {
        let o = bench(tmp.path(), &args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(!o.stderr.contains(&0x1b), "{args:?}: {}", text(&o));
        assert!(
            text(&o).contains("x\\x1b]0;pwned\\x07"),
            "{args:?}: {}",
            text(&o)
        );
    }
}

#[test]
fn a_closed_standard_error_ends_bench_as_sigpipe_would_not_with_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let db = store(tmp.path());
    // A pipe whose reader is gone before bench writes: every message fails with EPIPE.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["history", "nope", "--history"])
        .arg(&db)
        .current_dir(tmp.path())
        .stdout(std::process::Stdio::null())
        .stderr(writer)
        .env_remove("BENCH_HISTORY")
        .status()
        .unwrap();
    assert_eq!(o.code(), Some(141), "{o:?}");
}

/// A closed standard output ends `bench history CELL` with 141 too: its trend was written
/// with the error ignored, so `bench history CELL | head -c 10` exited 0.
#[test]
fn a_closed_standard_output_ends_bench_history_with_141() {
    let tmp = tempfile::tempdir().unwrap();
    let db = store(tmp.path());
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["history", CELL, "--history"])
        .arg(&db)
        .current_dir(tmp.path())
        .stdout(writer)
        .stderr(std::process::Stdio::null())
        .env_remove("BENCH_HISTORY")
        .status()
        .unwrap();
    assert_eq!(o.code(), Some(141), "{o:?}");
}

#[test]
fn bench_report_refuses_a_metric_no_measurement_gives() {
    // The re-render door holds a folder to the same bounds as merge and import: a forged
    // 1e308 tok/s was reported as a 300-digit improvement, -5 as "same speed".
    let tmp = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/runs/cpu-ok");
    for (i, v) in [1e308, -5.0].into_iter().enumerate() {
        let mut doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixture.join("results.json")).unwrap()).unwrap();
        doc["cells"][0]["metrics"]["tokens_per_s"]["value"] = serde_json::json!(v);
        let dir = tmp.path().join(format!("r{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("results.json"), doc.to_string()).unwrap();
        let o = bench(tmp.path(), &["report", dir.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{v}: {}", text(&o));
        assert!(
            text(&o).contains(&format!("cells[0] ({CELL}).metrics.tokens_per_s.value")),
            "{v}: {}",
            text(&o)
        );
        assert!(!dir.join("summary.md").exists(), "{v}: reports written");
    }
    // A copy of the committed run itself still reports.
    let ok = tmp.path().join("ok");
    std::fs::create_dir_all(&ok).unwrap();
    std::fs::copy(fixture.join("results.json"), ok.join("results.json")).unwrap();
    let o = bench(tmp.path(), &["report", ok.to_str().unwrap()]);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
    assert!(ok.join("summary.md").exists());
}

/// A cell argument holding a newline is shown escaped in the message naming it, so it
/// cannot print a line of its own that reads as bench's.
#[test]
fn a_cell_argument_with_a_newline_cannot_forge_a_line() {
    let tmp = tempfile::tempdir().unwrap();
    let db = store(tmp.path());
    let db = db.display().to_string();
    for args in [
        vec!["history", "cell\nerror: forged", "--history", &db],
        vec![
            "baseline",
            "accept",
            "cell\nerror: forged",
            "--reason",
            "r",
            "--history",
            &db,
        ],
    ] {
        let o = bench(tmp.path(), &args);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("cell\\nerror: forged"), "{args:?}: {err}");
        assert!(
            !err.lines().any(|l| l.starts_with("error: forged")),
            "{args:?}: {err}"
        );
    }
}

/// A stored reason (or branch, host, run id) is shown on one line and cut: a reason's
/// newline printed a line that read as bench's, and a 50 MB one wrote 105 MB to the
/// terminal.
#[test]
fn a_stored_reason_is_shown_on_one_line_and_cut() {
    let tmp = tempfile::tempdir().unwrap();
    let db = store(tmp.path());
    let db_s = db.display().to_string();
    // The most one argument may carry is 128 KiB (MAX_ARG_STRLEN); the store's own writers
    // (import, a shared PostgreSQL) carry more, and the same cut applies.
    let reason = format!("r\nerror: forged {}", "x".repeat(100_000));
    let o = bench(
        tmp.path(),
        &[
            "baseline",
            "accept",
            CELL,
            "--reason",
            &reason,
            "--history",
            &db_s,
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(o.stdout.len() < 10_000, "{} bytes", o.stdout.len());
    let o = history(tmp.path(), &db);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        out.contains("r\\nerror: forged"),
        "{}",
        &out[..out.len().min(3000)]
    );
    assert!(!out.lines().any(|l| l.starts_with("error: forged")));
    assert!(out.len() < 30_000, "{} bytes", out.len());
}
