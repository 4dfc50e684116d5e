//! `rules:` compiled once against the validated axes (every key and value checked, with
//! its location), and matched against each cell of the product: `exclude`, `when`,
//! `incompatible` and `requires`.

use std::collections::{BTreeSet, HashMap, HashSet};

use indexmap::IndexMap;

use super::validate::unknown_axis;
use super::{value_eq, Axis};
use crate::cell::{Cell, Value};
use crate::matrix::filter::{Filter, Vocabulary};
use crate::matrix::parse::Source;
use crate::matrix::spec::{MatchValue, MatrixSpec, Rule, Selector};
use crate::matrix::MatrixError;

/// A compiled rule.
pub(super) enum Matcher {
    Exclude(Vec<(String, MatchValue)>),
    When(Filter),
    Incompatible(Vec<String>),
    Requires(Box<Sel>, Box<Sel>),
}

pub(super) enum Sel {
    Expr(Filter),
    Match(Vec<(String, MatchValue)>),
}

pub(super) struct CompiledRule<'a> {
    pub(super) rule: &'a Rule,
    pub(super) index: usize,
    pub(super) matcher: Matcher,
}

pub(super) fn match_value(actual: Option<&Value>, want: &MatchValue, is_set_axis: bool) -> bool {
    let Some(actual) = actual else {
        return false;
    };
    match want {
        // On a scalar axis a list of strings is a list of alternatives.
        MatchValue::One(Value::Set(alts)) if !is_set_axis => {
            alts.contains(actual.fragment().as_ref())
        }
        MatchValue::One(v) => value_eq(actual, v),
        MatchValue::AnyOf(vs) => vs.iter().any(|v| value_eq(actual, v)),
    }
}

pub(super) fn partial_match(
    cell: &Cell,
    pairs: &[(String, MatchValue)],
    set_axes: &HashSet<String>,
) -> bool {
    pairs
        .iter()
        .all(|(k, v)| match_value(cell.values.get(k), v, set_axes.contains(k)))
}

pub(super) fn has_flag(cell: &Cell, flag: &str) -> bool {
    cell.values.values().any(|v| match v {
        Value::Set(s) => s.contains(flag),
        other => other.fragment() == flag,
    })
}

impl Matcher {
    pub(super) fn matches(&self, cell: &Cell, set_axes: &HashSet<String>) -> bool {
        match self {
            Matcher::Exclude(pairs) => partial_match(cell, pairs, set_axes),
            Matcher::When(f) => f.matches(cell),
            Matcher::Incompatible(flags) => flags.iter().all(|f| has_flag(cell, f)),
            Matcher::Requires(if_, then) => {
                sel_matches(if_, cell, set_axes) && !sel_matches(then, cell, set_axes)
            }
        }
    }
}

pub(super) fn sel_matches(sel: &Sel, cell: &Cell, set_axes: &HashSet<String>) -> bool {
    match sel {
        Sel::Expr(f) => f.matches(cell),
        Sel::Match(pairs) => partial_match(cell, pairs, set_axes),
    }
}

/// Expands `spec` (read from `src`) into cells, within the default budget.
pub(super) fn rule_label(r: &CompiledRule) -> String {
    match &r.rule.name {
        Some(n) => format!("rules[{}] {} ({n})", r.index, r.rule.kind()),
        None => format!("rules[{}] {}", r.index, r.rule.kind()),
    }
}

