//! Issue 31 ("A clean night never fails") end to end through the built binary: ordered
//! nights of a command workload whose speed the test sets per commit and per repeat
//! (tests/fixtures/sequence_worker.sh), each night a commit of its own repository, judged
//! by `bench matrix --history` as the CI templates run it.
//!
//! - A borrowed confirmation: a regression night, then its revert whose first run lands in
//!   a slow mode and whose re-run does not. The revert must not fail, and a later
//!   regression's range must start after the revert, which a clean run vouched for.
//! - One disturbed repeat: one repeat of three 35% slower. The verdict names it, and the
//!   band stays the width the history justifies.
//!
//! The busy host is tests/gate_busy_host_e2e.rs, a binary of its own that runs alone.

#[path = "common/sequence_lab.rs"]
mod lab;

use lab::{text, Lab};

#[test]
fn a_revert_night_in_a_slow_mode_borrows_no_confirmation() {
    let lab = Lab::new();
    lab.clean_nights(7);
    let good = lab.git(&["rev-parse", "HEAD"]);
    // The slow commit: 3% slower on every repeat and re-run. Regressed.
    let o = lab.night("slow", 1.03, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(lab.verdict("slow"), "regressed", "{}", text(&o));
    let since = &lab.history("slow")["cells"][0]["since"];
    assert_eq!(since["last_good_commit"], good.as_str(), "{since}");
    // The revert, whose run lands 6% slow (a mode the cell has, as issue 31's eager SAC
    // cell on an H100) and whose side-by-side repeats do not: it must not fail. Before
    // issue 31 the previous night's breach confirmed it, exit 1, with a range spanning the
    // slow commit; now the pairs against the last good commit find the code the same.
    let o = lab.night("revert", 1.0, &[1.06, 1.06, 1.06]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let h = lab.history("revert");
    let v = lab.verdict("revert");
    assert!(v == "environment" || v == "unchanged", "{h}");
    if v == "environment" {
        assert_eq!(h["cells"][0]["pairs"]["result"]["answer"], "same", "{h}");
    }
    assert!(
        std::fs::read_to_string(lab.dir.join("results/revert/summary.md"))
            .unwrap()
            .contains("no regressions"),
        "{out}"
    );
    // A later slowdown: its range starts at the revert, which a clean run vouched for,
    // never before the first slow commit.
    let revert = lab.git(&["rev-parse", "HEAD"]);
    let o = lab.night("slow2", 1.03, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let since = &lab.history("slow2")["cells"][0]["since"];
    assert_eq!(since["last_good_run_id"], "revert", "{since}");
    assert_eq!(since["last_good_commit"], revert.as_str(), "{since}");
}

#[test]
fn one_disturbed_repeat_is_named_and_does_not_widen_the_band() {
    let lab = Lab::new();
    lab.clean_nights(7);
    let before = lab.history("c06")["cells"][0]["judgement"]["band"]["half_width"]
        .as_f64()
        .unwrap();
    // Repeat 2 of 3 takes 35% longer per step: 26% fewer tokens/s.
    let o = lab.night("hiccup", 1.0, &[1.0, 1.35, 1.0]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let h = lab.history("hiccup");
    let cell = &h["cells"][0];
    assert_eq!(cell["judgement"]["verdict"], "unchanged", "{h}");
    let line = cell["line"].as_str().unwrap();
    assert!(
        line.contains("repeat 2 of 3 ran 26% slower than the others"),
        "{line}"
    );
    let md = std::fs::read_to_string(lab.dir.join("results/hiccup/summary.md")).unwrap();
    assert!(md.contains("repeat 2 of 3 ran 26% slower"), "{md}");
    // The band is what the history justifies, not +-80% from the run's own half-range.
    let band = cell["judgement"]["band"]["half_width"].as_f64().unwrap();
    let centre = cell["judgement"]["band"]["center"].as_f64().unwrap();
    assert!(
        band / centre < 0.05,
        "band +-{:.1}%: {h}",
        band / centre * 100.0
    );
    assert!(band <= before * 1.5, "{band} against {before}: {h}");
    // And a real 5% drop on such a night is still caught.
    let o = lab.night("hiccup-slow", 1.05, &[1.0, 1.35, 1.0]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(lab.verdict("hiccup-slow"), "regressed");
}
