//! The matrix language: from a YAML file to the exact list of cells to run, with the rule
//! and reason for every cell dropped.
//!
//! Stages: [`spec`] (serde + schemars types), [`parse`] (YAML with located errors),
//! [`expand`] (cartesian product, zips, rules, include), [`filter`] (the `--filter`
//! language), [`cmd`] (the `bench matrix --dry-run` and `bench schema` commands).

pub mod cmd;

use std::path::Path;

use crate::cell::Cell;

/// A cell removed by a rule or a filter, with what removed it.
#[derive(Debug, Clone, PartialEq)]
pub struct Dropped {
    pub cell: Cell,
    /// e.g. `rules[2] (incompatible)` or `--filter 'gpus>=8'`.
    pub by: String,
    pub reason: String,
}

/// The result of loading, expanding and filtering a matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Expansion {
    /// The matrix's `name`, or the file stem.
    pub name: String,
    /// Cells to run, in expansion order.
    pub cells: Vec<Cell>,
    /// Cells removed by rules, then by filters, in expansion order.
    pub dropped: Vec<Dropped>,
    /// Non-fatal findings, e.g. a rule that matches no cell (with its location).
    pub warnings: Vec<String>,
}

/// Errors of the matrix stage (placeholder until the parser lands).
#[derive(Debug, thiserror::Error)]
pub enum MatrixError {
    #[error("{0}")]
    Other(String),
}

/// Loads `path`, expands it and applies `filters` (combined with `and`).
pub fn load(path: &Path, filters: &[String]) -> Result<Expansion, MatrixError> {
    let _ = (path, filters);
    Err(MatrixError::Other("matrix loading is not built yet".into()))
}
