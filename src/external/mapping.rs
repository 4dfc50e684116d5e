//! How a cell maps onto a framework's terms, shared by every adapter and by the declared
//! capability tables: the Llama preset a framework trains, the tensor/data-parallel
//! degrees, and the checks every framework makes of a cell's shape.

use crate::cell::{Cell, Value};
use crate::workload::models::presets::{self, Family, ModelConfig};

/// The Llama preset a framework cell trains, or why there is none.
pub(crate) fn llama_preset(cell: &Cell, framework: &str) -> Result<ModelConfig, String> {
    let name = cell.model();
    let cfg = presets::get(name).ok_or_else(|| {
        format!("model `{name}` is not a bench preset, so {framework} cannot be given its shape")
    })?;
    if cfg.family != Family::Llama || cfg.qkv_bias {
        return Err(format!(
            "{framework} adapter builds Llama-3-style models only; `{name}` is not one"
        ));
    }
    Ok(cfg)
}

/// The Llama preset an expressible cell trains, for an adapter's mapping (`llama-tiny` for
/// a cell its table would have dropped, which is never prepared).
pub(crate) fn mapped_llama(cell: &Cell) -> ModelConfig {
    llama_preset(cell, "").unwrap_or_else(|_| presets::get("llama-tiny").expect("built-in preset"))
}

/// A cell's tensor-parallel degree and the data-parallel degrees beside it, as (tp,
/// replicated, sharded), for the frameworks that name all three (torchtitan, MaxText): `ddp`
/// replicates the model over the data-parallel ranks; `single` and `fsdp` shard it (over
/// one rank: plain training).
pub(crate) fn parallel_degrees(cell: &Cell) -> (u32, u32, u32) {
    let tp = degree(cell, "tp");
    let dp = cell.gpus() / tp.max(1);
    match cell.parallel() {
        crate::axes::Parallel::Ddp => (tp, dp, 1),
        _ => (tp, 1, dp),
    }
}

/// The bench preset a framework cell trains, of any family (each adapter's `unexpressible`
/// says which it can build), for FLOPs per token and the parameter count.
pub(crate) fn preset(cell: &Cell) -> Result<ModelConfig, String> {
    presets::get(cell.model())
        .ok_or_else(|| format!("model `{}` is not a bench preset", cell.model()))
}

/// An integer axis such as `tp` or `pp` (1 when the matrix has no such axis).
pub(crate) fn degree(cell: &Cell, axis: &str) -> u32 {
    cell.values
        .get(axis)
        .and_then(Value::as_f64)
        .map(|v| v.max(1.0) as u32)
        .unwrap_or(1)
}

/// Checks every adapter shares: known features, a warm-up that excludes the first step
/// (whose time includes start-up), and a global batch the data-parallel ranks divide.
pub(crate) fn common_checks(cell: &Cell, framework: &str, features: &[&str]) -> Option<String> {
    let p = &cell.params;
    if let Some(f) = cell
        .features()
        .into_iter()
        .find(|f| !features.contains(&f.as_str()))
    {
        return Some(if features.is_empty() {
            format!("{framework} adapter maps no features, not `{f}`")
        } else {
            format!(
                "{framework} adapter maps features {} only, not `{f}`",
                features.join(", ")
            )
        });
    }
    if cell.parallel().name() == "single" && cell.gpus() > 1 {
        return Some(format!(
            "parallel single runs one rank; {} GPUs need ddp or fsdp",
            cell.gpus()
        ));
    }
    if p.warmup < 1 {
        return Some(
            "warmup must be at least 1: a framework's first logged step includes its start-up"
                .into(),
        );
    }
    if p.steps <= p.warmup {
        return Some(format!(
            "steps ({}) must exceed warmup ({}) so that some step is measured",
            p.steps, p.warmup
        ));
    }
    let model_parallel = degree(cell, "tp") * degree(cell, "pp");
    if !cell.gpus().is_multiple_of(model_parallel) {
        return Some(format!(
            "tp x pp ({model_parallel}) does not divide gpus ({})",
            cell.gpus()
        ));
    }
    let dp = cell.gpus() / model_parallel;
    if p.global_batch != dp * p.micro_batch * p.grad_accum {
        return Some(format!(
            "global_batch {} is not data-parallel ranks ({dp}) x micro_batch ({}) x grad_accum ({})",
            p.global_batch, p.micro_batch, p.grad_accum
        ));
    }
    None
}
