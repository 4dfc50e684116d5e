//! The filter language's expression tree, what the parser builds and the evaluator walks,
//! with the limits on its depth and on the regular expressions in it. It lives apart from
//! the facade in `mod.rs` so that [`super::parse`], [`super::lex`] and [`super::eval`] can
//! share it without importing the file that imports them.

use regex::Regex;

/// How deep parentheses may nest. Every level costs a few stack frames in the parser and
/// the evaluator; 100 is far beyond any filter a person writes, and keeps the deepest
/// recursion well inside the smallest thread stack Rust gives (2 MiB), debug builds
/// included.
pub(crate) const MAX_NESTING: usize = 100;

/// The most memory a compiled `/regex/` may take. The regex crate's default (10 MiB) lets
/// `/a{99999}/` take seconds to compile (found by tests/fuzz.rs); a filter's regex matches
/// short axis values, and 256 KiB is far more than any of those needs.
pub(super) const REGEX_SIZE_LIMIT: usize = 256 * 1024;

#[derive(Debug, Clone)]
pub(super) enum Expr {
    /// At least two terms, any of which must hold (flat, so a long chain is not deep).
    Or(Vec<Expr>),
    /// At least two terms, all of which must hold.
    And(Vec<Expr>),
    Not(Box<Expr>),
    Word(String),
    Has(String),
    Cmp {
        name: String,
        op: Op,
        value: Operand,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Eq,
    Ne,
    Contains,
    Gt,
    Ge,
    Lt,
    Le,
}

#[derive(Debug, Clone)]
pub(super) enum Operand {
    Text(String),
    Regex(Regex),
}
