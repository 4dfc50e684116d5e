//! Checks of the axes and overrides before anything is expanded: names, duplicate values,
//! the types of the axes the built-in workload interprets (`gpus`, `dtype`, `parallel`,
//! `model`), each error located in the matrix file.

use std::collections::{HashMap, HashSet};

use clap::ValueEnum;
use itertools::Itertools;

use super::value::{value_eq, Axis, ValueKey};
use crate::axes::{Dtype, Parallel};
use crate::cell::{Cell, Params, Value};
use crate::matrix::error::MatrixError;
use crate::matrix::parse::Source;
use crate::matrix::spec::{AxisSpec, Explicit, MatrixSpec};

pub(super) fn validate_axes(spec: &MatrixSpec, src: &Source) -> Result<Vec<Axis>, MatrixError> {
    // The name heads every report and the terminal's summary: a newline in it printed a
    // line of its own that read as bench's ("error: forged"), an escape retitled a terminal.
    if let Some(name) = &spec.name {
        if name
            .chars()
            .any(|c| c.is_control() || crate::sanitize::is_bidi_or_separator(c))
        {
            return Err(src.error_at(
                "name",
                format!(
                    "the matrix name `{}` holds a control character (a newline, an escape, a bidirectional control): a name is one line of printable text",
                    crate::sanitize::inline(name)
                ),
            ));
        }
    }
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
pub(crate) const MAX_GPUS: i64 = 1 << 20;

/// Type checks for the axes the built-in workload interprets.
pub(super) fn check_well_known(
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
pub(super) fn typed_problem<T: ValueEnum + std::str::FromStr>(v: &Value) -> Option<String> {
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
pub(super) fn check_cell_values(
    cell: &Cell,
    axes: &[Axis],
    src: &Source,
) -> Result<(), MatrixError> {
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
pub(super) fn value_path(axes: &[Axis], name: &str, v: &Value) -> String {
    axes.iter()
        .find(|a| a.name == name)
        .and_then(|a| a.values.iter().position(|w| value_eq(v, w)))
        .map_or_else(|| "include".to_string(), |i| format!("axes.{name}[{i}]"))
}

/// The product's dimensions: each a list of (axis index, value index) tuples.
pub(super) fn unknown_axis(name: &str, axes: &[Axis]) -> String {
    let names: Vec<&str> = axes.iter().map(|a| a.name.as_str()).collect();
    format!("unknown axis `{name}` (axes: {})", names.join(", "))
}

pub(super) fn validate_overrides(
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
