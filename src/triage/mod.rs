//! The triage stage: the judge's verdicts on a run -> findings, one per cause.
//!
//! A nightly in which one change touches every fp8 cell gives a verdict per cell; a reader
//! wants one finding: "every dtype=fp8 cell -4.1% (12 of 12, -3.8..-4.4%); no dtype=bf16
//! cell changed (0 of 24)". [`findings`] groups the cells whose verdicts share a cause (the
//! same direction, the same suspects: commit range, switches, versions, environment) and
//! whose shifts are alike within their noise, then finds the axis values that separate the
//! group's cells from the cells of the run that did not change (factor attribution over the
//! matrix's axes), with the evidence for and against. A run with two independent causes
//! gives two findings. The reports render the findings they are given (`crate::report`);
//! this stage opens no store and runs nothing.
//!
//! The command layer then asks more of a finding whose cause is a commit range: the first
//! bad commit, found by bisecting its cheapest cell ([`culprit`], filled by
//! `crate::commands::triage` through `crate::bisect`), and the kernels that moved between
//! the last good and the first bad commit ([`kernels`]).

pub mod culprit;
pub mod kernels;

use indexmap::IndexMap;
use serde::Serialize;

use crate::baseline::compare::{CellStatus, MetricComparison, Verdict};
use crate::format::pct_change;
use crate::judge::Verdicts;
use crate::metrics::catalog;
use crate::results::RunResults;

/// One cause and the cells it changed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// `F1`, `F2`, ... in the order the reports list them (regressions first, then by the
    /// number of cells).
    pub id: String,
    /// `regressed` or `improved`.
    pub direction: &'static str,
    /// The label of the metric the cells changed in, when it is not their speed (an energy
    /// change at an unchanged speed: `tokens/J`); absent for a change of speed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metric: Option<&'static str>,
    /// What the verdicts name as changed since the last good run (commit range, switches,
    /// versions), or how the cells were judged when nothing is named.
    pub cause: String,
    /// The group's cells with their shift (relative change of the speed metric).
    pub cells: Vec<(String, f64)>,
    /// Median, lowest and highest shift of the group.
    pub shift: [f64; 3],
    /// The axis values that separate the group from the unchanged cells, each a sentence
    /// with its counts ("every dtype=fp8 cell -4.1% (12 of 12, -3.8..-4.4%)").
    pub separates: Vec<String>,
    /// The evidence against an attribution (cells of the value that did not change, or the
    /// group's cells without it).
    pub against: Vec<String>,
    /// The commit range the verdicts name among the causes (the last good run's commit and
    /// this run's, full shas): what the automatic bisection walks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commits: Option<[String; 2]>,
    /// The automatic bisection of the finding's commit range, when one was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bisected: Option<culprit::Bisected>,
    /// The kernels that moved between the last good and the first bad commit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernels: Option<kernels::KernelDiff>,
    /// Why there is no kernel diff although the first bad commit is known (the workload
    /// wrote no trace, a trace could not be read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernels_missing: Option<String>,
}

impl Finding {
    /// The finding in one line: what changed, where, and why it is thought to.
    pub fn headline(&self) -> String {
        let mut line = format!("{}: {}", self.id, self.headline_body());
        if let Some(c) = self.bisected.as_ref().and_then(|b| b.first_bad.as_ref()) {
            line.push_str(&format!("; first bad commit {}", c.render()));
        }
        if let Some(k) = &self.kernels {
            line.push_str(&format!("; kernels: {}", k.summary()));
        }
        line
    }

    /// [`Finding::headline`] without its id, the first bad commit and the kernels (which the
    /// Markdown and HTML reports give lines of their own).
    pub fn headline_body(&self) -> String {
        let what = if self.separates.is_empty() {
            format!(
                "{} cell{} {} {}",
                self.cells.len(),
                if self.cells.len() == 1 { "" } else { "s" },
                moved(self.direction, self.metric),
                pct_change(self.shift[0])
            )
        } else {
            self.separates.join("; ")
        };
        format!("{what}; cause: {}", self.cause)
    }

