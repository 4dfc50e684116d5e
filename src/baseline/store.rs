//! Baseline files: `baselines/<hardware-key>.yaml`, one per hardware key, keyed by cell id.
//!
//! A file holds, per cell, where its numbers came from (provenance) and per metric the
//! stored value, which direction is better, the tolerance of a change, an optional absolute
//! floor and the spread of the repeats that produced the value:
//!
//! ```yaml
//! schema_version: 1
//! hardware_key: h100-sxm-80gb
//! cells:
//!   gpt2-125m.bf16.1gpu.single.base:
//!     provenance: {date: 2026-11-22T10:15:00Z, commit: 1a2b3c4, bench_version: 0.1.0,
//!                  run_id: 20261122T101500Z, hardware: 1x NVIDIA H100 80GB HBM3}
//!     metrics:
//!       tokens_per_s: {value: 350000.0, direction: higher, spread: 0.004}
//!       peak_mem_bytes: {value: 2.1e10, direction: lower, tolerance: 0.05, floor: 1.0e8}
//! ```
//!
//! `direction` and `tolerance` may be left out; they then default by metric
//! ([`catalog::direction`], [`catalog::tolerance`]). `bench baseline update` writes the
//! direction explicitly, so reviewers see it, and keeps whatever tolerance and floor a user
//! set by hand. Files are read with located errors (file:line:column and the key path) and
//! written atomically.

use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_saphyr::{MessageFormatter, Spanned, UserMessageFormatter};

use crate::results::{CellResult, Environment, MetricValue, Outcome, RunResults};

/// Bumped on any incompatible change to the file format.
pub(crate) const SCHEMA_VERSION: u32 = 1;

pub use crate::metrics::catalog::Direction;
use crate::metrics::catalog::{self, DEFAULT_THROUGHPUT_TOLERANCE};

/// Where a cell's baseline numbers came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// RFC 3339 UTC time of the run (its start).
    pub date: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// True when the working tree had uncommitted changes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub git_dirty: bool,
    pub bench_version: String,
    pub run_id: String,
    /// The machine in words, e.g. `8x NVIDIA H100 80GB HBM3` or the CPU model.
    pub hardware: String,
}

impl Provenance {
    pub(crate) fn of_run(results: &RunResults) -> Provenance {
        let env = &results.environment;
        Provenance {
            date: results.started_at.clone(),
            commit: env.git_commit.clone(),
            git_dirty: env.git_dirty,
            bench_version: env.bench_version.clone(),
            run_id: results.run_id.clone(),
            hardware: hardware_words(env),
        }
    }
}

/// The machine in words: `<n>x <gpu model>` on a GPU host, the CPU model otherwise.
pub(crate) fn hardware_words(env: &Environment) -> String {
    match &env.gpu_model {
        Some(gpu) => format!("{}x {gpu}", env.gpu_count.max(1)),
        None => env.cpu.clone(),
    }
}

/// The stored reference of one metric of one cell.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricBaseline {
    pub value: f64,
    pub direction: Direction,
    /// Relative tolerance set by the user; [`catalog::tolerance`] when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<f64>,
    /// Absolute floor: a change smaller than this (in the metric's unit) is never a
    /// regression or an improvement, whatever its relative size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floor: Option<f64>,
    /// Relative spread of the repeats that produced `value` (see `results::MetricValue`).
    pub spread: f64,
}

impl MetricBaseline {
    /// The tolerance in force: the user's, or the metric's default.
    pub(crate) fn effective_tolerance(&self, metric: &str) -> f64 {
        self.tolerance.unwrap_or_else(|| catalog::tolerance(metric))
    }
}

/// The baseline of one cell.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CellBaseline {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
    pub metrics: IndexMap<String, MetricBaseline>,
}

/// The document of one baseline file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BaselineDoc {
    pub schema_version: u32,
    pub hardware_key: String,
    pub cells: IndexMap<String, CellBaseline>,
}

/// The baselines of one hardware key, with the file they live in.
#[derive(Debug, Clone, PartialEq)]
pub struct Baselines {
    pub path: PathBuf,
    /// False when no file exists yet for this hardware key (every cell is then new).
    pub existed: bool,
    pub doc: BaselineDoc,
}

/// Errors of baseline files, each locating the fault in the file.
#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    #[error("{path}: cannot read baselines: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not YAML, a wrong type, an unknown key or a missing required key.
    #[error("{path}:{line}:{column}: malformed baseline file: {message}")]
    Parse {
        path: PathBuf,
        line: u32,
        column: u32,
        message: String,
    },
    /// Well-formed YAML whose values make no sense (e.g. a negative tolerance).
    #[error("{path}:{line}:{column}: {key}: {message}")]
    Invalid {
        path: PathBuf,
        line: u32,
        column: u32,
        /// Key path, e.g. `cells.gpt2-125m.bf16.1gpu.single.base.metrics.mfu.tolerance`.
        key: String,
        message: String,
    },
    #[error("{path}: cannot write baselines: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl BaselineError {
    /// Write failures are bench's (or the disk's) fault; everything else is the file's.
    pub(crate) fn is_bad_input(&self) -> bool {
        !matches!(self, BaselineError::Write { .. })
    }
}

