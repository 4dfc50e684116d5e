//! The command layer: each command that runs more than one stage composes them here, in the
//! pipeline's one direction,
//!
//! `matrix` (spec -> cells) -> `run` (cells -> results) -> `judge` (results + baselines or
//! history -> verdicts) -> `triage` (verdicts -> findings; [`triage`] bisects a finding's
//! commit range and diffs its kernels) -> `report` (results + verdicts + findings -> every
//! format),
//!
//! passing each stage the value the one before it produced. No stage imports this layer or a
//! later stage (tests/module_graph.rs checks both); re-running the cells a verdict wants
//! confirmed is this layer asking `run` again for a subset and the judge again
//! ([`crate::history::gate::Confirmation`]), never the judge calling the runner.
//! docs/architecture.md draws the pipeline.

pub mod fleet;
pub mod matrix;
pub mod merge;
pub(crate) mod pairs;
pub mod report;
pub mod shard;
pub mod triage;

/// A JSON file of a run folder that may be absent (`shard.json`, `triage.json`,
/// `history.json`, `fleet.json`): `None` when nothing is at `path`, else the document. A file
/// that is there and does not read is bad input naming it
/// ([`crate::files::read_json_if_there`]).
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(
    path: &std::path::Path,
) -> Result<Option<T>, crate::error::CliError> {
    crate::files::read_json_if_there(path)
        .map_err(|m| crate::error::CliError::bad_input(miette::miette!("{m}")))
}

/// Writes `value` as pretty JSON to `path`, atomically (a reader never sees half a file),
/// and returns the text written. A failure is an internal error naming the file.
pub(crate) fn write_json<T: serde::Serialize + ?Sized>(
    path: &std::path::Path,
    value: &T,
) -> Result<String, crate::error::CliError> {
    let internal = |e: &dyn std::fmt::Display| {
        crate::error::CliError::internal(miette::miette!("{}: {e}", path.display()))
    };
    let text = serde_json::to_string_pretty(value).map_err(|e| internal(&e))?;
    crate::atomic::write(path, text.as_bytes()).map_err(|e| internal(&e))?;
    Ok(text)
}