    /// Whether `cell` is one of the finding's.
    pub fn has(&self, cell: &str) -> bool {
        self.cells.iter().any(|(c, _)| c == cell)
    }
}

/// `regressed`, or `regressed in tokens/J` for a change of a metric that is not the speed.
fn moved(direction: &str, metric: Option<&str>) -> String {
    match metric {
        Some(m) => format!("{direction} in {m}"),
        None => direction.to_string(),
    }
}

/// A changed cell as triage sees it.
struct Changed {
    id: String,
    direction: &'static str,
    /// The metric's label when the change is not the speed's (see [`Finding::metric`]).
    metric: Option<&'static str>,
    shift: f64,
    /// The relative noise its verdict allowed (band half-width or tolerance).
    noise: f64,
    cause: String,
}

/// The speed metric a cell's verdict was decided on, first of the catalog's speed metrics
/// the comparison has with a change.
fn speed(cell: &crate::baseline::compare::CellComparison) -> Option<&MetricComparison> {
    catalog::speed_metrics().find_map(|m| cell.metric(m).filter(|mc| mc.change.is_some()))
}

/// The metric a changed cell's finding is about: its speed, unless its speed did not move
/// the way its status says and its energy did (a change in energy at the same speed is a
/// finding of its own, and its shift is the energy's).
fn decisive(
    cell: &crate::baseline::compare::CellComparison,
    wanted: Verdict,
) -> Option<(&MetricComparison, Option<&'static str>)> {
    let speed = speed(cell);
    if speed.is_some_and(|m| m.verdict == wanted) {
        return speed.map(|m| (m, None));
    }
    let energy = ["tokens_per_joule", "kwh_per_1t_tokens"]
        .iter()
        .find_map(|name| {
            cell.metric(name)
                .filter(|m| m.verdict == wanted && m.change.is_some())
        });
    match energy {
        Some(m) => Some((m, catalog::get(&m.metric).map(|c| c.label))),
        None => speed.map(|m| (m, None)),
    }
}

/// The findings of a judged run, regressions first.
pub fn findings(results: &RunResults, verdicts: &Verdicts) -> Vec<Finding> {
    let mut changed = Vec::new();
    for cell in &verdicts.comparison.cells {
        let (direction, wanted) = match cell.status {
            CellStatus::Regression => ("regressed", Verdict::Regression),
            CellStatus::Improvement => ("improved", Verdict::Improvement),
            _ => continue,
        };
        let Some((m, metric)) = decisive(cell, wanted) else {
            continue;
        };
        let Some(mut shift) = m.change else { continue };
        // A step time that fell is a speed-up: shifts read in the good direction's sign.
        if m.direction == Some(crate::baseline::Direction::Lower) {
            shift = -shift;
        }
        let noise = m.tolerance.unwrap_or(0.0).max(m.noise.unwrap_or(0.0));
        changed.push(Changed {
            id: cell.id.clone(),
            direction,
            metric,
            shift,
            noise,
            cause: cause_of(verdicts, &cell.id),
        });
    }
    let mut groups: Vec<Vec<Changed>> = Vec::new();
    // Cells changed in different metrics are different findings, whatever their cause.
    let mut by_key: IndexMap<(&'static str, Option<&'static str>, String), Vec<Changed>> =
        IndexMap::new();
    for c in changed {
        by_key
            .entry((c.direction, c.metric, c.cause.clone()))
            .or_default()
            .push(c);
    }
    for (_, mut cells) in by_key {
        // Alike within their noise: sorted by shift, a new group starts where the gap to the
        // previous cell is wider than either cell's own noise allows (single linkage).
        cells.sort_by(|a, b| a.shift.total_cmp(&b.shift));
        let mut group: Vec<Changed> = Vec::new();
        for c in cells {
            if let Some(prev) = group.last() {
                let allowed = prev.noise.max(c.noise).max(1e-9);
                if (c.shift - prev.shift).abs() > allowed {
                    groups.push(std::mem::take(&mut group));
                }
            }
            group.push(c);
        }
        if !group.is_empty() {
            groups.push(group);
        }
    }
    groups.sort_by(|a, b| {
        (a[0].direction != "regressed")
            .cmp(&(b[0].direction != "regressed"))
            .then(b.len().cmp(&a.len()))
    });
    let all: Vec<String> = groups.iter().flatten().map(|c| c.id.clone()).collect();
    groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let elsewhere: Vec<&str> = all
                .iter()
                .map(String::as_str)
                .filter(|id| !g.iter().any(|c| c.id == *id))
                .collect();
            finding(i + 1, g, &elsewhere, results, verdicts)
        })
        .collect()
}

