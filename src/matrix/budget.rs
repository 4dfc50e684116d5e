//! The expansion budget: how many cells (and roughly how many bytes of them) a matrix may
//! expand to, checked from the axis sizes alone before any cell or `subsets_of` value is
//! built.
//!
//! Expansion builds every combination of the product (kept cells and dropped ones alike,
//! since `--dry-run` lists both), and a run keeps them all, so a file of a few lines (`100`
//! axes of two values, `subsets_of` over 40 flags) would otherwise ask for more time and
//! memory than any machine has. The count is the product of the dimensions' sizes (a `zip` group is one dimension,
//! a `subsets_of` axis of `n` flags has `2^n` values, counted without generating them) plus
//! one per `include` entry (each may add a cell), computed with checked arithmetic. The
//! size estimate multiplies that count by the bytes one cell takes at most: its axis names
//! and longest values plus a fixed allowance for the cell's parameters.

use std::collections::HashMap;

use super::error::MatrixError;
use super::parse::Source;
use super::spec::{AxisSpec, MatrixSpec};
use crate::cell::Value;

/// The default cell limit: far above the largest matrix a CI job can run (a nightly
/// matrix of a few hundred cells at minutes each is a day of GPU time), far below what
/// exhausts memory.
pub(crate) const DEFAULT_MAX_CELLS: u64 = 100_000;

/// The bytes of expanded cells allowed per cell of the limit: a cell of the shipped
/// matrices takes well under 1 KiB; 16 KiB leaves room for long command templates and
/// values while keeping the default budget (about 1.6 GB) inside a CI machine's memory.
pub(crate) const BYTES_PER_CELL: u64 = 16 * 1024;

/// What a cell costs besides its values: the id, the parameters, map overhead.
const CELL_OVERHEAD_BYTES: u64 = 512;
/// Per value of a cell: the axis name's copy and the map entry.
const VALUE_OVERHEAD_BYTES: u64 = 64;

/// Limits of one expansion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Most cells the product (plus `include` entries) may have, before rules and filters.
    pub max_cells: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            max_cells: DEFAULT_MAX_CELLS,
        }
    }
}

impl Budget {
    /// The size budget that goes with the cell limit.
    pub(crate) fn max_bytes(&self) -> u128 {
        u128::from(self.max_cells) * u128::from(BYTES_PER_CELL)
    }
}

/// One dimension of the product as the budget sees it.
struct Dim<'a> {
    /// The axis (the first one, for a zip group).
    name: &'a str,
    /// Number of values, `None` when it does not fit in a u128 (`subsets_of` over 128 flags
    /// or more).
    len: Option<u128>,
    /// Bytes the dimension's longest value, and its axis names, take in one cell.
    bytes: u128,
}

/// Values of an axis, counted without building them.
fn axis_len(axis: &AxisSpec) -> Option<u128> {
    match axis {
        AxisSpec::Values(v) => Some(v.len() as u128),
        AxisSpec::Subsets(s) => 1u128.checked_shl(u32::try_from(s.subsets_of.len()).ok()?),
    }
}

/// Bytes of the longest value of an axis (a `subsets_of` axis's longest value is the set
/// of all its flags).
fn axis_value_bytes(axis: &AxisSpec) -> u128 {
    match axis {
        AxisSpec::Values(v) => v.iter().map(value_bytes).max().unwrap_or(0),
        AxisSpec::Subsets(s) => s.subsets_of.iter().map(|f| f.len() as u128 + 1).sum(),
    }
}

fn value_bytes(v: &Value) -> u128 {
    (match v {
        Value::Str(s) => s.len(),
        Value::Set(s) => s.iter().map(|f| f.len() + 1).sum(),
        _ => 8,
    }) as u128
}

