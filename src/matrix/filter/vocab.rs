//! What a filter may name: the [`Vocabulary`] of a matrix (its axes, their values, the
//! parameters) and the name that selects a cell by id. The parser checks names against it
//! and the evaluator reads the id through it; it lives apart from the facade in `mod.rs`
//! so that neither imports the file that imports them.

use crate::cell::Value;

/// The name that compares the cell id, when no axis or parameter has it: a script (or
/// `bench bisect`) selects one cell exactly with `id=<cell id>`, which a bare word (a
/// substring of ids) cannot.
pub(crate) const ID_NAME: &str = "id";

/// What a filter may refer to: the axes of the matrix with their values, and parameter
/// names. Used to reject typos (`gpu=8`, `model=gtp2`) at parse time.
#[derive(Debug, Clone, Default)]
pub struct Vocabulary {
    /// Axis name -> every value the axis can take (declared values plus include values).
    pub axes: Vec<(String, Vec<Value>)>,
    /// Axes whose values are sets of flags.
    pub set_axes: Vec<String>,
    /// Other names that may be compared (parameters, keys added by `include`).
    pub params: Vec<String>,
}

impl Vocabulary {
    /// The vocabulary of a set of cells that were already expanded (e.g. the cells of a
    /// results document): every axis they use with every value seen, plus the parameters.
    pub fn from_cells<'a>(
        cells: impl IntoIterator<Item = &'a indexmap::IndexMap<String, Value>>,
    ) -> Vocabulary {
        let mut v = Vocabulary {
            params: crate::matrix::spec::PARAM_NAMES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            ..Vocabulary::default()
        };
        // Values seen per axis, by their JSON form (which tells values apart as `==` does),
        // so that many cells cost linear time, not a scan of every value seen per cell.
        let mut seen: std::collections::HashSet<(String, String)> = Default::default();
        for values in cells {
            for (axis, value) in values {
                let key = serde_json::to_string(value).unwrap_or_default();
                if !seen.insert((axis.clone(), key)) {
                    continue;
                }
                if matches!(value, Value::Set(_)) && !v.set_axes.contains(axis) {
                    v.set_axes.push(axis.clone());
                }
                match v.axes.iter_mut().find(|(n, _)| n == axis) {
                    Some((_, vals)) => vals.push(value.clone()),
                    None => v.axes.push((axis.clone(), vec![value.clone()])),
                }
            }
        }
        v
    }

    pub(super) fn axis(&self, name: &str) -> Option<&[Value]> {
        self.axes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }
    pub(super) fn flags(&self) -> impl Iterator<Item = &String> {
        self.axes
            .iter()
            .filter(|(n, _)| self.set_axes.contains(n))
            .flat_map(|(_, vals)| vals.iter().filter_map(Value::as_set).flatten())
    }
}
