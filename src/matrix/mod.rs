//! The matrix language: from a YAML file to the exact list of cells to run, with the rule
//! and reason for every cell dropped.
//!
//! Stages: [`spec`] (serde + schemars types), [`parse`] (YAML with located errors),
//! [`budget`] (the cell-count and size limit, checked before expansion), [`expand`]
//! (cartesian product, zips, rules, include, parameters), [`filter`] (the `--filter`
//! language, also used by `when:` rules), [`cmd`] (`bench matrix --dry-run` and `bench
//! schema`). Their errors, [`MatrixError`] and [`Located`], are defined in `error`. This
//! file is the facade: it drives the stages and re-exports what the rest of the crate uses.
//! docs/matrix.md documents the semantics for users.

pub mod budget;
pub mod cmd;
mod error;
pub mod expand;
pub mod filter;
pub mod parse;
pub mod spec;

use std::path::{Path, PathBuf};

use crate::cell::Cell;
use expand::plan::Plan;
use filter::{Filter, Vocabulary};

pub use error::{Located, MatrixError};

/// A cell removed by a rule or a filter, with what removed it.
#[derive(Debug, Clone, PartialEq)]
pub struct Dropped {
    pub cell: Cell,
    /// e.g. `rules[2] incompatible` or `--filter 'gpus>=8'`.
    pub by: String,
    pub reason: String,
}

/// The result of loading, expanding and filtering a matrix.
#[derive(Debug, Clone)]
pub struct Expansion {
    /// The matrix's `name`, or the file stem.
    pub name: String,
    pub file: PathBuf,
    pub spec: spec::MatrixSpec,
    /// Size of the product before rules and include.
    pub combinations: usize,
    /// Cells to run, in expansion order.
    pub cells: Vec<Cell>,
    /// Cells removed by rules, then by filters, in expansion order.
    pub dropped: Vec<Dropped>,
    /// Non-fatal findings, e.g. a rule that matches no cell (with its location).
    pub warnings: Vec<String>,
    /// What filters may name in this matrix.
    pub vocab: Vocabulary,
}

/// Refuses a cell to run on the built-in workload whose `model` has no preset, located at
/// the axis value (or the `include` that added it), so that `--dry-run` says so instead of
/// every such cell failing at run time. A `command` workload's models are its own, and
/// expansion stays a pure function of the matrix text, so this check sits here, on the path
/// from a matrix file to cells that will run: it is given to the expansion as the check of
/// each cell that runs.
fn model_check<'s>(
    spec: &'s spec::MatrixSpec,
    src: &'s parse::Source,
) -> impl FnMut(&Cell) -> Result<(), MatrixError> + 's {
    use crate::workload::models::presets;
    // Listed once: the presets are built afresh by each call of `presets::all`.
    let known: Vec<&'static str> = presets::all().iter().map(|c| c.name).collect();
    move |cell: &Cell| {
        if cell.params.workload != crate::cell::Workload::Builtin {
            return Ok(());
        }
        let Some(v) = cell.values.get("model") else {
            return Ok(());
        };
        let name = v.fragment();
        if known.contains(&name.as_ref()) {
            return Ok(());
        }
        let at = match spec.axes.get("model") {
            Some(spec::AxisSpec::Values(vs)) => vs
                .iter()
                .position(|w| expand::value_eq(v, w))
                .map(|i| format!("axes.model[{i}]")),
            _ => None,
        };
        Err(src.error_at(
            at.as_deref().unwrap_or("include"),
            format!(
                "cell `{}`: the built-in workload has no model `{name}` (known: {}); a \
                 `command` workload may name models of its own",
                cell.id,
                known.join(", ")
            ),
        ))
    }
}

