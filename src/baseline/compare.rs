//! Comparison of a run with its baselines: a [`Verdict`] per metric and a [`CellStatus`]
//! per cell. Pure functions of their inputs; reporters only render what this decides.
//!
//! # Method
//!
//! For a metric with baseline value `b` and current value `c`, the relative change is
//! `(c - b) / |b|`, signed so that a positive `worse` means the metric moved in its bad
//! direction. The change is flagged (a regression when worse, an improvement when better)
//! only when it is past **all three** of:
//!
//! 1. the tolerance `t` (the baseline's, or the metric's default, see
//!    `metrics::catalog::tolerance`): what the team accepts, e.g. host-to-host variation;
//! 2. the absolute floor `f`, when set: `|c - b| > f`, so that tiny absolute changes of
//!    small numbers are never flagged;
//! 3. the noise band of the repeats, `n = s_run + s_baseline`, where each `s` is the
//!    relative spread of the repeats (half their min..max range over the median). The true
//!    value behind each median lies within its range, so two measurements whose ranges
//!    overlap (`|c - b| / |b| <= s_run + s_baseline`) cannot be told apart. This is the
//!    range-overlap test for min..max error bars; criterion.rs applies the same two-part rule
//!    (a change must be statistically significant *and* past a noise threshold) with
//!    bootstrap confidence intervals, which the 1-5 repeats a GPU CI job can afford do not
//!    support.
//!
//! With DESIGN.md's measured noise (one host: +-0.5% over five runs; two hosts: 1.6-1.7%
//! apart) and the 3% default tolerance, a 2% difference between two runners is not a
//! regression, a 5% drop on one runner is, and a change inside the repeats' spread is not.

use serde::Serialize;

use crate::baseline::store::{Baselines, Direction, MetricBaseline, Provenance};
use crate::metrics::catalog;
use crate::results::{CellResult, MetricValue, Outcome, RunResults};

/// The verdict on one metric of one cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Worse than the baseline past tolerance, floor and noise.
    Regression,
    /// Better than the baseline past tolerance, floor and noise.
    Improvement,
    /// Within tolerance, floor or noise of the baseline.
    Unchanged,
    /// Measured now, no baseline to compare with: reported, never a failure.
    New,
    /// In the baseline, not measured by this run: informational.
    Missing,
}

/// One metric of one cell against its baseline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricComparison {
    pub metric: String,
    pub verdict: Verdict,
    pub current: Option<f64>,
    pub baseline: Option<f64>,
    /// Relative change `(current - baseline) / |baseline|`; `None` unless both exist and
    /// the baseline is not zero.
    pub change: Option<f64>,
    pub direction: Option<Direction>,
    /// Relative tolerance in force.
    pub tolerance: Option<f64>,
    /// Absolute floor in force.
    pub floor: Option<f64>,
    /// Relative spread of this run's repeats.
    pub current_spread: Option<f64>,
    /// Relative spread of the repeats behind the baseline.
    pub baseline_spread: Option<f64>,
    /// Combined noise band `current_spread + baseline_spread`.
    pub noise: Option<f64>,
}

impl MetricComparison {
    /// The change as a factor in the metric's good direction: 1.05 means 5% better
    /// (higher throughput, or 1/1.05 of the time or memory). `None` when not comparable.
    pub(crate) fn speedup(&self) -> Option<f64> {
        let (c, b) = (self.current?, self.baseline?);
        if c <= 0.0 || b <= 0.0 {
            return None;
        }
        Some(match self.direction? {
            Direction::Higher => c / b,
            Direction::Lower => b / c,
        })
    }
}

