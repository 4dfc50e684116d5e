//! What one run contributes to the history: its identity (id, time, commit, branch,
//! hardware key, host), the versions and speed switches it ran with, the GPU telemetry of
//! the run, and per cell its outcome, every metric with its repeats, and the loss curve of
//! the seeded run. Built from a run folder's `results.json` (and `telemetry.json`).

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

use crate::results::{CellResult, Outcome, RunResults};

use crate::telemetry::{CellTelemetry, Telemetry};

/// One run, ready to be written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub run_id: String,
    /// RFC 3339 UTC; runs are ordered by it.
    pub started_at: String,
    pub finished_at: Option<String>,
    pub commit: Option<String>,
    pub git_dirty: bool,
    pub branch: Option<String>,
    pub hardware_key: String,
    pub host: String,
    pub matrix_name: String,
    pub versions: Versions,
    pub switches: IndexMap<String, String>,
    /// `None`: the host had no GPU telemetry (a CPU host, or a run folder without it).
    pub telemetry: Option<Telemetry>,
    pub cells: Vec<CellRecord>,
}

/// The software a run measured with.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Versions {
    pub bench: String,
    pub libtorch: Option<String>,
    pub driver: Option<String>,
    pub cuda: Option<String>,
    pub rocm: Option<String>,
    pub nccl: Option<String>,
    pub gpu_model: Option<String>,
}

/// One cell of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellRecord {
    pub cell_id: String,
    /// `passed`, `failed`, `timed_out` or `skipped`.
    pub status: String,
    pub metrics: Vec<MetricRecord>,
    /// Losses of the first repeat's steps (warm-up included), the seeded run: every repeat
    /// of a cell uses the cell's seed, so the first one stands for all.
    pub loss_curve: Vec<f64>,
    /// GPU telemetry over the cell's measured steps (absent on a CPU host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<CellTelemetry>,
    /// What else identifies what the cell ran, beside the run's commit, switches and
    /// versions: for a framework cell its name, version, libraries and config hash.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub context: IndexMap<String, String>,
}

/// One metric of one cell: the value compared (median over repeats), each repeat's value
/// and their relative spread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricRecord {
    pub name: String,
    pub value: f64,
    pub samples: Vec<f64>,
    pub rel_spread: f64,
}

impl RunRecord {
    /// The record of a finished (or interrupted) run.
    pub fn from_results(
        results: &RunResults,
        branch: Option<String>,
        telemetry: Option<Telemetry>,
    ) -> RunRecord {
        let env = &results.environment;
        RunRecord {
            run_id: results.run_id.clone(),
            started_at: results.started_at.clone(),
            finished_at: results.finished_at.clone(),
            commit: env.git_commit.clone(),
            git_dirty: env.git_dirty,
            branch,
            hardware_key: env.hardware_key.clone(),
            host: env.host.clone(),
            matrix_name: results.matrix_name.clone(),
            versions: Versions {
                bench: env.bench_version.clone(),
                libtorch: env.libtorch.clone(),
                driver: env.driver.clone(),
                cuda: env.cuda.clone(),
                rocm: env.rocm.clone(),
                nccl: env.nccl.clone(),
                gpu_model: env.gpu_model.clone(),
            },
            switches: env.switches.clone(),
            telemetry,
            cells: results.cells.iter().map(CellRecord::from_result).collect(),
        }
    }

    pub(crate) fn throttled(&self) -> bool {
        self.telemetry.as_ref().is_some_and(|t| t.throttled)
    }
}

impl CellRecord {
    pub(crate) fn from_result(cell: &CellResult) -> CellRecord {
        let status = match &cell.outcome {
            Outcome::Passed => "passed",
            Outcome::Failed { .. } => "failed",
            Outcome::TimedOut { .. } => "timed_out",
            Outcome::Skipped { .. } => "skipped",
        };
        CellRecord {
            cell_id: cell.id.as_str().to_string(),
            status: status.to_string(),
            metrics: cell
                .metrics
                .iter()
                // A metric the run could not compute (NaN, an MFU or TFLOP/s of 0) is no
                // measurement: left out, whichever door the run came in by.
                .filter(|(name, m)| {
                    m.value.is_finite() && !crate::bounds::not_computed(name, m.value, &m.samples)
                })
                .map(|(name, m)| MetricRecord {
                    name: name.clone(),
                    value: m.value,
                    samples: m.samples.clone(),
                    rel_spread: m.rel_spread,
                })
                .collect(),
            loss_curve: cell
                .repeats
                .first()
                .map(|r| {
                    r.steps
                        .iter()
                        .filter(|s| s.rank.unwrap_or(0) == 0)
                        .map(|s| s.loss)
                        .collect()
                })
                .unwrap_or_default(),
            telemetry: cell.telemetry.as_deref().cloned(),
            context: context_of(cell),
        }
    }
}

/// A framework cell's identity (name, version, the libraries under it, config hash) from
/// its first repeat; empty for the built-in workload, whose code is the run's commit.
pub(crate) fn context_of(cell: &CellResult) -> IndexMap<String, String> {
    let mut out = IndexMap::new();
    if let Some(f) = cell
        .repeats
        .first()
        .and_then(|r| r.summary.framework.as_deref())
    {
        out.insert("framework".into(), f.name.clone());
        out.insert(format!("{} version", f.name), f.version.clone());
        for (lib, v) in &f.libraries {
            out.insert(lib.clone(), v.clone());
        }
        out.insert(
            "framework config".into(),
            f.config_sha256.chars().take(12).collect(),
        );
    }
    out
}

/// The branch a bisection's probes (and the side-by-side pairs, which a bisection reuses
/// as its two ends) are recorded under: never a branch whose history judges nightly runs,
/// so these measurements never join a band.
pub(crate) const PROBE_BRANCH: &str = "bisect";

/// The branch a run measured, from the CI's variables (a pull request's head branch first),
/// else from git; `None` when neither knows (a detached checkout outside CI).
pub(crate) fn current_branch() -> Option<String> {
    for var in [
        "GITHUB_HEAD_REF",
        "GITHUB_REF_NAME",
        "CI_MERGE_REQUEST_SOURCE_BRANCH_NAME",
        "CI_COMMIT_REF_NAME",
    ] {
        if let Ok(v) = std::env::var(var) {
            if !v.trim().is_empty() {
                return Some(v.trim().to_string());
            }
        }
    }
    // Bounded in time and output (`crate::proc`), as every call of a tool is.
    let out = crate::proc::Tool::git()
        .args(["rev-parse", "--abbrev-ref", "HEAD"])
        .stdout(None)
        .ok()?;
    let name = out.trim().to_string();
    (!name.is_empty() && name != "HEAD").then_some(name)
}
