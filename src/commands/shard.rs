//! `bench matrix --shard I/N`: the plan of a sharded run, computed by every shard on its
//! own and written into its run folder as `shard.json` before the first cell.
//!
//! Each cell's expected GPU-seconds come from the history when it has the cell on this
//! hardware (the median step time of its last runs, times the cell's steps, repeats and
//! GPUs), else from the model's FLOPs (the preset's FLOPs per token times the tokens the
//! cell trains, at an assumed MFU of the GPU's peak), else from a nominal second per step.
//! [`crate::shard::split`] turns them into the shards.
//!
//! Every shard must compute the same plan. The FLOPs and nominal costs are functions of the
//! matrix; the history's costs are too as long as the store gains no run of these cells
//! between the shards' starts (the shards of one run never read each other: this run id is
//! left out). When it does, the shards may disagree: the plan written by each shard lets
//! `bench report merge` see that and name every cell no shard ran, rather than drop it.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::cell::Cell;
use crate::error::CliError;
use crate::history::History;
use crate::shard::Shard;

/// The plan's file in a shard's run folder.
pub(crate) const FILE: &str = "shard.json";

/// MFU assumed for a cost from FLOPs: the built-in workload's measured range on H100 runs
/// 30-65% (DESIGN.md's table); only the ratio between cells matters within one hardware.
const ASSUMED_MFU: f64 = 0.4;

/// FLOP/s per device assumed where no peak is known (a CPU host, an unknown GPU).
const NOMINAL_FLOPS: f64 = 1e12;

/// How many of a cell's latest runs in the history its step time is the median of.
const HISTORY_RUNS: usize = 5;

/// Where a cell's expected cost came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum CostSource {
    /// The median step time of the cell's latest runs on this hardware.
    History,
    /// The preset's FLOPs at an assumed MFU.
    Flops,
    /// One second per step and GPU: a command cell of no known model, never run here.
    Nominal,
}

/// One cell of the plan: the whole cell (so the merge can name and report a cell whose
/// shard never ran), its shard (from 1) and its expected cost.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Planned {
    pub shard: u32,
    pub expected_gpu_s: f64,
    pub source: CostSource,
    pub cell: Cell,
}

/// The plan every shard of a run computes: `shard.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Plan {
    /// The run id the shards share.
    pub run_id: String,
    /// The shard whose folder this is.
    pub shard: Shard,
    /// The hardware key the costs were computed for.
    pub hardware_key: String,
    /// Every cell of the matrix (after rules and filters), in expansion order.
    pub cells: Vec<Planned>,
    /// Each shard's expected GPU-seconds, shard 1 first.
    pub expected_gpu_s: Vec<f64>,
}

impl Plan {
    /// The plan of a run that was not sharded: one shard holding every cell it ran, so
    /// that `bench report merge` takes a whole run's folder beside other runs' shards.
    pub(crate) fn whole(results: &crate::results::RunResults) -> Plan {
        let cells: Vec<Planned> = results
            .cells
            .iter()
            .map(|c| Planned {
                shard: 1,
                expected_gpu_s: c.duration_s,
                source: CostSource::Nominal,
                cell: Cell {
                    id: c.id.clone(),
                    values: c.values.clone(),
                    params: c.params.clone(),
                },
            })
            .collect();
        Plan {
            run_id: results.run_id.clone(),
            shard: Shard { index: 1, count: 1 },
            hardware_key: results.environment.hardware_key.clone(),
            expected_gpu_s: vec![cells.iter().map(|c| c.expected_gpu_s).sum()],
            cells,
        }
    }

    /// The cells of `shard` (from 1), in expansion order.
    pub(crate) fn cells_of(&self, shard: u32) -> impl Iterator<Item = &Planned> {
        self.cells.iter().filter(move |p| p.shard == shard)
    }

    /// Reads `shard.json` of a run folder; `None` when the folder has none.
    pub(crate) fn load(dir: &Path) -> Result<Option<Plan>, CliError> {
        let path = dir.join(FILE);
        let Some(plan) = super::read_json::<Plan>(&path)? else {
            return Ok(None);
        };
        plan.check()
            .map_err(|why| CliError::bad_input(miette::miette!("{}: {why}", path.display())))?;
        Ok(Some(plan))
    }

