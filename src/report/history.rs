//! The history's judgement as `summary.md` and the PR/MR comment show it: the counts, the
//! verdict lines of the cells that need a reader's eye (the words the judge wrote,
//! [`crate::history::words`]) and, for each regression, the `bench bisect` command that
//! finds its commit. It renders a [`GateReport`] it is given; it opens no store.

use crate::history::detect::HistoryVerdict;
use crate::history::gate::GateReport;
use crate::history::words::remarkable;
use crate::report::escape::{code, text};

/// The history section of `summary.md` and the PR/MR comment (empty when nothing was
/// judged).
pub fn markdown(r: &GateReport) -> String {
    if r.cells.is_empty() {
        return String::new();
    }
    let count = |v: HistoryVerdict| r.cells.iter().filter(|c| c.verdict() == v).count();
    let mut out = format!(
        "#### Against history ({})\n\n{} regressed, {} improved, {} environment, {} suspect, {} unknown, {} unchanged, {} with no history",
        text(&r.scope),
        count(HistoryVerdict::Regressed),
        count(HistoryVerdict::Improved),
        count(HistoryVerdict::Environment),
        count(HistoryVerdict::Suspect),
        count(HistoryVerdict::Unknown),
        count(HistoryVerdict::Unchanged),
        count(HistoryVerdict::InsufficientHistory),
    );
    // The energy verdicts, when the cells' power was read and any of them moved.
    let energy = |v: HistoryVerdict| {
        r.cells
            .iter()
            .filter(|c| c.energy_verdict() == Some(v))
            .count()
    };
    let (worse, better) = (
        energy(HistoryVerdict::Regressed),
        energy(HistoryVerdict::Improved),
    );
    if worse + better > 0 {
        out.push_str(&format!(
            "; in tokens/J {worse} regressed, {better} improved"
        ));
    }
    if let Some(c) = &r.confirm_run_id {
        out.push_str(&format!(" (re-run to confirm in {})", code(c)));
    }
    out.push_str(".\n\n");
    let mut any = false;
    for c in r.cells.iter().filter(|c| remarkable(c)) {
        any = true;
        out.push_str(&format!("- {}: {}\n", code(&c.cell_id), code(&c.line)));
        if let Some(cmd) = &c.bisect {
            out.push_str(&format!("  - find the commit: {}\n", code(cmd)));
        }
    }
    // Every cell measured side by side, remarkable or not: a pull request's reader sees each
    // cell's ratio to its merge-base, and a nightly's the evidence behind each verdict.
    let paired: Vec<_> = r.cells.iter().filter_map(|c| c.pairs.as_ref()).collect();
    if !paired.is_empty() {
        if any {
            out.push('\n');
        }
        any = false;
        out.push_str(&side_by_side(&paired));
    }
    if !r.over_budget.is_empty() {
        any = true;
        out.push_str(&format!(
            "- not confirmed (budget): {}\n",
            r.over_budget
                .iter()
                .map(|c| code(c))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if any {
        out.push('\n');
    }
    out
}

/// The table of the cells measured side by side: each against its last good commit (a
/// nightly) or its merge-base (a pull request), the ratio's change with its interval, the
/// pairs and their answer, and what they cost.
fn side_by_side(pairs: &[&crate::history::gate::SideBySide]) -> String {
    let mut out = String::from(
        "Side by side (the last good commit A and this run's B in this job, alternating A B B A, each repeat its own process):\n\n| cell | A | B vs A | interval | pairs | answer | GPU-s |\n|---|---|---:|---|---:|---|---:|\n",
    );
    for p in pairs {
        let short: String = p.base_commit.chars().take(7).collect();
        let (change, interval, n, answer) = match p.measured() {
            Some(r) => (
                format!("{:+.1}%", r.change_rel * 100.0),
                r.ci_rel
                    .map(|(lo, hi)| {
                        format!(
                            "{:+.1}%..{:+.1}% ({:.1}%)",
                            lo * 100.0,
                            hi * 100.0,
                            r.ci_level * 100.0
                        )
                    })
                    .unwrap_or_else(|| "-".into()),
                r.pairs.to_string(),
                r.answer.as_str().to_string(),
            ),
            _ => ("-".into(), "-".into(), "0".into(), "not measured".into()),
        };
        let answer = match &p.stopped {
            Some(why) => format!("{answer}: {}", text(why)),
            None => answer,
        };
        out.push_str(&format!(
            "| {} | {} | {change} | {interval} | {n} | {answer} | {:.0} |\n",
            code(&p.cell_id),
            code(&short),
            p.gpu_s
        ));
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::detect::Policy;
    use crate::history::words::tests::regressed;

    #[test]
    fn a_regression_names_its_bisect_command() {
        let c = regressed();
        let r = GateReport {
            run_id: "20261122T020000Z".into(),
            hardware_key: "h100-sxm-80gb".into(),
            store: "bench-history.sqlite".into(),
            policy: Policy::default(),
            scope: "runs of branch main".into(),
            confirm_run_id: Some("20261122T020000Z-confirm".into()),
            over_budget: vec![],
            cells: vec![c],
            reruns_gpu_s: 0.0,
            reruns_gpu_s_by_cell: Default::default(),
        };
        let md = markdown(&r);
        assert!(md.contains("1 regressed, 0 improved"), "{md}");
        assert!(md.contains("find the commit: `bench bisect"), "{md}");
    }

    #[test]
    fn values_cannot_leave_their_code_span() {
        assert_eq!(code("a`b"), "``a`b``");
        assert_eq!(code("`x"), "`` `x ``");
        assert_eq!(code("line\nbreak"), "`line break`");
    }
}
