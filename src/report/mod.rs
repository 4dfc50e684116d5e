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

mod escape;
pub mod fleet;
pub mod frameworks;
pub mod history;
pub mod html;
pub mod human;
pub mod input;
pub mod json;
pub mod junit;
pub mod markdown;
pub mod text;

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::CliError;
use crate::judge::Verdicts;
use crate::results::RunResults;

pub use input::{Exporter, ReportError, ReportInput};
pub use markdown::render_markdown;

pub use crate::format::Format;

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

/// Writes every report file of the run, and nothing else (no terminal summary, no job
/// summary): what the command layer writes before a long step after the judge (triage's
/// bisections), so that a job killed during it still leaves the finished run's reports;
/// [`finish_run`] writes them again after it.
pub(crate) fn write_files(
    run_dir: &Path,
    results: &RunResults,
    verdicts: &Verdicts,
    findings: &[crate::triage::Finding],
    gpu_hour_price: Option<f64>,
) -> Result<(), CliError> {
    let input = ReportInput::new(results, verdicts, findings);
    write_reports(run_dir, &input, gpu_hour_price)?;
    Ok(())
}

/// Everything after the judge: writes `junit.xml`, `summary.md`, `report.json`,
/// `report.html` (and `frameworks.md` for framework cells) atomically into `run_dir`,
/// appends the summary to `$GITHUB_STEP_SUMMARY` when set, prints the human summary (or,
/// with `--format json`, the JSON report) on stdout, and returns the exit code the run gives
/// (DESIGN.md: 1 when a cell regressed, failed or timed out, else 0; 130 when a signal
/// stopped it, [`RunResults::exit_code`]), which every report states. `verbose` lists
/// the ids of the dropped cells in the printed summary (`summary.txt` keeps only their
/// counts). It renders the verdicts it is given and judges nothing.
pub(crate) fn finish_run(
    run_dir: &Path,
    results: &RunResults,
    verdicts: &Verdicts,
    findings: &[crate::triage::Finding],
    format: Format,
    verbose: bool,
    gpu_hour_price: Option<f64>,
) -> Result<i32, CliError> {
    let input = ReportInput::new(results, verdicts, findings);
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
    // A closed pipe (`bench report ... | head`) ends bench with 141, never a panic.
    let _ = crate::exit::write_stdout(&stdout);
    Ok(input.exit_code())
}
