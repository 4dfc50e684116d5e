//! The results document of one run: `results/<run-id>/results.json`.
//!
//! The runner fills it cell by cell and makes every finished cell durable before the next
//! event: a small document is rewritten atomically after every cell; a large one gets the
//! cell appended to its journal, `results.journal`, and is rewritten whole on a doubling
//! schedule and at the end (see `run::dispatch::resume::Book`). Reporters, `bench report`
//! and `bench baseline update` only read it, through [`RunResults::load`], which merges
//! the journal. Its shape is versioned by
//! [`SCHEMA_VERSION`]; a reader refuses a document of a newer version with a clear error.

use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

use crate::cell::{CellId, Params, Value};
use crate::events::{StepEvent, SummaryEvent};

/// Bumped on any incompatible change to [`RunResults`].
pub(crate) const SCHEMA_VERSION: u32 = 1;

/// The longest a cell's run (or one attempt of it) is believed to take: a year. A longer
/// duration is a forged or overflowed figure, refused where results are read.
pub(crate) const MAX_CELL_S: f64 = 365.0 * 86_400.0;

/// Documents whose compact form is larger than this are written compact
/// ([`RunResults::document`]): a person reads a small one, a large one must stay within
/// what readers accept.
const PRETTY_MAX_BYTES: u64 = 16 * crate::files::MIB;

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
    /// The same nodes by name, in Slurm's order (`["gpu01", "gpu02"]`), so that a reader
    /// finds every node a multi-node cell ran on without expanding Slurm's list syntax.
    /// Absent for local attempts and in results written before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slurm_node_names: Vec<String>,
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
/// (largest rank), `time_to_1t_tokens_days`, and `tokens_per_joule` and
/// `kwh_per_1t_tokens` when the cell's telemetry read its GPUs' power
/// (`metrics::energy`).
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

/// The prefix of [`DroppedCell::by`] for cells another shard of the run runs (`bench matrix
/// --shard I/N`): like a filter's, the command line left them out of this folder.
pub(crate) const SHARD_DROP_PREFIX: &str = "--shard";

impl DroppedCell {
    /// True when the command line (`--filter`, or `--shard` for another shard's cells)
    /// removed the cell, not one of the matrix's rules.
    pub(crate) fn by_filter(&self) -> bool {
        self.by.starts_with(FILTER_DROP_PREFIX) || self.by_shard()
    }

    /// True when another shard of the run runs the cell.
    pub(crate) fn by_shard(&self) -> bool {
        self.by.starts_with(SHARD_DROP_PREFIX)
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
    /// What a signal (Ctrl-C, SIGTERM) stopped, when one did. The command then exits 130,
    /// and every report says so, whether written by that command or by `bench report`
    /// later: the exit code is decided from this document, not from the process that
    /// wrote it. `interrupted` without it is a run that `--fail-fast` or `--max-fail`
    /// stopped, which exits with its cells' verdicts (1); so is a document written before
    /// the field existed, which cannot tell the two apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted_in: Option<Interruption>,
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

/// The stage of a run that a signal stopped ([`RunResults::interrupted_in`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Interruption {
    /// The cells: some did not run, or were stopped ([`RunResults::interrupted`] too).
    Cells,
    /// The confirmation of the verdicts, after every cell ran: the side-by-side pairs or
    /// the re-runs.
    Confirmation,
    /// Triage, after the verdicts: a finding's bisection (its setup, a probe or a trace).
    Triage,
}

impl Interruption {
    /// What the run did not finish, as the reports say it after "the run was interrupted".
    pub(crate) fn words(self) -> &'static str {
        match self {
            Interruption::Cells => "before every cell ran",
            Interruption::Confirmation => "while its verdicts were being confirmed",
            Interruption::Triage => "during triage, before its bisections finished",
        }
    }
}

