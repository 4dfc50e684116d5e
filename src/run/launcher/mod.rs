//! The launcher seam: how one attempt of a cell is started, watched and stopped.
//!
//! The dispatcher ([`super::dispatch`]) decides which cell runs when; a [`Launcher`] owns
//! everything about *where and how* it runs: which cells it can run at all, how many may be
//! in flight, what a cell takes of that capacity, and one attempt from start to
//! [`AttemptReport`](seam::AttemptReport). [`Local`] starts worker processes on this host's
//! GPU slots; [`Slurm`] submits one Slurm job per attempt. A framework launcher (torchrun, srun
//! starting a framework's own ranks) is one more implementation of this trait: it builds
//! its command lines with [`super::launch`] and runs them with [`super::executor`] (or a
//! job executor of its own), and the dispatcher does not change.
//!
//! Layering (scripts/module-graph.sh checks it): dispatcher -> launcher -> executor; a
//! launcher never imports the dispatcher, and the executor never imports a launcher. The
//! trait and its values live in `seam`, which the implementations import; this file only
//! names the implementations and re-exports what the dispatcher uses.

mod local;
mod seam;
mod slurm;

pub(crate) use local::{kernel_trace_path, Local};
pub(crate) use seam::{AttemptIn, Launcher, News};
pub(crate) use slurm::Slurm;

/// A cell of `gpus` GPUs running `workload`, for the launchers' tests.
#[cfg(test)]
pub(crate) fn test_cell(gpus: i64, workload: crate::cell::Workload) -> crate::cell::Cell {
    use crate::cell::{Cell, CellId, Params, Value};
    let mut values = indexmap::IndexMap::new();
    values.insert("gpus".to_string(), Value::Int(gpus));
    Cell {
        id: CellId::from_values(&values),
        values,
        params: Params {
            workload,
            ..Params::default()
        },
    }
}
