//! `report.json`: the comparison of a run with its baselines, machine-readable (the verdict
//! per cell and metric, counts, exit code, and where the numbers came from).

use serde::Serialize;

use crate::baseline::compare::{CellComparison, Counts};
use crate::baseline::store::hardware_words;
use crate::report::input::{Exporter, ReportError, ReportInput};

/// Bumped on any incompatible change to the JSON report.
pub(crate) const SCHEMA_VERSION: u32 = 1;

#[derive(Serialize)]
struct JsonReport<'a> {
    schema_version: u32,
    run_id: &'a str,
    matrix_name: &'a str,
    started_at: &'a str,
    finished_at: Option<&'a str>,
    interrupted: bool,
    /// What a signal stopped (the cells, the confirmation, triage), when one did: the run
    /// then exits 130.
    #[serde(skip_serializing_if = "Option::is_none")]
    interrupted_in: Option<crate::results::Interruption>,
    hardware_key: &'a str,
    hardware: String,
    commit: Option<&'a str>,
    git_dirty: bool,
    bench_version: &'a str,
    baseline_file: &'a str,
    baseline_exists: bool,
    /// The exit code the command returns (DESIGN.md): 0 or 1 as the verdicts give it, 130
    /// when a signal stopped the run.
    exit_code: i32,
    /// Why the run fails beyond its cells (a merged run's unfinished shard), one line each.
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    run_failures: &'a [String],
    counts: Counts,
    mfu_policies: Vec<String>,
    cells: &'a [CellComparison],
    /// One finding per cause (`crate::triage`).
    findings: &'a [crate::triage::Finding],
    /// What the verdict cost, GPU-seconds: measuring, confirming, triage.
    cost: crate::report::input::Cost,
    /// The same by cell (they add up to `cost`).
    cell_costs: Vec<crate::report::input::CellCost>,
}

/// The `report.json` sink.
pub struct JsonExporter;

impl Exporter for JsonExporter {
    fn file_name(&self) -> &'static str {
        "report.json"
    }

    fn render(&self, input: &ReportInput<'_>) -> Result<String, ReportError> {
        let r = input.results;
        let c = input.comparison;
        let env = &r.environment;
        let doc = JsonReport {
            schema_version: SCHEMA_VERSION,
            run_id: &r.run_id,
            matrix_name: &r.matrix_name,
            started_at: &r.started_at,
            finished_at: r.finished_at.as_deref(),
            interrupted: r.interrupted,
            interrupted_in: r.interrupted_in,
            hardware_key: &env.hardware_key,
            hardware: hardware_words(env),
            commit: env.git_commit.as_deref(),
            git_dirty: env.git_dirty,
            bench_version: &env.bench_version,
            baseline_file: &c.baseline_file,
            baseline_exists: c.baseline_exists,
            exit_code: input.exit_code(),
            run_failures: &c.run_failures,
            counts: c.counts(),
            mfu_policies: crate::report::input::mfu_policies(r),
            cells: &c.cells,
            findings: input.findings,
            cost: input.cost(),
            cell_costs: input.cell_costs(),
        };
        let mut s = serde_json::to_string_pretty(&doc).map_err(|e| ReportError::Render {
            format: "report.json",
            message: e.to_string(),
        })?;
        s.push('\n');
        Ok(s)
    }
}