/// The journal at `path`, open for reading, or `None` when there is none. Anything but a
/// regular file (a FIFO would block the reader, a link to a device would never end) is an
/// error naming it.
fn open_journal(path: &Path) -> Result<Option<std::fs::File>, ResultsError> {
    let error = |source| ResultsError::Read {
        path: path.to_path_buf(),
        source,
    };
    match crate::files::open_regular(path) {
        Ok(f) => Ok(Some(f)),
        // Removed between the two calls: the run folded it into the document.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(error(e)),
    }
}

/// One journal line as an entry, or the column and message of why it is not one. Only the
/// documented object form reads (serde would take a struct written as a list too), and the
/// message leaves out serde's own position, which counts within the line.
fn parse_journal_line(line: &[u8]) -> Result<JournalEntry, (usize, String)> {
    let line = line.trim_ascii();
    if !line.starts_with(b"{") {
        return Err((
            1,
            "a journal line is one JSON object `{\"run\": ..., \"cell\": ...}`".into(),
        ));
    }
    serde_json::from_slice(line).map_err(|e| {
        let message = e.to_string();
        let message = match message.rsplit_once(" at line ") {
            Some((head, _)) => head.to_string(),
            None => message,
        };
        (e.column(), message)
    })
}

/// One line of [`RunResults::JOURNAL`]: a finished cell and the run it belongs to.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct JournalEntry {
    pub run: String,
    pub cell: CellResult,
}

impl JournalEntry {
    /// The journal line for `cell` of run `run`, newline included: compact JSON, so one
    /// line is one entry.
    pub(crate) fn line(run: &str, cell: &CellResult) -> serde_json::Result<Vec<u8>> {
        #[derive(Serialize)]
        struct Borrowed<'a> {
            run: &'a str,
            cell: &'a CellResult,
        }
        let mut line = serde_json::to_vec(&Borrowed { run, cell })?;
        line.push(b'\n');
        Ok(line)
    }
}

/// The hex SHA-256 of a matrix file's bytes, as [`RunResults::matrix_sha256`] records it.
pub(crate) fn matrix_digest(path: &Path) -> std::io::Result<String> {
    use sha2::Digest;
    let bytes = crate::files::read_bounded(path, crate::files::MAX_CONFIG_BYTES)?;
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
    /// A value no run can have written (a run id or hardware key that leaves its folder);
    /// the message names the key path.
    #[error("{message}")]
    Invalid { path: PathBuf, message: String },
    #[error("{path}: results schema version {found} is newer than this bench understands ({SCHEMA_VERSION}); upgrade bench")]
    Version { path: PathBuf, found: u32 },
    #[error("{path}: cannot write results: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl CellResult {
    /// GPUs the cell held ([`crate::cell::gpus_of`]: 1 for a CPU cell or no `gpus` axis).
    pub(crate) fn gpus(&self) -> u32 {
        crate::cell::gpus_of(self.values.get("gpus"))
    }

    /// GPU-seconds the cell took: its duration times its GPUs.
    pub(crate) fn gpu_seconds(&self) -> f64 {
        self.duration_s * f64::from(self.gpus())
    }
}

impl RunResults {
    /// The file name inside a run directory.
    pub const FILE: &'static str = "results.json";

    /// The run's exit code, given the one its verdicts give (`verdict`: 0, or 1 for
    /// regressions and failed cells): 130 when a signal stopped it, whatever its verdicts.
    /// The command returns it and every report states it, so no two of them can disagree.
    pub fn exit_code(&self, verdict: i32) -> i32 {
        // A run stopped before every cell ran is never a pass. `--fail-fast` and
        // `--max-fail` stop only after a failed cell (verdict 1), so one stopped with a
        // verdict of 0 was stopped by a signal, in a document written before
        // `interrupted_in` was.
        let stopped_clean = self.interrupted && verdict == crate::exit::bench::OK;
        if self.interrupted_in.is_some() || stopped_clean {
            crate::exit::bench::INTERRUPTED
        } else {
            verdict
        }
    }

