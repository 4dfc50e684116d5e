//! The local launcher: worker processes on this host, one cell per set of free GPU slots.
//!
//! A cell needs `gpus` devices. On a host with GPUs, a cell takes that many slots and its
//! processes see exactly those devices (the visible-devices variable set to them, empty
//! under `--gpus 0` on a GPU host: such a run is asked to stay on CPU); a cell that needs
//! more GPUs than the host has is unschedulable. On a host with no GPU, there is one slot,
//! so cells run one at a time on CPU, and a built-in cell that needs several GPUs is
//! unschedulable (a `command` cell still runs: the command decides what a GPU count means).

use std::path::PathBuf;

use super::seam::{AttemptFuture, AttemptIn, AttemptReport, Launcher, News, NewsSink, Placement};
use crate::cell::{Cell, Workload};
use crate::env::GpuInventory;
use crate::run::error::RunError;
use crate::run::executor::{self, AttemptSpec};
use crate::run::launch::{self, AttemptCtx};

/// Worker processes on this host.
pub(crate) struct Local {
    /// The program for built-in cells (`bench worker`).
    pub bench_exe: PathBuf,
    /// The host's GPU ids (empty on a CPU host or under `--gpus 0`).
    pub ids: Vec<String>,
    /// The visible-devices variable of this host's GPUs; `None` on a host without GPU tools.
    pub devices_var: Option<String>,
    /// Every attempt traces one step into the run folder's `kernels/` (`BENCH_PROFILE`).
    pub trace_kernels: bool,
}

impl Local {
    pub(crate) fn new(bench_exe: PathBuf, inv: &GpuInventory) -> Local {
        Local {
            bench_exe,
            ids: inv.ids.clone(),
            devices_var: inv.vendor.map(|v| v.visible_devices_var().to_string()),
            trace_kernels: false,
        }
    }
}

/// Where a cell's traced step goes in its run folder when every run keeps its kernels
/// (rank r of a multi-rank cell writes `.rank<r>` before the extension beside it). Each
/// repeat and retry writes it again; the last one's is what stays.
pub(crate) fn kernel_trace_path(run_dir: &std::path::Path, cell: &str) -> PathBuf {
    run_dir
        .join("kernels")
        .join(format!("{}.trace.json", cell.replace('/', "_")))
}

/// Why a cell cannot run on a host of `gpu_slots` GPUs at all, if it cannot.
pub(crate) fn unschedulable(cell: &Cell, gpu_slots: usize) -> Option<String> {
    let need = cell.gpus() as usize;
    if gpu_slots > 0 {
        (need > gpu_slots).then(|| format!("needs {need} GPUs; this host offers {gpu_slots}"))
    } else {
        (need > 1 && cell.params.workload == Workload::Builtin).then(|| {
            format!("needs {need} GPUs; this host has none (cells run one at a time on CPU here)")
        })
    }
}

impl Launcher for Local {
    fn name(&self) -> &'static str {
        "local"
    }

    fn check(&self, cell: &Cell) -> Result<(), RunError> {
        launch::plan(cell, &AttemptCtx::default(), &self.bench_exe)?;
        Ok(())
    }

    fn unschedulable(&self, cell: &Cell) -> Option<String> {
        unschedulable(cell, self.ids.len())
    }

    fn capacity(&self, _jobs: Option<usize>) -> usize {
        self.ids.len().max(1)
    }

    fn need(&self, cell: &Cell) -> usize {
        if self.ids.is_empty() {
            1
        } else {
            cell.gpus() as usize
        }
    }

    fn devices(&self, slots: &[usize]) -> Vec<String> {
        slots
            .iter()
            .filter_map(|s| self.ids.get(*s).cloned())
            .collect()
    }

    fn gpu_slots(&self) -> usize {
        self.ids.len()
    }

    fn attempt<'a>(&'a self, a: AttemptIn<'a>, news: NewsSink<'a>) -> AttemptFuture<'a> {
        Box::pin(async move {
            // A multi-rank cell needs a rendezvous port: a free one, or torchrun's default
            // when the system will not name one.
            let master_port = if launch::ranks(a.cell) > 1 {
                launch::free_port().unwrap_or(29500)
            } else {
                0
            };
            let ctx = AttemptCtx {
                visible_devices: self
                    .devices_var
                    .as_ref()
                    .map(|v| (v.clone(), a.devices.join(","))),
                repeat: a.repeat,
                attempt: a.attempt,
                run_dir: a.run_dir.to_path_buf(),
                master_port,
                profile: self
                    .trace_kernels
                    .then(|| kernel_trace_path(a.run_dir, a.cell.id.as_str())),
            };
            if let Some(dir) = ctx.profile.as_deref().and_then(std::path::Path::parent) {
                std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            }
            let plan = launch::plan(a.cell, &ctx, &self.bench_exe).map_err(|e| e.to_string())?;
            let out = executor::execute(
                AttemptSpec {
                    plan: &plan,
                    timeout: a.timeout,
                    grace: a.grace,
                    log_stem: &a.log_stem,
                },
                a.cancel,
                |ev| news(News::Event(ev)),
            )
            .await;
            Ok(AttemptReport {
                out,
                placement: Placement::default(),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::launcher::test_cell as cell;

    #[test]
    fn cells_larger_than_the_host_are_unschedulable() {
        assert!(unschedulable(&cell(8, Workload::Builtin), 8).is_none());
        let why = unschedulable(&cell(16, Workload::Builtin), 8).unwrap();
        assert!(
            why.contains("needs 16 GPUs") && why.contains("offers 8"),
            "{why}"
        );
        // CPU host: one-rank cells and command cells run; multi-GPU built-in cells do not.
        assert!(unschedulable(&cell(1, Workload::Builtin), 0).is_none());
        assert!(unschedulable(&cell(2, Workload::Builtin), 0).is_some());
        let cmd = Workload::Command {
            argv: vec!["true".into()],
            env: Default::default(),
        };
        assert!(unschedulable(&cell(2, cmd), 0).is_none());
    }
}
