//! A cell's parameters: `defaults`, then `overrides` in axis order, then axis values named
//! like parameters, then parameters set by `include`; then the values derived from them.

use indexmap::IndexMap;

use super::MAX_GPUS;
use crate::cell::{CellId, Params, Value};
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

    /// The parameters before any cell's values: `defaults` over the built-in defaults.
    /// A cell that a rule drops gets these when its own do not resolve.
    pub(super) fn base(&self) -> &Params {
        &self.base
    }

    /// The parameters of the cell with `values` and id `id`: defaults, overrides in axis
    /// order, axis values named like parameters, `include_params`, then derived values.
    pub(super) fn params(
        &self,
        values: &IndexMap<String, Value>,
        id: &CellId,
        include_params: &[(String, Value)],
    ) -> Result<Params, MatrixError> {
        let mut p = self.base.clone();
        let mut explicit = self.base_explicit;
        for (axis, per_value) in &self.spec.overrides {
            let Some(v) = values.get(axis) else { continue };
            if let Some(patch) = per_value.get(v.fragment().as_ref()) {
                // Validated in validate_overrides, so this cannot fail.
                let _ = patch.apply(&mut p, &mut explicit);
            }
        }
        for (name, v) in values {
            if PARAM_NAMES.contains(&name.as_str()) {
                set_param(&mut p, &mut explicit, name, v)
                    .map_err(|m| self.src.error_at(&format!("axes.{name}"), m))?;
            }
        }
        for (name, v) in include_params {
            set_param(&mut p, &mut explicit, name, v)
                .map_err(|m| self.src.error_at("include", format!("cell `{id}`: {m}")))?;
        }
        derive(values, id, &mut p, explicit, self.src)?;
        Ok(p)
    }
}

/// global_batch = gpus x micro_batch x grad_accum unless set; when it is set and grad_accum
/// is not, grad_accum follows from it.
fn derive(
    values: &IndexMap<String, Value>,
    id: &CellId,
    p: &mut Params,
    explicit: Explicit,
    src: &Source,
) -> Result<(), MatrixError> {
    // An `include` entry may set `gpus` too, so the range is checked here for every cell
    // (`Cell::gpus` would saturate 4294967296 to 4294967295).
    let gpus_value = values.get("gpus");
    if let Some(g) = gpus_value {
        if !matches!(g, Value::Int(n) if (0..=MAX_GPUS).contains(n)) {
            return Err(src.error_at(
                "axes.gpus",
                format!("cell `{id}`: `gpus` value `{g}` must be an integer from 0 to {MAX_GPUS}"),
            ));
        }
    }
    let gpus = crate::cell::gpus_of(gpus_value);
    if p.micro_batch == 0 || p.grad_accum == 0 || p.seq_len == 0 || p.steps == 0 {
        return Err(src.error_at(
            "defaults",
            format!("cell `{id}`: steps, seq_len, micro_batch and grad_accum must be at least 1"),
        ));
    }
    if p.warmup >= p.steps {
        return Err(src.error_at(
            "defaults.warmup",
            format!(
                "cell `{id}`: warmup ({}) must be less than steps ({}) so that some steps are measured",
                p.warmup, p.steps
            ),
        ));
    }
    // Checked: `gpus: 65536` with `micro_batch: 65536` wrapped to a global batch of 0.
    let product = |what: &str, a: u32, b: u32| {
        a.checked_mul(b).ok_or_else(|| {
            src.error_at(
                "defaults",
                format!(
                    "cell `{id}`: {what} = {a} x {b} does not fit in a batch size (at most {})",
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
                    "cell `{id}`: global_batch {} is not a multiple of gpus x micro_batch = {per_step}",
                    p.global_batch
                ),
            ));
        }
        p.grad_accum = p.global_batch / per_step;
    } else if u64::from(p.global_batch) != u64::from(per_step) * u64::from(p.grad_accum) {
        return Err(src.error_at(
            "defaults.global_batch",
            format!(
                "cell `{id}`: global_batch {} != gpus x micro_batch x grad_accum = {}",
                p.global_batch,
                u64::from(per_step) * u64::from(p.grad_accum)
            ),
        ));
    }
    Ok(())
}
