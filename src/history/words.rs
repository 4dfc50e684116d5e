//! The words of a history verdict: [`verdict_line`] is the one line every report shows for
//! a judged cell (the terminal table, `summary.md`, the PR/MR comment, `junit.xml`'s
//! failure message, `report.json`, `report.html`), e.g.
//!
//! `regressed -3.0% (-7.1 sigma) since run 20261124T0200Z (commit abc1234); changed
//! since: BENCH_FUSED_ADAMW (unset) -> 0; SM clock 1755 MHz (+0.1%), tokens/s per SM MHz
//! -3.1%`
//!
//! and [`remarkable`] says which judged cells need a reader's eye. The reports lay these words
//! out (`crate::report::history` writes the section `summary.md` and the comment add); the
//! judge writes them into each judgement, so every format says the same.

use super::detect::{HistoryVerdict, NumericsVerdict};
use super::verdicts::CellJudgement;

fn short(commit: &Option<String>) -> String {
    match commit {
        Some(c) => c.chars().take(7).collect(),
        None => "unknown".into(),
    }
}

/// The verdict line of one judged cell (plain text; Markdown callers put it in code spans
/// or escape it).
pub(crate) fn verdict_line(c: &CellJudgement) -> String {
    let j = &c.judgement;
    let mut line = c.verdict().as_str().to_string();
    line.push_str(&size(j));
    // Where the shift began comes right after its size, as the example reads:
    // `regressed -3.0% (-7.1 sigma) since run X (commit abc1234); ...`.
    if let Some(s) = &c.since {
        line.push_str(&format!(
            " since run {} (commit {})",
            s.run_id,
            short(&s.commit)
        ));
        if let Some(good) = &s.last_good_run_id {
            line.push_str(&format!(
                "; last good run {good} (commit {})",
                short(&s.last_good_commit)
            ));
        }
    }
    if let Some(p) = &c.pairs {
        line.push_str(&format!("; {}", p.describe()));
        let same = p
            .result
            .is_some_and(|r| r.answer == super::paired::Answer::Same);
        if same && c.verdict() == HistoryVerdict::Environment {
            // The pairs cleared the code: what the history saw is this host or this night.
            if let Some(r) = p.screened_rel {
                line.push_str(&format!(
                    "; the code runs the same as at its last good commit: this host (or this night) ran the cell {:.1}% {} its history",
                    r.abs() * 100.0,
                    if r < 0.0 { "below" } else { "above" }
                ));
            }
        }
    }
    if j.drift {
        line.push_str("; the recent runs have all drifted past the baseline's tolerance");
    }
    // A disturbed repeat is environment evidence: the median set it aside, the reader
    // should still know the run was not quiet.
    for o in &c.outliers {
        line.push_str(&format!(
            "; {} (set aside by the median: the run was disturbed)",
            o.describe(crate::baseline::Direction::Higher)
        ));
    }
    if c.confirm_values.len() > 1 {
        let each: Vec<String> = c
            .confirm_values
            .iter()
            .map(|v| crate::format::si(*v))
            .collect();
        line.push_str(&format!(
            "; {} re-runs measured {} (one is not enough while the cell has fewer than {} clean runs or they have shown values this far out)",
            each.len(),
            each.join(", "),
            crate::history::detect::RARE_AFTER
        ));
    } else if let Some(v) = c.confirm_value {
        line.push_str(&format!("; the re-run measured {}", crate::format::si(v)));
    }
    if let Some(why) = &c.confirm_failed {
        line.push_str(&format!("; the confirming re-run {why}"));
    }
    if !c.changes.is_empty() {
        let list: Vec<String> = c.changes.iter().map(|ch| ch.render()).collect();
        line.push_str(&format!("; changed since: {}", list.join(", ")));
    } else if matches!(
        c.verdict(),
        HistoryVerdict::Regressed | HistoryVerdict::Improved
    ) {
        line.push_str("; nothing recorded changed since the last good run (same commit, switches and versions)");
    }
    if let Some(f) = &c.environment {
        if c.verdict() == HistoryVerdict::Environment && !f.causes.is_empty() {
            line.push_str(&format!(
                "; blamed on the environment: {}",
                f.causes.join("; ")
            ));
        }
        for n in &f.notes {
            line.push_str(&format!("; {n}"));
        }
        if let Some(clk) = &f.clock {
            let mut parts = format!("SM clock {:.0} MHz", clk.sm_clock_mhz);
            if let Some(ch) = clk.clock_change() {
                parts.push_str(&format!(" ({:+.1}%)", ch * 100.0));
            }
            if let Some(ch) = clk.per_mhz_change() {
                parts.push_str(&format!(", tokens/s per SM MHz {:+.1}%", ch * 100.0));
            }
            line.push_str(&format!("; {parts}"));
        }
    }
    if let Some(clause) = energy_clause(c) {
        line.push_str(&clause);
    }
    if let NumericsVerdict::Changed {
        step,
        loss,
        center,
        half_width,
    } = &c.numerics
    {
        line.push_str(&format!(
            "; numerics changed: the seeded loss at step {step} is {loss:.5}, outside {center:.5} +- {half_width:.5}"
        ));
    }
    line
}