/// What the verdicts name as changed for `cell`: the history's suspects, else how it was
/// judged.
fn cause_of(verdicts: &Verdicts, cell: &str) -> String {
    let judged = verdicts
        .history
        .as_ref()
        .and_then(|h| h.cells.iter().find(|c| c.cell_id == cell));
    match judged {
        Some(j) if !j.changes.is_empty() => {
            let mut parts: Vec<String> = j.changes.iter().map(|c| c.render()).collect();
            parts.sort();
            parts.join("; ")
        }
        Some(j) => match &j.since {
            Some(s) => format!(
                "no recorded change since run {}",
                s.last_good_run_id.as_deref().unwrap_or("unknown")
            ),
            None => "no recorded change".to_string(),
        },
        None => "against the baselines (no history names a change)".to_string(),
    }
}

/// The commit range the history names for `cell` (full shas), when it names one.
fn commits_of(verdicts: &Verdicts, cell: &str) -> Option<[String; 2]> {
    let judged = verdicts
        .history
        .as_ref()?
        .cells
        .iter()
        .find(|c| c.cell_id == cell)?;
    let c = judged.changes.iter().find(|c| c.what == "commit")?;
    Some([c.before.clone()?, c.after.clone()?])
}

fn finding(
    n: usize,
    g: &[Changed],
    elsewhere: &[&str],
    results: &RunResults,
    verdicts: &Verdicts,
) -> Finding {
    let mut shifts: Vec<f64> = g.iter().map(|c| c.shift).collect();
    shifts.sort_by(f64::total_cmp);
    let median = crate::metrics::stats::median(&shifts).unwrap_or(0.0);
    let shift = [median, shifts[0], shifts[shifts.len() - 1]];
    // The cells of the run that were measured and did not change: the other side of the
    // attribution. Cells another finding holds are neither.
    let unchanged: Vec<&str> = verdicts
        .comparison
        .cells
        .iter()
        .filter(|c| c.status == CellStatus::Unchanged)
        .map(|c| c.id.as_str())
        .collect();
    let in_group = |id: &str| g.iter().any(|c| c.id == id);
    // The measured cells of the run with their axis values: this finding's, those another
    // cause changed, and the unchanged ones.
    let measured: Vec<(&str, Vec<(String, String)>)> = results
        .cells
        .iter()
        .filter(|c| {
            let id = c.id.as_str();
            in_group(id) || unchanged.contains(&id) || elsewhere.contains(&id)
        })
        .map(|c| {
            let values = c
                .values
                .iter()
                .map(|(a, v)| (a.clone(), v.id_fragment()))
                .collect();
            (c.id.as_str(), values)
        })
        .collect();
    let values_of = |id: &str| measured.iter().find(|(c, _)| *c == id).map(|(_, v)| v);
    // The axis values every cell of the finding has: a separating predicate is made of them.
    let mut shared: Vec<(String, String)> = values_of(&g[0].id).cloned().unwrap_or_default();
    for c in &g[1..] {
        let vs = values_of(&c.id).cloned().unwrap_or_default();
        shared.retain(|p| vs.contains(p));
    }
    // The measured cells outside the finding that satisfy every pair of `pred`.
    let outside = |pred: &[&(String, String)]| -> (usize, usize) {
        let mut same = 0;
        let mut other = 0;
        for (id, vs) in &measured {
            if in_group(id) || !pred.iter().all(|p| vs.contains(p)) {
                continue;
            }
            if unchanged.contains(id) {
                same += 1;
            } else {
                other += 1;
            }
        }
        (same, other)
    };
    let size = g.len();
    let range = if size > 1 {
        format!(", {}..{}", pct_change(shift[1]), pct_change(shift[2]))
    } else {
        String::new()
    };
    let every = |pred: &[&(String, String)]| {
        let names: Vec<String> = pred.iter().map(|(a, v)| format!("{a}={v}")).collect();
        format!(
            "every {} cell {} {} ({size} of {size}{range})",
            names.join(", "),
            moved(g[0].direction, g[0].metric),
            pct_change(shift[0])
        )
    };
    // With no measured cell outside the finding, every value its cells share "separates"
    // it, which says nothing (a one-cell nightly would list each of its axes): no value is
    // named, and the evidence against says why.
    if measured.iter().all(|(id, _)| in_group(id)) {
        shared.clear();
    }
    let mut separates = Vec::new();
    let mut against = Vec::new();
    for p in &shared {
        if outside(&[p]) != (0, 0) {
            continue;
        }
        let mut s = every(&[p]);
        // The other values of the axis whose every cell held still.
        let (axis, value) = p;
        let mut others: IndexMap<&str, (usize, bool)> = IndexMap::new();
        for (id, vs) in &measured {
            if let Some((_, v)) = vs.iter().find(|(a, v)| a == axis && v != value) {
                let e = others.entry(v.as_str()).or_insert((0, true));
                if unchanged.contains(id) {
                    e.0 += 1;
                } else {
                    e.1 = false;
                }
            }
        }
        let still: Vec<(&str, usize)> = others
            .iter()
            .filter(|(_, (n, all))| *all && *n > 0)
            .map(|(v, (n, _))| (*v, *n))
            .collect();
        if !still.is_empty() {
            let names: Vec<String> = still.iter().map(|(v, _)| format!("{axis}={v}")).collect();
            let n: usize = still.iter().map(|(_, n)| n).sum();
            s.push_str(&format!(
                "; no {} cell changed (0 of {n})",
                names.join(" or ")
            ));
        }
        separates.push(s);
    }
    // No one value: two together, as "the sac cells of bf16".
    if separates.is_empty() {
        for (i, p) in shared.iter().enumerate() {
            for q in &shared[i + 1..] {
                if outside(&[p, q]) == (0, 0) && outside(&[p]) != (0, 0) && outside(&[q]) != (0, 0)
                {
                    separates.push(every(&[p, q]));
                }
            }
        }
    }
    if separates.is_empty() {
        // The shared value with the fewest cells outside the finding, as the evidence against.
        let best = shared
            .iter()
            .map(|p| (p, outside(&[p])))
            .min_by_key(|(_, (same, other))| same + other);
        match best {
            Some(((axis, value), (same, other))) => {
                let mut s = format!("{axis}={value}: every cell of the finding has it, but");
                if same > 0 {
                    s.push_str(&format!(
                        " {same} {axis}={value} cell{} did not change",
                        if same == 1 { "" } else { "s" }
                    ));
                }
                if other > 0 {
                    s.push_str(&format!(
                        "{} {other} changed by another cause",
                        if same > 0 { " and" } else { "" }
                    ));
                }
                against.push(s);
            }
            None if unchanged.is_empty() && elsewhere.is_empty() => against.push(format!(
                "every measured cell of the run changed ({size}): no axis separates them"
            )),
            None => against.push(
                "the finding's cells share no axis value: they may have more than one cause".into(),
            ),
        }
    }
    let mut cells: Vec<(String, f64)> = g.iter().map(|c| (c.id.clone(), c.shift)).collect();
    cells.sort_by(|a, b| a.0.cmp(&b.0));
    Finding {
        id: format!("F{n}"),
        direction: g[0].direction,
        metric: g[0].metric,
        cause: g[0].cause.clone(),
        cells,
        shift,
        separates,
        against,
        commits: commits_of(verdicts, &g[0].id),
        bisected: None,
        kernels: None,
        kernels_missing: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::baseline::compare::{CellComparison, Comparison, Verdict};
    use crate::baseline::Direction;
    use crate::cell::Value;

    /// A run of dtype x features cells where `slow(dtype, features)` gives each cell's shift
    /// (0: unchanged), with a 2% tolerance.
    fn run(slow: impl Fn(&str, &str) -> f64) -> (RunResults, Verdicts) {
        let mut results: RunResults = serde_json::from_str(include_str!(
            "../../tests/fixtures/runs/cpu-ok/results.json"
        ))
        .unwrap();
        let template = results.cells[0].clone();
        results.cells.clear();
        let mut cmp = Comparison {
            hardware_key: "cpu".into(),
            baseline_file: "baselines/cpu.json".into(),
            baseline_exists: true,
            history_scope: None,
            cells: Vec::new(),
            run_failures: Vec::new(),
        };
        for dtype in ["bf16", "fp8"] {
            for features in ["base", "compile", "sac"] {
                let id = format!("m.{dtype}.{features}");
                let mut c = template.clone();
                c.values = IndexMap::new();
                c.values.insert("model".into(), Value::Str("m".into()));
                c.values.insert("dtype".into(), Value::Str(dtype.into()));
                c.values
                    .insert("features".into(), Value::Str(features.into()));
                c.id = crate::cell::CellId::from_values(&c.values);
                results.cells.push(c);
                let s = slow(dtype, features);
                let status = if s < 0.0 {
                    CellStatus::Regression
                } else if s > 0.0 {
                    CellStatus::Improvement
                } else {
                    CellStatus::Unchanged
                };
                cmp.cells.push(CellComparison {
                    id,
                    status,
                    reason: None,
                    flaky: false,
                    duration_s: Some(1.0),
                    metrics: vec![MetricComparison {
                        metric: "tokens_per_s".into(),
                        verdict: Verdict::Unchanged,
                        current: Some(100.0 * (1.0 + s)),
                        baseline: Some(100.0),
                        change: Some(s),
                        direction: Some(Direction::Higher),
                        tolerance: Some(0.02),
                        floor: None,
                        current_spread: None,
                        baseline_spread: None,
                        noise: Some(0.01),
                    }],
                    baseline_provenance: None,
                });
            }
        }
        let verdicts = Verdicts {
            comparison: cmp,
            history: None,
            trends: None,
        };
        (results, verdicts)
    }

    #[test]
    fn a_finding_with_every_measured_cell_names_no_axis_value() {
        // Every cell slowed alike: "every model=m cell" (and every other shared value) would
        // separate it from nothing. As on a one-cell nightly, no value is named.
        let (results, verdicts) = run(|_, _| -0.04);
        let f = findings(&results, &verdicts);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert!(f[0].separates.is_empty(), "{:?}", f[0].separates);
        assert_eq!(
            f[0].against,
            ["every measured cell of the run changed (6): no axis separates them"]
        );
        assert!(
            f[0].headline().starts_with("F1: 6 cells regressed -4.0%"),
            "{}",
            f[0].headline()
        );
    }

    #[test]
    fn one_cause_on_one_axis_value_is_one_finding_naming_it() {
        let (r, v) = run(|d, _| if d == "fp8" { -0.041 } else { 0.0 });
        let f = findings(&r, &v);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].cells.len(), 3);
        assert_eq!(
            f[0].separates,
            vec!["every dtype=fp8 cell regressed -4.1% (3 of 3, -4.1%..-4.1%); no dtype=bf16 cell changed (0 of 3)"]
        );
        assert!(f[0]
            .headline()
            .starts_with("F1: every dtype=fp8 cell regressed"));
    }

    #[test]
    fn two_causes_of_different_size_are_two_findings() {
        // fp8 cells 4% slower; the sac cells of bf16 20% slower: shifts apart by far more
        // than their noise.
        let (r, v) = run(|d, f| match (d, f) {
            ("fp8", _) => -0.04,
            ("bf16", "sac") => -0.20,
            _ => 0.0,
        });
        let f = findings(&r, &v);
        assert_eq!(f.len(), 2, "{f:#?}");
        let fp8 = f.iter().find(|x| x.cells.len() == 3).unwrap();
        assert!(
            fp8.separates[0].starts_with("every dtype=fp8 cell"),
            "{fp8:#?}"
        );
        // The one slowed bf16 cell: neither bf16 (its base and compile cells held still)
        // nor sac (the fp8 sac cell changed by the other cause) alone, but both together.
        let sac = f.iter().find(|x| x.cells.len() == 1).unwrap();
        assert_eq!(
            sac.separates,
            vec!["every dtype=bf16, features=sac cell regressed -20.0% (1 of 1)"],
            "{sac:#?}"
        );
        assert!(sac.has("m.bf16.sac"));
    }

    #[test]
    fn a_clean_run_has_no_finding_and_improvements_come_after_regressions() {
        let (r, v) = run(|_, _| 0.0);
        assert!(findings(&r, &v).is_empty());
        let (r, v) = run(|d, f| match (d, f) {
            ("bf16", "compile") => 0.10,
            ("fp8", "compile") => -0.10,
            _ => 0.0,
        });
        let f = findings(&r, &v);
        assert_eq!(f.len(), 2);
        assert_eq!((f[0].id.as_str(), f[0].direction), ("F1", "regressed"));
        assert_eq!((f[1].id.as_str(), f[1].direction), ("F2", "improved"));
    }

    #[test]
    fn an_energy_change_at_the_same_speed_is_a_finding_in_tokens_per_joule() {
        // Every fp8 cell as fast as before but 6% fewer tokens per joule.
        let (r, mut v) = run(|_, _| 0.0);
        for c in v
            .comparison
            .cells
            .iter_mut()
            .filter(|c| c.id.contains("fp8"))
        {
            c.status = CellStatus::Regression;
            c.metrics.push(MetricComparison {
                metric: "tokens_per_joule".into(),
                verdict: Verdict::Regression,
                current: Some(94.0),
                baseline: Some(100.0),
                change: Some(-0.06),
                direction: Some(Direction::Higher),
                tolerance: Some(0.08),
                floor: None,
                current_spread: None,
                baseline_spread: None,
                noise: Some(0.0),
            });
        }
        let f = findings(&r, &v);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].metric, Some("tokens/J"));
        assert_eq!(
            f[0].separates,
            vec!["every dtype=fp8 cell regressed in tokens/J -6.0% (3 of 3, -6.0%..-6.0%); no dtype=bf16 cell changed (0 of 3)"]
        );
    }

    #[test]
    fn a_value_that_unchanged_cells_share_is_evidence_against() {
        // Two of three fp8 cells slower: no value holds every changed cell without
        // unchanged ones.
        let (r, v) = run(|d, f| if d == "fp8" && f != "sac" { -0.05 } else { 0.0 });
        let f = findings(&r, &v);
        assert_eq!(f.len(), 1);
        assert!(
            f[0].against
                .iter()
                .any(|a| a.contains("dtype=fp8") && a.contains("did not change")),
            "{:#?}",
            f[0]
        );
    }
}
