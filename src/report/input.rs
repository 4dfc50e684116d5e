//! What every sink is given and what it answers with: the run and the judge's verdicts
//! ([`ReportInput`]), the sink's trait ([`Exporter`]), its errors ([`ReportError`]), and the
//! facts of a run that several sinks read from it (its duration, its MFU policies). The
//! sinks import these and the facade in `mod.rs` calls the sinks, so they live apart from
//! the facade.

use std::path::PathBuf;

use crate::baseline::Comparison;
use crate::error::CliError;
use crate::judge::Verdicts;
use crate::results::RunResults;

/// What every sink renders: a run and its comparison with the baselines.
#[derive(Debug, Clone, Copy)]
pub struct ReportInput<'a> {
    pub results: &'a RunResults,
    pub comparison: &'a Comparison,
    /// Earlier runs' values, when a history is at hand (charts then show trends).
    pub trends: Option<&'a crate::trend::Trends>,
    /// The history's verdicts, when the run was judged (already laid over `comparison`).
    pub history: Option<&'a crate::history::gate::GateReport>,
    /// The triage's findings, one per cause (`crate::triage`), regressions first.
    pub findings: &'a [crate::triage::Finding],
}

/// What a run's verdict cost, and each cell's ([`ReportInput::cell_costs`]); the history
/// keeps them too (`bench_costs`), so they are defined there.
pub use crate::history::cost::{CellCost, Cost};

impl<'a> ReportInput<'a> {
    /// What the verdict cost (see [`Cost`]).
    pub fn cost(&self) -> Cost {
        // Rust's sum of no f64 is -0.0, which printed "side by side -0" and "triage -0"
        // for a run with no pairs or bisections, and `-0.0` in report.json: every zero is
        // written as 0.
        let zero = |x: f64| if x == 0.0 { 0.0 } else { x };
        Cost {
            measuring_gpu_s: zero(self.results.gpu_seconds()),
            pairs_gpu_s: zero(self.history.map_or(0.0, |h| h.pairs_gpu_s())),
            reruns_gpu_s: zero(self.history.map_or(0.0, |h| h.reruns_gpu_s)),
            triage_gpu_s: zero(
                self.findings
                    .iter()
                    .filter_map(|f| f.bisected.as_ref())
                    .map(|b| b.gpu_s)
                    .sum(),
            ),
        }
    }

    /// What each cell's verdict cost, in the run's cell order: measuring it, its pairs, its
    /// re-runs, and the bisections that searched it (a finding bisects one cell of its
    /// group, which carries that cost). The cells' costs add up to [`Self::cost`].
    pub fn cell_costs(&self) -> Vec<CellCost> {
        let zero = |x: f64| if x == 0.0 { 0.0 } else { x };
        self.results
            .cells
            .iter()
            .map(|c| {
                let id = c.id.as_str();
                let judged = self.history.and_then(|h| h.cell(id));
                CellCost {
                    cell_id: id.to_string(),
                    cost: Cost {
                        measuring_gpu_s: zero(c.gpu_seconds()),
                        pairs_gpu_s: zero(
                            judged
                                .and_then(|j| j.pairs.as_ref())
                                .map_or(0.0, |p| p.gpu_s),
                        ),
                        reruns_gpu_s: zero(self.history.map_or(0.0, |h| {
                            h.reruns_gpu_s_by_cell.get(id).copied().unwrap_or(0.0)
                        })),
                        triage_gpu_s: zero(
                            self.findings
                                .iter()
                                .filter_map(|f| f.bisected.as_ref())
                                .filter(|b| b.cell == id)
                                .map(|b| b.gpu_s)
                                .sum(),
                        ),
                    },
                }
            })
            .collect()
    }

    /// Why the figures the cost is computed from cannot be a run's (`None`: they can): a
    /// run folder's `history.json` and `triage.json` are files anyone can edit, and the
    /// reports state their sum. Each figure must be GPU-seconds a run spends, each judged
    /// cell the run's and judged once, the re-runs by cell must add up to their total, and
    /// each bisection must have searched a cell of the run; else a report would state a
    /// total its cells do not add up to (or 1e308 GPU-s).
    pub fn implausible_cost(&self) -> Option<String> {
        let in_run = |id: &str| self.results.cells.iter().any(|c| c.id.as_str() == id);
        if let Some(why) = self.history.and_then(|h| h.implausible_cost(in_run)) {
            return Some(format!("history.json: {why}"));
        }
        for (i, f) in self.findings.iter().enumerate() {
            let Some(b) = &f.bisected else { continue };
            if let Err(why) = crate::bounds::check_gpu_seconds("bisected.gpu_s", b.gpu_s) {
                return Some(format!("triage.json: findings[{i}]: {why}"));
            }
            if !in_run(&b.cell) {
                return Some(format!(
                    "triage.json: findings[{i}]: bisected.cell {} is not a cell of this run",
                    crate::sanitize::inline(&b.cell)
                ));
            }
        }
        None
    }

    /// What the sinks render of `results`, the judge's `verdicts` and the triage's
    /// `findings`.
    pub fn new(
        results: &'a RunResults,
        verdicts: &'a Verdicts,
        findings: &'a [crate::triage::Finding],
    ) -> ReportInput<'a> {
        ReportInput {
            results,
            comparison: &verdicts.comparison,
            trends: verdicts.trends.as_ref(),
            history: verdicts.history.as_ref(),
            findings,
        }
    }

    /// The exit code the run gives ([`RunResults::exit_code`]): the one every sink states
    /// and the command returns.
    pub fn exit_code(&self) -> i32 {
        self.results.exit_code(self.comparison.exit_code())
    }
}

/// One report format.
pub trait Exporter {
    /// The file this sink writes into the run directory.
    fn file_name(&self) -> &'static str;
    /// Whether the run gets this file at all: a report about something the run does not
    /// have (the framework comparison of a run without framework cells) is not written.
    fn applies(&self, _input: &ReportInput<'_>) -> bool {
        true
    }
    /// Renders the report.
    fn render(&self, input: &ReportInput<'_>) -> Result<String, ReportError>;
}

/// Errors of rendering or writing reports, each naming the report or file.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot render {format}: {message}")]
    Render {
        format: &'static str,
        message: String,
    },
    #[error("{path}: cannot write report: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl From<ReportError> for CliError {
    fn from(e: ReportError) -> Self {
        CliError::internal(miette::Report::msg(e.to_string()))
    }
}

/// Seconds from the run's start to its end, when both are known.
pub(crate) fn run_duration_s(results: &RunResults) -> Option<f64> {
    use time::format_description::well_known::Rfc3339;
    let start = time::OffsetDateTime::parse(&results.started_at, &Rfc3339).ok()?;
    let end = time::OffsetDateTime::parse(results.finished_at.as_deref()?, &Rfc3339).ok()?;
    Some((end - start).as_seconds_f64())
}

/// The MFU policies the cells' workers reported (which peak MFU is against), deduplicated.
pub(crate) fn mfu_policies(results: &RunResults) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for cell in &results.cells {
        for r in &cell.repeats {
            if let Some(p) = &r.summary.mfu_policy {
                if !out.contains(p) {
                    out.push(p.clone());
                }
            }
        }
    }
    out
}
