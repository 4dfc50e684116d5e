//! The filter language of `--filter` and of `when:` rules.
//!
//! Grammar (lowest precedence first; keywords are case-insensitive):
//!
//! ```text
//! expr    := or
//! or      := and (("or" | "||") and)*
//! and     := unary (("and" | "&&") unary)*
//! unary   := ("not" | "!") unary | atom
//! atom    := "(" expr ")" | "has(" word ")" | name op value | word
//! op      := "=" | "==" | "!=" | "~" | ">" | ">=" | "<" | "<="
//! value   := word | quoted string | /regex/
//! ```
//!
//! A bare word matches a cell when it equals any axis value (or any flag of a set-valued
//! axis) or is a substring of the cell id, so `--filter fsdp` and `--filter gpt2` do what a
//! user expects. `name` is an axis, or a parameter such as `seq_len` when no axis has that
//! name, or `id`, the cell id (`id=gpt2-125m.bf16.1gpu.single.compile` selects exactly one
//! cell; an axis or parameter named `id` keeps that name). `=` compares numerically when both sides are numbers, else as text; for set-valued
//! axes the value is a `+`-joined set (`features=compile+sac`, `features=base` for the empty
//! set). `~` is a substring test, `=/re/` a regular-expression search (unanchored, as grep).
//! Errors carry the byte offset of the fault so the CLI can put a caret under it.
//!
//! Hostile input cannot exhaust the stack: `and`/`or` chains are kept flat (one node with
//! a list of terms, however many terms), a run of `not`s collapses to its parity while it
//! is read, and parentheses may nest at most [`ast::MAX_NESTING`] deep, so parsing, evaluating
//! and dropping a filter recurse a bounded number of times whatever its length.
//!
//! This file is the language's facade, [`Filter`]; [`ast`] holds the expression tree,
//! [`error`] the errors and [`vocab`] what a filter may name, and [`lex`], [`parse`] and
//! [`eval`] are its three stages (the byte offsets the lexer records are what the parser's
//! errors point at).

mod ast;
mod error;
mod eval;
mod lex;
mod parse;
mod vocab;

use self::ast::Expr;
use self::eval::eval;
use self::lex::Lexer;
use self::parse::Parser;

use crate::cell::Cell;

pub use self::error::FilterError;
pub use self::vocab::Vocabulary;

/// A parsed, validated filter expression.
#[derive(Debug, Clone)]
pub struct Filter {
    source: String,
    expr: Expr,
}

impl Filter {
    /// Parses `source` and checks every name and value against `vocab`. An empty
    /// vocabulary accepts any name (used where the matrix is not known).
    pub fn parse(source: &str, vocab: &Vocabulary) -> Result<Filter, FilterError> {
        let toks = Lexer {
            src: source,
            pos: 0,
        }
        .tokens()?;
        if toks.is_empty() {
            return Err(FilterError {
                expr: source.to_string(),
                offset: 0,
                len: 1,
                message: "empty filter expression".into(),
            });
        }
        let mut p = Parser {
            src: source,
            toks,
            i: 0,
            vocab,
            depth: 0,
        };
        let expr = p.or()?;
        if p.i < p.toks.len() {
            let (o, l) = p.here();
            return Err(p.err(o, l, "unexpected token: join terms with `and` / `or`"));
        }
        Ok(Filter {
            source: source.to_string(),
            expr,
        })
    }

    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    /// Whether `cell` passes the filter.
    pub fn matches(&self, cell: &Cell) -> bool {
        eval(&self.expr, cell)
    }
}

#[cfg(test)]
mod tests {
    use super::ast::MAX_NESTING;
    use super::*;
    use crate::cell::{CellId, Params, Value};
    use indexmap::IndexMap;

    fn cell(model: &str, gpus: i64, parallel: &str, feats: &[&str]) -> Cell {
        let mut v = IndexMap::new();
        v.insert("model".to_string(), Value::Str(model.into()));
        v.insert("gpus".to_string(), Value::Int(gpus));
        v.insert("parallel".to_string(), Value::Str(parallel.into()));
        v.insert(
            "features".to_string(),
            Value::Set(feats.iter().map(|s| s.to_string()).collect()),
        );
        Cell {
            id: CellId::from_values(&v),
            values: v,
            params: Params::default(),
        }
    }