/// Whether a verdict is one a reader must see (a shift, or a shift not yet settled).
fn shifted(v: HistoryVerdict) -> bool {
    matches!(
        v,
        HistoryVerdict::Regressed
            | HistoryVerdict::Improved
            | HistoryVerdict::Suspect
            | HistoryVerdict::Unknown
            | HistoryVerdict::Environment
    )
}

/// The energy clause of a verdict line, when the cell's tokens/J shifted: `; energy:
/// tokens/J regressed -6.1% (-9.8 sigma; band +-2.5% around the median of its last 10
/// runs) at an unchanged speed; the re-run measured 812 tok/J`.
fn energy_clause(c: &CellJudgement) -> Option<String> {
    let e = c.energy.as_ref().filter(|e| shifted(e.verdict()))?;
    let mut out = format!(
        "; energy: tokens/J {}{}",
        e.verdict().as_str(),
        size(&e.judgement)
    );
    if !shifted(c.verdict()) {
        out.push_str(" at an unchanged speed");
    }
    // The speed's part of the line names the causes when the speed was blamed on them too.
    if let (HistoryVerdict::Environment, false, Some(f)) = (
        e.verdict(),
        c.verdict() == HistoryVerdict::Environment,
        &c.environment,
    ) {
        out.push_str(&format!(
            ", blamed on the environment: {}",
            f.causes.join("; ")
        ));
    }
    if let Some(v) = e.confirm_value {
        out.push_str(&format!(
            "; the re-run measured {} tok/J",
            crate::format::si(v)
        ));
    }
    Some(out)
}

/// How far a judgement's value lies from what it was judged against, and by which test:
/// ` -3.0% (-7.1 sigma; band +-1.2% around the median of its last 10 runs)`.
fn size(j: &crate::history::detect::Judgement) -> String {
    let mut line = String::new();
    match (j.band, j.rel_change, &j.repeats_test) {
        (Some(b), Some(rel), _) => line.push_str(&format!(
            " {:+.1}% ({}band +-{:.1}% around the median of its last {} runs)",
            rel * 100.0,
            match j.sigmas {
                Some(s) => format!("{s:+.1} sigma; "),
                // Identical earlier nights: no spread to measure a distance in.
                None => "no spread in the history; ".to_string(),
            },
            b.half_width / b.center.abs().max(f64::MIN_POSITIVE) * 100.0,
            b.runs
        )),
        (None, Some(rel), Some(t)) => line.push_str(&format!(
            " {:+.1}% (repeats {} against {} earlier: {}, p={:.3}{})",
            rel * 100.0,
            t.n_after,
            t.n_before,
            t.answer.as_str(),
            t.p_value,
            match t.ci_rel {
                Some((lo, hi)) => format!(
                    ", {:.0}% interval {:+.1}%..{:+.1}%",
                    t.ci_level * 100.0,
                    lo * 100.0,
                    hi * 100.0
                ),
                None => String::new(),
            }
        )),
        (None, Some(rel), None) => line.push_str(&format!(
            " {:+.1}% against the stored baseline (no history yet)",
            rel * 100.0
        )),
        _ if j.verdict == HistoryVerdict::InsufficientHistory => {
            line.push_str(" (no earlier run of this cell: nothing to compare with)")
        }
        _ => {}
    }
    line
}