pub(super) fn check_pairs(
    pairs: &IndexMap<String, MatchValue>,
    path: &str,
    src: &Source,
    axes: &[Axis],
    axis_index: &HashMap<&str, usize>,
) -> Result<Vec<(String, MatchValue)>, MatrixError> {
    if pairs.is_empty() {
        return Err(src.error_at(
            path,
            "an empty match would select every cell; name at least one axis",
        ));
    }
    for (k, want) in pairs {
        let kpath = format!("{path}.{k}");
        let Some(&a) = axis_index.get(k.as_str()) else {
            return Err(src.error_at(&kpath, unknown_axis(k, axes)));
        };
        let axis = &axes[a];
        let candidates: Vec<Value> = match want {
            MatchValue::One(Value::Set(alts)) if !axis.is_set => {
                alts.iter().map(|s| Value::Str(s.clone())).collect()
            }
            MatchValue::One(v) => vec![v.clone()],
            MatchValue::AnyOf(vs) => vs.clone(),
        };
        for c in candidates {
            let known = axis
                .values
                .iter()
                .any(|v| value_eq(v, &c) || (!axis.is_set && v.id_fragment() == c.id_fragment()));
            if !known {
                let shown: Vec<String> = axis.values.iter().map(Value::id_fragment).collect();
                return Err(src.error_at(
                    &kpath,
                    format!(
                        "axis `{k}` has no value `{}` (values: {})",
                        c.id_fragment(),
                        shown.join(", ")
                    ),
                ));
            }
        }
    }
    Ok(pairs.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

pub(super) fn compile_selector(
    sel: &Selector,
    path: &str,
    src: &Source,
    axes: &[Axis],
    axis_index: &HashMap<&str, usize>,
    vocab: &Vocabulary,
) -> Result<Sel, MatrixError> {
    Ok(match sel {
        Selector::Expr(e) => Sel::Expr(
            Filter::parse(e, vocab)
                .map_err(|fe| src.error_in_value(path, fe.offset, fe.len, fe.message))?,
        ),
        Selector::Match(m) => Sel::Match(check_pairs(m, path, src, axes, axis_index)?),
    })
}

pub(super) fn compile_rules<'a>(
    spec: &'a MatrixSpec,
    src: &Source,
    axes: &[Axis],
    axis_index: &HashMap<&str, usize>,
    vocab: &Vocabulary,
) -> Result<Vec<CompiledRule<'a>>, MatrixError> {
    let known_flags: BTreeSet<String> = axes
        .iter()
        .flat_map(|a| a.values.iter())
        .flat_map(|v| match v {
            Value::Set(s) => s.iter().cloned().collect::<Vec<_>>(),
            other => vec![other.id_fragment()],
        })
        .collect();
    let mut out = Vec::new();
    for (i, rule) in spec.rules.iter().enumerate() {
        let path = format!("rules[{i}]");
        let kinds = [
            rule.exclude.is_some(),
            rule.when.is_some(),
            rule.incompatible.is_some(),
            rule.requires.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if kinds != 1 {
            return Err(src.error_at(
                &path,
                "a rule needs exactly one of `exclude`, `when`, `incompatible`, `requires`",
            ));
        }
        if rule.reason.trim().is_empty() {
            return Err(src.error_at(
                &format!("{path}.reason"),
                "`reason` must say why the cells are dropped",
            ));
        }
        let matcher = if let Some(pairs) = &rule.exclude {
            Matcher::Exclude(check_pairs(
                pairs,
                &format!("{path}.exclude"),
                src,
                axes,
                axis_index,
            )?)
        } else if let Some(expr) = &rule.when {
            let p = format!("{path}.when");
            Matcher::When(
                Filter::parse(expr, vocab)
                    .map_err(|fe| src.error_in_value(&p, fe.offset, fe.len, fe.message))?,
            )
        } else if let Some(flags) = &rule.incompatible {
            let p = format!("{path}.incompatible");
            if flags.len() < 2 {
                return Err(src.error_at(&p, "`incompatible` needs at least two flags"));
            }
            for (j, f) in flags.iter().enumerate() {
                if !known_flags.contains(f) {
                    return Err(src.error_at(
                        &format!("{p}[{j}]"),
                        format!(
                            "unknown flag `{f}`: it is neither in a set-valued axis nor the value of any axis"
                        ),
                    ));
                }
            }
            Matcher::Incompatible(flags.clone())
        } else if let Some(req) = &rule.requires {
            let p = format!("{path}.requires");
            Matcher::Requires(
                Box::new(compile_selector(
                    &req.if_,
                    &format!("{p}.if"),
                    src,
                    axes,
                    axis_index,
                    vocab,
                )?),
                Box::new(compile_selector(
                    &req.then,
                    &format!("{p}.then"),
                    src,
                    axes,
                    axis_index,
                    vocab,
                )?),
            )
        } else {
            unreachable!("exactly one rule kind was checked above")
        };
        out.push(CompiledRule {
            rule,
            index: i,
            matcher,
        });
    }
    Ok(out)
}