/// Compares one measured metric with its baseline (see the module docs for the method).
pub(crate) fn compare_metric(
    metric: &str,
    current: &MetricValue,
    base: &MetricBaseline,
) -> MetricComparison {
    let tolerance = base.effective_tolerance(metric);
    let noise = current.rel_spread.max(0.0) + base.spread.max(0.0);
    let diff = current.value - base.value;
    let worse = match base.direction {
        Direction::Higher => -diff,
        Direction::Lower => diff,
    };
    let floor = base.floor.unwrap_or(0.0);
    let change = (base.value != 0.0).then(|| diff / base.value.abs());
    // With a zero baseline no relative test applies: only the floor decides.
    let threshold = if base.value != 0.0 {
        (tolerance.max(noise) * base.value.abs()).max(floor)
    } else {
        floor
    };
    let verdict = if worse > threshold {
        Verdict::Regression
    } else if -worse > threshold {
        Verdict::Improvement
    } else {
        Verdict::Unchanged
    };
    MetricComparison {
        metric: metric.to_string(),
        verdict,
        current: Some(current.value),
        baseline: Some(base.value),
        change,
        direction: Some(base.direction),
        tolerance: Some(tolerance),
        floor: base.floor,
        current_spread: Some(current.rel_spread),
        baseline_spread: Some(base.spread),
        noise: Some(noise),
    }
}

fn new_metric(metric: &str, current: &MetricValue) -> MetricComparison {
    MetricComparison {
        metric: metric.to_string(),
        verdict: Verdict::New,
        current: Some(current.value),
        baseline: None,
        change: None,
        direction: catalog::direction(metric),
        tolerance: Some(catalog::tolerance(metric)),
        floor: None,
        current_spread: Some(current.rel_spread),
        baseline_spread: None,
        noise: None,
    }
}

fn missing_metric(metric: &str, base: &MetricBaseline) -> MetricComparison {
    MetricComparison {
        metric: metric.to_string(),
        verdict: Verdict::Missing,
        current: None,
        baseline: Some(base.value),
        change: None,
        direction: Some(base.direction),
        tolerance: Some(base.effective_tolerance(metric)),
        floor: base.floor,
        current_spread: None,
        baseline_spread: Some(base.spread),
        noise: None,
    }
}

/// What happened to a cell, all metrics and its outcome taken together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CellStatus {
    /// At least one metric regressed.
    Regression,
    /// At least one metric improved and none regressed.
    Improvement,
    /// Compared with its baseline, nothing past tolerance and noise.
    Unchanged,
    /// Ran, and has no baseline.
    New,
    /// In the baseline, absent from this run (neither run, skipped nor dropped).
    Missing,
    /// The worker failed (crash, OOM, NaN loss...).
    Failed,
    /// Killed at its timeout.
    TimedOut,
    /// Did not run (unsupported, not enough GPUs, interrupted).
    Skipped,
    /// Removed by a matrix rule or a filter before running.
    Dropped,
    /// Judged against the run history: worse once, not confirmed (`--no-confirm`, or the
    /// confirmation budget ran out). Does not fail the run.
    Suspect,
    /// Judged against a short run history: the repeats cannot yet tell same from
    /// different. Does not fail the run.
    Unknown,
    /// Judged against the run history: worse, and the cell's telemetry explains it (a
    /// foreign process, a lower clock, a new slowdown reason). Does not fail the run.
    Environment,
}

impl CellStatus {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CellStatus::Regression => "regression",
            CellStatus::Improvement => "improvement",
            CellStatus::Unchanged => "unchanged",
            CellStatus::New => "new",
            CellStatus::Missing => "missing",
            CellStatus::Failed => "failed",
            CellStatus::TimedOut => "timed out",
            CellStatus::Skipped => "skipped",
            CellStatus::Dropped => "dropped",
            CellStatus::Suspect => "suspect",
            CellStatus::Unknown => "unknown",
            CellStatus::Environment => "environment",
        }
    }

    /// Statuses that make the run fail (exit 1).
    pub(crate) fn fails_run(self) -> bool {
        matches!(
            self,
            CellStatus::Regression | CellStatus::Failed | CellStatus::TimedOut
        )
    }
}

/// One cell of the run (or of the baseline) and its verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CellComparison {
    pub id: String,
    pub status: CellStatus,
    /// Why a cell failed, timed out, was skipped or dropped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// An infrastructure failure was retried and a later attempt succeeded.
    pub flaky: bool,
    /// Wall time of the cell (all repeats and attempts); `None` for cells that did not run.
    pub duration_s: Option<f64>,
    /// Per metric, in the run's metric order, then metrics only the baseline has.
    pub metrics: Vec<MetricComparison>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_provenance: Option<Provenance>,
}

