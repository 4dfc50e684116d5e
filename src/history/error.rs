//! The history stage's errors, each naming the store (file or URL without password) or the
//! input at fault; the stage's files import them from here, not from the module's root.

/// Errors of the history stage; each names the store (file or URL without password).
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("{location}: cannot open the history store: {message}")]
    Open { location: String, message: String },
    #[error("{location}: {message}")]
    Query { location: String, message: String },
    #[error("{location}: schema version {found} is newer than this bench understands ({known}); upgrade bench")]
    Newer {
        location: String,
        found: i64,
        known: i64,
    },
    #[error("{path}: {message}")]
    Input { path: String, message: String },
}

impl HistoryError {
    /// Whether the user's input is at fault (exit 2) rather than the store (internal).
    pub(crate) fn is_bad_input(&self) -> bool {
        matches!(
            self,
            HistoryError::Input { .. } | HistoryError::Open { .. } | HistoryError::Newer { .. }
        )
    }
}

impl From<HistoryError> for crate::error::CliError {
    fn from(e: HistoryError) -> Self {
        if e.is_bad_input() {
            crate::error::CliError::bad_input(miette::miette!("{e}"))
        } else {
            crate::error::CliError::internal(miette::miette!("{e}"))
        }
    }
}
