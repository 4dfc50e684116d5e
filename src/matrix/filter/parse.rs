//! The filter language's parser: tokens to an [`Expr`] (flat `and`/`or` chains, bounded
//! nesting), every name and value checked against the matrix's [`Vocabulary`], every
//! error located.

use crate::cell::Value;

use super::ast::{Expr, Op, Operand, MAX_NESTING, REGEX_SIZE_LIMIT};
use super::error::{FilterError, CARET_WINDOW};
use super::eval::text_matches;
use super::lex::Tok;
use super::vocab::{Vocabulary, ID_NAME};

pub(super) struct Parser<'a> {
    pub(super) src: &'a str,
    pub(super) toks: Vec<(usize, usize, Tok)>,
    pub(super) i: usize,
    pub(super) vocab: &'a Vocabulary,
    /// Parentheses open at the current token.
    pub(super) depth: usize,
}

impl<'a> Parser<'a> {
    pub(super) fn err(&self, offset: usize, len: usize, message: impl Into<String>) -> FilterError {
        FilterError::at(self.src, offset, len, message)
    }
    pub(super) fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.i).map(|t| &t.2)
    }
    pub(super) fn here(&self) -> (usize, usize) {
        self.toks
            .get(self.i)
            .map(|t| (t.0, t.1))
            .unwrap_or((self.src.len(), 1))
    }
    pub(super) fn next(&mut self) -> Option<(usize, usize, Tok)> {
        let t = self.toks.get(self.i).cloned();
        self.i += 1;
        t
    }

    /// A chain `operand (op operand)*`, read in a loop into one flat node made by `make`
    /// (both operators are associative, so the order of evaluation is unchanged).
    pub(super) fn chain(
        &mut self,
        op: Tok,
        operand: fn(&mut Self) -> Result<Expr, FilterError>,
        make: fn(Vec<Expr>) -> Expr,
    ) -> Result<Expr, FilterError> {
        let first = operand(self)?;
        if self.peek() != Some(&op) {
            return Ok(first);
        }
        let mut terms = vec![first];
        while self.peek() == Some(&op) {
            self.i += 1;
            terms.push(operand(self)?);
        }
        Ok(make(terms))
    }

    pub(super) fn or(&mut self) -> Result<Expr, FilterError> {
        self.chain(Tok::Or, Self::and, Expr::Or)
    }

    pub(super) fn and(&mut self) -> Result<Expr, FilterError> {
        self.chain(Tok::And, Self::unary, Expr::And)
    }

    /// `not not x` is `x`: a run of negations is counted in a loop and only its parity
    /// kept, so a long run neither recurses nor builds a deep tree.
    pub(super) fn unary(&mut self) -> Result<Expr, FilterError> {
        let mut negate = false;
        while self.peek() == Some(&Tok::Not) {
            self.i += 1;
            negate = !negate;
        }
        let atom = self.atom()?;
        Ok(if negate {
            Expr::Not(Box::new(atom))
        } else {
            atom
        })
    }

    pub(super) fn atom(&mut self) -> Result<Expr, FilterError> {
        let (off, len) = self.here();
        match self.next() {
            None => Err(self.err(off, 1, "expected a word, `name=value`, `has(flag)` or `(`")),
            Some((_, _, Tok::LParen)) => {
                if self.depth >= MAX_NESTING {
                    return Err(self.err(
                        off,
                        len,
                        format!("parentheses nest more than {MAX_NESTING} deep here; simplify the expression"),
                    ));
                }
                self.depth += 1;
                let e = self.or()?;
                self.depth -= 1;
                match self.next() {
                    Some((_, _, Tok::RParen)) => Ok(e),
                    Some((o, l, _)) => Err(self.err(o, l, "expected `)`")),
                    None => Err(self.err(self.src.len(), 1, "missing `)`")),
                }
            }
            Some((_, _, Tok::Word(w))) if w.eq_ignore_ascii_case("has") => self.has(off, len),
            Some((_, _, Tok::Word(w))) => match self.peek() {
                Some(Tok::Op(op)) => {
                    let op = *op;
                    self.i += 1;
                    self.check_name(&w, off, len)?;
                    let (voff, vlen) = self.here();
                    let value = match self.next() {
                        Some((_, _, Tok::Word(v))) | Some((_, _, Tok::Quoted(v))) => {
                            Operand::Text(v)
                        }
                        Some((o, l, Tok::Regex(r))) => {
                            if !matches!(op, Op::Eq | Op::Ne) {
                                return Err(self.err(o, l, "a /regex/ goes after `=` or `!=`"));
                            }
                            Operand::Regex(
                                regex::RegexBuilder::new(&r)
                                    .size_limit(REGEX_SIZE_LIMIT)
                                    .build()
                                    .map_err(|e| {
                                        self.err(o, l, format!("bad regular expression: {e}"))
                                    })?,
                            )
                        }
                        _ => {
                            return Err(self.err(voff, vlen, "expected a value after the operator"))
                        }
                    };
                    self.check_value(&w, op, &value, voff, vlen)?;
                    Ok(Expr::Cmp { name: w, op, value })
                }
                _ => Ok(Expr::Word(w)),
            },
            Some((o, l, Tok::Quoted(w))) => {
                let _ = (o, l);
                Ok(Expr::Word(w))
            }
            Some((o, l, _)) => Err(self.err(
                o,
                l,
                "expected a word, `name=value`, `has(flag)` or `(` here",
            )),
        }
    }

    pub(super) fn has(&mut self, off: usize, len: usize) -> Result<Expr, FilterError> {
        if self.peek() != Some(&Tok::LParen) {
            // `has` alone is a bare word (a value may be called "has").
            return Ok(Expr::Word(self.src[off..off + len].to_string()));
        }
        self.i += 1;
        let (foff, flen) = self.here();
        let flag = match self.next() {
            Some((_, _, Tok::Word(f))) | Some((_, _, Tok::Quoted(f))) => f,
            _ => return Err(self.err(foff, flen, "expected a flag name inside has(...)")),
        };
        match self.next() {
            Some((_, _, Tok::RParen)) => {}
            Some((o, l, _)) => return Err(self.err(o, l, "expected `)` after the flag")),
            None => return Err(self.err(self.src.len(), 1, "missing `)`")),
        }
        if !self.vocab.axes.is_empty() && !self.vocab.flags().any(|f| *f == flag) {
            let known: Vec<&String> = self
                .vocab
                .flags()
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            return Err(self.err(
                foff,
                flen,
                format!(
                    "unknown flag `{}` (flags of set-valued axes: {})",
                    clip(&flag),
                    join_or_none(known.iter().map(|s| s.as_str()))
                ),
            ));
        }
        Ok(Expr::Has(flag))
    }

    pub(super) fn check_name(&self, name: &str, off: usize, len: usize) -> Result<(), FilterError> {
        if self.vocab.axes.is_empty() && self.vocab.params.is_empty() {
            return Ok(());
        }
        if self.vocab.axis(name).is_some()
            || self.vocab.params.iter().any(|p| p == name)
            || name == ID_NAME
        {
            return Ok(());
        }
        let axes: Vec<&str> = self.vocab.axes.iter().map(|(n, _)| n.as_str()).collect();
        Err(self.err(
            off,
            len,
            format!(
                "unknown axis or parameter `{}` (axes: {})",
                clip(name),
                join_or_none(axes.into_iter())
            ),
        ))
    }

    pub(super) fn check_value(
        &self,
        name: &str,
        op: Op,
        value: &Operand,
        off: usize,
        len: usize,
    ) -> Result<(), FilterError> {
        let Operand::Text(text) = value else {
            return Ok(());
        };
        match op {
            Op::Gt | Op::Ge | Op::Lt | Op::Le => {
                if text.parse::<f64>().is_err() {
                    return Err(self.err(off, len, format!("`{}` is not a number", clip(text))));
                }
                if let Some(vals) = self.vocab.axis(name) {
                    if vals.iter().any(|v| v.as_f64().is_none()) {
                        return Err(self.err(
                            off,
                            len,
                            format!(
                                "axis `{name}` is not numeric, so it cannot be compared with `{}`",
                                op_str(op)
                            ),
                        ));
                    }
                }
                Ok(())
            }
            Op::Eq | Op::Ne => {
                if let Some(vals) = self.vocab.axis(name) {
                    let is_set = self.vocab.set_axes.iter().any(|a| a == name);
                    if !vals.iter().any(|v| text_matches(v, text, is_set)) {
                        let shown: Vec<String> = vals.iter().map(Value::id_fragment).collect();
                        return Err(self.err(
                            off,
                            len,
                            format!(
                                "axis `{name}` has no value `{}` (values: {})",
                                clip(text),
                                join_or_none(shown.iter().map(String::as_str))
                            ),
                        ));
                    }
                }
                Ok(())
            }
            Op::Contains => Ok(()),
        }
    }
}

/// User text quoted in a message, cut to [`CARET_WINDOW`] characters so that a hostile
/// value cannot make the message as long as itself (the caret line shows where it is).
pub(super) fn clip(text: &str) -> String {
    match text.char_indices().nth(CARET_WINDOW) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

pub(super) fn op_str(op: Op) -> &'static str {
    match op {
        Op::Eq => "=",
        Op::Ne => "!=",
        Op::Contains => "~",
        Op::Gt => ">",
        Op::Ge => ">=",
        Op::Lt => "<",
        Op::Le => "<=",
    }
}

pub(super) fn join_or_none<'a>(it: impl Iterator<Item = &'a str>) -> String {
    let v: Vec<&str> = it.collect();
    if v.is_empty() {
        "none".to_string()
    } else {
        v.join(", ")
    }
}