    /// What a plan must hold to be merged: a shard count within
    /// [`crate::shard::MAX_SHARDS`], its own shard and every cell's within it, one expected
    /// load per shard, a run id and a hardware key. A hand-edited or damaged plan is
    /// refused naming the field, rather than read into a panic or a huge allocation.
    fn check(&self) -> Result<(), String> {
        let n = self.shard.count;
        if n == 0 || n > crate::shard::MAX_SHARDS {
            return Err(format!(
                "shard.count {n} is not between 1 and {}",
                crate::shard::MAX_SHARDS
            ));
        }
        if self.shard.index == 0 || self.shard.index > n {
            return Err(format!(
                "shard.index {} is not between 1 and shard.count {n}",
                self.shard.index
            ));
        }
        if let Some((i, p)) = self
            .cells
            .iter()
            .enumerate()
            .find(|(_, p)| p.shard == 0 || p.shard > n)
        {
            return Err(format!(
                "cells[{i}].shard {} ({}) is not between 1 and shard.count {n}",
                p.shard, p.cell.id
            ));
        }
        if self.expected_gpu_s.len() != n as usize {
            return Err(format!(
                "expected_gpu_s holds {} loads for {n} shards",
                self.expected_gpu_s.len()
            ));
        }
        if self.run_id.is_empty() || self.hardware_key.is_empty() {
            return Err("run_id and hardware_key must not be empty".into());
        }
        crate::ids::check_run_id("run_id", &self.run_id).map_err(|e| e.to_string())?;
        crate::ids::check_hardware_key("hardware_key", &self.hardware_key)
            .map_err(|e| e.to_string())?;
        let cost = |v: f64| v.is_finite() && v >= 0.0;
        if let Some((i, v)) = self
            .expected_gpu_s
            .iter()
            .enumerate()
            .find(|(_, v)| !cost(**v))
        {
            return Err(format!(
                "expected_gpu_s[{i}] is {v}: not a number of GPU-seconds"
            ));
        }
        // Each cell once: a cell planned twice would be run, or failed, twice.
        let mut seen = std::collections::HashSet::new();
        for (i, p) in self.cells.iter().enumerate() {
            if !cost(p.expected_gpu_s) {
                return Err(format!(
                    "cells[{i}].expected_gpu_s ({}) is {}: not a number of GPU-seconds",
                    crate::sanitize::terminal(p.cell.id.as_str()),
                    p.expected_gpu_s
                ));
            }
            if !seen.insert(p.cell.id.as_str()) {
                return Err(format!(
                    "cells[{i}] ({}) is planned twice: a plan names each cell once",
                    crate::sanitize::terminal(p.cell.id.as_str())
                ));
            }
        }
        Ok(())
    }

    fn save(&self, dir: &Path) -> Result<(), CliError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| CliError::internal(miette::miette!("{}: {e}", dir.display())))?;
        super::write_json(&dir.join(FILE), self).map(drop)
    }
}

/// What the costs are computed on: the hardware key whose history is read, and the GPU's
/// name for its peak.
pub(crate) struct Hardware<'a> {
    pub key: &'a str,
    pub device: Option<&'a str>,
}

/// Plans the run of `cells` in `shard.count` shards, writes the plan into `dir`, keeps
/// only this shard's cells in `cells` and returns the plan and the other shards' cells. A folder that already has a plan (a shard resumed
/// with `--resume`) keeps it, so a resumed shard runs the cells it was given, whatever the
/// history learnt since; a plan of another shard or run there is bad input.
pub(crate) fn apply(
    cells: &mut Vec<Cell>,
    shard: Shard,
    run_id: &str,
    dir: &Path,
    store: Option<&mut History>,
    hw: &Hardware<'_>,
) -> Result<(Plan, Vec<Cell>), CliError> {
    let plan = match Plan::load(dir)? {
        Some(p) if p.shard != shard || p.run_id != run_id => {
            return Err(CliError::bad_input(miette::miette!(
                "{}: the folder holds shard {} of run {}, not shard {shard} of run {run_id}",
                dir.join(FILE).display(),
                p.shard,
                p.run_id
            )))
        }
        Some(p) => p,
        None => {
            let p = plan(cells, shard, run_id, store, hw)?;
            p.save(dir)?;
            p
        }
    };
    let (mine, others) = std::mem::take(cells).into_iter().partition(|c| {
        plan.cells
            .iter()
            .any(|p| p.shard == shard.index && p.cell.id == c.id)
    });
    *cells = mine;
    Ok((plan, others))
}

