//! The training loop: one optimizer step = `grad_accum` micro-batches of forward and
//! backward (plain, or with selective checkpointing) and one AdamW update, timed with the
//! device synchronised, reported as one step event.
//!
//! Under `compile` on a GPU the whole step (gradient zeroing, every micro-batch, the fused
//! AdamW update) is captured once into a CUDA graph on a side stream after eager warm-up
//! steps, and replayed: inputs are copied into static buffers before each replay. This is
//! the fastest execution libtorch offers from Rust (no TorchScript, no Inductor): one launch
//! per step, no host overhead between kernels.
//!
//! `BENCH_PROFILE=FILE` traces the last warm-up step with libtorch's profiler (host ops and
//! device kernels, Chrome-trace JSON; `scripts/trace-top.py` sums it by kernel), so that the
//! measured steps stay untouched.

use std::path::PathBuf;
use std::time::Instant;

use tch::{Device, Tensor};

use super::data::Batches;
use super::device::DeviceInfo;
use super::dp::DataParallel;
use super::error::WorkerError;
use super::ffi::{self, CudaGraph};
use super::measure::Recorder;
use super::models::Model;
use super::optim::AdamW;
use super::overlap::Overlap;
use super::precision::Ctx;
use super::sac;
use crate::events::{Event, StepEvent};

/// Eager steps that precede graph capture (allocator and cuBLAS warm-up, gradient buffers).
pub(crate) const EAGER_BEFORE_CAPTURE: u32 = 3;

/// How the ranks of a run share the work.
#[derive(Clone, Copy)]
pub(crate) enum Parallel<'a> {
    /// One process, the plain loop.
    Single,
    /// DDP or FSDP ([`DataParallel`]), over one rank or several.
    Data(&'a DataParallel<'a>),
}

impl Parallel<'_> {
    /// This process's rank and the number of ranks.
    pub(crate) fn rank_world(&self) -> (u32, u32) {
        match self {
            Parallel::Single => (0, 1),
            Parallel::Data(d) => (d.rank(), d.world_size()),
        }
    }

    /// The rank, for step events of a multi-rank run.
    fn event_rank(&self) -> Option<u32> {
        match self {
            Parallel::Data(d) if d.world_size() > 1 => Some(d.rank()),
            _ => None,
        }
    }
}

pub(crate) struct Loop<'a> {
    pub model: &'a dyn Model,
    pub ctx: Ctx,
    pub device: &'a DeviceInfo,
    pub opt: AdamW,
    pub data: Batches,
    pub steps: u32,
    pub warmup: u32,
    pub grad_accum: u32,
    /// Checkpoint every k-th block (`None`: no checkpointing).
    pub sac_every: Option<usize>,
    /// Capture and replay the step as a CUDA graph.
    pub cuda_graph: bool,
    /// Tokens of one step over all ranks.
    pub tokens_per_step: u64,
    pub started: Instant,
    /// Work sharing across ranks; with DDP or FSDP the loss is averaged over the ranks and
    /// the step time is the slowest rank's.
    pub parallel: Parallel<'a>,
    /// The AdamW update overlapped with the backward (plain loop, one micro-batch a step,
    /// `BENCH_OVERLAP_ADAMW=1`).
    pub overlap: Option<Overlap>,
}

