//! A cell's parameters: `defaults`, then `overrides` in axis order, then axis values named
//! like parameters, then parameters set by `include`; then the values derived from them.

use indexmap::IndexMap;

use super::MAX_GPUS;
use crate::cell::{Cell, CellId, Params, Value};
use crate::matrix::parse::Source;
use crate::matrix::spec::{set_param, Explicit, MatrixSpec, PARAM_NAMES};
use crate::matrix::MatrixError;

/// Resolves parameters for a cell: defaults, overrides in axis order, axis values named
/// like parameters, include parameters, then derived values.
pub(super) struct ParamBuilder<'a> {
    spec: &'a MatrixSpec,
    src: &'a Source,
    base: Params,
    base_explicit: Explicit,
}

impl<'a> ParamBuilder<'a> {
    pub(super) fn new(spec: &'a MatrixSpec, src: &'a Source) -> Result<Self, MatrixError> {
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

    pub(super) fn lenient(&self, values: IndexMap<String, Value>) -> Cell {
        Cell {
            id: CellId::from_values(&values),
            values,
            params: self.base.clone(),
        }
    }

    pub(super) fn cell(
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
pub(super) fn derive(
    mut cell: Cell,
    explicit: Explicit,
    src: &Source,
) -> Result<Cell, MatrixError> {
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