/// The plan of `cells` (pure but for the history's reads).
pub(crate) fn plan(
    cells: &[Cell],
    shard: Shard,
    run_id: &str,
    mut store: Option<&mut History>,
    hw: &Hardware<'_>,
) -> Result<Plan, CliError> {
    let mut costs = Vec::with_capacity(cells.len());
    for c in cells {
        let from_history = match store.as_deref_mut() {
            Some(s) => history_cost(s, c, run_id, hw.key)?,
            None => None,
        };
        costs.push(match from_history {
            Some(g) => (g, CostSource::History),
            None => match flops_cost(c, hw.device) {
                // A plan is always one every merge reads: a cost that is not a finite
                // number (a model whose FLOPs overflow) falls back to the nominal one.
                (g, source) if g.is_finite() && g >= 0.0 => (g, source),
                _ => (gpu_steps(c), CostSource::Nominal),
            },
        });
    }
    let weights: Vec<f64> = costs.iter().map(|(g, _)| *g).collect();
    let count = shard.count as usize;
    let shard_of = crate::shard::split(&weights, count);
    Ok(Plan {
        run_id: run_id.to_string(),
        shard,
        hardware_key: hw.key.to_string(),
        expected_gpu_s: crate::shard::loads(&weights, &shard_of, count),
        cells: cells
            .iter()
            .zip(costs)
            .zip(shard_of)
            .map(|((c, (g, source)), s)| Planned {
                shard: s as u32 + 1,
                expected_gpu_s: g,
                source,
                cell: c.clone(),
            })
            .collect(),
    })
}

/// The steps, repeats and GPUs a cell's cost multiplies a step by.
fn gpu_steps(c: &Cell) -> f64 {
    f64::from(c.params.steps.max(1))
        * f64::from(c.params.repeats.max(1))
        * f64::from(c.world_gpus().max(1))
}

/// The cell's cost from its latest runs in the history on this hardware (this run and
/// confirming re-runs left out), or `None` when the history has none.
fn history_cost(
    store: &mut History,
    c: &Cell,
    run_id: &str,
    hardware_key: &str,
) -> Result<Option<f64>, CliError> {
    let trend = store.trend(c.id.as_str(), hardware_key, "step_time_s")?;
    let mut latest: Vec<f64> = trend
        .iter()
        .rev()
        .filter(|p| p.run_id != run_id && !crate::history::gate::is_confirm_run(&p.run_id))
        .map(|p| p.value)
        // A stored step time no step can take (1e308, kept by a store written before
        // imports checked values) is no estimate: its cost overflowed to infinity, which
        // the plan wrote as `null` and every merge of that night refused.
        .filter(|v| crate::bounds::check("step_time_s", *v).is_ok())
        .take(HISTORY_RUNS)
        .collect();
    if latest.is_empty() {
        return Ok(None);
    }
    latest.sort_by(f64::total_cmp);
    let median = latest[latest.len() / 2];
    let cost = median * gpu_steps(c);
    Ok(cost.is_finite().then_some(cost))
}

