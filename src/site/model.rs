//! The fleet as the site shows it, built from the store's rows alone (pure): one series
//! per cell, hardware key and branch with its change points, verdicts and accepted
//! shifts, and the open regressions grouped into findings by the run that opened them.

use std::collections::HashMap;

use crate::history::changepoint::{e_divisive, ChangePoint, Settings};
use crate::history::store::{FleetRun, FleetValue, Segment};

/// Runs kept in a sparkline of the fleet overview: enough to see a step, small enough that
/// 1,000 rows stay a page of a few hundred kilobytes.
pub(crate) const SPARK_POINTS: usize = 60;

/// One value of a series: the run (an index into [`Fleet::runs`]), the value and the
/// verdict the run got for the cell.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Value {
    pub run: usize,
    pub value: f64,
    pub verdict: Option<String>,
}

/// One cell's values on one hardware key and branch, oldest first.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    pub cell: String,
    pub key: String,
    pub branch: String,
    pub values: Vec<Value>,
    pub change_points: Vec<ChangePoint>,
    /// The accepted shifts of the cell on this key, each with the index of its first
    /// value in [`Series::values`] (`None`: its first run is not on this branch).
    pub segments: Vec<(Segment, Option<usize>)>,
}

impl Series {
    pub(crate) fn last_verdict(&self) -> Option<&str> {
        self.values.last().and_then(|v| v.verdict.as_deref())
    }

    /// Still regressed at its last run: the regression is open until a run is clean again
    /// or the shift is accepted (an accepted shift starting at the last run closes it).
    pub(crate) fn open(&self) -> bool {
        let accepted_last = self
            .segments
            .iter()
            .any(|(_, i)| *i == Some(self.values.len().saturating_sub(1)));
        self.last_verdict() == Some("regressed") && !accepted_last
    }
}

/// Where one host of a hardware key runs a cell: its clean values since the series' last
/// change point (the level the cell is at now), against the same values of every host.
/// A CI pool has several runners per hardware key, and one of them running every cell a
/// few percent below the others is the environment, not a regression: the cell page
/// shows the hosts apart so a reader can see it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HostLevel {
    pub host: String,
    /// Its clean values since the last change point.
    pub runs: usize,
    /// Their median.
    pub median: f64,
    /// That median against the median of every host's values, relative (-0.02: 2% below).
    pub rel: f64,
}

/// The hosts of `s` and where each runs the cell ([`HostLevel`]), the slowest first;
/// empty when its values since the last change point come from one host only.
pub(crate) fn host_levels(s: &Series, runs: &[FleetRun]) -> Vec<HostLevel> {
    let from = s.change_points.last().map_or(0, |c| c.index);
    let mut by_host: Vec<(String, Vec<f64>)> = Vec::new();
    let mut all = Vec::new();
    for v in &s.values[from.min(s.values.len())..] {
        if !clean(v.verdict.as_deref()) || !v.value.is_finite() {
            continue;
        }
        let host = &runs[v.run].host;
        match by_host.iter_mut().find(|(h, _)| h == host) {
            Some((_, xs)) => xs.push(v.value),
            None => by_host.push((host.clone(), vec![v.value])),
        }
        all.push(v.value);
    }
    if by_host.len() < 2 {
        return Vec::new();
    }
    let Some(pool) = crate::metrics::stats::median(&all) else {
        return Vec::new();
    };
    let mut levels: Vec<HostLevel> = by_host
        .into_iter()
        .filter_map(|(host, xs)| {
            let median = crate::metrics::stats::median(&xs)?;
            Some(HostLevel {
                host,
                runs: xs.len(),
                median,
                rel: median / pool.abs().max(f64::MIN_POSITIVE) - 1.0,
            })
        })
        .collect();
    levels.sort_by(|a, b| a.rel.total_cmp(&b.rel).then_with(|| a.host.cmp(&b.host)));
    levels
}

/// An open regression of one cell: where it started and the last clean run before it.
#[derive(Debug, Clone)]
pub(crate) struct Opened {
    pub series: usize,
    /// The index of the first value of the trailing regressed runs.
    pub first_bad: usize,
    /// The last value before it that a clean verdict (or none) vouched for.
    pub last_good: Option<usize>,
    /// The relative change of the first bad value against the last good one.
    pub change: Option<f64>,
}

