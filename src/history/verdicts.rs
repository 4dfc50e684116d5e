//! The history's verdicts on a run as data: each judged cell ([`CellJudgement`]) and the
//! run's whole judgement ([`GateReport`], kept as `history.json` in the run folder). The
//! gate ([`super::gate`]) produces them, the verdict words ([`super::words`]) and the
//! reports read them; this file imports neither, so both can.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::detect::{HistoryVerdict, Judgement, NumericsVerdict, OutlierRepeat, Policy};
use super::environment::Finding;
use super::suspects::Change;

/// Where a shift began and the last run before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Since {
    pub run_id: String,
    pub commit: Option<String>,
    pub started_at: String,
    pub last_good_run_id: Option<String>,
    pub last_good_commit: Option<String>,
}

/// The history's verdict on one cell of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellJudgement {
    pub cell_id: String,
    pub metric: String,
    pub value: f64,
    /// This run's repeats.
    #[serde(default)]
    pub samples: Vec<f64>,
    /// Repeats far from the others while the others agree: a disturbed run (environment
    /// evidence, named in the verdict line).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outliers: Vec<OutlierRepeat>,
    pub judgement: Judgement,
    /// The re-run's value (median), when the cell was re-run to confirm (the last re-run's
    /// when there were several).
    pub confirm_value: Option<f64>,
    #[serde(default)]
    pub confirm_samples: Vec<f64>,
    /// Each re-run's value (median), in order, when the cell was re-run more than once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub confirm_values: Vec<f64>,
    /// Why the confirming re-run produced no measurement, when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirm_failed: Option<String>,
    pub numerics: NumericsVerdict,
    /// For a regression or improvement: the first run of the shift and the last good one.
    pub since: Option<Since>,
    /// The baseline's own verdict (the old rule), which decides with no history at all.
    pub baseline_regressed: bool,
    /// What the cell's telemetry says against its clean runs (clocks, reasons, processes).
    #[serde(default)]
    pub environment: Option<Finding>,
    /// What differs from the last good run (regressed, improved, suspect, numerics).
    #[serde(default)]
    pub changes: Vec<Change>,
    /// The verdict line every report shows.
    #[serde(default)]
    pub line: String,
    /// The `bench bisect` command that would find the commit, for a regression between
    /// two known commits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bisect: Option<String>,
}

impl CellJudgement {
    pub fn verdict(&self) -> HistoryVerdict {
        self.judgement.verdict
    }

    /// Whether this cell fails the job: a confirmed regression, changed numerics, or a
    /// baseline regression where there is no history at all.
    pub(crate) fn fails_run(&self) -> bool {
        self.verdict().fails_run()
            || matches!(self.numerics, NumericsVerdict::Changed { .. })
            || (self.verdict() == HistoryVerdict::InsufficientHistory && self.baseline_regressed)
    }
}

/// The history's verdicts on a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateReport {
    pub run_id: String,
    pub hardware_key: String,
    pub store: String,
    pub policy: Policy,
    /// Which runs the cells were judged against (branch, merge-base).
    #[serde(default)]
    pub scope: String,
    /// The run that re-ran the suspect and unknown cells, when one did (the last, when
    /// several passes re-ran them).
    pub confirm_run_id: Option<String>,
    /// Cells left unconfirmed because the confirmation budget ran out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub over_budget: Vec<String>,
    pub cells: Vec<CellJudgement>,
}

impl GateReport {
    /// The file in a run folder.
    pub(crate) const FILE: &'static str = "history.json";

    /// 1 when a cell fails the job, else 0.
    pub fn exit_code(&self) -> i32 {
        if self.cells.iter().any(CellJudgement::fails_run) {
            crate::exit::bench::FAILED
        } else {
            crate::exit::bench::OK
        }
    }

    /// Reads `history.json` from a run folder; `None` when the run was not judged.
    pub(crate) fn load(run_dir: &Path) -> Option<GateReport> {
        let text = crate::files::read_to_string_bounded(
            &run_dir.join(Self::FILE),
            crate::files::MAX_RESULTS_BYTES,
        )
        .ok()?;
        serde_json::from_str(&text).ok()
    }

    pub(crate) fn cell(&self, id: &str) -> Option<&CellJudgement> {
        self.cells.iter().find(|c| c.cell_id == id)
    }

    /// Cells the confirmation re-runs: suspects, then unknown ones.
    pub fn to_confirm(&self) -> Vec<String> {
        let pick = |v: HistoryVerdict| {
            self.cells
                .iter()
                .filter(move |c| c.verdict() == v)
                .map(|c| c.cell_id.clone())
        };
        pick(HistoryVerdict::Suspect)
            .chain(pick(HistoryVerdict::Unknown))
            .collect()
    }
}
