//! The one place where stage errors become exit codes.
//!
//! Stages return their own `thiserror` enums, each carrying the location of the fault
//! (file:line:column or a key path). The CLI converts them into a [`CliError`], which only
//! knows the class of failure: bad input (exit 2) or an internal failure (exit 3). Results
//! such as regressions are not errors; commands return them as exit code 1 themselves.

use crate::exit::bench as exit;

/// A failure of a command, classified for its exit code and rendered by miette.
#[derive(Debug)]
pub enum CliError {
    BadInput(miette::Report),
    Internal(miette::Report),
}

impl CliError {
    pub(crate) fn bad_input(e: impl Into<miette::Report>) -> Self {
        CliError::BadInput(e.into())
    }
    pub(crate) fn internal(e: impl Into<miette::Report>) -> Self {
        CliError::Internal(e.into())
    }
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::BadInput(_) => exit::BAD_INPUT,
            CliError::Internal(_) => exit::INTERNAL,
        }
    }
    pub fn report(&self) -> &miette::Report {
        match self {
            CliError::BadInput(r) | CliError::Internal(r) => r,
        }
    }
}

/// A run id or hardware key that names no single folder or file: bad input.
impl From<crate::ids::IdError> for CliError {
    fn from(e: crate::ids::IdError) -> Self {
        CliError::bad_input(miette::miette!("{e}"))
    }
}

/// A path to write that cannot be written (a dangling link, a file where a folder must be,
/// a read-only place): the user's to fix, so bad input.
impl From<crate::files::OutputError> for CliError {
    fn from(e: crate::files::OutputError) -> Self {
        CliError::bad_input(miette::miette!("{e}"))
    }
}

impl From<crate::results::ResultsError> for CliError {
    fn from(e: crate::results::ResultsError) -> Self {
        use crate::results::ResultsError as E;
        match e {
            E::Read { .. } | E::Parse { .. } | E::Version { .. } | E::Invalid { .. } => {
                CliError::BadInput(miette::Report::msg(e.to_string()))
            }
            E::Write { .. } => CliError::Internal(miette::Report::msg(e.to_string())),
        }
    }
}
