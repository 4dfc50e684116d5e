//! Expansion: from a validated [`MatrixSpec`] to cells, in a documented, stable order.
//!
//! Order of operations (docs/matrix.md has the full semantics):
//! 1. every axis gives its values (`subsets_of` generates all subsets, smallest first);
//! 2. `zip` groups advance in lockstep and count as one dimension, placed at the group's
//!    first axis;
//! 3. the cartesian product of the dimensions, first axis slowest (as nested loops written
//!    in file order, and as GitHub Actions orders a matrix);
//! 4. `rules`, in order: the first rule that matches a cell drops it, with its reason;
//! 5. `include`, with GitHub Actions semantics, on the cells that survived;
//! 6. parameters: `defaults`, then `overrides` in axis order, then axes named like
//!    parameters, then parameters set by `include`; then derived values;
//! 7. cell ids, which must be unique.
//!
//! Filters are applied afterwards by the caller.
//!
//! Why one file of this size: the steps above are one algorithm whose order is the contract
//! (docs/matrix.md); split across files, the order would have to be read from several places.

use std::collections::{BTreeSet, HashMap, HashSet};

use indexmap::IndexMap;
use itertools::Itertools;

use super::budget::Budget;
use super::filter::{Filter, Vocabulary};
use super::parse::Source;
use super::spec::{
    set_param, AxisSpec, Explicit, MatchValue, MatrixSpec, Rule, Selector, PARAM_NAMES,
};
use super::{Dropped, MatrixError};
use crate::axes::{Dtype, Parallel};
use crate::cell::{Cell, CellId, Params, Value};
use clap::ValueEnum;

/// A surviving combination before parameters: its values, and parameters set by include.
type Draft = (IndexMap<String, Value>, Vec<(String, Value)>);
/// One dimension of the product: each choice sets one or more (axis, value index) pairs.
type Dimension = Vec<Vec<(usize, usize)>>;

/// The cells of a matrix before filtering.
#[derive(Debug, Clone)]
pub struct Expanded {
    pub cells: Vec<Cell>,
    pub dropped: Vec<Dropped>,
    pub warnings: Vec<String>,
    /// What filters may name.
    pub vocab: Vocabulary,
    /// Size of the product before rules and include.
    pub combinations: usize,
}

/// An axis after validation.
struct Axis {
    name: String,
    values: Vec<Value>,
    is_set: bool,
}

/// A compiled rule.
enum Matcher {
    Exclude(Vec<(String, MatchValue)>),
    When(Filter),
    Incompatible(Vec<String>),
    Requires(Box<Sel>, Box<Sel>),
}

enum Sel {
    Expr(Filter),
    Match(Vec<(String, MatchValue)>),
}

struct CompiledRule<'a> {
    rule: &'a Rule,
    index: usize,
    matcher: Matcher,
}

