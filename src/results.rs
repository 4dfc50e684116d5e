//! The results document of one run: `results/<run-id>/results.json`.
//!
//! The runner fills it cell by cell and writes it atomically after every cell; reporters,
//! `bench report` and `bench baseline update` only read it. Its shape is versioned by
//! [`SCHEMA_VERSION`]; a reader refuses a document of a newer version with a clear error.

use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

use crate::cell::{CellId, Params, Value};
use crate::events::{StepEvent, SummaryEvent};

/// Bumped on any incompatible change to [`RunResults`].
pub(crate) const SCHEMA_VERSION: u32 = 1;

/// Where and on what a run happened, captured once per run: on the host that runs `bench`,
/// or under `--launcher slurm` on the first node a job reported from (see
/// [`EnvironmentSource`] and `run::dispatch::node_env`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    /// e.g. "NVIDIA H100 80GB HBM3"; None on a host with no GPU.
    pub gpu_model: Option<String>,
    pub gpu_count: u32,
    pub gpu_memory_mib: Option<u64>,
    pub driver: Option<String>,
    pub cuda: Option<String>,
    pub rocm: Option<String>,
    pub libtorch: Option<String>,
    pub nccl: Option<String>,
    pub cpu: String,
    pub host: String,
    pub os: String,
    pub git_commit: Option<String>,
    pub git_dirty: bool,
    pub bench_version: String,
    /// Baseline key, e.g. `h100-sxm-80gb` or `cpu-x86_64`.
    pub hardware_key: String,
    /// The environment variables set for this run that change its speed (`BENCH_FUSED_*`
    /// switches, NCCL and allocator settings; see `env::speed_switches`), so a history of
    /// runs can tell a code change from a changed switch. Empty when none was set.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub switches: IndexMap<String, String>,
}

/// Where a run's [`Environment`] was captured, when that is not simply the host that ran
/// `bench` (the local launcher's case, where the field is absent).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "from", rename_all = "snake_case")]
pub enum EnvironmentSource {
    /// On the first node of a Slurm job (`--launcher slurm`): the hardware the cells ran on.
    SlurmNode {
        /// The job whose node reported first.
        job_id: String,
        /// The cell that job ran.
        cell: String,
    },
    /// On the submitting host, because no Slurm job has reported its node's environment:
    /// the hardware key may not be that of the nodes the cells ran on.
    SubmitHost,
}

/// Why a cell did not produce a measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    /// Every repeat finished with a summary.
    Passed,
    /// The worker failed in a way that is the cell's fault (OOM, NaN loss, bad config, a
    /// crash that persisted through retries).
    Failed { reason: String },
    /// The cell ran past its timeout and was killed.
    TimedOut { reason: String },
    /// The cell did not run: unsupported on this device, needs more GPUs than the host has,
    /// or the run was interrupted before it.
    Skipped { reason: String },
}

/// One attempt of one repeat (retries add attempts).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    pub repeat: u32,
    pub attempt: u32,
    pub exit_code: Option<i32>,
    pub duration_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The Slurm job that ran this attempt (`--launcher slurm`), for `sacct -j`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job_id: Option<String>,
    /// The nodes Slurm ran the job on, as Slurm writes a node list (e.g. `gpu[01-02]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_nodes: Option<String>,
    /// The hardware key of the node the job ran on (its first node), as the job script's
    /// `bench env` saw it; absent for local attempts and for jobs that never reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_hardware_key: Option<String>,
}

/// Measurements of one successful repeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Repeat {
    pub steps: Vec<StepEvent>,
    #[serde(default)]
    pub summary: SummaryEvent,
    /// Worker notices (e.g. compile fell back to plain execution).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notices: Vec<String>,
}

/// A statistic of one metric over a cell's measurements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricValue {
    /// The value compared with baselines: the median over repeats.
    pub value: f64,
    /// One value per repeat.
    pub samples: Vec<f64>,
    /// Relative spread of the repeats (half the min..max range over the median; 0 with one
    /// repeat), used to tell noise from change.
    pub rel_spread: f64,
}

/// Summary metrics of a cell, keyed by metric name: `tokens_per_s`,
/// `tokens_per_s_per_gpu`, `step_time_s`, `mfu`, `tflops_per_gpu`, `peak_mem_bytes`
/// (largest rank), `time_to_1t_tokens_days`.
pub(crate) type Metrics = IndexMap<String, MetricValue>;

