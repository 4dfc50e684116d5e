//! What the expansion's steps share, apart from the facade (`expand`) that imports them:
//! an axis after validation, and equality of values (numbers as numbers).

use std::collections::BTreeSet;

use crate::cell::Value;

/// An axis after validation.
pub(super) struct Axis {
    pub(super) name: String,
    pub(super) values: Vec<Value>,
    pub(super) is_set: bool,
}

/// Numeric values compare as numbers (so `8` equals `8.0`), everything else exactly.
pub(crate) fn value_eq(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// A value's identity under [`value_eq`], hashable: numbers by their `f64` bits (so `8`
/// and `8.0` are one key, and `-0.0` is `0.0`), everything else as itself. NaN is never
/// equal to anything under `value_eq`, so each NaN gets a key of its own.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) enum ValueKey<'a> {
    Num(u64),
    Unique(usize),
    Bool(bool),
    Str(&'a str),
    Set(&'a BTreeSet<String>),
}

impl<'a> ValueKey<'a> {
    pub(super) fn of(v: &'a Value) -> ValueKey<'a> {
        if let Some(x) = v.as_f64() {
            return if x.is_nan() {
                ValueKey::Unique(v as *const Value as usize)
            } else {
                ValueKey::Num((x + 0.0).to_bits())
            };
        }
        match v {
            Value::Bool(b) => ValueKey::Bool(*b),
            Value::Str(s) => ValueKey::Str(s),
            Value::Set(s) => ValueKey::Set(s),
            // Numbers were handled above.
            Value::Int(_) | Value::Float(_) => ValueKey::Unique(v as *const Value as usize),
        }
    }
}