    fn vocab() -> Vocabulary {
        Vocabulary {
            axes: vec![
                (
                    "model".into(),
                    vec![
                        Value::Str("gpt2-125m".into()),
                        Value::Str("llama-3.1-8b".into()),
                    ],
                ),
                ("gpus".into(), vec![Value::Int(1), Value::Int(8)]),
                (
                    "parallel".into(),
                    vec![Value::Str("single".into()), Value::Str("fsdp".into())],
                ),
                (
                    "features".into(),
                    vec![
                        Value::Set(Default::default()),
                        Value::Set(["compile".to_string()].into()),
                        Value::Set(["compile".to_string(), "sac".to_string()].into()),
                    ],
                ),
            ],
            set_axes: vec!["features".into()],
            params: vec!["seq_len".into()],
        }
    }

    fn m(expr: &str, c: &Cell) -> bool {
        Filter::parse(expr, &vocab()).unwrap().matches(c)
    }

    #[test]
    fn bare_word_matches_values_and_id_fragments() {
        let c = cell("gpt2-125m", 8, "fsdp", &["compile"]);
        assert!(m("fsdp", &c));
        assert!(m("gpt2", &c));
        assert!(m("compile", &c));
        assert!(!m("llama", &c));
    }

    #[test]
    fn comparisons() {
        let c = cell("gpt2-125m", 8, "fsdp", &["compile", "sac"]);
        assert!(m("gpus>=8", &c));
        assert!(!m("gpus>8", &c));
        assert!(m("gpus = 8", &c));
        assert!(m("model!=llama-3.1-8b", &c));
        assert!(m("model~125", &c));
        assert!(m("model=/^gpt2-\\d+m$/", &c));
        assert!(m("features=compile+sac", &c));
        assert!(m("features=sac+compile", &c));
        assert!(!m("features=compile", &c));
        assert!(m("has(sac)", &c));
        assert!(m("seq_len=1024", &c));
    }

    /// `id` names the cell id exactly (a bare word is only a substring of it), unless the
    /// matrix has an axis called `id`.
    #[test]
    fn id_selects_one_cell_exactly() {
        let c = cell("gpt2-125m", 8, "fsdp", &["compile", "sac"]);
        assert_eq!(c.id.as_str(), "gpt2-125m.8gpu.fsdp.compile+sac");
        assert!(m("id=gpt2-125m.8gpu.fsdp.compile+sac", &c));
        assert!(!m("id=gpt2-125m.8gpu.fsdp", &c));
        assert!(m("id~8gpu.fsdp", &c));
        assert!(m("id=/^gpt2-.*sac$/", &c));
        let mut v = IndexMap::new();
        v.insert("id".to_string(), Value::Str("x".into()));
        let own = Cell {
            id: CellId::from_values(&v),
            values: v,
            params: Params::default(),
        };
        let vocab = Vocabulary {
            axes: vec![("id".into(), vec![Value::Str("x".into())])],
            ..Vocabulary::default()
        };
        assert!(Filter::parse("id=x", &vocab).unwrap().matches(&own));
    }

    #[test]
    fn precedence_not_over_and_over_or() {
        let c = cell("gpt2-125m", 1, "single", &[]);
        // `or` binds looser than `and`: true or (false and false) = true.
        assert!(m("single or fsdp and llama", &c));
        // Parentheses override it: (true or false) and false = false.
        assert!(!m("(single or fsdp) and llama", &c));
        // `not` binds tighter than `and`.
        assert!(m("not fsdp and single", &c));
        assert!(!m("not (fsdp or single)", &c));
        assert!(m("!has(compile) && gpus<2 || llama", &c));
    }