/// Open regressions alike in hardware key, branch, first bad run and last good run: one
/// cause, as the run that opened them and the range it names are the same.
#[derive(Debug, Clone)]
pub(crate) struct Finding {
    pub cells: Vec<Opened>,
}

/// One round of an automatic bisection or of `bench bisect` (a run on the history's branch
/// `bisect`, at the probed commit): not a night of the cell's trend, since the rounds come
/// in the search's order of commits, not history's, but what a finding's triage measured.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Probe {
    pub cell: String,
    pub key: String,
    /// An index into [`Fleet::runs`] (the run holds the probed commit).
    pub run: usize,
    pub value: f64,
}

#[derive(Debug, Clone)]
pub(crate) struct Fleet {
    pub runs: Vec<FleetRun>,
    pub series: Vec<Series>,
    pub findings: Vec<Finding>,
    /// The bisections' rounds, in the store's order (cell, key, run start).
    pub probes: Vec<Probe>,
}

/// Verdicts a clean run gets: the last one of them before a regression is its last good run.
fn clean(verdict: Option<&str>) -> bool {
    matches!(
        verdict,
        None | Some("unchanged") | Some("improved") | Some("insufficient_history")
    )
}

/// Builds the fleet: `values` in the store's order (cell, key, run start), confirming
/// re-runs left out as the trends leave them out, and only `branch`'s runs when given.
pub(crate) fn build(
    runs: Vec<FleetRun>,
    values: Vec<FleetValue>,
    segments: Vec<Segment>,
    branch: Option<&str>,
    threads: usize,
) -> Fleet {
    let index: HashMap<&str, usize> = runs
        .iter()
        .enumerate()
        .map(|(i, r)| (r.run_id.as_str(), i))
        .collect();
    let branch_of = |r: &FleetRun| r.branch.clone().unwrap_or_default();
    let mut series: Vec<Series> = Vec::new();
    let mut at: HashMap<(String, String, String), usize> = HashMap::new();
    let mut probes = Vec::new();
    for v in values {
        let Some(&run) = index.get(v.run_id.as_str()) else {
            continue;
        };
        if crate::history::gate::is_confirm_run(&v.run_id) {
            continue;
        }
        let b = branch_of(&runs[run]);
        if b == crate::bisect::probe::BRANCH {
            probes.push(Probe {
                cell: v.cell_id,
                key: v.hardware_key,
                run,
                value: v.value,
            });
            continue;
        }
        if branch.is_some_and(|want| want != b) {
            continue;
        }
        let k = (v.cell_id, v.hardware_key, b);
        let i = match at.get(&k) {
            Some(&i) => i,
            None => {
                series.push(Series {
                    cell: k.0.clone(),
                    key: k.1.clone(),
                    branch: k.2.clone(),
                    values: Vec::new(),
                    change_points: Vec::new(),
                    segments: Vec::new(),
                });
                at.insert(k, series.len() - 1);
                series.len() - 1
            }
        };
        series[i].values.push(Value {
            run,
            value: v.value,
            verdict: v.verdict,
        });
    }
    for s in segments {
        for se in series
            .iter_mut()
            .filter(|x| x.cell == s.cell_id && x.key == s.hardware_key)
        {
            let first = se
                .values
                .iter()
                .position(|v| runs[v.run].started_at >= s.starts_at);
            se.segments.push((s.clone(), first));
        }
    }
    change_points(&mut series, threads);
    let findings = findings(&series, &runs);
    Fleet {
        runs,
        series,
        findings,
        probes,
    }
}

/// The change points of every series, on `threads` threads: E-divisive's permutation
/// tests are the site's one costly step (most of its time for 1,000 series of a year of
/// nights), and the series are independent.
fn change_points(series: &mut [Series], threads: usize) {
    let settings = Settings::default();
    let per = series.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|scope| {
        for chunk in series.chunks_mut(per) {
            scope.spawn(move || {
                for s in chunk {
                    let xs: Vec<f64> = s.values.iter().map(|v| v.value).collect();
                    if xs.iter().all(|x| x.is_finite()) {
                        s.change_points = e_divisive(&xs, &settings);
                    }
                }
            });
        }
    });
}

