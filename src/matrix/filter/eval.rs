//! Evaluating a parsed filter against a cell.

use std::borrow::Cow;

use super::ast::{Expr, Op, Operand};
use super::vocab::ID_NAME;
use crate::cell::{Cell, Value};

/// Parses a `+`-joined flag set; `base` and the empty string are the empty set.
pub(super) fn parse_set(text: &str) -> std::collections::BTreeSet<String> {
    if text.is_empty() || text == "base" {
        return Default::default();
    }
    text.split('+').map(str::to_string).collect()
}

/// Whether `value` equals the textual operand `text`.
pub(super) fn text_matches(value: &Value, text: &str, is_set: bool) -> bool {
    match value {
        Value::Set(s) if is_set => *s == parse_set(text),
        Value::Set(s) => *s == parse_set(text),
        Value::Int(_) | Value::Float(_) => match text.parse::<f64>() {
            Ok(n) => value.as_f64() == Some(n),
            Err(_) => false,
        },
        other => other.fragment() == text,
    }
}

/// The value of `name` in `cell`: an axis value, else a parameter, else (for `id`) the
/// cell id. An axis value is borrowed: filters and `when:` rules look up a value in every
/// cell of the product.
pub(super) fn lookup<'c>(cell: &'c Cell, name: &str) -> Option<Cow<'c, Value>> {
    if let Some(v) = cell.values.get(name) {
        return Some(Cow::Borrowed(v));
    }
    crate::matrix::spec::param_value(&cell.params, name)
        .or_else(|| (name == ID_NAME).then(|| Value::Str(cell.id.as_str().to_string())))
        .map(Cow::Owned)
}

pub(super) fn eval(e: &Expr, cell: &Cell) -> bool {
    match e {
        Expr::Or(terms) => terms.iter().any(|t| eval(t, cell)),
        Expr::And(terms) => terms.iter().all(|t| eval(t, cell)),
        Expr::Not(a) => !eval(a, cell),
        Expr::Word(w) => {
            cell.id.as_str().contains(w.as_str())
                || cell.values.values().any(|v| match v {
                    Value::Set(s) => s.contains(w) || v.fragment() == w.as_str(),
                    other => other.fragment() == w.as_str(),
                })
        }
        Expr::Has(flag) => cell
            .values
            .values()
            .any(|v| v.as_set().is_some_and(|s| s.contains(flag))),
        Expr::Cmp { name, op, value } => {
            let Some(actual) = lookup(cell, name) else {
                // A name the cell lacks (e.g. a key only some `include` entries add) never
                // equals anything, so only `!=` holds.
                return *op == Op::Ne;
            };
            let actual: &Value = &actual;
            let is_set = matches!(actual, Value::Set(_));
            match (op, value) {
                (Op::Eq, Operand::Regex(re)) => re.is_match(&actual.fragment()),
                (Op::Ne, Operand::Regex(re)) => !re.is_match(&actual.fragment()),
                (Op::Eq, Operand::Text(t)) => text_matches(actual, t, is_set),
                (Op::Ne, Operand::Text(t)) => !text_matches(actual, t, is_set),
                (Op::Contains, Operand::Text(t)) => actual.fragment().contains(t.as_str()),
                (Op::Contains, Operand::Regex(_)) => false,
                (cmp, Operand::Text(t)) => {
                    let (Some(a), Ok(b)) = (actual.as_f64(), t.parse::<f64>()) else {
                        return false;
                    };
                    match cmp {
                        Op::Gt => a > b,
                        Op::Ge => a >= b,
                        Op::Lt => a < b,
                        Op::Le => a <= b,
                        _ => false,
                    }
                }
                (_, Operand::Regex(_)) => false,
            }
        }
    }
}