    /// GPU-seconds the run's cells took (one a second for a CPU cell).
    pub(crate) fn gpu_seconds(&self) -> f64 {
        self.cells.iter().map(CellResult::gpu_seconds).sum()
    }

    /// The journal beside [`Self::FILE`] while a run of many cells is in progress (or was
    /// killed): one line per finished cell that `results.json` may not hold yet, each a
    /// compact [`JournalEntry`]. A run that ends in order folds it in and removes it.
    pub const JOURNAL: &'static str = "results.journal";

    /// Reads `results.json` from a run directory (or the file itself), with the cells its
    /// journal holds beyond it.
    pub fn load(path: &Path) -> Result<RunResults, ResultsError> {
        let file = if path.is_dir() {
            path.join(Self::FILE)
        } else {
            path.to_path_buf()
        };
        // Only the run folder's own document has a journal: a copy under another name does
        // not take the cells of whatever run left one beside it. The journal is opened
        // before the document is read: a run that rewrites the document and removes the
        // journal in between leaves this reader the removed journal's cells through its
        // handle, and the document read after holds them anyway. The other order could
        // read an old document and then find no journal, losing saved cells.
        let journal_path = file.with_file_name(Self::JOURNAL);
        let journal = if file.file_name() == Some(std::ffi::OsStr::new(Self::FILE)) {
            open_journal(&journal_path)?
        } else {
            None
        };
        // A regular file of a bounded size (crate::files): a FIFO would hang the reader,
        // a link to /dev/zero fill its memory.
        let text = crate::files::read_bounded(&file, crate::files::MAX_RESULTS_BYTES).map_err(
            |source| ResultsError::Read {
                path: file.clone(),
                source,
            },
        )?;
        let mut doc: RunResults =
            serde_json::from_slice(&text).map_err(|e| ResultsError::Parse {
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
        // The names a run folder gives are checked as the command line's are
        // (crate::ids): a document whose run id or hardware key leaves its folder would
        // have a report read a baseline file, or the history key a run, anywhere.
        crate::ids::check_run_id(&format!("{}: run_id", file.display()), &doc.run_id).map_err(
            |e| ResultsError::Invalid {
                path: file.clone(),
                message: e.to_string(),
            },
        )?;
        // An empty key (a run whose hardware was never known) names no file and is kept.
        let key = &doc.environment.hardware_key;
        (if key.is_empty() {
            Ok(())
        } else {
            crate::ids::check_hardware_key(
                &format!("{}: environment.hardware_key", file.display()),
                key,
            )
        })
        .map_err(|e| ResultsError::Invalid {
            path: file.clone(),
            message: e.to_string(),
        })?;
        if let Some(handle) = journal {
            let bytes = crate::files::read_open_bounded(handle, crate::files::MAX_RESULTS_BYTES)
                .map_err(|source| ResultsError::Read {
                    path: journal_path.clone(),
                    source,
                })?;
            doc.merge_journal(&journal_path, &bytes)?;
        }
        // Every reader gets durations it can turn into times: a duration of 1e20 s made
        // `bench report` panic converting it, while `bench history import` took it.
        if let Some(why) = doc.implausible_duration() {
            return Err(ResultsError::Invalid {
                message: format!("{}: {why}", file.display()),
                path: file,
            });
        }
        Ok(doc)
    }

    /// The first duration of the document no run can have taken (not a finite number of
    /// seconds between 0 and [`MAX_CELL_S`]), as its key path and why; `None` when every
    /// cell's and attempt's duration is plausible.
    pub(crate) fn implausible_duration(&self) -> Option<String> {
        let bad = |v: f64| !(v.is_finite() && (0.0..=MAX_CELL_S).contains(&v));
        let why = |key: String, v: f64| {
            format!(
                "{key} is {v:e}: not a duration a cell can take (between 0 and {MAX_CELL_S:e} s, a year)"
            )
        };
        for (i, c) in self.cells.iter().enumerate() {
            let at = format!("cells[{i}] ({})", crate::sanitize::terminal(c.id.as_str()));
            if bad(c.duration_s) {
                return Some(why(format!("{at}.duration_s"), c.duration_s));
            }
            if let Some((j, a)) = c
                .attempts
                .iter()
                .enumerate()
                .find(|(_, a)| bad(a.duration_s))
            {
                return Some(why(format!("{at}.attempts[{j}].duration_s"), a.duration_s));
            }
        }
        None
    }

    /// The first value of the document no measurement can have given, as its key path and
    /// why: a metric ([`crate::bounds::check`]; one the run could not compute,
    /// [`crate::bounds::not_computed`], is no measurement and is not checked), then each
    /// repeat's steps and summary ([`StepEvent::implausible`],
    /// [`SummaryEvent::implausible`]: the rule the worker's door holds them to). Every
    /// reader that renders, merges or imports a run folder holds it to this one check.
    pub(crate) fn implausible_measurement(&self) -> Option<String> {
        self.implausible_metric()
            .or_else(|| self.implausible_repeat())
    }

    /// The first step or repeat summary of the document no worker could have reported, as
    /// its key path and why. The HTML report draws every repeat's step times, the gate
    /// reads the measured steps and the history keeps the first repeat's loss curve, so a
    /// forged 1e308 s step or a -1 tok/s summary would be taken for a measurement there,
    /// though the worker's door refuses both.
    fn implausible_repeat(&self) -> Option<String> {
        for (i, cell) in self.cells.iter().enumerate() {
            let at = || {
                format!(
                    "cells[{i}] ({})",
                    crate::sanitize::terminal(cell.id.as_str())
                )
            };
            for (j, r) in cell.repeats.iter().enumerate() {
                for (k, step) in r.steps.iter().enumerate() {
                    if let Some((field, why)) = step.implausible() {
                        return Some(format!("{}.repeats[{j}].steps[{k}].{field}: {why}", at()));
                    }
                }
                if let Some((field, why)) = r.summary.implausible() {
                    return Some(format!("{}.repeats[{j}].summary.{field}: {why}", at()));
                }
            }
        }
        None
    }

    /// The first metric value of the document no measurement can have given
    /// ([`crate::bounds::check`]), as its key path and why; a metric the run could not
    /// compute ([`crate::bounds::not_computed`]) is no measurement and is not checked.
    fn implausible_metric(&self) -> Option<String> {
        for (i, cell) in self.cells.iter().enumerate() {
            for (name, m) in &cell.metrics {
                if crate::bounds::not_computed(name, m.value, &m.samples) {
                    continue;
                }
                if m.samples.len() > crate::bounds::MAX_SAMPLES {
                    return Some(format!(
                        "cells[{i}] ({}).metrics.{}.samples: {} samples, more than the {} one value may hold",
                        crate::sanitize::terminal(cell.id.as_str()),
                        crate::sanitize::terminal(name),
                        m.samples.len(),
                        crate::bounds::MAX_SAMPLES
                    ));
                }
                if let Err(why) = crate::bounds::check_rel_spread(m.rel_spread) {
                    return Some(format!(
                        "cells[{i}] ({}).metrics.{}.rel_spread: {why}",
                        crate::sanitize::terminal(cell.id.as_str()),
                        crate::sanitize::terminal(name),
                    ));
                }
                let values = std::iter::once((String::from("value"), m.value)).chain(
                    m.samples
                        .iter()
                        .enumerate()
                        .map(|(j, v)| (format!("samples[{j}]"), *v)),
                );
                for (key, v) in values {
                    if let Err(why) = crate::bounds::check(name, v) {
                        return Some(format!(
                            "cells[{i}] ({}).metrics.{}.{key}: {why}",
                            crate::sanitize::terminal(cell.id.as_str()),
                            crate::sanitize::terminal(name),
                        ));
                    }
                }
            }
        }
        None
    }

    /// Adds the journal's cells to the document: a cell the document holds already (a
    /// resumed run's cell run again, or a journal left behind by a crash just after the
    /// document took it in) is replaced by the journal's later result; a new one is
    /// appended. Entries of another run are refused. Each line is synced before its cell is
    /// reported saved, so a last line that does not read is a write that a crash cut short
    /// (without its newline, or with pages that reached the disk out of order): its cell was
    /// never reported saved, and it is left out with a warning rather than guessed at, so
    /// that `--resume` runs it again. An unreadable line before the last is an error.
    fn merge_journal(&mut self, path: &Path, bytes: &[u8]) -> Result<(), ResultsError> {
        let mut at: std::collections::HashMap<CellId, usize> = self
            .cells
            .iter()
            .enumerate()
            .map(|(i, c)| (c.id.clone(), i))
            .collect();
        let lines: Vec<(usize, &[u8])> = bytes
            .split(|&b| b == b'\n')
            .enumerate()
            .map(|(n, l)| (n + 1, l))
            .filter(|(_, l)| !l.trim_ascii().is_empty())
            .collect();
        // Whatever follows the last newline, unless blank, is a line cut short.
        let torn_tail = bytes
            .rsplit(|&b| b == b'\n')
            .next()
            .is_some_and(|tail| !tail.trim_ascii().is_empty());
        for (k, &(line_no, line)) in lines.iter().enumerate() {
            let last = k + 1 == lines.len();
            if last && torn_tail {
                // Cut short before its newline: never reported saved.
                continue;
            }
            let error = |column: usize, message: String| ResultsError::Parse {
                path: path.to_path_buf(),
                line: line_no,
                column,
                message,
            };
            let entry = match parse_journal_line(line) {
                Ok(entry) => entry,
                Err((column, message)) if last => {
                    eprintln!(
                        "bench: warning: {}:{line_no}:{column}: the last journal line does not read ({message}); taken as a write cut short, its cell as not saved",
                        path.display()
                    );
                    continue;
                }
                Err((column, message)) => return Err(error(column, message)),
            };
            if entry.run != self.run_id {
                return Err(error(
                    1,
                    format!(
                        "journal entry of run `{}` beside results of run `{}`",
                        entry.run, self.run_id
                    ),
                ));
            }
            match at.get(&entry.cell.id) {
                Some(&i) => self.cells[i] = entry.cell,
                None => {
                    at.insert(entry.cell.id.clone(), self.cells.len());
                    self.cells.push(entry.cell);
                }
            }
        }
        Ok(())
    }

    /// Writes `results.json` into `dir` atomically: a temporary file in the same directory,
    /// flushed to disk, then renamed over the old one, so a reader (or a crash) never sees
    /// a half-written document.
    pub fn save_atomic(&self, dir: &Path) -> Result<(), ResultsError> {
        let path = dir.join(Self::FILE);
        let json = self.document().map_err(|e| ResultsError::Write {
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        crate::atomic::write(&path, &json).map_err(|source| ResultsError::Write { path, source })
    }

    /// The bytes of `results.json`: indented for a person when the document is small,
    /// compact when it is large. Indentation made a large document (a merge of two shards
    /// of 20,001 cells) more than twice its size, past [`crate::files::MAX_RESULTS_BYTES`],
    /// which every reader then refused.
    pub(crate) fn document(&self) -> serde_json::Result<Vec<u8>> {
        let compact = serde_json::to_vec(self)?;
        if compact.len() as u64 > PRETTY_MAX_BYTES {
            return Ok(compact);
        }
        serde_json::to_vec_pretty(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bounds::MAX_STEP_S;

    fn cell(id: &str, reason: &str) -> CellResult {
        serde_json::from_value(serde_json::json!({
            "id": id, "values": {}, "params": Params::default(),
            "status": "failed", "reason": reason, "duration_s": 1.0,
        }))
        .unwrap()
    }

    /// A run folder with `cells` in results.json and `journal` as the journal's bytes.
    fn folder(cells: &[CellResult], journal: &[u8]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let doc: RunResults = serde_json::from_value(serde_json::json!({
            "schema_version": 1, "run_id": "r", "matrix": "m.yaml", "matrix_name": "m",
            "filters": [], "started_at": "t", "environment": Environment::default(),
            "cells": cells,
        }))
        .unwrap();
        doc.save_atomic(dir.path()).unwrap();
        std::fs::write(dir.path().join(RunResults::JOURNAL), journal).unwrap();
        dir
    }

    fn ids(r: &RunResults) -> Vec<(&str, String)> {
        r.cells
            .iter()
            .map(|c| {
                let why = match &c.outcome {
                    Outcome::Failed { reason } => reason.clone(),
                    o => format!("{o:?}"),
                };
                (c.id.as_str(), why)
            })
            .collect()
    }

    #[test]
    fn the_journal_adds_cells_and_replaces_earlier_results_of_the_same_cell() {
        let mut journal = JournalEntry::line("r", &cell("b", "journal")).unwrap();
        journal.extend(JournalEntry::line("r", &cell("a", "again")).unwrap());
        let dir = folder(&[cell("a", "first")], &journal);
        let r = RunResults::load(dir.path()).unwrap();
        assert_eq!(
            ids(&r),
            [("a", "again".to_string()), ("b", "journal".to_string())]
        );
        // The file named directly reads the same; a copy under another name has no journal.
        let file = dir.path().join(RunResults::FILE);
        assert_eq!(RunResults::load(&file).unwrap(), r);
        let copy = dir.path().join("copy.json");
        std::fs::copy(&file, &copy).unwrap();
        assert_eq!(RunResults::load(&copy).unwrap().cells.len(), 1);
    }

    /// A crash in the middle of an append leaves a line without its newline: that cell was
    /// never reported saved, and it is left out whatever its bytes parse as.
    #[test]
    fn a_torn_last_line_is_left_out() {
        let mut journal = JournalEntry::line("r", &cell("b", "whole")).unwrap();
        let torn = JournalEntry::line("r", &cell("c", "torn")).unwrap();
        journal.extend_from_slice(&torn[..torn.len() - 1]);
        let dir = folder(&[], &journal);
        let r = RunResults::load(dir.path()).unwrap();
        assert_eq!(ids(&r), [("b", "whole".to_string())]);
        let dir = folder(&[], &torn[..20]);
        assert!(RunResults::load(dir.path()).unwrap().cells.is_empty());
    }

    #[test]
    fn a_malformed_or_foreign_line_is_an_error_naming_the_journal_and_line() {
        let good = JournalEntry::line("r", &cell("b", "ok")).unwrap();
        for (bad, column, says) in [
            (&b"{\"run\": \"r\", \"cell\": 7}"[..], 22, "invalid type"),
            (b"[\"r\", {}]", 1, "one JSON object"),
            (b"\0\0\0", 1, "one JSON object"),
        ] {
            let mut journal = good.clone();
            journal.extend_from_slice(bad);
            journal.push(b'\n');
            journal.extend_from_slice(&good);
            let dir = folder(&[], &journal);
            let e = RunResults::load(dir.path()).unwrap_err().to_string();
            assert!(
                e.contains(&format!("results.journal:2:{column}: malformed results: "))
                    && e.contains(says)
                    && !e.contains("at line 1"),
                "{e}"
            );
        }

        let journal = JournalEntry::line("other", &cell("b", "ok")).unwrap();
        let dir = folder(&[], &journal);
        let e = RunResults::load(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("results.journal:1:1") && e.contains("run `other`"),
            "{e}"
        );
    }

    /// A last line that ends in its newline but does not read (pages of one append that
    /// reached the disk out of order) was never reported saved either: left out, so that
    /// `--resume` runs its cell again, instead of blocking every reader. Blank lines and
    /// CRLF endings are no entries and no errors.
    #[test]
    fn an_unreadable_last_line_and_blank_lines_are_left_out() {
        let mut journal = b"\n \r\n".to_vec();
        journal.extend(JournalEntry::line("r", &cell("b", "whole")).unwrap());
        journal.extend_from_slice(b"\0\0{\"run\": \"r\", \"ce\n  \n");
        let dir = folder(&[], &journal);
        let r = RunResults::load(dir.path()).unwrap();
        assert_eq!(ids(&r), [("b", "whole".to_string())]);
    }

    /// A small document is written for a person to read, a large one compact (indented, a
    /// 40,002-cell merge outgrew what readers accept); both read back the same.
    #[test]
    fn a_large_document_is_written_compact() {
        let dir = folder(&[cell("a", "small")], b"");
        let small = RunResults::load(dir.path()).unwrap();
        assert!(small.document().unwrap().starts_with(b"{\n"));
        let mut large = small.clone();
        large.cells[0] = cell("a", &"x".repeat(PRETTY_MAX_BYTES as usize + 1));
        let doc = large.document().unwrap();
        assert!(doc.starts_with(b"{\"schema_version\":"));
        assert_eq!(serde_json::from_slice::<RunResults>(&doc).unwrap(), large);
    }

    /// Durations no cell takes are found with their key path; a year is the limit.
    #[test]
    fn implausible_durations_are_named() {
        let dir = folder(&[cell("a", "x")], b"");
        let mut r = RunResults::load(dir.path()).unwrap();
        assert_eq!(r.implausible_duration(), None);
        for v in [1e20, -1.0, f64::NAN, MAX_CELL_S * 1.01] {
            r.cells[0].duration_s = v;
            let why = r.implausible_duration().unwrap();
            assert!(why.starts_with("cells[0] (a).duration_s is "), "{why}");
        }
        r.cells[0].duration_s = MAX_CELL_S;
        assert_eq!(r.implausible_duration(), None);
    }

    /// A repeat's step or summary figure that the worker's door refuses is found with its
    /// key path; the figures a worker reports pass.
    #[test]
    fn implausible_steps_and_summaries_are_named() {
        let dir = folder(&[cell("a", "x")], b"");
        let mut r = RunResults::load(dir.path()).unwrap();
        let repeat: Repeat = serde_json::from_value(serde_json::json!({
            "steps": [
                {"step": 0, "step_time_s": 1.0, "tokens": 1024, "loss": 2.5, "warmup": true},
                {"step": 1, "step_time_s": 0.01, "tokens": 1024, "loss": 2.5},
            ],
            "summary": {"tokens_per_s": 102400.0, "peak_mem_bytes": [1000], "mfu": 0.0},
        }))
        .unwrap();
        r.cells[0].repeats = vec![repeat.clone(), repeat];
        assert_eq!(r.implausible_measurement(), None);
        for v in [1e308, -1.0, 0.0, f64::NAN, MAX_STEP_S * 2.0] {
            let mut bad = r.clone();
            bad.cells[0].repeats[1].steps[1].step_time_s = v;
            let why = bad.implausible_measurement().unwrap();
            assert!(
                why.starts_with("cells[0] (a).repeats[1].steps[1].step_time_s: "),
                "{why}"
            );
        }
        let mut bad = r.clone();
        bad.cells[0].repeats[0].summary.tokens_per_s = Some(-1.0);
        let why = bad.implausible_measurement().unwrap();
        assert!(
            why.starts_with("cells[0] (a).repeats[0].summary.tokens_per_s: tokens_per_s -1"),
            "{why}"
        );
    }

    /// A journal that is not a regular file is an error, not a reader that blocks on a FIFO
    /// or reads a device forever.
    #[test]
    fn a_journal_that_is_not_a_file_is_an_error() {
        let dir = folder(&[], b"");
        let journal = dir.path().join(RunResults::JOURNAL);
        std::fs::remove_file(&journal).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(&journal)
            .status()
            .unwrap();
        assert!(made.success());
        let e = RunResults::load(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("results.journal") && e.contains("not a regular file"),
            "{e}"
        );
    }
}
