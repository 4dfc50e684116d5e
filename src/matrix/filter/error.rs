//! The filter language's error, located by byte offset in the expression, and the caret
//! line that shows where the fault is. The lexer and the parser both return it, so it lives
//! in a file of its own rather than in the facade that imports them.

use std::fmt;

/// A filter that failed to parse or to validate, with the span of the fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct FilterError {
    pub expr: String,
    /// Byte offset of the fault in `source`.
    pub offset: usize,
    /// Length of the fault (at least 1 for the caret).
    pub len: usize,
    pub message: String,
}

impl FilterError {
    /// The error `message` about `len` bytes at byte `offset` of the expression `expr`.
    pub(super) fn at(
        expr: &str,
        offset: usize,
        len: usize,
        message: impl Into<String>,
    ) -> FilterError {
        FilterError {
            expr: expr.to_string(),
            offset,
            len,
            message: message.into(),
        }
    }

    /// The expression with a caret line under the fault, indented by `indent` spaces.
    /// A long expression (a generated one, or a hostile one) is shown as a window of
    /// [`CARET_WINDOW`] characters either side of the fault, so the message stays readable.
    pub(crate) fn caret(&self, indent: usize) -> String {
        let offset = self.offset.min(self.expr.len());
        let before: Vec<char> = self.expr[..offset].chars().collect();
        let after: Vec<char> = self.expr[offset..].chars().collect();
        let skip = before.len().saturating_sub(CARET_WINDOW);
        let lead = if skip > 0 { "…" } else { "" };
        let shown_before: String = before[skip..].iter().collect();
        let shown_after: String = after.iter().take(CARET_WINDOW).collect();
        let tail = if after.len() > CARET_WINDOW {
            "…"
        } else {
            ""
        };
        let col = lead.chars().count() + before.len() - skip;
        let width = self.len.max(1).min(after.len().max(1)).min(CARET_WINDOW);
        format!(
            "{pad}{lead}{shown_before}{shown_after}{tail}\n{pad}{}{}",
            " ".repeat(col),
            "^".repeat(width),
            pad = " ".repeat(indent)
        )
    }
}

/// Characters of context shown either side of a fault in a long expression.
pub(super) const CARET_WINDOW: usize = 60;

impl fmt::Display for FilterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}\n{}", self.message, self.caret(4))
    }
}
