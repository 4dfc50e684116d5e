//! Reports of a finished run: every format is one sink behind the [`Exporter`] trait (as
//! hyperfine's `export` module), rendering the run's results and the judge's verdicts on
//! them ([`crate::judge::Verdicts`]). This module owns writing every file of a judged run
//! ([`finish_run`]); the commands that call it (`bench matrix`, `bench report RUN_DIR`,
//! `bench ingest`) judge first. A sink renders what it is given: no sink opens a store or
//! judges again.
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
pub mod text;

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::baseline::Comparison;
use crate::error::CliError;
use crate::judge::Verdicts;
use crate::results::RunResults;

pub use markdown::render_markdown;

pub use crate::format::Format;

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

impl<'a> ReportInput<'a> {
    /// What the sinks render of `results` and the judge's `verdicts`.
    pub fn new(results: &'a RunResults, verdicts: &'a Verdicts) -> ReportInput<'a> {
        ReportInput {
            results,
            comparison: &verdicts.comparison,
            trends: verdicts.trends.as_ref(),
            history: verdicts.history.as_ref(),
        }
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

/// Everything after the judge: writes `junit.xml`, `summary.md`, `report.json`,
/// `report.html` (and `frameworks.md` for framework cells) atomically into `run_dir`,
/// appends the summary to `$GITHUB_STEP_SUMMARY` when set, prints the human summary (or,
/// with `--format json`, the JSON report) on stdout, and returns the exit code the verdicts
/// give (DESIGN.md: 1 when a cell regressed, failed or timed out, else 0). `verbose` lists
/// the ids of the dropped cells in the printed summary (`summary.txt` keeps only their
/// counts). It renders the verdicts it is given and judges nothing.
pub(crate) fn finish_run(
    run_dir: &Path,
    results: &RunResults,
    verdicts: &Verdicts,
    format: Format,
    verbose: bool,
    gpu_hour_price: Option<f64>,
) -> Result<i32, CliError> {
    let input = ReportInput::new(results, verdicts);
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
    Ok(verdicts.exit_code())
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
