//! The matrix stage's errors: every one names the file and, where it has one, the line,
//! column and key path of the fault. They live apart from the facade in `mod.rs` because
//! the stages the facade drives ([`super::parse`], [`super::budget`], [`super::expand`])
//! return them too, and a stage importing the file that imports it back would tie the two
//! into a circle.

use std::fmt;
use std::path::PathBuf;

use super::filter::FilterError;

/// Errors of the matrix stage; every one names the file and, where it has one, the line,
/// column and key path of the fault.
#[derive(Debug, thiserror::Error)]
pub enum MatrixError {
    #[error("{}: cannot read matrix file: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(Box<Located>),
    #[error("bad --filter: {0}")]
    Filter(FilterError),
}

/// A fault in a matrix file: where it is and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub path: PathBuf,
    pub line: Option<usize>,
    pub column: Option<usize>,
    /// e.g. `rules[1].exclude.gpus`.
    pub key_path: Option<String>,
    pub message: String,
    /// The source line with a caret under the fault.
    pub snippet: Option<String>,
}

impl fmt::Display for Located {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let (Some(l), Some(c)) = (self.line, self.column) {
            write!(f, ":{l}:{c}")?;
        }
        write!(f, ": ")?;
        if let Some(k) = self.key_path.as_deref().filter(|k| !k.is_empty()) {
            write!(f, "{k}: ")?;
        }
        f.write_str(&self.message)?;
        if let Some(sn) = &self.snippet {
            write!(f, "\n{sn}")?;
        }
        Ok(())
    }
}