fn opened(i: usize, s: &Series) -> Opened {
    let n = s.values.len();
    let first_bad = (0..n)
        .rev()
        .take_while(|&j| s.values[j].verdict.as_deref() == Some("regressed"))
        .last()
        .unwrap_or(n.saturating_sub(1));
    let last_good = (0..first_bad)
        .rev()
        .find(|&j| clean(s.values[j].verdict.as_deref()));
    let change = last_good.map(|g| {
        let (a, b) = (s.values[g].value, s.values[first_bad].value);
        (b - a) / a.abs().max(f64::MIN_POSITIVE)
    });
    Opened {
        series: i,
        first_bad,
        last_good,
        change,
    }
}

/// The open regressions, one finding per (key, branch, first bad run, last good run), the
/// largest first.
fn findings(series: &[Series], runs: &[FleetRun]) -> Vec<Finding> {
    let mut groups: Vec<Finding> = Vec::new();
    let mut at: HashMap<(String, String, usize, Option<usize>), usize> = HashMap::new();
    for (i, s) in series.iter().enumerate().filter(|(_, s)| s.open()) {
        let o = opened(i, s);
        let key = (
            s.key.clone(),
            s.branch.clone(),
            s.values[o.first_bad].run,
            o.last_good.map(|g| s.values[g].run),
        );
        match at.get(&key) {
            Some(&g) => groups[g].cells.push(o),
            None => {
                at.insert(key, groups.len());
                groups.push(Finding { cells: vec![o] });
            }
        }
    }
    // The most cells first, then the newest opening run: the widest cause leads.
    groups.sort_by(|a, b| {
        let run = |f: &Finding| series[f.cells[0].series].values[f.cells[0].first_bad].run;
        b.cells
            .len()
            .cmp(&a.cells.len())
            .then(runs[run(b)].started_at.cmp(&runs[run(a)].started_at))
    });
    groups
}

/// The parts of a cell id, its axis values in axis order (`gpt2-125m.bf16.1gpu.single.base`).
pub(crate) fn parts(cell: &str) -> Vec<&str> {
    cell.split('.').collect()
}