impl CellComparison {
    pub(crate) fn metric(&self, name: &str) -> Option<&MetricComparison> {
        self.metrics.iter().find(|m| m.metric == name)
    }

    /// The cell's speed-up against its baseline by the first of the catalog's speed
    /// metrics it has: tokens/s now over tokens/s then (or the inverse ratio of step times
    /// when tokens/s is not there).
    pub fn speedup(&self) -> Option<f64> {
        catalog::speed_metrics().find_map(|m| self.metric(m).and_then(MetricComparison::speedup))
    }

    /// The metrics that regressed.
    pub(crate) fn regressions(&self) -> impl Iterator<Item = &MetricComparison> {
        self.metrics
            .iter()
            .filter(|m| m.verdict == Verdict::Regression)
    }
}

/// How many cells ended in each status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub cells: usize,
    pub regression: usize,
    pub improvement: usize,
    pub unchanged: usize,
    pub new: usize,
    pub missing: usize,
    pub failed: usize,
    pub timed_out: usize,
    pub skipped: usize,
    pub dropped: usize,
    pub suspect: usize,
    pub unknown: usize,
    pub environment: usize,
    pub flaky: usize,
}

/// The comparison of a whole run with the baselines of its hardware key.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub hardware_key: String,
    /// The baseline file compared with (it may not exist: then every cell is new).
    pub baseline_file: String,
    pub baseline_exists: bool,
    /// When the run history judged the run (`--history`): the runs it was judged against,
    /// e.g. "runs of branch main". Its verdicts are laid over the baseline's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history_scope: Option<String>,
    /// Cells of the run in run order, then dropped cells, then cells only the baseline has.
    pub cells: Vec<CellComparison>,
    /// Why the run fails whatever its cells' verdicts, one line each: a merged run's
    /// shard that did not finish every cell of its plan (`bench report merge`). Each fails
    /// the exit code, and every report names it beside that code.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub run_failures: Vec<String>,
}

impl Comparison {
    pub(crate) fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for cell in &self.cells {
            c.cells += 1;
            c.flaky += usize::from(cell.flaky);
            *match cell.status {
                CellStatus::Regression => &mut c.regression,
                CellStatus::Improvement => &mut c.improvement,
                CellStatus::Unchanged => &mut c.unchanged,
                CellStatus::New => &mut c.new,
                CellStatus::Missing => &mut c.missing,
                CellStatus::Failed => &mut c.failed,
                CellStatus::TimedOut => &mut c.timed_out,
                CellStatus::Skipped => &mut c.skipped,
                CellStatus::Dropped => &mut c.dropped,
                CellStatus::Suspect => &mut c.suspect,
                CellStatus::Unknown => &mut c.unknown,
                CellStatus::Environment => &mut c.environment,
            } += 1;
        }
        c
    }

    /// DESIGN.md's exit code: 1 when a cell regressed, failed or timed out (or the run
    /// failed beyond its cells: [`Self::run_failures`]), else 0.
    pub fn exit_code(&self) -> i32 {
        if !self.run_failures.is_empty() || self.cells.iter().any(|c| c.status.fails_run()) {
            crate::exit::bench::FAILED
        } else {
            crate::exit::bench::OK
        }
    }

    /// True when a cell regressed, improved or is new (what a PR comment is worth posting for).
    pub(crate) fn has_changes(&self) -> bool {
        self.cells.iter().any(|c| {
            matches!(
                c.status,
                CellStatus::Regression | CellStatus::Improvement | CellStatus::New
            )
        })
    }

    pub fn cell(&self, id: &str) -> Option<&CellComparison> {
        self.cells.iter().find(|c| c.id == id)
    }

    /// Cells in a given status, in report order.
    pub fn with_status(&self, status: CellStatus) -> impl Iterator<Item = &CellComparison> {
        self.cells.iter().filter(move |c| c.status == status)
    }
}