impl From<BaselineError> for crate::error::CliError {
    fn from(e: BaselineError) -> Self {
        if e.is_bad_input() {
            crate::error::CliError::bad_input(miette::Report::msg(e.to_string()))
        } else {
            crate::error::CliError::internal(miette::Report::msg(e.to_string()))
        }
    }
}

// The file as written, before validation. `Spanned` keeps each value's line and column so
// that a value that parses but makes no sense is reported where it stands.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDoc {
    schema_version: Spanned<u32>,
    hardware_key: Spanned<String>,
    #[serde(default)]
    cells: IndexMap<String, Spanned<RawCell>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCell {
    #[serde(default)]
    provenance: Option<Provenance>,
    metrics: IndexMap<String, Spanned<RawMetric>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetric {
    value: Spanned<f64>,
    #[serde(default)]
    direction: Option<Direction>,
    #[serde(default)]
    tolerance: Option<Spanned<f64>>,
    #[serde(default)]
    floor: Option<Spanned<f64>>,
    #[serde(default)]
    spread: Option<Spanned<f64>>,
}

/// The path of the baseline file of `hardware_key` in `dir`.
pub fn file_for(dir: &Path, hardware_key: &str) -> PathBuf {
    dir.join(format!("{hardware_key}.yaml"))
}

impl Baselines {
    /// Empty baselines for `hardware_key`, to be saved at `path`.
    pub fn empty(path: PathBuf, hardware_key: &str) -> Baselines {
        Baselines {
            path,
            existed: false,
            doc: BaselineDoc {
                schema_version: SCHEMA_VERSION,
                hardware_key: hardware_key.to_string(),
                cells: IndexMap::new(),
            },
        }
    }

    /// Loads the baselines of `hardware_key` from `dir`; empty ones when the file does not
    /// exist (a new hardware key has no baselines, which is not an error).
    pub fn load_for(dir: &Path, hardware_key: &str) -> Result<Baselines, BaselineError> {
        let path = file_for(dir, hardware_key);
        // A run whose hardware was never known has no baselines.
        if hardware_key.is_empty() {
            return Ok(Baselines::empty(path, hardware_key));
        }
        // The key names one file in `dir` (crate::ids), whoever gave it: a results
        // document's `../evil` must not read a file outside --baselines.
        crate::ids::check_hardware_key("hardware key", hardware_key).map_err(|e| {
            BaselineError::Read {
                path: dir.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()),
            }
        })?;
        match crate::files::read_to_string_bounded(&path, crate::files::MAX_CONFIG_BYTES) {
            Ok(text) => {
                let doc = parse(&path, &text)?;
                if doc.hardware_key != hardware_key {
                    return Err(BaselineError::Invalid {
                        path,
                        line: 1,
                        column: 1,
                        key: "hardware_key".into(),
                        message: format!(
                            "the file is named for `{hardware_key}` but says `{}`",
                            doc.hardware_key
                        ),
                    });
                }
                Ok(Baselines {
                    path,
                    existed: true,
                    doc,
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Ok(Baselines::empty(path, hardware_key))
            }
            Err(source) => Err(BaselineError::Read { path, source }),
        }
    }

    /// Checks every baseline file (`*.yaml`) in `dir` the way [`Baselines::load_for`] reads
    /// it, for the runner to call before the first cell starts: a malformed file (bad YAML,
    /// a value of 0, a negative or NaN tolerance, a file that names another hardware key) is
    /// then an exit-2 error with its file, line, column and key path, rather than a failure
    /// found after every cell has run. Every file, not only this host's: under Slurm the
    /// run's hardware key is the nodes', known only once a job reports. A missing folder
    /// holds no baselines, which is not an error (every cell is new).
    pub(crate) fn check_dir(dir: &Path) -> Result<(), BaselineError> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => {
                return Err(BaselineError::Read {
                    path: dir.to_path_buf(),
                    source,
                })
            }
        };
        let mut keys: Vec<String> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            // Every `*.yaml`, regular or not: a FIFO or a folder named like a baseline file
            // is refused here, before the first cell, not when the run is compared.
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .collect();
        keys.sort();
        for key in keys {
            Baselines::load_for(dir, &key)?;
        }
        Ok(())
    }

    /// Loads one baseline file by path.
    pub fn load_file(path: &Path) -> Result<Baselines, BaselineError> {
        let text = crate::files::read_to_string_bounded(path, crate::files::MAX_CONFIG_BYTES)
            .map_err(|source| BaselineError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Baselines {
            path: path.to_path_buf(),
            existed: true,
            doc: parse(path, &text)?,
        })
    }

    /// Writes the file atomically, with a header that says how to read and edit it.
    pub fn save(&self) -> Result<(), BaselineError> {
        let yaml = serde_saphyr::to_string(&self.doc).map_err(|e| BaselineError::Write {
            path: self.path.clone(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let text = format!("{HEADER}{yaml}");
        crate::atomic::write(&self.path, text.as_bytes()).map_err(|source| BaselineError::Write {
            path: self.path.clone(),
            source,
        })
    }

    pub fn cell(&self, id: &str) -> Option<&CellBaseline> {
        self.doc.cells.get(id)
    }
}

const HEADER: &str = "\
# bench baselines for one hardware key, keyed by cell id. Written by
# `bench baseline update RUN_DIR`; review changes like code.
# Per metric: value; direction (higher|lower is better); tolerance (relative change allowed;
# default 0.03 for throughput, MFU and time, 0.08 for energy (tokens/J, kWh per 1T tokens),
# 0.10 for memory, 0.05 otherwise); floor
# (optional absolute change below which nothing is flagged); spread (relative spread of the
# repeats that produced the value). Hand-set tolerance and floor survive updates.
";

/// Parses and validates the text of a baseline file.
pub fn parse(path: &Path, text: &str) -> Result<BaselineDoc, BaselineError> {
    // Nesting bounded as in matrix files (a baseline file nests 6 deep), so that a hostile
    // file cannot exhaust the stack.
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! { max_depth: crate::matrix::parse::MAX_YAML_DEPTH },
    };
    let raw: RawDoc = serde_saphyr::from_str_with_options(text, options).map_err(|e| {
        let (line, column) = e
            .location()
            .map(|l| (l.line() as u32, l.column() as u32))
            .unwrap_or((0, 0));
        BaselineError::Parse {
            path: path.to_path_buf(),
            line,
            column,
            message: UserMessageFormatter.format_message(&e).into_owned(),
        }
    })?;
    let invalid =
        |at: &serde_saphyr::Location, key: String, message: String| BaselineError::Invalid {
            path: path.to_path_buf(),
            line: at.line() as u32,
            column: at.column() as u32,
            key,
            message,
        };
    if raw.schema_version.value > SCHEMA_VERSION {
        return Err(invalid(
            &raw.schema_version.referenced,
            "schema_version".into(),
            format!(
                "version {} is newer than this bench understands ({SCHEMA_VERSION}); upgrade bench",
                raw.schema_version.value
            ),
        ));
    }
    if raw.hardware_key.value.trim().is_empty() {
        return Err(invalid(
            &raw.hardware_key.referenced,
            "hardware_key".into(),
            "must not be empty".into(),
        ));
    }
    let mut cells = IndexMap::new();
    for (id, cell) in raw.cells {
        let at = cell.referenced;
        let cell = cell.value;
        if id.trim().is_empty() {
            return Err(invalid(
                &at,
                "cells".into(),
                "a cell id must not be empty".into(),
            ));
        }
        let mut metrics = IndexMap::new();
        for (name, m) in cell.metrics {
            let key = format!("cells.{id}.metrics.{name}");
            let m_at = m.referenced;
            let m = m.value;
            let non_negative = |v: &Option<Spanned<f64>>, field: &str| match v {
                Some(s) if !(s.value.is_finite() && s.value >= 0.0) => Err(invalid(
                    &s.referenced,
                    format!("{key}.{field}"),
                    format!("must be a finite number >= 0, found {}", s.value),
                )),
                _ => Ok(v.as_ref().map(|s| s.value)),
            };
            // Changes are relative to the stored value: against 0 every change is infinite,
            // against a negative value better and worse swap; no measurement is either.
            if !is_storable(m.value.value) {
                return Err(invalid(
                    &m.value.referenced,
                    format!("{key}.value"),
                    format!("must be a finite number above 0, found {}", m.value.value),
                ));
            }
            // A stored value no measurement can give (1e308 tokens/s) would judge every run
            // against it with a 300-digit ratio: the same bounds as a result's metrics.
            if let Err(why) = crate::bounds::check(&name, m.value.value) {
                return Err(invalid(&m.value.referenced, format!("{key}.value"), why));
            }
            let tolerance = non_negative(&m.tolerance, "tolerance")?;
            let floor = non_negative(&m.floor, "floor")?;
            let spread = non_negative(&m.spread, "spread")?.unwrap_or(0.0);
            let direction = match m.direction.or_else(|| catalog::direction(&name)) {
                Some(d) => d,
                None => {
                    return Err(invalid(
                        &m_at,
                        format!("{key}.direction"),
                        format!(
                            "`{name}` has no default direction; set `direction: higher` or `direction: lower`"
                        ),
                    ))
                }
            };
            metrics.insert(
                name,
                MetricBaseline {
                    value: m.value.value,
                    direction,
                    tolerance,
                    floor,
                    spread,
                },
            );
        }
        cells.insert(
            id,
            CellBaseline {
                provenance: cell.provenance,
                metrics,
            },
        );
    }
    Ok(BaselineDoc {
        schema_version: SCHEMA_VERSION,
        hardware_key: raw.hardware_key.value,
        cells,
    })
}

/// Whether a value can be a baseline: finite and above 0, since changes are judged
/// relative to it.
pub fn is_storable(value: f64) -> bool {
    value.is_finite() && value > 0.0
}

/// What `bench baseline update` changed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpdateSummary {
    /// Cells that had no baseline and now have one.
    pub added: Vec<String>,
    /// Cells whose baseline was replaced by this run's measurements.
    pub updated: Vec<String>,
    /// Cells left as they were, with why (failed, not selected, not an improvement...).
    pub kept: Vec<(String, String)>,
}

/// The baseline entry a measurement becomes, keeping what the user set on the old entry
/// (direction, tolerance, floor). `None` for a metric with no known direction and no old
/// entry to take one from.
fn entry_from(
    metric: &str,
    m: &MetricValue,
    old: Option<&MetricBaseline>,
    cell_tolerance: Option<f64>,
) -> Option<MetricBaseline> {
    // A value the file could not be read back with is not written (see `parse`).
    if !is_storable(m.value) {
        return None;
    }
    let direction = old
        .map(|o| o.direction)
        .or_else(|| catalog::direction(metric))?;
    // The matrix's per-cell tolerance applies to the throughput and time metrics (those with
    // the throughput default); memory keeps its own default. A tolerance already written in
    // the baseline file (by hand, in review) always wins.
    let from_cell =
        cell_tolerance.filter(|_| catalog::tolerance(metric) == DEFAULT_THROUGHPUT_TOLERANCE);
    Some(MetricBaseline {
        value: m.value,
        direction,
        tolerance: old.and_then(|o| o.tolerance).or(from_cell),
        floor: old.and_then(|o| o.floor),
        // Six decimals keep the file readable; the spread is a noise estimate, not a figure
        // anyone compares to the last digit.
        spread: (m.rel_spread * 1e6).round() / 1e6,
    })
}

/// Writes the measurements of the run's passed cells into `baselines`.
///
/// `selected` says which cells the user asked for (`--filter`); `improved` says whether the
/// comparison judged a cell an improvement. With `only_improvements`, a cell that already
/// has a baseline is replaced only when it improved (past its tolerance and noise, with no
/// metric regressing), so that noise cannot ratchet a baseline up run after run; new cells
/// are always added. A replaced cell keeps its hand-set tolerances and floors, and keeps
/// baseline metrics this run did not measure.
pub fn merge_run(
    baselines: &mut Baselines,
    results: &RunResults,
    selected: &dyn Fn(&CellResult) -> bool,
    improved: &dyn Fn(&str) -> bool,
    only_improvements: bool,
) -> UpdateSummary {
    let provenance = Provenance::of_run(results);
    let mut summary = UpdateSummary::default();
    for cell in &results.cells {
        let id = cell.id.as_str().to_string();
        if !selected(cell) {
            summary.kept.push((id, "not selected by --filter".into()));
            continue;
        }
        if !matches!(cell.outcome, Outcome::Passed) || cell.metrics.is_empty() {
            summary.kept.push((id, "no measurement in this run".into()));
            continue;
        }
        match baselines.doc.cells.get_mut(&id) {
            None => {
                let metrics = cell
                    .metrics
                    .iter()
                    .filter_map(|(name, m)| {
                        entry_from(name, m, None, cell.params.tolerance).map(|e| (name.clone(), e))
                    })
                    .collect();
                baselines.doc.cells.insert(
                    id.clone(),
                    CellBaseline {
                        provenance: Some(provenance.clone()),
                        metrics,
                    },
                );
                summary.added.push(id);
            }
            Some(_) if only_improvements && !improved(&id) => {
                summary.kept.push((id, "not an improvement".into()));
            }
            Some(old) => {
                for (name, m) in &cell.metrics {
                    if let Some(e) =
                        entry_from(name, m, old.metrics.get(name), cell.params.tolerance)
                    {
                        old.metrics.insert(name.clone(), e);
                    }
                }
                old.provenance = Some(provenance.clone());
                summary.updated.push(id);
            }
        }
    }
    summary
}

#[cfg(test)]
mod tests;