/// One cell of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellResult {
    pub id: CellId,
    pub values: IndexMap<String, Value>,
    pub params: Params,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// True when an infrastructure failure was retried and a later attempt succeeded.
    #[serde(default)]
    pub flaky: bool,
    #[serde(default)]
    pub attempts: Vec<Attempt>,
    #[serde(default)]
    pub repeats: Vec<Repeat>,
    #[serde(default)]
    pub metrics: Metrics,
    /// Log files of this cell, relative to the run directory (one per repeat and rank).
    #[serde(default)]
    pub logs: Vec<PathBuf>,
    pub duration_s: f64,
    /// GPU telemetry over the cell's measured steps on its own GPUs (`crate::telemetry`);
    /// absent on a host without GPU telemetry and under `--launcher slurm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<Box<crate::telemetry::CellTelemetry>>,
}

/// A cell the matrix rules or the filter removed before running.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DroppedCell {
    pub id: CellId,
    pub values: IndexMap<String, Value>,
    /// The rule (or filter) that dropped it, e.g. `rules[1] (incompatible)`.
    pub by: String,
    pub reason: String,
}

/// The prefix of [`DroppedCell::by`] for cells the command line's `--filter` removed (as
/// opposed to the matrix's rules): reports leave those out, since nobody meant to run them.
pub(crate) const FILTER_DROP_PREFIX: &str = "--filter";

impl DroppedCell {
    /// True when `--filter` removed the cell, not one of the matrix's rules.
    pub(crate) fn by_filter(&self) -> bool {
        self.by.starts_with(FILTER_DROP_PREFIX)
    }
}

/// The whole results document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResults {
    pub schema_version: u32,
    pub run_id: String,
    /// The matrix file as given on the command line.
    pub matrix: PathBuf,
    /// The matrix's `name`, or the file stem.
    pub matrix_name: String,
    /// SHA-256 of the matrix file's bytes when the run started: `--resume` refuses to
    /// continue a run with a different matrix, which would mix two matrices' cells in one
    /// results document (absent in documents written before the field existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matrix_sha256: Option<String>,
    pub filters: Vec<String>,
    /// RFC 3339 UTC.
    pub started_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// True when the run was stopped (Ctrl-C, --fail-fast) before every cell ran.
    #[serde(default)]
    pub interrupted: bool,
    pub environment: Environment,
    /// Where `environment` was captured; absent when on the host that ran `bench` (every
    /// local run, and documents written before the field existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_source: Option<EnvironmentSource>,
    /// How the cells were started: `local` or `slurm` (absent in documents written before
    /// the field existed, which were all local).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launcher: Option<String>,
    pub cells: Vec<CellResult>,
    #[serde(default)]
    pub dropped: Vec<DroppedCell>,
}

/// The hex SHA-256 of a matrix file's bytes, as [`RunResults::matrix_sha256`] records it.
pub(crate) fn matrix_digest(path: &Path) -> std::io::Result<String> {
    use sha2::Digest;
    let bytes = std::fs::read(path)?;
    Ok(sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Errors reading or writing a results document, each naming the file.
#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    #[error("{path}: cannot read results: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: malformed results: {message}")]
    Parse {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{path}: results schema version {found} is newer than this bench understands ({SCHEMA_VERSION}); upgrade bench")]
    Version { path: PathBuf, found: u32 },
    #[error("{path}: cannot write results: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl RunResults {
    /// The file name inside a run directory.
    pub const FILE: &'static str = "results.json";

    /// Reads `results.json` from a run directory (or the file itself).
    pub fn load(path: &Path) -> Result<RunResults, ResultsError> {
        let file = if path.is_dir() {
            path.join(Self::FILE)
        } else {
            path.to_path_buf()
        };
        let text = std::fs::read_to_string(&file).map_err(|source| ResultsError::Read {
            path: file.clone(),
            source,
        })?;
        let doc: RunResults = serde_json::from_str(&text).map_err(|e| ResultsError::Parse {
            path: file.clone(),
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        })?;
        if doc.schema_version > SCHEMA_VERSION {
            return Err(ResultsError::Version {
                path: file,
                found: doc.schema_version,
            });
        }
        Ok(doc)
    }

    /// Writes `results.json` into `dir` atomically: a temporary file in the same directory,
    /// flushed to disk, then renamed over the old one, so a reader (or a crash) never sees
    /// a half-written document.
    pub fn save_atomic(&self, dir: &Path) -> Result<(), ResultsError> {
        let path = dir.join(Self::FILE);
        let json = serde_json::to_vec_pretty(self).map_err(|e| ResultsError::Write {
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        crate::atomic::write(&path, &json).map_err(|source| ResultsError::Write { path, source })
    }
}