impl Loop<'_> {
    /// Forward and backward of every micro-batch; returns the mean loss (a device scalar).
    fn micro_batches(&self, xs: &[Tensor], ys: &[Tensor]) -> Result<Tensor, WorkerError> {
        let scale = 1.0 / self.grad_accum as f64;
        let mut total: Option<Tensor> = None;
        for (x, y) in xs.iter().zip(ys) {
            let loss = match (self.parallel, self.sac_every) {
                (Parallel::Data(d), k) => {
                    d.forward_backward(self.model, &self.ctx, x, y, k, scale)?
                }
                (_, Some(k)) => sac::forward_backward(self.model, &self.ctx, x, y, k, scale),
                (_, None) => {
                    let loss = self.model.forward_loss(&self.ctx, x, y);
                    (&loss * scale).backward();
                    loss.detach()
                }
            };
            // The master-weight kernel sums each micro-batch's bf16 gradients in fp32 (under
            // DDP/FSDP the reduced slices, which the next micro-batch overwrites); the other
            // layouts accumulate in their fp32 gradients and this does nothing.
            if self.grad_accum > 1 {
                self.opt.accumulate().map_err(WorkerError::from_device)?;
            }
            let part = loss * scale;
            total = Some(match total {
                Some(t) => t + part,
                None => part,
            });
        }
        Ok(total.unwrap_or_else(|| Tensor::zeros([], (tch::Kind::Float, self.device.device))))
    }

    /// One optimizer step. Gradients are dropped first rather than zeroed, so the backward
    /// hands them over instead of adding into zeroed buffers (two passes over every
    /// gradient saved). Under graph capture the gradients the captured backward allocates
    /// come from the graph's pool and keep their addresses on every replay.
    ///
    /// Under DDP and FSDP the optimizer's gradients are this rank's fp32 slices, into
    /// which every micro-batch's averaged gradients are added: zeroed in one fill.
    fn eager_step(&mut self, xs: &[Tensor], ys: &[Tensor]) -> Result<Tensor, WorkerError> {
        match self.parallel {
            Parallel::Data(d) => d.zero_grads(),
            Parallel::Single => self.opt.zero_grad(true).map_err(WorkerError::Internal)?,
        }
        let loss = match (&self.overlap, xs, ys) {
            // The update is queued stage by stage during the backward.
            (Some(ov), [x], [y]) => ov.step(
                &mut self.opt,
                self.model,
                &self.ctx,
                x,
                y,
                self.sac_every,
                1.0,
            )?,
            _ => {
                let loss = self.micro_batches(xs, ys)?;
                match self.parallel {
                    // The update of the units already reduced runs beside the last
                    // collectives.
                    Parallel::Data(d) if d.split_update() => d.split_step(&mut self.opt)?,
                    _ => self.opt.step().map_err(WorkerError::from_device)?,
                }
                loss
            }
        };
        // Delayed fp8 scaling turns its history over once per optimizer step, inside a
        // captured step too.
        self.ctx.end_step().map_err(WorkerError::from_device)?;
        match self.parallel {
            Parallel::Data(d) => {
                d.after_step()?;
                d.mean(&loss)
            }
            Parallel::Single => Ok(loss),
        }
    }

    /// This rank's micro-batches of the step. The ranks of a DDP run read the same seeded
    /// stream: of every step's `world x grad_accum` batches rank r takes the r-th run of
    /// `grad_accum`, so together they see what one process with `grad_accum x world`
    /// would, and the two runs train alike.
    fn host_batches(&mut self) -> (Vec<Tensor>, Vec<Tensor>) {
        let (rank, world) = self.parallel.rank_world();
        let (rank, world) = (rank as usize, world as usize);
        let a = self.grad_accum as usize;
        self.data.skip(rank * a);
        let out = (0..a).map(|_| self.data.next_batch()).unzip();
        self.data.skip((world - 1 - rank) * a);
        out
    }

    fn to_device(&self, ts: Vec<Tensor>) -> Vec<Tensor> {
        let dev = self.device.device;
        ts.into_iter()
            .map(|t| {
                if dev == Device::Cpu {
                    t
                } else {
                    t.to_device(dev)
                }
            })
            .collect()
    }

    /// Runs every step, emitting a step event after each; hands the optimizer back (it may
    /// hold the fp32 masters).
    pub(crate) fn run(
        mut self,
        emit: &mut dyn FnMut(Event),
        rec: &mut Recorder,
    ) -> Result<AdamW, WorkerError> {
        let mut graph: Option<(CudaGraph, Vec<Tensor>, Vec<Tensor>, Tensor)> = None;
        let device_index = match self.device.device {
            Device::Cuda(i) => i as i64,
            _ => -1,
        };
        let mut side: Option<CudaGraph> = None;
        if self.cuda_graph {
            side = Some(CudaGraph::new(device_index).map_err(WorkerError::Internal)?);
        }
        let rank = self.parallel.rank_world().0;
        let profile = std::env::var_os("BENCH_PROFILE").map(|p| rank_trace_path(p.into(), rank));
        let profile_step = self.warmup.saturating_sub(1);
        for step in 0..self.steps {
            let profiling = profile.is_some() && step == profile_step;
            if profiling {
                ffi::profiler_start().map_err(WorkerError::Internal)?;
            }
            let t0 = Instant::now();
            let (hx, hy) = self.host_batches();
            let loss = if let Some((g, sx, sy, sloss)) = &mut graph {
                for (s, h) in sx.iter_mut().zip(&hx).chain(sy.iter_mut().zip(&hy)) {
                    s.copy_(h);
                }
                g.replay().map_err(WorkerError::from_device)?;
                sloss.shallow_clone()
            } else if let Some(mut g) = side.take() {
                let (xs, ys) = (self.to_device(hx), self.to_device(hy));
                let loss = g
                    .on_side_stream(|| self.eager_step(&xs, &ys))
                    .map_err(WorkerError::from_device)??;
                if step + 1 >= EAGER_BEFORE_CAPTURE {
                    // Capture one step into the graph; capture records kernels without
                    // running them, so this step's update happens in the first replay.
                    let sx: Vec<Tensor> = xs.iter().map(Tensor::zeros_like).collect();
                    let sy: Vec<Tensor> = ys.iter().map(Tensor::zeros_like).collect();
                    self.device.synchronize()?;
                    let sloss = g
                        .capture(|| self.eager_step(&sx, &sy))
                        .map_err(WorkerError::from_device)??;
                    graph = Some((g, sx, sy, sloss));
                } else {
                    side = Some(g);
                }
                loss
            } else {
                let (xs, ys) = (self.to_device(hx), self.to_device(hy));
                self.eager_step(&xs, &ys)?
            };
            let loss_value = loss
                .f_double_value(&[])
                .map_err(|e| WorkerError::from_device(e.to_string()))?;
            self.device.synchronize()?;
            let mut dt = t0.elapsed().as_secs_f64();
            // Every rank waits in the collectives for the others, but a rank can still
            // finish its optimizer step later; the step is as slow as the slowest rank.
            if let Parallel::Data(d) = self.parallel {
                dt = d.max_f64(dt)?;
            }
            if !loss_value.is_finite() {
                return Err(WorkerError::NanLoss {
                    step: step as u64,
                    value: loss_value,
                });
            }
            if let (true, Some(path)) = (profiling, &profile) {
                ffi::profiler_stop(path).map_err(WorkerError::Internal)?;
            }
            let warm = step < self.warmup;
            rec.record(warm, dt, loss_value, self.started.elapsed().as_secs_f64());
            emit(Event::Step(StepEvent {
                step: step as u64,
                step_time_s: dt,
                tokens: self.tokens_per_step,
                loss: loss_value,
                warmup: warm.then_some(true),
                rank: self.parallel.event_rank(),
            }));
        }
        Ok(self.opt)
    }
}

/// Where rank `r` of a data-parallel run writes its `BENCH_PROFILE` trace: rank 0 at the path
/// given, every other rank beside it with `.rank{r}` before the extension, so that the ranks
/// (which share the environment) never write one file at once.
fn rank_trace_path(path: PathBuf, rank: u32) -> PathBuf {
    if rank == 0 {
        return path;
    }
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.rank{rank}.{}", ext.to_string_lossy()),
        None => format!("{stem}.rank{rank}"),
    };
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_but_the_first_traces_to_a_file_of_its_own() {
        let p = PathBuf::from("/tmp/x/trace.ddp.json");
        assert_eq!(rank_trace_path(p.clone(), 0), p);
        assert_eq!(
            rank_trace_path(p, 1),
            PathBuf::from("/tmp/x/trace.ddp.rank1.json")
        );
        assert_eq!(
            rank_trace_path(PathBuf::from("trace"), 3),
            PathBuf::from("trace.rank3")
        );
    }
}
