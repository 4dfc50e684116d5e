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
pub mod report;
pub mod shard;
pub mod triage;