/// Whether a judged cell needs a reader's eye.
pub(crate) fn remarkable(c: &CellJudgement) -> bool {
    shifted(c.verdict())
        || c.energy_verdict().is_some_and(shifted)
        || matches!(c.numerics, NumericsVerdict::Changed { .. })
        || (c.verdict() == HistoryVerdict::InsufficientHistory && c.baseline_regressed)
        // A disturbed repeat is environment evidence a reader should see whatever the
        // verdict.
        || !c.outliers.is_empty()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::history::detect::{Band, Judgement};
    use crate::history::gate::Since;
    use crate::history::suspects::Change;

    /// A judged regression with every part of its verdict line, for the tests of the
    /// words and of the reports that lay them out.
    pub(crate) fn regressed() -> CellJudgement {
        let mut c = CellJudgement {
            cell_id: "gpt2-125m.bf16.1gpu.single.compile".into(),
            metric: "tokens_per_s".into(),
            value: 487000.0,
            samples: vec![487000.0, 486000.0, 488000.0],
            outliers: vec![],
            judgement: Judgement {
                verdict: HistoryVerdict::Regressed,
                band: Some(Band {
                    center: 500000.0,
                    sigma_history: 1500.0,
                    sigma: 1500.0,
                    half_width: 6000.0,
                    runs: 10,
                }),
                sigmas: Some(-8.67),
                rel_change: Some(-0.026),
                drift: false,
                repeats_test: None,
                reruns_needed: 1,
            },
            confirm_value: Some(486500.0),
            confirm_samples: vec![486500.0],
            confirm_values: vec![],
            confirm_failed: None,
            numerics: NumericsVerdict::Unchanged,
            since: Some(Since {
                run_id: "20261122T020000Z".into(),
                commit: Some("abcdef0123".into()),
                started_at: "2026-11-22T02:00:00Z".into(),
                last_good_run_id: Some("20261121T020000Z".into()),
                last_good_commit: Some("9876543210".into()),
            }),
            baseline_regressed: false,
            environment: None,
            changes: vec![Change {
                what: "BENCH_FUSED_ADAMW".into(),
                before: None,
                after: Some("0".into()),
            }],
            line: String::new(),
            bisect: Some("bench bisect x --good 9876543 --bad abcdef0".into()),
            energy: None,
            last_good_run_id: Some("20261121T020000Z".into()),
            last_good_commit: Some("9876543210".into()),
            pairs: None,
            only_code_changed: false,
            open_regression: false,
        };
        c.line = verdict_line(&c);
        c
    }

    #[test]
    fn a_regression_says_since_when_how_far_and_what_changed() {
        let c = regressed();
        assert!(
            c.line
                .starts_with("regressed -2.6% (-8.7 sigma; band +-1.2%"),
            "{}",
            c.line
        );
        assert!(
            c.line
                .contains("since run 20261122T020000Z (commit abcdef0)"),
            "{}",
            c.line
        );
        assert!(c
            .line
            .contains("last good run 20261121T020000Z (commit 9876543)"));
        assert!(c
            .line
            .contains("changed since: BENCH_FUSED_ADAMW (unset) -> 0"));
    }

    #[test]
    fn an_energy_change_at_the_same_speed_is_named_and_remarkable() {
        let mut c = regressed();
        c.judgement.verdict = HistoryVerdict::Unchanged;
        c.judgement.rel_change = Some(0.001);
        c.since = None;
        c.changes.clear();
        assert!(!remarkable(&c));
        c.energy = Some(crate::history::verdicts::EnergyJudgement {
            metric: "tokens_per_joule".into(),
            value: 812.0,
            samples: vec![812.0, 810.0, 815.0],
            judgement: Judgement {
                verdict: HistoryVerdict::Regressed,
                band: Some(Band {
                    center: 865.0,
                    sigma_history: 5.0,
                    sigma: 5.0,
                    half_width: 20.0,
                    runs: 10,
                }),
                sigmas: Some(-10.6),
                rel_change: Some(-0.0613),
                drift: false,
                repeats_test: None,
                reruns_needed: 1,
            },
            confirm_value: Some(811.0),
        });
        assert!(remarkable(&c));
        let line = verdict_line(&c);
        assert!(line.starts_with("unchanged +0.1%"), "{line}");
        assert!(
            line.contains(
                "; energy: tokens/J regressed -6.1% (-10.6 sigma; band +-2.3% around the median of its last 10 runs) at an unchanged speed; the re-run measured 811 tok/J"
            ),
            "{line}"
        );
        assert!(c.fails_run());
        assert_eq!(c.status_verdict(), HistoryVerdict::Regressed);
        // With the speed regressed too, the clause does not call the speed unchanged.
        c.judgement.verdict = HistoryVerdict::Regressed;
        assert!(!verdict_line(&c).contains("at an unchanged speed"));
    }

    #[test]
    fn unremarkable_cells_add_no_line_but_numerics_do() {
        let mut c = regressed();
        c.judgement.verdict = HistoryVerdict::Unchanged;
        c.since = None;
        assert!(!remarkable(&c));
        c.numerics = NumericsVerdict::Changed {
            step: 3,
            loss: 9.1,
            center: 9.0,
            half_width: 0.01,
        };
        assert!(remarkable(&c));
        assert!(verdict_line(&c).contains("numerics changed"));
    }
}
