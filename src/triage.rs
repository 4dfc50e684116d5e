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

use indexmap::IndexMap;
use serde::Serialize;

use crate::baseline::compare::{CellStatus, MetricComparison};
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
}

impl Finding {
    /// The finding in one line: what changed, where, and why it is thought to.
    pub fn headline(&self) -> String {
        let what = if self.separates.is_empty() {
            format!(
                "{} cell{} {} {}",
                self.cells.len(),
                if self.cells.len() == 1 { "" } else { "s" },
                self.direction,
                pct(self.shift[0])
            )
        } else {
            self.separates.join("; ")
        };
        format!("{}: {what}; cause: {}", self.id, self.cause)
    }

    /// Whether `cell` is one of the finding's.
    pub fn has(&self, cell: &str) -> bool {
        self.cells.iter().any(|(c, _)| c == cell)
    }
}

fn pct(v: f64) -> String {
    format!("{:+.1}%", v * 100.0)
}

/// A changed cell as triage sees it.
struct Changed {
    id: String,
    direction: &'static str,
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

/// The findings of a judged run, regressions first.
pub fn findings(results: &RunResults, verdicts: &Verdicts) -> Vec<Finding> {
    let mut changed = Vec::new();
    for cell in &verdicts.comparison.cells {
        let direction = match cell.status {
            CellStatus::Regression => "regressed",
            CellStatus::Improvement => "improved",
            _ => continue,
        };
        let Some(m) = speed(cell) else { continue };
        let Some(mut shift) = m.change else { continue };
        // A step time that fell is a speed-up: shifts read in the good direction's sign.
        if m.direction == Some(crate::baseline::Direction::Lower) {
            shift = -shift;
        }
        let noise = m.tolerance.unwrap_or(0.0).max(m.noise.unwrap_or(0.0));
        changed.push(Changed {
            id: cell.id.clone(),
            direction,
            shift,
            noise,
            cause: cause_of(verdicts, &cell.id),
        });
    }
    let mut groups: Vec<Vec<Changed>> = Vec::new();
    let mut by_key: IndexMap<(&'static str, String), Vec<Changed>> = IndexMap::new();
    for c in changed {
        by_key
            .entry((c.direction, c.cause.clone()))
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
    groups
        .into_iter()
        .enumerate()
        .map(|(i, g)| finding(i + 1, &g, results, verdicts))
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

fn finding(n: usize, g: &[Changed], results: &RunResults, verdicts: &Verdicts) -> Finding {
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
    let values_of = |id: &str| {
        results
            .cells
            .iter()
            .find(|c| c.id.as_str() == id)
            .map(|c| &c.values)
    };
    // Every axis and value any group cell has.
    let mut axes: IndexMap<String, IndexMap<String, (usize, usize)>> = IndexMap::new();
    for c in g {
        if let Some(values) = values_of(&c.id) {
            for (axis, v) in values {
                let e = axes
                    .entry(axis.clone())
                    .or_default()
                    .entry(v.id_fragment())
                    .or_default();
                e.0 += 1;
            }
        }
    }
    for id in &unchanged {
        if let Some(values) = values_of(id) {
            for (axis, v) in values {
                if let Some(per) = axes.get_mut(axis) {
                    per.entry(v.id_fragment()).or_default().1 += 1;
                }
            }
        }
    }
    let mut separates = Vec::new();
    let mut against = Vec::new();
    let size = g.len();
    let range = if size > 1 {
        format!(", {}..{}", pct(shift[1]), pct(shift[2]))
    } else {
        String::new()
    };
    for (axis, per) in &axes {
        // An axis on which every cell of the run has one value separates nothing.
        let run_values: usize = per.len();
        for (value, (changed, same)) in per {
            if *changed == size && *same == 0 && (run_values > 1 || !unchanged.is_empty()) {
                let mut s = format!(
                    "every {axis}={value} cell {} {} ({size} of {size}{range})",
                    g[0].direction,
                    pct(shift[0])
                );
                let others: Vec<(&String, usize)> = per
                    .iter()
                    .filter(|(v, _)| *v != value)
                    .map(|(v, (_, same))| (v, *same))
                    .filter(|(_, same)| *same > 0)
                    .collect();
                if !others.is_empty() {
                    let names: Vec<String> =
                        others.iter().map(|(v, _)| format!("{axis}={v}")).collect();
                    let total: usize = others.iter().map(|(_, n)| n).sum();
                    s.push_str(&format!(
                        "; no {} cell changed (0 of {total})",
                        names.join(" or ")
                    ));
                }
                separates.push(s);
            } else if *changed == size && *same > 0 {
                against.push(format!(
                    "{axis}={value}: every cell of the finding has it, but {same} {axis}={value} cell{} did not change",
                    if *same == 1 { "" } else { "s" }
                ));
            }
        }
    }
    // Where no value holds every cell, the value holding most of them, as evidence.
    if separates.is_empty() {
        let best = axes
            .iter()
            .flat_map(|(a, per)| per.iter().map(move |(v, n)| (a, v, *n)))
            .filter(|(_, _, (changed, _))| *changed < size && *changed > 0)
            .max_by(|x, y| x.2 .0.cmp(&y.2 .0).then(y.2 .1.cmp(&x.2 .1)));
        if let Some((axis, value, (changed, same))) = best {
            against.push(format!(
                "no axis value holds every cell: {axis}={value} holds {changed} of {size} ({same} {axis}={value} cell{} unchanged)",
                if same == 1 { "" } else { "s" }
            ));
        } else if unchanged.is_empty() {
            against.push(format!(
                "every measured cell of the run changed ({size}): no axis separates them"
            ));
        }
    }
    let mut cells: Vec<(String, f64)> = g.iter().map(|c| (c.id.clone(), c.shift)).collect();
    cells.sort_by(|a, b| a.0.cmp(&b.0));
    Finding {
        id: format!("F{n}"),
        direction: g[0].direction,
        cause: g[0].cause.clone(),
        cells,
        shift,
        separates,
        against,
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
        let mut results: RunResults =
            serde_json::from_str(include_str!("../tests/fixtures/runs/cpu-ok/results.json"))
                .unwrap();
        let template = results.cells[0].clone();
        results.cells.clear();
        let mut cmp = Comparison {
            hardware_key: "cpu".into(),
            baseline_file: "baselines/cpu.json".into(),
            baseline_exists: true,
            history_scope: None,
            cells: Vec::new(),
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
        let sac = f.iter().find(|x| x.cells.len() == 1).unwrap();
        assert!(
            sac.separates
                .iter()
                .any(|s| s.starts_with("every dtype=bf16 cell"))
                || !sac.against.is_empty(),
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