/// Refuses a framework workload whose `kind` no adapter has, at its `kind` key, with the
/// names of the adapters bench knows: a typo found by `--dry-run`, not by a cell that fails
/// after the cells before it ran for hours.
fn check_workloads(spec: &spec::MatrixSpec, src: &parse::Source) -> Result<(), MatrixError> {
    let mut places: Vec<(String, &crate::cell::Workload)> = Vec::new();
    if let Some(w) = &spec.defaults.workload {
        places.push(("defaults.workload.kind".to_string(), w));
    }
    for (axis, values) in &spec.overrides {
        for (value, patch) in values {
            if let Some(w) = &patch.workload {
                places.push((format!("overrides.{axis}.{value}.workload.kind"), w));
            }
        }
    }
    for (path, w) in places {
        if let crate::cell::Workload::Framework { kind, .. } = w {
            if crate::external::find(kind).is_none() {
                return Err(src.error_at(
                    &path,
                    format!(
                        "unknown workload kind `{kind}` (known: builtin, command, {})",
                        crate::external::names().join(", ")
                    ),
                ));
            }
        }
    }
    Ok(())
}

pub use spec::MAX_TRIAGE_BUDGET_GPU_S;

/// The `triage:` block's numbers, refused at load so that `--dry-run` refuses what the run
/// would.
pub(crate) fn check_triage(
    spec: &spec::MatrixSpec,
    src: &parse::Source,
) -> Result<(), MatrixError> {
    match spec.triage.as_ref().and_then(spec::TriageSpec::fault) {
        Some((key, message)) => Err(src.error_at(key, message)),
        None => Ok(()),
    }
}

/// [`load`] within `budget`.
pub(crate) fn load_within(
    path: &Path,
    filters: &[String],
    budget: budget::Budget,
) -> Result<Expansion, MatrixError> {
    let (spec, src) = parse::parse_file(path)?;
    check_workloads(&spec, &src)?;
    check_triage(&spec, &src)?;
    let plan = Plan::new(&spec, &src, budget, filters, &mut model_check(&spec, &src))?;
    let parts = collect(&plan);
    drop(plan);
    Ok(parts.into_expansion(spec, &src))
}

/// Expands an already-parsed matrix within the default budget and applies `filters`.
pub fn from_spec(
    spec: spec::MatrixSpec,
    src: &parse::Source,
    filters: &[String],
) -> Result<Expansion, MatrixError> {
    from_spec_within(spec, src, filters, budget::Budget::default())
}

/// [`from_spec`] within `budget`.
pub fn from_spec_within(
    spec: spec::MatrixSpec,
    src: &parse::Source,
    filters: &[String],
    budget: budget::Budget,
) -> Result<Expansion, MatrixError> {
    let plan = Plan::new(&spec, src, budget, filters, &mut |_| Ok(()))?;
    let parts = collect(&plan);
    drop(plan);
    Ok(parts.into_expansion(spec, src))
}

/// An [`Expansion`] but for the matrix it came from.
struct Collected {
    combinations: usize,
    cells: Vec<Cell>,
    dropped: Vec<Dropped>,
    warnings: Vec<String>,
    vocab: Vocabulary,
}

/// Every cell of `plan`, built: what a run needs.
fn collect(plan: &Plan) -> Collected {
    Collected {
        combinations: plan.combinations,
        cells: plan.cells().collect(),
        dropped: plan.dropped().collect(),
        warnings: plan.warnings.clone(),
        vocab: plan.vocab.clone(),
    }
}

impl Collected {
    fn into_expansion(self, spec: spec::MatrixSpec, src: &parse::Source) -> Expansion {
        Expansion {
            name: budget::matrix_name(&spec, src),
            file: src.path.clone(),
            spec,
            combinations: self.combinations,
            cells: self.cells,
            dropped: self.dropped,
            warnings: self.warnings,
            vocab: self.vocab,
        }
    }
}

/// Parses filter expressions against a known vocabulary (e.g. one rebuilt from results),
/// for stages that select cells after the run (`bench baseline update --filter`).
pub(crate) fn parse_filters(
    filters: &[String],
    vocab: &Vocabulary,
) -> Result<Vec<Filter>, MatrixError> {
    filters
        .iter()
        .map(|f| Filter::parse(f, vocab).map_err(MatrixError::Filter))
        .collect()
}
