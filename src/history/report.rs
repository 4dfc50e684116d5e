//! The Markdown lines a run judged against its history adds to the job summary and the
//! PR/MR comment: per cell that needs a reader's eye (regressed, improved, suspect,
//! throttled, numerics changed), the change against the history's median, how far outside
//! the cell's normal spread that is (in robust standard deviations, 1.4826 x MAD), and since
//! which run and commit. Reports call [`markdown`] with the run's `history.json`
//! ([`super::gate::GateReport::load`]).

use super::detect::{HistoryVerdict, NumericsVerdict};
use super::gate::{CellJudgement, GateReport};

fn short(commit: &Option<String>) -> String {
    match commit {
        Some(c) => format!("`{}`", &c[..c.len().min(7)]),
        None => "unknown commit".into(),
    }
}

/// One line about one cell, or `None` when it is unremarkable.
pub(crate) fn cell_line(c: &CellJudgement) -> Option<String> {
    let verdict = c.verdict();
    let numerics = matches!(c.numerics, NumericsVerdict::Changed { .. });
    let speed_news = matches!(
        verdict,
        HistoryVerdict::Regressed
            | HistoryVerdict::Improved
            | HistoryVerdict::Suspect
            | HistoryVerdict::Throttled
    ) || (verdict == HistoryVerdict::InsufficientHistory && c.baseline_regressed);
    if !speed_news && !numerics {
        return None;
    }
    let mut line = format!("- **{}** `{}`", verdict.as_str(), c.cell_id);
    if let (Some(b), Some(rel)) = (c.judgement.band, c.judgement.rel_change) {
        line.push_str(&format!(
            ": {:.4} {} is {:+.1}% against the median of the last {} runs ({:+.1} sigma; the band is +-{:.1}%)",
            c.value,
            c.metric,
            rel * 100.0,
            b.runs,
            c.judgement.sigmas.unwrap_or(0.0),
            b.half_width / b.center.abs().max(f64::MIN_POSITIVE) * 100.0
        ));
    } else if let Some(rel) = c.judgement.rel_change {
        line.push_str(&format!(
            ": {:+.1}% against the stored baseline (too little history to judge)",
            rel * 100.0
        ));
    }
    if c.judgement.drift {
        line.push_str("; the recent runs have all drifted past the baseline's tolerance");
    }
    if let Some(v) = c.confirm_value {
        line.push_str(&format!("; the re-run measured {v:.4}"));
    }
    if let Some(s) = &c.since {
        line.push_str(&format!(
            ", since run `{}` (commit {})",
            s.run_id,
            short(&s.commit)
        ));
        if let Some(good) = &s.last_good_run_id {
            line.push_str(&format!(
                "; last good run `{good}` (commit {})",
                short(&s.last_good_commit)
            ));
        }
    }
    if verdict == HistoryVerdict::Throttled {
        line.push_str(&format!(
            "; the GPU reported {} during the run, so the code is not blamed",
            c.throttle_reasons.join(", ")
        ));
    }
    if let NumericsVerdict::Changed {
        step,
        loss,
        center,
        half_width,
    } = &c.numerics
    {
        line.push_str(&format!(
            "; **numerics changed**: the seeded loss at step {step} is {loss:.5}, outside {center:.5} +- {half_width:.5}"
        ));
    }
    Some(line)
}

/// The section for a run (empty when no cell needs attention and nothing was judged).
pub fn markdown(r: &GateReport) -> String {
    if r.cells.is_empty() {
        return String::new();
    }
    let count = |v: HistoryVerdict| r.cells.iter().filter(|c| c.verdict() == v).count();
    let mut out = format!(
        "### Against history ({} on `{}`)\n\n{} regressed, {} improved, {} suspect, {} throttled, {} unchanged, {} with too little history",
        r.store,
        r.hardware_key,
        count(HistoryVerdict::Regressed),
        count(HistoryVerdict::Improved),
        count(HistoryVerdict::Suspect),
        count(HistoryVerdict::Throttled),
        count(HistoryVerdict::Unchanged),
        count(HistoryVerdict::InsufficientHistory),
    );
    if let Some(c) = &r.confirm_run_id {
        out.push_str(&format!(" (suspects re-run in `{c}`)"));
    }
    out.push_str(".\n\n");
    let lines: Vec<String> = r.cells.iter().filter_map(cell_line).collect();
    for l in &lines {
        out.push_str(l);
        out.push('\n');
    }
    if !lines.is_empty() {
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::detect::{Band, Judgement, Policy};
    use crate::history::gate::Since;

    fn regressed() -> CellJudgement {
        CellJudgement {
            cell_id: "gpt2-125m.bf16.1gpu.single.compile".into(),
            metric: "tokens_per_s".into(),
            value: 487000.0,
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
            },
            confirm_value: Some(486500.0),
            numerics: NumericsVerdict::Unchanged,
            since: Some(Since {
                run_id: "20261122T020000Z".into(),
                commit: Some("abcdef0123".into()),
                started_at: "2026-11-22T02:00:00Z".into(),
                last_good_run_id: Some("20261121T020000Z".into()),
                last_good_commit: Some("9876543210".into()),
            }),
            baseline_regressed: false,
            throttle_reasons: vec![],
        }
    }

    #[test]
    fn a_regression_says_since_when_and_how_far_outside_the_spread() {
        let r = GateReport {
            run_id: "20261122T020000Z".into(),
            hardware_key: "h100-sxm-80gb".into(),
            store: "bench-history.sqlite".into(),
            policy: Policy::default(),
            confirm_run_id: Some("20261122T020000Z-confirm".into()),
            cells: vec![regressed()],
        };
        let md = markdown(&r);
        assert!(md.contains("1 regressed, 0 improved"), "{md}");
        assert!(
            md.contains("-2.6% against the median of the last 10 runs (-8.7 sigma"),
            "{md}"
        );
        assert!(
            md.contains("since run `20261122T020000Z` (commit `abcdef0`)"),
            "{md}"
        );
        assert!(
            md.contains("last good run `20261121T020000Z` (commit `9876543`)"),
            "{md}"
        );
    }

    #[test]
    fn unremarkable_cells_add_no_line() {
        let mut c = regressed();
        c.judgement.verdict = HistoryVerdict::Unchanged;
        c.since = None;
        assert_eq!(cell_line(&c), None);
        c.numerics = NumericsVerdict::Changed {
            step: 3,
            loss: 9.1,
            center: 9.0,
            half_width: 0.01,
        };
        assert!(cell_line(&c).unwrap().contains("numerics changed"));
    }
}
