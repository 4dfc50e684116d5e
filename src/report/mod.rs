//! Reports of a finished run: every format is one sink behind the [`Exporter`] trait (as
//! hyperfine's `export` module), rendering the run's results and their comparison with the
//! baselines. This module owns the orchestration the runner calls after the last cell
//! ([`finish_run`]) and `bench report RUN_DIR`, which renders every report again from
//! `results.json` without rerunning anything.
//!
//! Sinks: [`junit`] (`junit.xml`), [`markdown`] (`summary.md`, also appended to
//! `$GITHUB_STEP_SUMMARY`), [`json`] (`report.json`), [`html`] (`report.html`, charts),
//! [`human`] (the terminal summary, also kept as `summary.txt`). [`crate::trend`] is the shape
//! of earlier runs' values that the Markdown and HTML reports draw when a history is given.

pub mod frameworks;
pub mod history;
pub mod html;
pub mod human;
pub mod json;
pub mod junit;
pub mod markdown;
pub mod post;
pub mod text;

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::baseline::{Baselines, Comparison};
use crate::error::CliError;
use crate::results::RunResults;

pub use markdown::render_markdown;

pub use crate::format::Format;

/// Resolved settings of `bench report RUN_DIR`.
#[derive(Debug, Clone)]
pub(crate) struct ReportSettings {
    /// The run folder (or its `results.json`).
    pub run_dir: PathBuf,
    /// Folder of baseline files.
    pub baselines: PathBuf,
    /// Terminal output format.
    pub format: Format,
    /// List every dropped cell's id under its rule in the terminal summary.
    pub verbose: bool,
    /// Price of one GPU-hour, for the framework comparison's cost per 1T tokens.
    pub gpu_hour_price: Option<f64>,
}

/// What every sink renders: a run and its comparison with the baselines.
#[derive(Debug, Clone, Copy)]
pub struct ReportInput<'a> {
    pub results: &'a RunResults,
    pub comparison: &'a Comparison,
    /// Earlier runs' values, when a history is at hand (charts then show trends).
    pub trends: Option<&'a crate::trend::Trends>,
    /// The history's verdicts, when the run was judged (already laid over `comparison`).
    pub history: Option<&'a crate::history::gate::GateReport>,
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

/// The sinks that write files into the run directory.
/// `gpu_hour_price` is the price of one GPU-hour for the framework comparison's cost column.
pub(crate) fn file_exporters(gpu_hour_price: Option<f64>) -> Vec<Box<dyn Exporter>> {
    vec![
        Box::new(junit::JunitExporter),
        Box::new(markdown::MarkdownExporter),
        Box::new(json::JsonExporter),
        Box::new(human::HumanExporter),
        Box::new(html::HtmlExporter),
        Box::new(frameworks::FrameworksExporter { gpu_hour_price }),
    ]
}

/// Renders every file report that applies to the run and writes each atomically into
/// `run_dir`; returns the paths.
///
/// A report that does not apply is removed when an earlier bench left it there, so that
/// `bench report RUN_DIR` leaves the folder as a fresh run of this version would.
pub(crate) fn write_reports(
    run_dir: &Path,
    input: &ReportInput<'_>,
    gpu_hour_price: Option<f64>,
) -> Result<Vec<PathBuf>, ReportError> {
    let mut written = Vec::new();
    for exporter in file_exporters(gpu_hour_price) {
        let path = run_dir.join(exporter.file_name());
        if !exporter.applies(input) {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(ReportError::Write { path, source: e })
                }
                _ => continue,
            }
        }
        let text = exporter.render(input)?;
        crate::atomic::write(&path, text.as_bytes()).map_err(|source| ReportError::Write {
            path: path.clone(),
            source,
        })?;
        written.push(path);
    }
    Ok(written)
}

/// Appends the Markdown summary to the file named by `$GITHUB_STEP_SUMMARY` (GitHub
/// Actions shows it on the job's page). Appending, not replacing, is that file's contract:
/// several steps of one job add to it.
pub(crate) fn append_step_summary(markdown: &str) -> Result<Option<PathBuf>, ReportError> {
    let Some(path) = std::env::var_os("GITHUB_STEP_SUMMARY").filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let path = PathBuf::from(path);
    // A regular file only, opened without blocking: a FIFO there (no reader) would hang the
    // run after its cells, past every signal.
    let mut file =
        crate::files::open_append_regular(&path).map_err(|source| ReportError::Write {
            path: path.clone(),
            source,
        })?;
    file.write_all(format!("{markdown}\n").as_bytes())
        .map_err(|source| ReportError::Write {
            path: path.clone(),
            source,
        })?;
    Ok(Some(path))
}

/// Everything after the last cell: loads the baselines of the run's hardware key, compares,
/// writes `junit.xml`, `summary.md`, `report.json` and `report.html` atomically into `run_dir`, appends the
/// summary to `$GITHUB_STEP_SUMMARY` when set, prints the human summary (or, with
/// `--format json`, the JSON report) on stdout, and returns the exit code of DESIGN.md:
/// 1 when a cell regressed, failed or timed out, else 0. `verbose` lists the ids of the
/// dropped cells in the printed summary (`summary.txt` keeps only their counts).
///
/// A malformed baseline file is bad input (exit 2); the reports are then not written, since
/// they would call every cell new.
pub(crate) fn finish_run(
    run_dir: &Path,
    results: &RunResults,
    baselines_dir: &Path,
    format: Format,
    verbose: bool,
    gpu_hour_price: Option<f64>,
) -> Result<i32, CliError> {
    let baselines = Baselines::load_for(baselines_dir, &results.environment.hardware_key)?;
    // A run judged against its history (`history.json`) is reported with the history's
    // verdicts: one verdict in every report and the exit code.
    let (comparison, gate) =
        crate::history::gate::judged_comparison(results, &baselines, Some(run_dir));
    let trends = gate
        .as_ref()
        .and_then(|g| crate::history::trends::for_run(&g.store, results).ok());
    let input = ReportInput {
        results,
        comparison: &comparison,
        trends: trends.as_ref(),
        history: gate.as_ref(),
    };
    write_reports(run_dir, &input, gpu_hour_price)?;
    // The job summary is a convenience: failing to append to it must not hide the verdict.
    if let Err(e) = append_step_summary(&markdown::render_summary(&input)) {
        eprintln!("warning: {e}");
    }
    let stdout = match format {
        Format::Human if verbose => human::render_verbose(&input),
        Format::Human => human::HumanExporter.render(&input)?,
        Format::Json => json::JsonExporter.render(&input)?,
    };
    // A closed pipe (`bench report ... | head`) must not turn a verdict into a panic.
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(stdout.as_bytes()).and_then(|_| out.flush());
    Ok(comparison.exit_code())
}

/// `bench report RUN_DIR [--baselines DIR] [--format human|json]`: renders every report of
/// a finished run again from its `results.json`, against the baselines as they are now.
pub(crate) fn report_command(settings: &ReportSettings) -> Result<i32, CliError> {
    let run_dir = &settings.run_dir;
    let results = RunResults::load(run_dir)?;
    let dir = if run_dir.is_dir() {
        run_dir.clone()
    } else {
        run_dir
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."))
    };
    finish_run(
        &dir,
        &results,
        &settings.baselines,
        settings.format,
        settings.verbose,
        settings.gpu_hour_price,
    )
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