fn compare_cell(cell: &CellResult, baselines: &Baselines) -> CellComparison {
    let base = baselines.cell(cell.id.as_str());
    let (status, reason) = match &cell.outcome {
        Outcome::Failed { reason } => (Some(CellStatus::Failed), Some(reason.clone())),
        Outcome::TimedOut { reason } => (Some(CellStatus::TimedOut), Some(reason.clone())),
        Outcome::Skipped { reason } => (Some(CellStatus::Skipped), Some(reason.clone())),
        Outcome::Passed => (None, None),
    };
    let mut metrics = Vec::new();
    // Only a passed cell's measurements are judged: a failed cell's partial figures would
    // make noise, and its failure already fails the run.
    if status.is_none() {
        for (name, value) in &cell.metrics {
            metrics.push(match base.and_then(|b| b.metrics.get(name)) {
                Some(b) => compare_metric(name, value, b),
                None => new_metric(name, value),
            });
        }
        if let Some(b) = base {
            for (name, mb) in &b.metrics {
                if !cell.metrics.contains_key(name) {
                    metrics.push(missing_metric(name, mb));
                }
            }
        }
    }
    let status = status.unwrap_or_else(|| {
        if base.is_none() {
            CellStatus::New
        } else if metrics.iter().any(|m| m.verdict == Verdict::Regression) {
            CellStatus::Regression
        } else if metrics.iter().any(|m| m.verdict == Verdict::Improvement) {
            CellStatus::Improvement
        } else {
            CellStatus::Unchanged
        }
    });
    CellComparison {
        id: cell.id.as_str().to_string(),
        status,
        reason,
        flaky: cell.flaky,
        duration_s: Some(cell.duration_s),
        metrics,
        baseline_provenance: base.and_then(|b| b.provenance.clone()),
    }
}

