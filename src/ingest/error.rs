//! Why a log cannot be judged: `bench ingest`'s errors, each naming the file (and line) at
//! fault; the stage's files import them from here, not from the module's root.

use crate::error::CliError;

/// Why a log cannot be judged. Every variant names the file (and line) at fault; all are
/// bad input (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("{path}: cannot read the log: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}{}", if .text.is_empty() { String::new() } else { format!("\n  the line: `{}`", .text) })]
    Line {
        path: String,
        line: usize,
        /// The line, shortened.
        text: String,
        message: String,
    },
    #[error("{path}: {message}")]
    Log { path: String, message: String },
    #[error("{0}")]
    Args(String),
}

impl IngestError {
    /// An error at `path:line` about `text` (shortened to 200 characters).
    pub(crate) fn at(path: &str, line: usize, text: &str, message: impl Into<String>) -> Self {
        let mut text = text.trim().to_string();
        if text.chars().count() > 200 {
            text = text.chars().take(200).collect::<String>() + "…";
        }
        IngestError::Line {
            path: path.to_string(),
            line,
            text,
            message: message.into(),
        }
    }
}

impl From<IngestError> for CliError {
    fn from(e: IngestError) -> Self {
        CliError::bad_input(miette::miette!("{e}"))
    }
}