/// The cell's cost from its model's FLOPs (a bench preset), else nominal.
fn flops_cost(c: &Cell, device: Option<&str>) -> (f64, CostSource) {
    let Some(cfg) = crate::workload::models::presets::get(c.model()) else {
        return (gpu_steps(c), CostSource::Nominal);
    };
    let p = &c.params;
    let per_token = crate::metrics::flops::flops_per_token(
        cfg.n_matmul_params(),
        cfg.layers as u64,
        cfg.hidden as u64,
        u64::from(p.seq_len),
    );
    let sequences = u64::from(p.global_batch).max(
        u64::from(p.micro_batch.max(1))
            * u64::from(p.grad_accum.max(1))
            * u64::from(c.world_gpus().max(1)),
    );
    let tokens = sequences as f64
        * f64::from(p.seq_len)
        * f64::from(p.steps.max(1))
        * f64::from(p.repeats.max(1));
    let rate = device
        .and_then(|d| crate::metrics::flops::peak_tflops(d, c.dtype()))
        .map(|peak| peak.tflops * 1e12 * ASSUMED_MFU)
        .unwrap_or(NOMINAL_FLOPS);
    (per_token * tokens / rate, CostSource::Flops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cell::{CellId, Params, Value};
    use indexmap::IndexMap;

    fn cell(id: &str, model: &str, gpus: i64, steps: u32) -> Cell {
        let mut values = IndexMap::new();
        values.insert("model".to_string(), Value::Str(model.into()));
        values.insert("gpus".to_string(), Value::Int(gpus));
        let params = Params {
            steps,
            repeats: 1,
            seq_len: 1024,
            micro_batch: 8,
            grad_accum: 1,
            ..Params::default()
        };
        Cell {
            id: CellId::join([id]),
            values,
            params,
        }
    }

    const H100: Hardware<'static> = Hardware {
        key: "h100-sxm-80gb",
        device: Some("NVIDIA H100 80GB HBM3"),
    };

    #[test]
    fn costs_follow_the_models_flops_without_a_history() {
        let small = cell("a", "gpt2-125m", 1, 20);
        let big = cell("b", "gpt2-1.5b", 1, 20);
        let (s, src) = flops_cost(&small, H100.device);
        let (b, _) = flops_cost(&big, H100.device);
        assert_eq!(src, CostSource::Flops);
        assert!(b > 8.0 * s, "{s} {b}");
        // A model bench has no preset of costs a nominal second per step and GPU.
        let (n, src) = flops_cost(&cell("c", "mystery", 2, 10), H100.device);
        assert_eq!((n, src), (20.0, CostSource::Nominal));
    }

    #[test]
    fn the_plan_puts_the_big_cell_alone_and_every_cell_once() {
        let cells = vec![
            cell("s1", "gpt2-125m", 1, 20),
            cell("big", "gpt2-1.5b", 1, 20),
            cell("s2", "gpt2-125m", 1, 20),
            cell("s3", "gpt2-125m", 1, 20),
        ];
        let one = plan(&cells, "1/2".parse().unwrap(), "r", None, &H100).unwrap();
        let two = plan(&cells, "2/2".parse().unwrap(), "r", None, &H100).unwrap();
        let shards = |p: &Plan| p.cells.iter().map(|c| c.shard).collect::<Vec<_>>();
        // Both shards compute the same split on their own.
        assert_eq!(shards(&one), shards(&two));
        assert_eq!(shards(&one), [2, 1, 2, 2]);
        assert_eq!(one.cells_of(1).count(), 1);
    }

    #[test]
    fn apply_keeps_this_shards_cells_and_a_resumed_shard_keeps_its_plan() {
        let tmp = tempfile::tempdir().unwrap();
        let all = vec![
            cell("x", "mystery", 1, 10),
            cell("y", "mystery", 1, 30),
            cell("z", "mystery", 1, 20),
        ];
        let shard: Shard = "1/2".parse().unwrap();
        let mut cells = all.clone();
        let (_, others) = apply(&mut cells, shard, "r", tmp.path(), None, &H100).unwrap();
        assert_eq!(others.len(), 2);
        let ids: Vec<_> = cells.iter().map(|c| c.id.as_str().to_string()).collect();
        assert_eq!(ids, ["y"]);
        // The history could have changed the costs since; the folder's plan wins.
        let mut cheaper = all.clone();
        cheaper[1].params.steps = 1;
        let mut again = cheaper.clone();
        apply(&mut again, shard, "r", tmp.path(), None, &H100).unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].id.as_str(), "y");
        // Another shard's folder is refused.
        let e = apply(
            &mut cheaper,
            "2/2".parse().unwrap(),
            "r",
            tmp.path(),
            None,
            &H100,
        )
        .unwrap_err();
        assert!(format!("{e:?}").contains("holds shard 1/2"), "{e:?}");
    }
}