/// The product's dimensions, zip groups merged (a malformed zip is reported later by
/// expansion; here an unknown name is ignored and a group counts as its longest member).
fn dims(spec: &MatrixSpec) -> Vec<Dim<'_>> {
    let mut group_of: HashMap<&str, usize> = HashMap::new();
    for (g, group) in spec.zip.iter().enumerate() {
        for name in group {
            group_of.entry(name.as_str()).or_insert(g);
        }
    }
    let mut out: Vec<Dim> = Vec::new();
    let mut slot_of_group: HashMap<usize, usize> = HashMap::new();
    for (name, axis) in &spec.axes {
        let len = axis_len(axis);
        let bytes = axis_value_bytes(axis) + name.len() as u128 + u128::from(VALUE_OVERHEAD_BYTES);
        match group_of.get(name.as_str()) {
            Some(g) => match slot_of_group.get(g) {
                Some(&slot) => {
                    let d = &mut out[slot];
                    d.len = match (d.len, len) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        _ => None,
                    };
                    d.bytes += bytes;
                }
                None => {
                    slot_of_group.insert(*g, out.len());
                    out.push(Dim { name, len, bytes });
                }
            },
            None => out.push(Dim { name, len, bytes }),
        }
    }
    out
}

/// Checks `spec` against `budget` before expansion; returns the number of cells the
/// product and `include` may give.
pub(crate) fn check(spec: &MatrixSpec, src: &Source, budget: Budget) -> Result<u128, MatrixError> {
    // An empty axis is refused here, before the product: it would make the product zero
    // and pass, and validation builds the axes' values in order (a `subsets_of` axis's 2^n
    // sets) before it reaches the empty one; `x: []` beside `subsets_of` over 57 flags
    // asked for 2^57 sets (found by the matrix fuzz target).
    for (name, axis) in &spec.axes {
        if matches!(axis, AxisSpec::Values(v) if v.is_empty()) {
            return Err(src.error_at(
                &format!("axes.{name}"),
                format!("axis `{name}` has no values"),
            ));
        }
    }
    let dims = dims(spec);
    let include = spec.include.len() as u128;
    let cells = dims
        .iter()
        .try_fold(1u128, |acc, d| d.len.and_then(|n| acc.checked_mul(n)))
        .and_then(|p| p.checked_add(include));
    let name = matrix_name(spec, src);
    let mut largest: Vec<&Dim> = dims.iter().collect();
    largest.sort_by_key(|d| std::cmp::Reverse(d.len.unwrap_or(u128::MAX)));
    let largest = largest
        .iter()
        .take(3)
        .map(|d| match d.len {
            Some(n) => format!("`{}` {n}", d.name),
            None => format!("`{}` more than 2^127", d.name),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let count = match cells {
        Some(n) => n.to_string(),
        None => "more than 3.4e38".to_string(),
    };
    let too_many = cells.is_none_or(|n| n > u128::from(budget.max_cells));
    if too_many {
        return Err(src.error_at(
            "axes",
            format!(
                "matrix `{name}` expands to {count} cells before rules and filters ({} axes; largest: {largest}), more than the limit of {} cells; drop or zip axes, or raise the limit with --max-cells N",
                dims.len(),
                budget.max_cells
            ),
        ));
    }
    let cells = cells.unwrap_or(u128::MAX);
    let per_cell = u128::from(CELL_OVERHEAD_BYTES) + dims.iter().map(|d| d.bytes).sum::<u128>();
    let bytes = cells.saturating_mul(per_cell);
    if bytes > budget.max_bytes() {
        return Err(src.error_at(
            "axes",
            format!(
                "matrix `{name}` expands to {cells} cells of up to {per_cell} bytes each, about {} in all, more than the {} that --max-cells {} allows ({} KiB per cell); shorten the axis values or raise --max-cells",
                human_bytes(bytes),
                human_bytes(budget.max_bytes()),
                budget.max_cells,
                BYTES_PER_CELL / 1024
            ),
        ));
    }
    Ok(cells)
}

/// Bytes in KiB, MiB or GiB, whichever reads best.
fn human_bytes(b: u128) -> String {
    match b {
        b if b >= 1 << 30 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b => format!("{} KiB", b.div_ceil(1024)),
    }
}

/// The matrix's `name`, or its file stem (as [`super::Expansion::name`]).
pub(crate) fn matrix_name(spec: &MatrixSpec, src: &Source) -> String {
    spec.name.clone().unwrap_or_else(|| {
        src.path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "matrix".to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::parse::parse_str;
    use std::path::Path;

    fn check_str(yaml: &str, max_cells: u64) -> Result<u128, String> {
        let (spec, src) = parse_str(Path::new("m.yaml"), yaml.to_string()).unwrap();
        check(&spec, &src, Budget { max_cells }).map_err(|e| e.to_string())
    }

    fn axes_of_two(n: usize) -> String {
        let mut y = String::from("axes:\n");
        for i in 0..n {
            y.push_str(&format!("  a{i}: [x, y]\n"));
        }
        y
    }

    #[test]
    fn counts_the_product_zips_subsets_and_include() {
        let y = "axes:\n  a: [1, 2, 3]\n  b: [x, y, z]\n  c: [p, q]\n  f: {subsets_of: [s, t]}\nzip: [[a, b]]\ninclude:\n  - a: 9\n";
        // zip(a, b) = 3, c = 2, f = 4, plus one include entry.
        assert_eq!(check_str(y, 1000), Ok(3 * 2 * 4 + 1));
    }

    #[test]
    fn an_empty_axis_does_not_hide_a_bomb_beside_it() {
        let flags: Vec<String> = (0..57).map(|i| format!("f{i}")).collect();
        let y = format!(
            "axes:\n  many: {{subsets_of: [{}]}}\n  x: []\n",
            flags.join(", ")
        );
        let e = check_str(&y, 100_000).unwrap_err();
        assert!(
            e.contains("m.yaml:3:3") && e.contains("axis `x` has no values"),
            "{e}"
        );
    }

    #[test]
    fn refuses_bombs_with_the_count_and_the_file() {
        let e = check_str(&axes_of_two(100), DEFAULT_MAX_CELLS).unwrap_err();
        assert!(
            e.starts_with(
                "m.yaml:1:1: axes: matrix `m` expands to 1267650600228229401496703205376 cells"
            ),
            "{e}"
        );
        assert!(e.contains("--max-cells"), "{e}");
        let e = check_str(&axes_of_two(30), DEFAULT_MAX_CELLS).unwrap_err();
        assert!(e.contains("1073741824 cells"), "{e}");
        let flags: Vec<String> = (0..40).map(|i| format!("f{i}")).collect();
        let y = format!(
            "axes:\n  features: {{subsets_of: [{}]}}\n",
            flags.join(", ")
        );
        let e = check_str(&y, DEFAULT_MAX_CELLS).unwrap_err();
        assert!(e.contains("1099511627776 cells"), "{e}");
        let flags: Vec<String> = (0..200).map(|i| format!("f{i}")).collect();
        let y = format!(
            "axes:\n  features: {{subsets_of: [{}]}}\n",
            flags.join(", ")
        );
        let e = check_str(&y, u64::MAX).unwrap_err();
        assert!(e.contains("more than 3.4e38 cells"), "{e}");
        assert!(e.contains("`features` more than 2^127"), "{e}");
    }

    #[test]
    fn the_limit_is_raised_by_max_cells_and_bounds_size_too() {
        assert!(check_str(&axes_of_two(17), DEFAULT_MAX_CELLS).is_err());
        assert_eq!(check_str(&axes_of_two(17), 1 << 17), Ok(1 << 17));
        // Ten cells of a 100 KB value: few cells, but more bytes than ten cells may take.
        let long = "v".repeat(100_000);
        let y = format!("axes:\n  a: [{long}, w{long}]\n  b: [1, 2, 3, 4, 5]\n");
        let e = check_str(&y, 10).unwrap_err();
        assert!(
            e.contains("more than the 160 KiB that --max-cells 10 allows"),
            "{e}"
        );
        assert_eq!(check_str(&y, 1000), Ok(10));
    }
}