    #[test]
    fn errors_point_at_the_fault() {
        let e = Filter::parse("gpus>= and fsdp", &vocab()).unwrap_err();
        assert_eq!(e.offset, 7);
        assert!(e.to_string().contains("expected a value"), "{e}");
        let e = Filter::parse("gpu=8", &vocab()).unwrap_err();
        assert_eq!((e.offset, e.len), (0, 3));
        assert!(e.message.contains("unknown axis"));
        let e = Filter::parse("model=gtp2", &vocab()).unwrap_err();
        assert_eq!(e.offset, 6);
        assert!(e.message.contains("no value `gtp2`"));
        let e = Filter::parse("(fsdp", &vocab()).unwrap_err();
        assert!(e.message.contains("missing `)`"));
        let e = Filter::parse("model>3", &vocab()).unwrap_err();
        assert!(e.message.contains("not numeric"));
        let e = Filter::parse("has(fp9)", &vocab()).unwrap_err();
        assert!(e.message.contains("unknown flag"));
        let e = Filter::parse("model=/(/", &vocab()).unwrap_err();
        assert!(e.message.contains("bad regular expression"));
        // Found by the filter fuzzer: a long unknown value made the message as long.
        let e = Filter::parse(&format!("model=\"{}\"", "!".repeat(5000)), &vocab()).unwrap_err();
        assert!(e.to_string().len() < 600, "{e}");
        // Found by the filter fuzzer: a huge repetition took seconds to compile.
        let t = std::time::Instant::now();
        let e = Filter::parse("model=/a{99999}/", &vocab()).unwrap_err();
        assert!(e.message.contains("size limit"), "{e}");
        assert!(t.elapsed() < std::time::Duration::from_millis(500));
        let e = Filter::parse("fsdp single", &vocab()).unwrap_err();
        assert_eq!(e.offset, 5);
        let e = Filter::parse("", &vocab()).unwrap_err();
        assert!(e.message.contains("empty"));
        let caret = Filter::parse("gpus>=8 y", &vocab()).unwrap_err().caret(0);
        assert_eq!(caret, "gpus>=8 y\n        ^");
    }

    /// The shapes that used to overflow the stack (issue 13): each either parses and
    /// evaluates or is refused with a located error, on a test thread's 2 MiB stack.
    #[test]
    fn hostile_nesting_is_bounded() {
        let c = cell("gpt2-125m", 8, "fsdp", &["compile"]);
        // 100,000 negations: an even run is the plain term.
        let nots = format!("{}fsdp", "!".repeat(100_000));
        assert!(m(&nots, &c));
        let odd = format!("{}fsdp", "not ".repeat(99_999));
        assert!(!m(&odd, &c));
        // 40,000 `||` terms and as many `&&` terms stay flat.
        let ors = vec!["llama"; 40_000].join(" || ") + " || fsdp";
        assert!(m(&ors, &c));
        let ands = vec!["fsdp"; 40_000].join(" && ") + " && llama";
        assert!(!m(&ands, &c));
        // Parentheses up to the limit parse; one more is refused at the `(` that is too deep.
        let ok = format!("{}fsdp{}", "(".repeat(MAX_NESTING), ")".repeat(MAX_NESTING));
        assert!(m(&ok, &c));
        let deep = format!("{}fsdp{}", "(".repeat(4_500), ")".repeat(4_500));
        let e = Filter::parse(&deep, &vocab()).unwrap_err();
        assert_eq!((e.offset, e.len), (MAX_NESTING, 1));
        assert!(e.message.contains("nest more than 100 deep"), "{e}");
        // The message shows a window around the fault, not 9,000 characters.
        assert!(e.to_string().len() < 400, "{}", e.to_string().len());
        let mixed = "!(".repeat(4_500) + "fsdp" + &")".repeat(4_500);
        assert!(Filter::parse(&mixed, &vocab()).is_err());
    }

    #[test]
    fn caret_window_points_at_the_fault_in_a_long_expression() {
        let expr = format!("{} and gpu=8", vec!["fsdp"; 100].join(" or "));
        let e = Filter::parse(&expr, &vocab()).unwrap_err();
        let caret = e.caret(0);
        let (line, marks) = caret.split_once('\n').unwrap();
        assert!(line.starts_with('…'), "{line}");
        let col = marks.find('^').unwrap();
        let shown: String = line.chars().skip(col).take(3).collect();
        assert_eq!(shown, "gpu");
    }
}
