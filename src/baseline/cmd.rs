//! `bench baseline update RUN_DIR [--filter EXPR]... [--only-improvements] [--baselines DIR]`:
//! writes a finished run's measurements into `baselines/<hardware-key>.yaml`.

use std::io::Write;
use std::path::PathBuf;

use crate::baseline::compare::{compare, CellStatus};
use crate::baseline::store::{merge_run, Baselines};
use crate::cell::Cell;
use crate::error::CliError;
use crate::exit::bench as exit;
use crate::matrix::filter::Vocabulary;
use crate::results::{CellResult, RunResults};

/// A predicate over the cells of a run.
pub(crate) type CellSelector = Box<dyn Fn(&CellResult) -> bool>;

/// Decides which cells `--filter` selects: the matrix filter language, checked against the
/// axes and values of the run's own cells (so a typo such as `gpu=8` is an error, exit 2,
/// with a caret under it). Several filters combine with `and`; none selects every cell.
pub(crate) fn cell_selector(
    filters: &[String],
    results: &RunResults,
) -> Result<CellSelector, CliError> {
    if filters.is_empty() {
        return Ok(Box::new(|_| true));
    }
    let vocab = Vocabulary::from_cells(results.cells.iter().map(|c| &c.values));
    let compiled = crate::matrix::parse_filters(filters, &vocab)?;
    Ok(Box::new(move |c: &CellResult| {
        let cell = Cell {
            id: c.id.clone(),
            values: c.values.clone(),
            params: c.params.clone(),
        };
        compiled.iter().all(|f| f.matches(&cell))
    }))
}

/// Resolved settings of `bench baseline update`.
#[derive(Debug, Clone)]
pub(crate) struct UpdateSettings {
    /// The run folder.
    pub run_dir: PathBuf,
    /// Only update cells matching these filter expressions (combined with `and`).
    pub filters: Vec<String>,
    /// Only raise baselines where the run improved on them (and add new cells).
    pub only_improvements: bool,
    /// Folder of baseline files.
    pub baselines: PathBuf,
}

/// Runs `bench baseline update`.
pub(crate) fn update(args: &UpdateSettings) -> Result<i32, CliError> {
    let results = RunResults::load(&args.run_dir)?;
    let selected = cell_selector(&args.filters, &results)?;
    let key = &results.environment.hardware_key;
    if key.trim().is_empty() {
        return Err(CliError::bad_input(miette::miette!(
            "{}: the run has no hardware key (environment.hardware_key)",
            args.run_dir.display()
        )));
    }
    let mut baselines = Baselines::load_for(&args.baselines, key)?;
    let comparison = compare(&results, &baselines);
    let improved = |id: &str| {
        comparison
            .cell(id)
            .is_some_and(|c| c.status == CellStatus::Improvement)
    };
    let summary = merge_run(
        &mut baselines,
        &results,
        &*selected,
        &improved,
        args.only_improvements,
    );
    if !summary.added.is_empty() || !summary.updated.is_empty() {
        baselines.save()?;
    }
    let mut text = format!(
        "{}: {} added, {} updated, {} kept\n",
        baselines.path.display(),
        summary.added.len(),
        summary.updated.len(),
        summary.kept.len()
    );
    for id in &summary.added {
        text.push_str(&format!("  added    {id}\n"));
    }
    for id in &summary.updated {
        text.push_str(&format!("  updated  {id}\n"));
    }
    for (id, why) in &summary.kept {
        text.push_str(&format!("  kept     {id} ({why})\n"));
    }
    // The file is written; a closed stdout pipe must not turn that into a panic.
    let _ = std::io::stdout().write_all(text.as_bytes());
    Ok(exit::OK)
}