/// Which axis values separate a finding's cells from the rest of its key and branch: for
/// each position where all its cells share a value, how many cells of that value there
/// are; the value all of whose cells regressed (else the one with the largest share).
pub(crate) fn attribution(fleet: &Fleet, finding: &Finding) -> Option<String> {
    let first = &fleet.series[finding.cells[0].series];
    let cells: Vec<&Series> = finding
        .cells
        .iter()
        .map(|o| &fleet.series[o.series])
        .collect();
    let first_parts = parts(&first.cell);
    let mut best: Option<(f64, String)> = None;
    for (p, v) in first_parts.iter().enumerate() {
        if !cells.iter().all(|s| parts(&s.cell).get(p) == Some(v)) {
            continue;
        }
        let peers = fleet
            .series
            .iter()
            .filter(|s| s.key == first.key && s.branch == first.branch)
            .filter(|s| parts(&s.cell).get(p) == Some(v))
            .count();
        let share = cells.len() as f64 / peers.max(1) as f64;
        let line = if cells.len() == peers {
            format!("every {v} cell regressed ({} of {peers})", cells.len())
        } else {
            format!(
                "{} of {peers} {v} cells regressed; the others did not",
                cells.len()
            )
        };
        if best.as_ref().is_none_or(|(b, _)| share > *b) {
            best = Some((share, line));
        }
    }
    best.map(|(_, l)| l)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: &str, t: &str) -> FleetRun {
        FleetRun {
            run_id: id.into(),
            started_at: t.into(),
            hardware_key: "h100".into(),
            commit: Some(format!("c{id}")),
            branch: Some("main".into()),
            host: "h".into(),
            matrix_name: "m".into(),
        }
    }

    fn value(cell: &str, run: &str, v: f64, verdict: &str) -> FleetValue {
        FleetValue {
            cell_id: cell.into(),
            hardware_key: "h100".into(),
            run_id: run.into(),
            value: v,
            verdict: Some(verdict.into()),
        }
    }

    #[test]
    fn a_host_two_percent_below_the_others_is_shown_apart() {
        // Twelve clean nights alternating between two hosts, host b 2% slower; one
        // regressed night on a is left out of the levels.
        let runs: Vec<FleetRun> = (0..13)
            .map(|i| FleetRun {
                host: if i % 2 == 0 { "a".into() } else { "b".into() },
                ..run(&format!("r{i:02}"), &format!("t{i:02}"))
            })
            .collect();
        let values = (0..13)
            .map(|i| {
                let (v, verdict) = match i {
                    12 => (50.0, "regressed"),
                    i if i % 2 == 0 => (100.0 + (i % 3) as f64 * 0.1, "unchanged"),
                    _ => (98.0 + (i % 3) as f64 * 0.1, "environment"),
                };
                value("c", &format!("r{i:02}"), v, verdict)
            })
            .collect();
        let f = build(runs.clone(), values, Vec::new(), None, 1);
        let s = &f.series[0];
        // The environment verdict is not clean: only host a's nights count so far.
        assert!(host_levels(s, &f.runs).is_empty());
        let mut s = s.clone();
        for v in &mut s.values {
            if v.verdict.as_deref() == Some("environment") {
                v.verdict = Some("unchanged".into());
            }
        }
        let levels = host_levels(&s, &f.runs);
        assert_eq!(levels.len(), 2, "{levels:?}");
        assert_eq!((levels[0].host.as_str(), levels[0].runs), ("b", 6));
        assert_eq!((levels[1].host.as_str(), levels[1].runs), ("a", 6));
        assert!((levels[1].median / levels[0].median - 100.0 / 98.0).abs() < 1e-3);
        assert!(
            levels[0].rel < -0.005 && levels[1].rel > 0.005,
            "{levels:?}"
        );
    }

    #[test]
    fn an_open_regression_names_its_first_bad_and_last_good_run() {
        let runs: Vec<FleetRun> = (0..6)
            .map(|i| run(&format!("r{i}"), &format!("t{i}")))
            .collect();
        let mut values = Vec::new();
        for cell in ["a.bf16", "b.bf16", "c.fp8"] {
            for i in 0..6 {
                let bad = cell != "c.fp8" && i >= 4;
                values.push(value(
                    cell,
                    &format!("r{i}"),
                    if bad { 90.0 } else { 100.0 },
                    if bad { "regressed" } else { "unchanged" },
                ));
            }
        }
        values.push(value("a.bf16", "r5-confirm", 1.0, "regressed"));
        let fleet = build(runs, values, Vec::new(), None, 2);
        assert_eq!(fleet.series.len(), 3);
        assert!(
            fleet.series.iter().all(|s| s.values.len() == 6),
            "confirming re-runs left out"
        );
        assert_eq!(fleet.findings.len(), 1);
        let f = &fleet.findings[0];
        assert_eq!(f.cells.len(), 2);
        assert_eq!((f.cells[0].first_bad, f.cells[0].last_good), (4, Some(3)));
        assert!((f.cells[0].change.unwrap() + 0.1).abs() < 1e-12);
        assert_eq!(
            attribution(&fleet, f).as_deref(),
            Some("every bf16 cell regressed (2 of 2)")
        );
    }

    #[test]
    fn an_accepted_shift_at_the_last_run_closes_the_regression() {
        let runs: Vec<FleetRun> = (0..3)
            .map(|i| run(&format!("r{i}"), &format!("t{i}")))
            .collect();
        let values = vec![
            value("a", "r0", 100.0, "unchanged"),
            value("a", "r1", 100.0, "unchanged"),
            value("a", "r2", 90.0, "regressed"),
        ];
        let seg = Segment {
            cell_id: "a".into(),
            hardware_key: "h100".into(),
            starts_at: "t2".into(),
            first_run_id: "r2".into(),
            reason: "new kernel".into(),
            accepted_at: "t3".into(),
        };
        let fleet = build(runs, values, vec![seg], None, 1);
        assert_eq!(fleet.series[0].segments[0].1, Some(2));
        assert!(fleet.findings.is_empty());
    }
}