/// Numeric values compare as numbers (so `8` equals `8.0`), everything else exactly.
pub fn value_eq(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// A value's identity under [`value_eq`], hashable: numbers by their `f64` bits (so `8`
/// and `8.0` are one key, and `-0.0` is `0.0`), everything else as itself. NaN is never
/// equal to anything under `value_eq`, so each NaN gets a key of its own.
#[derive(Debug, PartialEq, Eq, Hash)]
enum ValueKey<'a> {
    Num(u64),
    Unique(usize),
    Bool(bool),
    Str(&'a str),
    Set(&'a BTreeSet<String>),
}

impl<'a> ValueKey<'a> {
    fn of(v: &'a Value) -> ValueKey<'a> {
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

fn match_value(actual: Option<&Value>, want: &MatchValue, is_set_axis: bool) -> bool {
    let Some(actual) = actual else {
        return false;
    };
    match want {
        // On a scalar axis a list of strings is a list of alternatives.
        MatchValue::One(Value::Set(alts)) if !is_set_axis => alts.contains(&actual.id_fragment()),
        MatchValue::One(v) => value_eq(actual, v),
        MatchValue::AnyOf(vs) => vs.iter().any(|v| value_eq(actual, v)),
    }
}

fn partial_match(cell: &Cell, pairs: &[(String, MatchValue)], set_axes: &HashSet<String>) -> bool {
    pairs
        .iter()
        .all(|(k, v)| match_value(cell.values.get(k), v, set_axes.contains(k)))
}

fn has_flag(cell: &Cell, flag: &str) -> bool {
    cell.values.values().any(|v| match v {
        Value::Set(s) => s.contains(flag),
        other => other.id_fragment() == flag,
    })
}

impl Matcher {
    fn matches(&self, cell: &Cell, set_axes: &HashSet<String>) -> bool {
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

fn sel_matches(sel: &Sel, cell: &Cell, set_axes: &HashSet<String>) -> bool {
    match sel {
        Sel::Expr(f) => f.matches(cell),
        Sel::Match(pairs) => partial_match(cell, pairs, set_axes),
    }
}

/// Expands `spec` (read from `src`) into cells, within the default budget.
pub fn expand(spec: &MatrixSpec, src: &Source) -> Result<Expanded, MatrixError> {
    expand_within(spec, src, Budget::default())
}

/// Expands `spec` into cells, refusing it before any value is generated when it would
/// exceed `budget` (see [`super::budget`]).
pub fn expand_within(
    spec: &MatrixSpec,
    src: &Source,
    budget: Budget,
) -> Result<Expanded, MatrixError> {
    super::budget::check(spec, src, budget)?;
    let axes = validate_axes(spec, src)?;
    let axis_index: HashMap<&str, usize> = axes
        .iter()
        .enumerate()
        .map(|(i, a)| (a.name.as_str(), i))
        .collect();
    let set_axes: HashSet<String> = axes
        .iter()
        .filter(|a| a.is_set)
        .map(|a| a.name.clone())
        .collect();
    let dims = dimensions(spec, src, &axes, &axis_index)?;
    validate_overrides(spec, src, &axes, &axis_index)?;
    let vocab = vocabulary(spec, &axes);
    let rules = compile_rules(spec, src, &axes, &axis_index, &vocab)?;
    let builder = ParamBuilder::new(spec, src)?;

    // The product, first dimension slowest.
    let combinations: usize = dims.iter().map(Vec::len).product();
    let mut kept: Vec<Draft> = Vec::new();
    let mut dropped = Vec::new();
    let mut rule_hits = vec![0usize; rules.len()];
    for combo in dims.iter().map(|d| d.iter()).multi_cartesian_product() {
        let mut picked: Vec<(usize, usize)> = combo.into_iter().flatten().copied().collect();
        picked.sort_unstable();
        let values: IndexMap<String, Value> = picked
            .iter()
            .map(|&(a, v)| (axes[a].name.clone(), axes[a].values[v].clone()))
            .collect();
        // A cell that a rule drops may have parameters that do not derive (e.g. a global
        // batch that its GPU count does not divide); rules still see it, with the
        // parameters as far as they resolve, and only kept cells must derive cleanly.
        let cell = builder
            .cell(values.clone(), &[])
            .unwrap_or_else(|_| builder.lenient(values.clone()));
        let mut first: Option<&CompiledRule> = None;
        for (i, r) in rules.iter().enumerate() {
            if r.matcher.matches(&cell, &set_axes) {
                rule_hits[i] += 1;
                first.get_or_insert(r);
            }
        }
        match first {
            Some(r) => dropped.push(Dropped {
                by: rule_label(r),
                reason: r.rule.reason.clone(),
                cell,
            }),
            // A framework adapter drops what its framework cannot express, like a rule.
            None => match crate::external::unexpressible(&cell) {
                Some((by, reason)) => dropped.push(Dropped { by, reason, cell }),
                None => kept.push((values, Vec::new())),
            },
        }
    }
    // Dimensions are never empty (validated), so the product always has a first element;
    // `multi_cartesian_product` of zero dimensions yields nothing, which cannot happen as a
    // matrix has at least one axis.

    let mut warnings = Vec::new();
    for (r, hits) in rules.iter().zip(&rule_hits) {
        if *hits == 0 {
            let path = format!("rules[{}]", r.index);
            let loc = match src.key_pos(&path) {
                Some(p) => format!("{}:{}:{}: ", src.path.display(), p.line, p.column),
                None => format!("{}: ", src.path.display()),
            };
            warnings.push(format!("{loc}{} matches no cell", rule_label(r)));
        }
    }

    apply_include(spec, &axis_index, &mut kept);

    let mut cells = Vec::with_capacity(kept.len());
    for (values, include_params) in kept {
        let cell = builder.cell(values, &include_params)?;
        check_cell_values(&cell, &axes, src)?;
        cells.push(cell);
    }
    check_unique_ids(&cells, src)?;

    let vocab = filter_vocabulary(vocab, spec, &axis_index);
    Ok(Expanded {
        cells,
        dropped,
        warnings,
        vocab,
        combinations,
    })
}

fn rule_label(r: &CompiledRule) -> String {
    match &r.rule.name {
        Some(n) => format!("rules[{}] {} ({n})", r.index, r.rule.kind()),
        None => format!("rules[{}] {}", r.index, r.rule.kind()),
    }
}

fn validate_axes(spec: &MatrixSpec, src: &Source) -> Result<Vec<Axis>, MatrixError> {
    if spec.axes.is_empty() {
        return Err(src.error_at("axes", "`axes` is empty: a matrix needs at least one axis"));
    }
    let mut out = Vec::new();
    for (name, axis) in &spec.axes {
        let path = format!("axes.{name}");
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(src.error_at(
                &path,
                format!("axis name `{name}` must be letters, digits, `_` or `-`"),
            ));
        }
        let (values, is_set) = match axis {
            AxisSpec::Values(v) => {
                let sets = v.iter().filter(|x| matches!(x, Value::Set(_))).count();
                if sets != 0 && sets != v.len() {
                    return Err(src.error_at(
                        &path,
                        format!("axis `{name}` mixes flag sets and scalars; use one kind"),
                    ));
                }
                (v.clone(), sets != 0)
            }
            AxisSpec::Subsets(s) => {
                let mut seen = HashSet::new();
                for (i, f) in s.subsets_of.iter().enumerate() {
                    if !seen.insert(f) {
                        return Err(src.error_at(
                            &format!("{path}.subsets_of[{i}]"),
                            format!("duplicate flag `{f}` in axis `{name}`"),
                        ));
                    }
                }
                let subsets = s
                    .subsets_of
                    .iter()
                    .cloned()
                    .powerset()
                    .map(|set| Value::Set(set.into_iter().collect()))
                    .collect();
                (subsets, true)
            }
        };
        if values.is_empty() {
            return Err(src.error_at(&path, format!("axis `{name}` has no values")));
        }
        // A hash of each value's identity under `value_eq` keeps this linear: an axis of
        // 200,000 values was quadratic (44 s) with pairwise comparison.
        let mut seen: HashSet<ValueKey> = HashSet::with_capacity(values.len());
        for (i, v) in values.iter().enumerate() {
            if !seen.insert(ValueKey::of(v)) {
                return Err(src.error_at(
                    &format!("{path}[{i}]"),
                    format!("duplicate value `{}` in axis `{name}`", v.id_fragment()),
                ));
            }
        }
        check_well_known(name, &values, is_set, &path, src)?;
        out.push(Axis {
            name: name.clone(),
            values,
            is_set,
        });
    }
    Ok(out)
}

/// The most GPUs a cell may ask for: more than any cluster has, and far inside the
/// integer types world sizes and batch products are computed in.
pub const MAX_GPUS: i64 = 1 << 20;

/// Type checks for the axes the built-in workload interprets.
fn check_well_known(
    name: &str,
    values: &[Value],
    is_set: bool,
    path: &str,
    src: &Source,
) -> Result<(), MatrixError> {
    for (i, v) in values.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let want = match name {
            "gpus" if !matches!(v, Value::Int(n) if (0..=MAX_GPUS).contains(n)) => {
                Some("an integer from 0 to 1048576".to_string())
            }
            "model" if v.as_str().is_none() => Some("a string".to_string()),
            "dtype" => typed_problem::<Dtype>(v),
            "parallel" => typed_problem::<Parallel>(v),
            _ => None,
        };
        if let Some(want) = want {
            return Err(src.error_at(
                &at,
                format!("`{name}` value `{}` must be {want}", v.id_fragment()),
            ));
        }
    }
    if name == "features" && !is_set {
        return Err(src.error_at(
            path,
            "`features` is a set-valued axis: give lists of flags (`[[], [compile]]`) or `{subsets_of: [compile, sac]}`",
        ));
    }
    Ok(())
}

/// What is wrong with `v` as a value of a typed axis: None when it names a variant of `T`.
fn typed_problem<T: ValueEnum + std::str::FromStr>(v: &Value) -> Option<String> {
    if v.as_str().is_some_and(|s| s.parse::<T>().is_ok()) {
        return None;
    }
    let names: Vec<String> = T::value_variants()
        .iter()
        .filter_map(|t| t.to_possible_value().map(|p| p.get_name().to_string()))
        .collect();
    Some(format!("one of {}", names.join(", ")))
}

/// Refuses a `dtype` or `parallel` value that `include` added outside the typed values
/// (axis values were checked with their index in [`check_well_known`]), so that a cell that
/// could only fail when it runs is refused before anything runs.
fn check_cell_values(cell: &Cell, axes: &[Axis], src: &Source) -> Result<(), MatrixError> {
    for (name, problem) in [
        (
            "dtype",
            typed_problem::<Dtype> as fn(&Value) -> Option<String>,
        ),
        ("parallel", typed_problem::<Parallel>),
    ] {
        if let Some(v) = cell.values.get(name) {
            if let Some(want) = problem(v) {
                return Err(src.error_at(
                    &value_path(axes, name, v),
                    format!(
                        "cell `{}`: `{name}` value `{}` must be {want}",
                        cell.id,
                        v.id_fragment()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Where a cell's value of axis `name` came from: its place in the axis, else the
/// `include` that added it.
fn value_path(axes: &[Axis], name: &str, v: &Value) -> String {
    axes.iter()
        .find(|a| a.name == name)
        .and_then(|a| a.values.iter().position(|w| value_eq(v, w)))
        .map_or_else(|| "include".to_string(), |i| format!("axes.{name}[{i}]"))
}

/// The product's dimensions: each a list of (axis index, value index) tuples.
fn dimensions(
    spec: &MatrixSpec,
    src: &Source,
    axes: &[Axis],
    axis_index: &HashMap<&str, usize>,
) -> Result<Vec<Dimension>, MatrixError> {
    let mut group_of: HashMap<usize, usize> = HashMap::new();
    for (g, group) in spec.zip.iter().enumerate() {
        if group.len() < 2 {
            return Err(src.error_at(&format!("zip[{g}]"), "a zip group needs at least two axes"));
        }
        let mut len = None;
        for (j, name) in group.iter().enumerate() {
            let path = format!("zip[{g}][{j}]");
            let Some(&a) = axis_index.get(name.as_str()) else {
                return Err(src.error_at(&path, unknown_axis(name, axes)));
            };
            if group_of.insert(a, g).is_some() {
                return Err(src.error_at(
                    &path,
                    format!("axis `{name}` is in more than one zip group"),
                ));
            }
            let n = axes[a].values.len();
            match len {
                None => len = Some(n),
                Some(m) if m != n => {
                    return Err(src.error_at(
                        &path,
                        format!(
                            "zipped axes must have the same number of values: `{}` has {m}, `{name}` has {n}",
                            group[0]
                        ),
                    ))
                }
                _ => {}
            }
        }
    }
    let mut dims = Vec::new();
    let mut done_groups = HashSet::new();
    for (a, axis) in axes.iter().enumerate() {
        match group_of.get(&a) {
            None => dims.push((0..axis.values.len()).map(|v| vec![(a, v)]).collect()),
            Some(&g) => {
                if !done_groups.insert(g) {
                    continue;
                }
                let members: Vec<usize> = spec.zip[g]
                    .iter()
                    .filter_map(|n| axis_index.get(n.as_str()).copied())
                    .collect();
                let n = axis.values.len();
                dims.push(
                    (0..n)
                        .map(|v| members.iter().map(|&m| (m, v)).collect())
                        .collect(),
                );
            }
        }
    }
    Ok(dims)
}

fn unknown_axis(name: &str, axes: &[Axis]) -> String {
    let names: Vec<&str> = axes.iter().map(|a| a.name.as_str()).collect();
    format!("unknown axis `{name}` (axes: {})", names.join(", "))
}

fn validate_overrides(
    spec: &MatrixSpec,
    src: &Source,
    axes: &[Axis],
    axis_index: &HashMap<&str, usize>,
) -> Result<(), MatrixError> {
    for (axis, per_value) in &spec.overrides {
        let path = format!("overrides.{axis}");
        let Some(&a) = axis_index.get(axis.as_str()) else {
            return Err(src.error_at(&path, unknown_axis(axis, axes)));
        };
        for (value, patch) in per_value {
            let vpath = format!("{path}.{value}");
            if !axes[a].values.iter().any(|v| v.id_fragment() == *value) {
                let known: Vec<String> = axes[a].values.iter().map(Value::id_fragment).collect();
                return Err(src.error_at(
                    &vpath,
                    format!(
                        "axis `{axis}` has no value `{value}` (values: {})",
                        known.join(", ")
                    ),
                ));
            }
            let mut scratch = Params::default();
            patch
                .apply(&mut scratch, &mut Explicit::default())
                .map_err(|(k, m)| src.error_at(&format!("{vpath}.{k}"), m))?;
        }
    }
    Ok(())
}

fn vocabulary(spec: &MatrixSpec, axes: &[Axis]) -> Vocabulary {
    let mut params: Vec<String> = PARAM_NAMES.iter().map(|s| s.to_string()).collect();
    params.extend(spec.defaults.extra.keys().cloned());
    for per_value in spec.overrides.values() {
        for patch in per_value.values() {
            params.extend(patch.extra.keys().cloned());
        }
    }
    params.sort();
    params.dedup();
    Vocabulary {
        axes: axes
            .iter()
            .map(|a| (a.name.clone(), a.values.clone()))
            .collect(),
        set_axes: axes
            .iter()
            .filter(|a| a.is_set)
            .map(|a| a.name.clone())
            .collect(),
        params,
    }
}

/// Adds the keys and values that `include` entries introduce, so filters may name them.
fn filter_vocabulary(
    mut vocab: Vocabulary,
    spec: &MatrixSpec,
    axis_index: &HashMap<&str, usize>,
) -> Vocabulary {
    for entry in &spec.include {
        for (k, v) in entry {
            if PARAM_NAMES.contains(&k.as_str()) && !axis_index.contains_key(k.as_str()) {
                continue;
            }
            match vocab.axes.iter_mut().find(|(n, _)| n == k) {
                Some((_, vals)) => {
                    if !vals.iter().any(|w| value_eq(v, w)) {
                        vals.push(v.clone());
                    }
                }
                None => vocab.axes.push((k.clone(), vec![v.clone()])),
            }
        }
    }
    vocab
}

fn check_pairs(
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

fn compile_selector(
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

fn compile_rules<'a>(
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

/// GitHub Actions `include`: extend matching original cells without overwriting original
/// values; an entry that matches no original cell becomes a new cell. Cells added by
/// include are never matched by later entries (as in GitHub Actions).
fn apply_include(spec: &MatrixSpec, axis_index: &HashMap<&str, usize>, kept: &mut Vec<Draft>) {
    let originals = kept.len();
    for entry in &spec.include {
        let mut matched = false;
        for (values, params) in kept.iter_mut().take(originals) {
            let fits = entry
                .iter()
                .filter(|(k, _)| axis_index.contains_key(k.as_str()))
                .all(|(k, v)| values.get(k).is_some_and(|w| value_eq(v, w)));
            if !fits {
                continue;
            }
            matched = true;
            for (k, v) in entry {
                if axis_index.contains_key(k.as_str()) {
                    continue;
                }
                if PARAM_NAMES.contains(&k.as_str()) {
                    params.retain(|(n, _)| n != k);
                    params.push((k.clone(), v.clone()));
                } else {
                    values.insert(k.clone(), v.clone());
                }
            }
        }
        if !matched {
            // New cell: declared axes first in axis order, then other keys in entry order,
            // so its id reads like the others'.
            let mut values: IndexMap<String, Value> = IndexMap::new();
            let mut params = Vec::new();
            let mut axis_keys: Vec<(&String, &Value)> = entry
                .iter()
                .filter(|(k, _)| axis_index.contains_key(k.as_str()))
                .collect();
            axis_keys.sort_by_key(|(k, _)| axis_index[k.as_str()]);
            for (k, v) in axis_keys {
                values.insert(k.clone(), v.clone());
            }
            for (k, v) in entry {
                if axis_index.contains_key(k.as_str()) {
                    continue;
                }
                if PARAM_NAMES.contains(&k.as_str()) {
                    params.push((k.clone(), v.clone()));
                } else {
                    values.insert(k.clone(), v.clone());
                }
            }
            kept.push((values, params));
        }
    }
}

fn check_unique_ids(cells: &[Cell], src: &Source) -> Result<(), MatrixError> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, c) in cells.iter().enumerate() {
        if let Some(j) = seen.insert(c.id.as_str(), i) {
            return Err(src.error_at(
                "axes",
                format!(
                    "duplicate cell id `{}` (cells #{} and #{}): axis values that differ only in such characters give the same id (characters outside [A-Za-z0-9._+-] become `_`); rename one",
                    c.id,
                    j + 1,
                    i + 1
                ),
            ));
        }
    }
    Ok(())
}

/// Resolves parameters for a cell: defaults, overrides in axis order, axis values named
/// like parameters, include parameters, then derived values.
struct ParamBuilder<'a> {
    spec: &'a MatrixSpec,
    src: &'a Source,
    base: Params,
    base_explicit: Explicit,
}

impl<'a> ParamBuilder<'a> {
    fn new(spec: &'a MatrixSpec, src: &'a Source) -> Result<Self, MatrixError> {
        let mut base = Params::default();
        let mut base_explicit = Explicit::default();
        spec.defaults
            .apply(&mut base, &mut base_explicit)
            .map_err(|(k, m)| src.error_at(&format!("defaults.{k}"), m))?;
        Ok(ParamBuilder {
            spec,
            src,
            base,
            base_explicit,
        })
    }

    fn lenient(&self, values: IndexMap<String, Value>) -> Cell {
        Cell {
            id: CellId::from_values(&values),
            values,
            params: self.base.clone(),
        }
    }

    fn cell(
        &self,
        values: IndexMap<String, Value>,
        include_params: &[(String, Value)],
    ) -> Result<Cell, MatrixError> {
        let mut p = self.base.clone();
        let mut explicit = self.base_explicit;
        for (axis, per_value) in &self.spec.overrides {
            let Some(v) = values.get(axis) else { continue };
            if let Some(patch) = per_value.get(&v.id_fragment()) {
                // Validated in validate_overrides, so this cannot fail.
                let _ = patch.apply(&mut p, &mut explicit);
            }
        }
        let id = CellId::from_values(&values);
        for (name, v) in &values {
            if PARAM_NAMES.contains(&name.as_str()) {
                set_param(&mut p, &mut explicit, name, v)
                    .map_err(|m| self.src.error_at(&format!("axes.{name}"), m))?;
            }
        }
        for (name, v) in include_params {
            set_param(&mut p, &mut explicit, name, v)
                .map_err(|m| self.src.error_at("include", format!("cell `{id}`: {m}")))?;
        }
        let cell = Cell {
            id,
            values,
            params: p,
        };
        derive(cell, explicit, self.src)
    }
}

/// global_batch = gpus x micro_batch x grad_accum unless set; when it is set and grad_accum
/// is not, grad_accum follows from it.
fn derive(mut cell: Cell, explicit: Explicit, src: &Source) -> Result<Cell, MatrixError> {
    // An `include` entry may set `gpus` too, so the range is checked here for every cell
    // (`Cell::gpus` would saturate 4294967296 to 4294967295).
    if let Some(g) = cell.values.get("gpus") {
        if !matches!(g, Value::Int(n) if (0..=MAX_GPUS).contains(n)) {
            return Err(src.error_at(
                "axes.gpus",
                format!(
                    "cell `{}`: `gpus` value `{g}` must be an integer from 0 to {MAX_GPUS}",
                    cell.id
                ),
            ));
        }
    }
    let gpus = cell.gpus();
    let p = &mut cell.params;
    if p.micro_batch == 0 || p.grad_accum == 0 || p.seq_len == 0 || p.steps == 0 {
        return Err(src.error_at(
            "defaults",
            format!(
                "cell `{}`: steps, seq_len, micro_batch and grad_accum must be at least 1",
                cell.id
            ),
        ));
    }
    if p.warmup >= p.steps {
        return Err(src.error_at(
            "defaults.warmup",
            format!(
                "cell `{}`: warmup ({}) must be less than steps ({}) so that some steps are measured",
                cell.id, p.warmup, p.steps
            ),
        ));
    }
    // Checked: `gpus: 65536` with `micro_batch: 65536` wrapped to a global batch of 0.
    let product = |what: &str, a: u32, b: u32| {
        a.checked_mul(b).ok_or_else(|| {
            src.error_at(
                "defaults",
                format!(
                    "cell `{}`: {what} = {a} x {b} does not fit in a batch size (at most {})",
                    cell.id,
                    u32::MAX
                ),
            )
        })
    };
    let per_step = product("gpus x micro_batch", gpus, p.micro_batch)?;
    if !explicit.global_batch {
        p.global_batch = product("gpus x micro_batch x grad_accum", per_step, p.grad_accum)?;
    } else if !explicit.grad_accum {
        if !p.global_batch.is_multiple_of(per_step) || p.global_batch == 0 {
            return Err(src.error_at(
                "defaults.global_batch",
                format!(
                    "cell `{}`: global_batch {} is not a multiple of gpus x micro_batch = {per_step}",
                    cell.id, p.global_batch
                ),
            ));
        }
        p.grad_accum = p.global_batch / per_step;
    } else if u64::from(p.global_batch) != u64::from(per_step) * u64::from(p.grad_accum) {
        return Err(src.error_at(
            "defaults.global_batch",
            format!(
                "cell `{}`: global_batch {} != gpus x micro_batch x grad_accum = {}",
                cell.id,
                p.global_batch,
                u64::from(per_step) * u64::from(p.grad_accum)
            ),
        ));
    }
    Ok(cell)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::parse::parse_str;
    use std::path::Path;

    fn expand_str(yaml: &str) -> Result<Expanded, MatrixError> {
        let (spec, src) = parse_str(Path::new("t.yaml"), yaml.to_string())?;
        expand(&spec, &src)
    }

    /// Cells as `key=value` lists (values in cell order), for readable assertions.
    fn rows(e: &Expanded) -> Vec<String> {
        e.cells
            .iter()
            .map(|c| {
                c.values
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect()
    }

    #[test]
    fn github_include_example() {
        // docs.github.com "Expanding or adding matrix configurations", example 1.
        let e = expand_str(
            r#"
axes:
  fruit: [apple, pear]
  animal: [cat, dog]
include:
  - color: green
  - color: pink
    animal: cat
  - fruit: apple
    shape: circle
  - fruit: banana
  - fruit: banana
    animal: cat
"#,
        )
        .unwrap();
        assert_eq!(
            rows(&e),
            vec![
                "fruit=apple,animal=cat,color=pink,shape=circle",
                "fruit=apple,animal=dog,color=green,shape=circle",
                "fruit=pear,animal=cat,color=pink",
                "fruit=pear,animal=dog,color=green",
                "fruit=banana",
                "fruit=banana,animal=cat",
            ]
        );
    }

    #[test]
    fn github_include_extends_one_job() {
        // docs.github.com example: node 16 on windows gets npm 6; others unchanged.
        let e = expand_str(
            "axes:\n  os: [windows-latest, ubuntu-latest]\n  node: [14, 16]\ninclude:\n  - os: windows-latest\n    node: 16\n    npm: 6\n",
        )
        .unwrap();
        assert_eq!(
            rows(&e),
            vec![
                "os=windows-latest,node=14",
                "os=windows-latest,node=16,npm=6",
                "os=ubuntu-latest,node=14",
                "os=ubuntu-latest,node=16",
            ]
        );
    }

    #[test]
    fn github_exclude_example_partial_match() {
        // docs.github.com "Excluding matrix configurations": 12 - 1 - 2 = 9 jobs.
        let e = expand_str(
            r#"
axes:
  os: [macos-latest, windows-latest]
  version: [12, 14, 16]
  environment: [staging, production]
rules:
  - exclude: {os: macos-latest, version: 12, environment: production}
    reason: a
  - exclude: {os: windows-latest, version: 16}
    reason: b
"#,
        )
        .unwrap();
        assert_eq!(e.combinations, 12);
        assert_eq!(e.cells.len(), 9);
        assert_eq!(e.dropped.len(), 3);
        assert_eq!(e.dropped[0].reason, "a");
        assert!(e.dropped[1..].iter().all(|d| d.reason == "b"));
    }

    #[test]
    fn include_adds_back_an_excluded_cell() {
        let e = expand_str(
            "axes:\n  a: [x, y]\nrules:\n  - exclude: {a: y}\n    reason: r\ninclude:\n  - a: y\n",
        )
        .unwrap();
        assert_eq!(rows(&e), vec!["a=x", "a=y"]);
        assert_eq!(e.dropped.len(), 1);
    }

    #[test]
    fn include_sets_parameters_without_changing_ids() {
        let e = expand_str(
            "axes:\n  model: [a, b]\ndefaults:\n  micro_batch: 4\ninclude:\n  - model: b\n    micro_batch: 2\n",
        )
        .unwrap();
        assert_eq!(e.cells[1].id.as_str(), "b");
        assert_eq!(e.cells[1].params.micro_batch, 2);
        assert_eq!(e.cells[0].params.micro_batch, 4);
    }

    #[test]
    fn order_is_first_axis_slowest_and_subsets_smallest_first() {
        let e =
            expand_str("axes:\n  m: [a, b]\n  features: {subsets_of: [compile, sac]}\n").unwrap();
        let ids: Vec<&str> = e.cells.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(
            ids,
            vec![
                "a.base",
                "a.compile",
                "a.sac",
                "a.compile+sac",
                "b.base",
                "b.compile",
                "b.sac",
                "b.compile+sac"
            ]
        );
    }

    #[test]
    fn zip_advances_in_lockstep() {
        let e = expand_str(
            "axes:\n  gpus: [1, 2, 8]\n  model: [a, b]\n  global_batch: [8, 16, 64]\nzip: [[gpus, global_batch]]\ndefaults: {micro_batch: 8}\n",
        )
        .unwrap();
        assert_eq!(e.combinations, 6);
        assert_eq!(
            rows(&e),
            vec![
                "gpus=1,model=a,global_batch=8",
                "gpus=1,model=b,global_batch=8",
                "gpus=2,model=a,global_batch=16",
                "gpus=2,model=b,global_batch=16",
                "gpus=8,model=a,global_batch=64",
                "gpus=8,model=b,global_batch=64",
            ]
        );
        // The zipped axis sets the parameter; grad_accum follows from it.
        assert_eq!(e.cells[5].params.global_batch, 64);
        assert_eq!(e.cells[5].params.grad_accum, 1);
        assert_eq!(e.cells[0].params.grad_accum, 1);
    }

    #[test]
    fn zip_errors() {
        let e = expand_str("axes:\n  a: [1, 2]\n  b: [1]\nzip: [[a, b]]\n").unwrap_err();
        assert!(e.to_string().starts_with("t.yaml:4:11:"), "{e}");
        assert!(e.to_string().contains("same number of values"), "{e}");
        let e = expand_str("axes:\n  a: [1, 2]\nzip: [[a, c]]\n").unwrap_err();
        assert!(e.to_string().contains("unknown axis `c`"), "{e}");
    }

    #[test]
    fn each_rule_kind() {
        let e = expand_str(
            r#"
axes:
  dtype: [bf16, fp8]
  gpus: [1, 8]
  parallel: [single, fsdp]
  features: {subsets_of: [compile, sac]}
rules:
  - incompatible: [compile, fp8]
    reason: compile+fp8
  - when: parallel=single and gpus>1
    reason: single is one gpu
  - requires: {if: "has(sac)", then: {parallel: fsdp}}
    reason: sac needs fsdp
  - exclude: {parallel: fsdp, gpus: 1}
    reason: fsdp needs gpus
"#,
        )
        .unwrap();
        let by = |id: &str| {
            e.dropped
                .iter()
                .find(|d| d.cell.id.as_str() == id)
                .map(|d| d.reason.clone())
        };
        assert_eq!(
            by("fp8.1gpu.single.compile").as_deref(),
            Some("compile+fp8")
        );
        assert_eq!(
            by("bf16.8gpu.single.base").as_deref(),
            Some("single is one gpu")
        );
        assert_eq!(
            by("bf16.1gpu.single.sac").as_deref(),
            Some("sac needs fsdp")
        );
        assert_eq!(
            by("bf16.1gpu.fsdp.base").as_deref(),
            Some("fsdp needs gpus")
        );
        assert!(e
            .cells
            .iter()
            .any(|c| c.id.as_str() == "bf16.8gpu.fsdp.compile+sac"));
        assert!(e
            .cells
            .iter()
            .any(|c| c.id.as_str() == "bf16.1gpu.single.compile"));
        assert!(e.warnings.is_empty(), "{:?}", e.warnings);
        assert_eq!(e.cells.len() + e.dropped.len(), 32);
    }

    #[test]
    fn exclude_alternatives_on_scalar_axes() {
        let e = expand_str(
            "axes:\n  m: [a, b, c]\n  g: [1, 2, 4]\nrules:\n  - exclude: {m: [a, b], g: [2, 4]}\n    reason: r\n",
        )
        .unwrap();
        assert_eq!(e.dropped.len(), 4);
    }

    #[test]
    fn rule_matching_nothing_warns_with_location() {
        let e = expand_str("axes:\n  m: [a, b]\nrules:\n  - exclude: {m: a}\n    reason: x\n  - when: m=b and m=a\n    reason: never\n").unwrap();
        assert_eq!(e.warnings.len(), 1);
        assert!(
            e.warnings[0].starts_with("t.yaml:6:5: rules[1]"),
            "{:?}",
            e.warnings
        );
    }

    #[test]
    fn overrides_and_derived_values() {
        let e = expand_str(
            "axes:\n  model: [small, big]\n  gpus: [1, 4]\ndefaults: {micro_batch: 8, grad_accum: 2, timeout: 10m}\noverrides:\n  model:\n    big: {micro_batch: 2, timeout: 1h}\n",
        )
        .unwrap();
        let big4 = e
            .cells
            .iter()
            .find(|c| c.id.as_str() == "big.4gpu")
            .unwrap();
        assert_eq!(big4.params.micro_batch, 2);
        assert_eq!(big4.params.global_batch, 4 * 2 * 2);
        assert_eq!(big4.params.timeout_s, 3600);
        let small1 = &e.cells[0];
        assert_eq!(small1.params.global_batch, 16);
        assert_eq!(small1.params.timeout_s, 600);
    }

    #[test]
    fn global_batch_that_does_not_divide_is_an_error() {
        let e = expand_str("axes:\n  gpus: [1, 3]\ndefaults: {global_batch: 8, micro_batch: 2}\n")
            .unwrap_err();
        assert!(e.to_string().contains("not a multiple"), "{e}");
        assert!(e.to_string().starts_with("t.yaml:3:"), "{e}");
    }

    #[test]
    fn located_semantic_errors() {
        let cases = [
            ("axes:\n  m: []\n", "t.yaml:2:3:", "has no values"),
            (
                "axes:\n  m: [a, b, a]\n",
                "t.yaml:2:13:",
                "duplicate value `a`",
            ),
            ("axes: {}\n", "t.yaml:1:1:", "`axes` is empty"),
            (
                "axes:\n  m: [a]\nrules:\n  - exclude: {gpu: 8}\n    reason: r\n",
                "t.yaml:4:15:",
                "unknown axis `gpu`",
            ),
            (
                "axes:\n  m: [a]\nrules:\n  - exclude: {m: z}\n    reason: r\n",
                "t.yaml:4:15:",
                "no value `z`",
            ),
            (
                "axes:\n  m: [a]\nrules:\n  - when: m=zz\n    reason: r\n",
                "t.yaml:4:13:",
                "no value `zz`",
            ),
            (
                "axes:\n  m: [a]\nrules:\n  - when: \"m=a and gpu>1\"\n    reason: r\n",
                "t.yaml:4:20:",
                "unknown axis or parameter `gpu`",
            ),
            (
                "axes:\n  m: [a]\nrules:\n  - incompatible: [a, fp8]\n    reason: r\n",
                "t.yaml:4:23:",
                "unknown flag `fp8`",
            ),
            (
                "axes:\n  m: [a]\nrules:\n  - exclude: {m: a}\n    when: m=a\n    reason: r\n",
                "t.yaml:4:5:",
                "exactly one of",
            ),
            (
                "axes:\n  m: [a]\noverrides:\n  m:\n    b: {steps: 3}\n",
                "t.yaml:5:5:",
                "no value `b`",
            ),
            (
                "axes:\n  m: [a]\noverrides:\n  m:\n    a: {timeout: soon}\n",
                "t.yaml:5:9:",
                "not a duration",
            ),
            (
                "axes:\n  gpus: [one]\n",
                "t.yaml:2:10:",
                "an integer from 0 to 1048576",
            ),
            (
                "axes:\n  parallel: [single, zero3]\n",
                "t.yaml:2:22:",
                "one of single, ddp, fsdp",
            ),
            (
                "axes:\n  features: [compile, sac]\n",
                "t.yaml:2:3:",
                "set-valued axis",
            ),
            (
                "axes:\n  m: [a]\ndefaults: {steps: 5, warmup: 5}\n",
                "t.yaml:3:22:",
                "warmup (5) must be less than steps",
            ),
            (
                "axes:\n  m: [a/b, a:b]\n",
                "t.yaml:1:1:",
                "duplicate cell id `a_b`",
            ),
        ];
        for (yaml, loc, msg) in cases {
            let e = expand_str(yaml).expect_err(yaml);
            let s = e.to_string();
            assert!(s.starts_with(loc), "expected {loc} for {yaml:?}, got:\n{s}");
            assert!(s.contains(msg), "expected {msg:?} for {yaml:?}, got:\n{s}");
            assert!(s.contains('^'), "no caret for {yaml:?}:\n{s}");
        }
    }
}