/// Compares every cell of `results` with `baselines` (which should be those of
/// `results.environment.hardware_key`).
pub fn compare(results: &RunResults, baselines: &Baselines) -> Comparison {
    let mut cells: Vec<CellComparison> = results
        .cells
        .iter()
        .map(|c| compare_cell(c, baselines))
        .collect();
    for d in &results.dropped {
        cells.push(CellComparison {
            id: d.id.as_str().to_string(),
            status: CellStatus::Dropped,
            reason: Some(format!("{}: {}", d.by, d.reason)),
            flaky: false,
            duration_s: None,
            metrics: Vec::new(),
            baseline_provenance: baselines
                .cell(d.id.as_str())
                .and_then(|b| b.provenance.clone()),
        });
    }
    for (id, b) in &baselines.doc.cells {
        if cells.iter().any(|c| &c.id == id) {
            continue;
        }
        cells.push(CellComparison {
            id: id.clone(),
            status: CellStatus::Missing,
            reason: Some("in the baseline but not in this run".into()),
            flaky: false,
            duration_s: None,
            metrics: b
                .metrics
                .iter()
                .map(|(name, mb)| missing_metric(name, mb))
                .collect(),
            baseline_provenance: b.provenance.clone(),
        });
    }
    Comparison {
        hardware_key: baselines.doc.hardware_key.clone(),
        baseline_file: baselines.path.display().to_string(),
        baseline_exists: baselines.existed,
        history_scope: None,
        cells,
        run_failures: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(value: f64, rel_spread: f64) -> MetricValue {
        MetricValue {
            value,
            samples: vec![value],
            rel_spread,
        }
    }

    fn base(value: f64, direction: Direction, spread: f64) -> MetricBaseline {
        MetricBaseline {
            value,
            direction,
            tolerance: None,
            floor: None,
            spread,
        }
    }

    #[test]
    fn host_to_host_two_percent_is_not_a_regression() {
        // DESIGN.md: two hosts of the same kind are 1.6-1.7% apart; each host's repeats
        // lie within +-0.5%.
        let b = base(350_000.0, Direction::Higher, 0.005);
        let c = compare_metric("tokens_per_s", &measured(343_000.0, 0.005), &b);
        assert!((c.change.unwrap() + 0.02).abs() < 1e-9);
        assert_eq!(c.verdict, Verdict::Unchanged);
        // The same for time (lower is better): 2% slower steps.
        let b = base(0.0470, Direction::Lower, 0.005);
        let c = compare_metric("step_time_s", &measured(0.0470 * 1.02, 0.005), &b);
        assert_eq!(c.verdict, Verdict::Unchanged);
    }

    #[test]
    fn five_percent_drop_on_one_runner_is_a_regression() {
        let b = base(350_000.0, Direction::Higher, 0.005);
        let c = compare_metric("tokens_per_s", &measured(332_500.0, 0.005), &b);
        assert_eq!(c.verdict, Verdict::Regression);
        assert_eq!(c.noise, Some(0.01));
        // Lower-is-better metrics regress upwards.
        let b = base(0.0470, Direction::Lower, 0.005);
        let c = compare_metric("step_time_s", &measured(0.0470 * 1.05, 0.005), &b);
        assert_eq!(c.verdict, Verdict::Regression);
    }

    #[test]
    fn change_inside_the_spread_is_not_a_regression() {
        // A 5% drop past the 3% tolerance, but the repeats scatter by 3% and 2.5%: their
        // ranges overlap, so the drop cannot be told from noise.
        let b = base(350_000.0, Direction::Higher, 0.025);
        let c = compare_metric("tokens_per_s", &measured(332_500.0, 0.03), &b);
        assert_eq!(c.verdict, Verdict::Unchanged);
        // A larger drop leaves the noise band and is flagged.
        let c = compare_metric("tokens_per_s", &measured(315_000.0, 0.03), &b);
        assert_eq!(c.verdict, Verdict::Regression);
    }

    #[test]
    fn improvements_are_symmetric() {
        let b = base(350_000.0, Direction::Higher, 0.005);
        let c = compare_metric("tokens_per_s", &measured(367_500.0, 0.005), &b);
        assert_eq!(c.verdict, Verdict::Improvement);
        assert!((c.speedup().unwrap() - 1.05).abs() < 1e-9);
        let b = base(2.0e9, Direction::Lower, 0.0);
        let c = compare_metric("peak_mem_bytes", &measured(1.5e9, 0.0), &b);
        assert_eq!(c.verdict, Verdict::Improvement);
    }

    #[test]
    fn memory_default_tolerance_is_wider() {
        let b = base(2.0e9, Direction::Lower, 0.0);
        let c = compare_metric("peak_mem_bytes", &measured(2.0e9 * 1.08, 0.0), &b);
        assert_eq!(c.verdict, Verdict::Unchanged);
        let c = compare_metric("peak_mem_bytes", &measured(2.0e9 * 1.12, 0.0), &b);
        assert_eq!(c.verdict, Verdict::Regression);
    }

    #[test]
    fn absolute_floor_keeps_small_changes_quiet() {
        // 50% more of a tiny number, but below the 1 MiB floor.
        let mut b = base(1_000_000.0, Direction::Lower, 0.0);
        b.floor = Some(1_048_576.0);
        let c = compare_metric("peak_mem_bytes", &measured(1_500_000.0, 0.0), &b);
        assert_eq!(c.verdict, Verdict::Unchanged);
        let c = compare_metric("peak_mem_bytes", &measured(2_100_000.0, 0.0), &b);
        assert_eq!(c.verdict, Verdict::Regression);
    }

    #[test]
    fn custom_tolerance_applies() {
        let mut b = base(100.0, Direction::Higher, 0.0);
        b.tolerance = Some(0.01);
        let c = compare_metric("tokens_per_s", &measured(98.0, 0.0), &b);
        assert_eq!(c.verdict, Verdict::Regression);
        assert_eq!(c.tolerance, Some(0.01));
    }

    #[test]
    fn zero_baseline_uses_only_the_floor() {
        let b = base(0.0, Direction::Lower, 0.0);
        let c = compare_metric("custom", &measured(0.0, 0.0), &b);
        assert_eq!(c.verdict, Verdict::Unchanged);
        assert_eq!(c.change, None);
        let c = compare_metric("custom", &measured(1.0, 0.0), &b);
        assert_eq!(c.verdict, Verdict::Regression);
    }
}
