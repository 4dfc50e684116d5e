//! The errors that stop a bisection before it measures anything. The git and probe stages
//! raise them and the command reports them, so they live apart from the command, in a file
//! every stage imports without importing the command back.

use crate::error::CliError;

/// Errors that stop a bisection before it measures anything, with what they concern.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BisectError {
    #[error("{dir}: not in a git repository ({message}); bench bisect walks the commits of the repository it is started in")]
    NotARepo { dir: String, message: String },
    #[error("{flag} {rev}: not a commit of the repository {repo}")]
    UnknownRev {
        flag: String,
        rev: String,
        repo: String,
    },
    #[error("--good {good} is not an ancestor of --bad {bad}: the good commit must come before the bad one in history")]
    NotAncestor { good: String, bad: String },
    #[error("--good and --bad are both commit {sha}: there is no range to bisect")]
    SameCommit { sha: String },
    #[error("{matrix} at the {flag} commit {commit}: {message}")]
    Matrix {
        matrix: String,
        flag: String,
        commit: String,
        message: String,
    },
    #[error("{matrix} at the {flag} commit {commit} has no cell {cell} (cells: {cells})")]
    UnknownCell {
        cell: String,
        matrix: String,
        flag: String,
        commit: String,
        cells: String,
    },
    #[error("git {args}: {message}")]
    Git { args: String, message: String },
    #[error("{path}: {message}")]
    Io { path: String, message: String },
}

impl From<BisectError> for CliError {
    fn from(e: BisectError) -> Self {
        match e {
            BisectError::Git { .. } | BisectError::Io { .. } => {
                CliError::internal(miette::miette!("{e}"))
            }
            _ => CliError::bad_input(miette::miette!("{e}")),
        }
    }
}
