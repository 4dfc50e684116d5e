//! `bench baseline update RUN_DIR [--filter EXPR]... [--only-improvements] [--baselines DIR]`:
//! writes a finished run's measurements into `baselines/<hardware-key>.yaml`.

use std::io::Write;

use crate::baseline::compare::{compare, CellStatus};
use crate::baseline::store::{merge_run, Baselines};
use crate::cli::BaselineUpdateArgs;
use crate::error::{exit, CliError};
use crate::results::{CellResult, RunResults};

/// A predicate over the cells of a run.
pub type CellSelector = Box<dyn Fn(&CellResult) -> bool>;

/// Decides which cells `--filter` selects.
///
/// This is the single seam for the matrix filter language (`bench::matrix::filter`, owned by
/// the matrix stage): at merge it parses `filters` once and returns a predicate over a
/// cell's id and axis values. Until that language is in this build, a filter is refused as
/// bad input rather than guessed at with different semantics; with no filter every cell is
/// selected.
pub fn cell_selector(filters: &[String]) -> Result<CellSelector, CliError> {
    if filters.is_empty() {
        return Ok(Box::new(|_| true));
    }
    Err(CliError::bad_input(miette::miette!(
        "--filter {:?}: this build of bench has no filter language for `baseline update` yet; \
         run it without --filter to update every cell",
        filters.join(" and ")
    )))
}

/// Runs `bench baseline update`.
pub fn update(args: &BaselineUpdateArgs) -> Result<i32, CliError> {
    let selected = cell_selector(&args.filters)?;
    let results = RunResults::load(&args.run_dir)?;
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
