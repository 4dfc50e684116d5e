//! The judge stage: a finished run's results, the baselines of its hardware key and, when the
//! run was judged against a history, that judgement (`history.json`, written by
//! [`crate::history::gate::Confirmation`]) become one [`Verdicts`] value: per cell and metric
//! the verdict every report shows and the exit code follows, the history's judgement with its
//! suspects and environment, and the trends the charts draw.
//!
//! The pipeline is `matrix` (spec -> cells) -> `run` (cells -> results) -> `judge` (results +
//! baselines or history -> [`Verdicts`]) -> `report` (results + verdicts -> every format); the
//! command layer ([`crate::commands`]) composes them. The reports render the verdicts they
//! are given: they open no store and judge nothing again.

use std::path::Path;

use crate::baseline::{compare::Comparison, Baselines};
use crate::error::CliError;
use crate::history::gate::GateReport;
use crate::results::RunResults;
use crate::trend::Trends;

/// What the judge decided about one run.
#[derive(Debug, Clone)]
pub struct Verdicts {
    /// Every cell's comparison with its baseline, with the history's verdicts laid over the
    /// cells the history judged (the history decides speed where it has one).
    pub comparison: Comparison,
    /// The history's judgement, when the run was judged against one.
    pub history: Option<GateReport>,
    /// Earlier runs' values of the run's cells, when a history is at hand.
    pub trends: Option<Trends>,
}

impl Verdicts {
    /// The exit code the verdicts give (DESIGN.md): 1 when a cell regressed, failed or timed
    /// out, else 0. The run's, which a signal can make 130, is
    /// [`crate::results::RunResults::exit_code`] of it.
    pub fn exit_code(&self) -> i32 {
        self.comparison.exit_code()
    }
}

/// The verdicts on `results` against the baselines in `baselines_dir` (of the run's own
/// hardware key) and the history's judgement kept in `run_dir`, with the trends of that
/// history's store. A malformed baseline file or `history.json` is bad input (exit 2).
pub fn of_run(
    results: &RunResults,
    baselines_dir: &Path,
    run_dir: Option<&Path>,
) -> Result<Verdicts, CliError> {
    let baselines = Baselines::load_for(baselines_dir, &results.environment.hardware_key)?;
    // A damaged history.json is bad input: read as absent, the run would be judged
    // against the baselines instead and its verdict changed without a word.
    let (comparison, history) =
        crate::history::gate::judged_comparison(results, &baselines, run_dir)
            .map_err(|m| CliError::bad_input(miette::miette!("{m}")))?;
    // A store that cannot be read now (moved, or a server that is down) leaves the charts
    // without trends; the verdicts were recorded in history.json when the run was judged.
    let trends = history
        .as_ref()
        .and_then(|g| crate::history::trends::for_run(&g.store, results).ok());
    Ok(Verdicts {
        comparison,
        history,
        trends,
    })
}
