//! Data parallelism of the built-in workload across GPUs: DDP (replicated parameters) and
//! FSDP (ZeRO-3: parameters, gradients and optimizer state sharded), one mechanism.
//!
//! Units: every transformer block is one unit, the embeddings are one (with a token
//! embedding tied to the head), and the final norm with the output head is one, so the
//! head's gradients are reduced right after its backward and only the embedding's wait
//! for the end of the backward. A unit's parameters are laid out in one flat
//! buffer, decayed parameters first and each aligned to [`ALIGN`] elements, padded to a
//! multiple of `world x ALIGN`; under FSDP rank r keeps the r-th equal slice of it, under
//! DDP every rank keeps all of it ([`UnitLayout`] with a world of one).
//!
//! What each rank holds for the whole run: its slices of the fp32 master weights, of their
//! fp32 gradients and of the fp32 AdamW state (all units in one flat buffer each, so the
//! optimizer runs over a handful of views). Precision is the single-GPU policy's: fp32
//! masters and AdamW state, matmuls in the compute dtype (bf16, or fp8 through the shim).
//!
//! Working parameters: the model's parameters are re-pointed (`set_data`) at views of
//! their unit's full flat buffer in the compute dtype, so the model code runs unchanged and
//! casts nothing. Under DDP those buffers are views of one flat buffer that lives for the
//! whole run and is refreshed from the masters after each optimizer step (by the
//! master-weight kernel itself, [`Update::Kernel`]). Under FSDP they are all-gathered from every rank's
//! compute-dtype slice before each use, and between uses the memory behind them is handed
//! back to the caching allocator while the storage object stays
//! ([`ffi::storage_release`]): the autograd graph keeps its references to the weights,
//! which see the re-gathered memory again before the backward needs them. Gradients are
//! the backward's own: each parameter gets a fresh one, as in the plain loop, and right
//! after the unit's backward they are copied into one flat buffer and dropped. That
//! buffer is the unit's own reduced-gradient slice where the reduction can happen in place
//! (DDP's all-reduce, one rank), else a full-size buffer that exists only until FSDP's
//! reduce-scatter has read it. The reduced slices hold memory from the unit's backward to
//! the optimizer step only, so none is held through the forward.
//!
//! Schedule, per micro-batch: the forward and the backward are driven block by block from
//! Rust, each block its own autograd segment (the technique of [`super::sac`], which also
//! lets checkpointed blocks recompute with their unit gathered). Collectives run on one
//! communication stream. As soon as a unit's backward is queued, its gradients are
//! averaged in the compute dtype: all-reduced (DDP) or reduce-scattered (FSDP) into a
//! buffer of the rank's slices, so communication overlaps the backward of the blocks
//! before it; under FSDP the all-gather of the next unit is queued before the current
//! block's kernels (one unit of prefetch, forward and backward). CUDA events order the two
//! streams; memory first used on the compute stream and then by a collective is recorded
//! on the communication stream before it is released (the caching allocator's
//! `recordStream`). At the end of a micro-batch the optimizer reads the reduced slices
//! ([`Update`]).
//!
//! With one rank (`--parallel ddp|fsdp` without WORLD_SIZE > 1) the same code runs with
//! local copies for collectives, on any device, and the CPU tests exercise the layout, the
//! re-pointing, the storage release and the segment-wise schedule that way, sharded too.
//! The worker itself runs FSDP over one rank with the units whole ([`Sharding::Replicated`]:
//! a slice of a world of one is the whole unit, so gathering it would only copy it), so a
//! one-GPU `fsdp` cell holds no second copy of the units in use, as torchtitan, which
//! applies no FSDP at `dp_shard` 1, holds none; it runs the many-rank schedule, gradient
//! flattening and optimizer over the slices.

use std::cell::Cell;
use std::ffi::c_void;
use std::ops::Range;

use tch::{Device, Kind, Tensor};

use super::error::WorkerError;
use super::ffi::{self, CudaEvent};
use super::group::{nccl_dtype, Group};
use super::models::{Param, Place};
use super::optim::{AdamW, AdamWConfig, Slices};

mod checksum;
mod layout;
mod schedule;
#[cfg(test)]
mod tests;

pub use checksum::{checksum_line, param_checksum, parse_checksum_line};
pub(crate) use layout::UnitLayout;

/// Whether the ranks split the model or each keep all of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sharding {
    /// DDP: every rank keeps the whole model; gradients are all-reduced.
    Replicated,
    /// FSDP: every rank keeps a slice; parameters are all-gathered before each use and
    /// gradients reduce-scattered.
    Sharded,
}

/// How the optimizer updates the rank's fp32 slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Update {
    /// libtorch's AdamW (fused on a GPU) over the fp32 slices, whose fp32 gradients every
    /// micro-batch's reduced slices are added into; then a copy into the compute dtype.
    /// Any device and compute dtype.
    Separate,
    /// The shim's master-weight AdamW kernel ([`AdamW::over_slices`]) reads the reduced
    /// bf16 gradient slices directly and writes the bf16 copy in the same pass, as the
    /// single-GPU path's [`AdamW::with_masters`] does: no fp32 gradient buffer, no fill, no
    /// add and no separate refresh copy (about 22 of the 50 bytes a parameter the separate
    /// update moves each step). `accumulate` keeps an fp32 sum across micro-batches.
    /// CUDA and bf16 compute (bf16 or fp8) only.
    Kernel { accumulate: bool },
}

/// How the collectives are carried out.
pub(crate) enum Comms<'a> {
    /// One rank: all-gather and reduce-scatter are copies on the current stream.
    Local,
    /// NCCL across the group's ranks, on a separate communication stream.
    Nccl {
        group: &'a Group,
        /// The communication stream (a raw `cudaStream_t`).
        stream: *mut c_void,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Only this rank's slice exists.
    Sharded,
    /// The all-gather is queued; the compute stream has not waited for it yet.
    Gathering,
    /// Full parameters usable on the compute stream.
    Gathered,
}

struct Unit {
    layout: UnitLayout,
    /// Where this unit's slice starts in the rank's flat slice buffers.
    shard_off: usize,
    /// The full parameters (compute dtype); the model's parameters are views of it.
    full: Tensor,
    /// The model's parameters of this unit, in the order of `layout.slots`.
    params: Vec<Tensor>,
    /// The padding between and after the parameters in the flat buffers.
    gaps: Vec<Range<usize>>,
    /// The full gradients (compute dtype) for FSDP's reduce-scatter across ranks; its
    /// memory exists only from the unit's backward until the collective has read it.
    grad: Tensor,
    /// This rank's slice of the unit's averaged gradients (compute dtype): what the
    /// optimizer reads. Its memory exists from the unit's first reduction in an optimizer
    /// step until [`DataParallel::after_step`], so it is not held through the next
    /// forward, where the plain loop holds no gradients either (one flat buffer for every
    /// unit cost a rank a whole model's gradients beside the forward's activations).
    reduced: Tensor,
    /// Whether `reduced` has its memory now.
    reduced_live: Cell<bool>,
    state: Cell<State>,
    /// Recorded on the communication stream after this unit's all-gather.
    gathered: Option<CudaEvent>,
}

/// One rank's data-parallel state.
pub(crate) struct DataParallel<'a> {
    comms: Comms<'a>,
    sharding: Sharding,
    rank: usize,
    world: usize,
    kind: Kind,
    /// Blocks `0..layers`, then the embedding unit, then the head unit.
    units: Vec<Unit>,
    update: Update,
    /// This rank's slices of every unit (under DDP: every unit whole), one after the
    /// other: fp32 masters, their fp32 gradients (only for [`Update::Separate`] and for
    /// the kernel's sums under accumulation) and the masters in the compute dtype. The
    /// compute-dtype copy is what FSDP's all-gathers send; under DDP the units' working
    /// parameters are views of it.
    shard32: Tensor,
    grad32: Option<Tensor>,
    work: Tensor,
    /// The optimizer's view of the slices, with their decay flags: fp32 views of the
    /// masters with fp32 gradients ([`Update::Separate`]), or compute-dtype views of
    /// `work` whose `.grad` are fixed views of their unit's `reduced` ([`Update::Kernel`]).
    pieces: Vec<Param>,
    /// Where each piece starts in the flat slice buffers.
    piece_offsets: Vec<i64>,
    /// Reused to make the communication stream wait for the compute stream.
    compute_ready: Option<CudaEvent>,
    device_index: i64,
    /// The split update ([`DataParallel::enable_split_update`]), when it is on.
    split: Option<SplitUpdate>,
}

/// What the split update needs each step, fixed once it is enabled.
struct SplitUpdate {
    /// Recorded on the communication stream after every collective but block 0's and the
    /// embeddings'.
    early_reduced: CudaEvent,
    /// The optimizer's entries (slice pieces) updated once those collectives are done.
    early: Vec<usize>,
    /// Block 0's and the embeddings' entries, whose collectives come last.
    late: Vec<usize>,
}

fn internal(e: impl std::fmt::Display) -> WorkerError {
    WorkerError::Internal(format!("data parallel: {e}"))
}

impl Unit {
    /// Gives `reduced` its memory if it has none (the unit's first reduction of a step).
    fn reduced_buffer(&self, elt: usize) -> Result<&Tensor, WorkerError> {
        if !self.reduced_live.get() {
            ffi::storage_allocate(&self.reduced, self.layout.shard * elt)
                .map_err(WorkerError::from_device)?;
            self.reduced_live.set(true);
        }
        Ok(&self.reduced)
    }

    /// Hands `reduced`'s memory back to the allocator. Its last readers are on the compute
    /// stream (the optimizer, or the accumulation), which has waited for the communication
    /// stream's writes by then.
    fn release_reduced(&self) -> Result<(), WorkerError> {
        if self.reduced_live.replace(false) {
            // SAFETY: nothing reads `reduced` again before `reduced_buffer` allocates it.
            unsafe { ffi::storage_release(&self.reduced, std::ptr::null_mut()) }
                .map_err(WorkerError::from_device)?;
        }
        Ok(())
    }
}

impl<'a> DataParallel<'a> {
    /// Takes over `params` (the model's freshly built fp32 parameters, identical on every
    /// rank after rank 0's are broadcast): keeps this rank's fp32 slices of them and
    /// re-points them at their units' full buffers in the compute dtype `kind`. Under FSDP
    /// only the slices hold memory afterwards.
    pub(crate) fn new(
        comms: Comms<'a>,
        sharding: Sharding,
        update: Update,
        params: &[Param],
        layers: usize,
        kind: Kind,
        device: Device,
    ) -> Result<DataParallel<'a>, WorkerError> {
        if matches!(update, Update::Kernel { .. }) && (kind != Kind::BFloat16 || !device.is_cuda())
        {
            return Err(internal(format!(
                "the master-weight kernel needs bf16 compute on a CUDA device, not {kind:?} on {device:?}"
            )));
        }
        let (rank, world) = match &comms {
            Comms::Local => (0, 1),
            Comms::Nccl { group, .. } => {
                group.broadcast_params(params)?;
                (group.rank() as usize, group.world_size() as usize)
            }
        };
        // Under DDP every rank keeps all of every unit: slices of a world of one.
        let (slice_rank, slice_world) = match sharding {
            Sharding::Sharded => (rank, world),
            Sharding::Replicated => (0, 1),
        };
        let device_index = match device {
            Device::Cuda(i) => i as i64,
            _ => -1,
        };
        if matches!(comms, Comms::Nccl { .. }) && nccl_dtype(kind).is_none() {
            return Err(WorkerError::Unsupported(format!(
                "data parallel: NCCL cannot carry {kind:?}"
            )));
        }
        // Units: one per block, then the embeddings, then the head.
        let mut members: Vec<Vec<(usize, usize, bool)>> = vec![Vec::new(); layers + 2];
        for (i, p) in params.iter().enumerate() {
            let u = match p.place {
                Place::Block(b) if b < layers => b,
                Place::Block(b) => {
                    return Err(internal(format!("{} is in block {b} of {layers}", p.name)))
                }
                Place::Embed => layers,
                Place::Head => layers + 1,
            };
            if !p.tensor.is_contiguous() {
                return Err(internal(format!("parameter {} is not contiguous", p.name)));
            }
            members[u].push((i, p.tensor.numel(), p.decay));
        }
        let layouts: Vec<UnitLayout> = members
            .iter()
            .map(|m| UnitLayout::new(m, slice_world))
            .collect();
        let total: usize = layouts.iter().map(|l| l.shard).sum();
        let f32opt = (Kind::Float, device);
        let shard32 = Tensor::zeros([total as i64], f32opt);
        let grad32 = match update {
            Update::Separate | Update::Kernel { accumulate: true } => {
                Some(Tensor::zeros([total as i64], f32opt))
            }
            Update::Kernel { accumulate: false } => None,
        };
        // Under DDP the units' working parameters are views of this one buffer, so a
        // single pass refreshes them all; under FSDP it is the all-gathers' input and is
        // filled from the masters once they are complete.
        let work = Tensor::zeros([total as i64], (kind, device));
        let cuda = device.is_cuda();
        let mut units = Vec::with_capacity(layouts.len());
        let mut shard_off = 0;
        tch::no_grad(|| -> Result<(), WorkerError> {
            for layout in layouts {
                let n = layout.padded as i64;
                // The fp32 values of the whole unit, to cut this rank's slice from.
                let full32 = Tensor::zeros([n], f32opt);
                for s in &layout.slots {
                    let p = &params[s.param].tensor;
                    full32
                        .narrow(0, s.offset as i64, s.numel as i64)
                        .copy_(&p.reshape([-1]));
                }
                shard32
                    .narrow(0, shard_off as i64, layout.shard as i64)
                    .copy_(&full32.narrow(
                        0,
                        (slice_rank * layout.shard) as i64,
                        layout.shard as i64,
                    ));
                let full = match sharding {
                    Sharding::Sharded => full32.to_kind(kind),
                    Sharding::Replicated => {
                        let full = work.narrow(0, shard_off as i64, n);
                        full.shallow_clone().copy_(&full32);
                        full
                    }
                };
                drop(full32);
                let grad = Tensor::zeros([n], (kind, device));
                let reduced = Tensor::zeros([layout.shard as i64], (kind, device));
                let mut unit_params = Vec::with_capacity(layout.slots.len());
                for s in &layout.slots {
                    let p = &params[s.param];
                    let shape = p.tensor.size();
                    let mut t = p.tensor.shallow_clone();
                    t.set_data(
                        &full
                            .narrow(0, s.offset as i64, s.numel as i64)
                            .view(shape.as_slice()),
                    );
                    unit_params.push(t);
                }
                // SAFETY: nothing reads the buffers until they are allocated again. DDP's
                // working parameters stay for the whole run.
                unsafe {
                    if sharding == Sharding::Sharded {
                        ffi::storage_release(&full, std::ptr::null_mut()).map_err(internal)?;
                    }
                    ffi::storage_release(&grad, std::ptr::null_mut()).map_err(internal)?;
                }
                units.push(Unit {
                    shard_off,
                    full,
                    params: unit_params,
                    gaps: layout.gaps(),
                    grad,
                    reduced,
                    reduced_live: Cell::new(true),
                    state: Cell::new(match sharding {
                        Sharding::Sharded => State::Sharded,
                        Sharding::Replicated => State::Gathered,
                    }),
                    gathered: if cuda && world > 1 && sharding == Sharding::Sharded {
                        Some(CudaEvent::new().map_err(internal)?)
                    } else {
                        None
                    },
                    layout,
                });
                shard_off += units.last().map_or(0, |u| u.layout.shard);
            }
            Ok(())
        })?;
        if sharding == Sharding::Sharded {
            tch::no_grad(|| work.shallow_clone().copy_(&shard32));
        }
        let (mut pieces, mut piece_offsets) = (Vec::new(), Vec::new());
        for (u, unit) in units.iter().enumerate() {
            for (range, decay) in unit.layout.pieces(slice_rank) {
                let (start, len) = ((unit.shard_off + range.start) as i64, range.len() as i64);
                let (value, grad) = match (update, &grad32) {
                    (Update::Separate, Some(g32)) => (&shard32, g32.narrow(0, start, len)),
                    _ => (&work, unit.reduced.narrow(0, range.start as i64, len)),
                };
                let mut t = value.narrow(0, start, len).detach().set_requires_grad(true);
                ffi::set_grad(&mut t, &grad).map_err(internal)?;
                piece_offsets.push(start);
                pieces.push(Param {
                    name: format!("unit{u}.{}", if decay { "decay" } else { "no_decay" }),
                    tensor: t,
                    decay,
                    place: match u {
                        u if u < layers => Place::Block(u),
                        u if u == layers => Place::Embed,
                        _ => Place::Head,
                    },
                });
            }
        }
        // The views are set: the reduced gradients' memory now waits for the first backward.
        for unit in &units {
            unit.release_reduced()?;
        }
        let compute_ready = if cuda && world > 1 {
            Some(CudaEvent::new().map_err(internal)?)
        } else {
            None
        };
        Ok(DataParallel {
            comms,
            sharding,
            rank,
            world,
            kind,
            units,
            update,
            shard32,
            grad32,
            work,
            pieces,
            piece_offsets,
            compute_ready,
            device_index,
            split: None,
        })
    }

    /// Splits each optimizer step around the step's last two collectives (the default;
    /// `BENCH_OVERLAP_ADAMW=0` keeps one update after every collective):
    /// every unit whose gradients are reduced is updated while block 0's and the embeddings'
    /// collectives still run, then those two. A traced two-GPU step (docs/perf-notes.md,
    /// 2026-11-27) showed those collectives exposed at the step's end (DDP 6.1 ms of 143)
    /// while the update, which only starts after them, runs alone. Possible with more than
    /// one rank, the master-weight kernel without accumulation and at least one block;
    /// returns whether the split is on.
    pub(crate) fn enable_split_update(&mut self) -> Result<bool, WorkerError> {
        let possible = matches!(self.comms, Comms::Nccl { .. })
            && self.update == (Update::Kernel { accumulate: false })
            && self.units.len() > 2;
        if possible {
            let (late, early): (Vec<usize>, Vec<usize>) = (0..self.pieces.len())
                .partition(|&i| matches!(self.pieces[i].place, Place::Block(0) | Place::Embed));
            self.split = Some(SplitUpdate {
                early_reduced: CudaEvent::new().map_err(internal)?,
                early,
                late,
            });
        }
        Ok(possible)
    }

    /// Whether each step's update is split ([`DataParallel::enable_split_update`]).
    pub(crate) fn split_update(&self) -> bool {
        self.split.is_some()
    }

    pub(crate) fn rank(&self) -> u32 {
        self.rank as u32
    }

    pub(crate) fn world_size(&self) -> u32 {
        self.world as u32
    }

    /// The optimizer over this rank's slices, in the layout `update` chose.
    pub(crate) fn optimizer(&self, cfg: AdamWConfig) -> Result<AdamW, WorkerError> {
        match self.update {
            Update::Separate => Ok(AdamW::new(&self.pieces, cfg, self.work.device().is_cuda())),
            Update::Kernel { .. } => AdamW::over_slices(
                &self.pieces,
                self.piece_offsets.clone(),
                Slices {
                    master: self.shard32.shallow_clone(),
                    work: self.work.shallow_clone(),
                    acc: self.grad32.as_ref().map(Tensor::shallow_clone),
                },
                cfg,
            )
            .map_err(internal),
        }
    }

    /// The mean of a device scalar over all ranks.
    pub(crate) fn mean(&self, t: &Tensor) -> Result<Tensor, WorkerError> {
        match &self.comms {
            Comms::Local => Ok(t.shallow_clone()),
            Comms::Nccl { group, .. } => group.mean(t),
        }
    }

    /// The largest of every rank's `x`.
    pub(crate) fn max_f64(&self, x: f64) -> Result<f64, WorkerError> {
        match &self.comms {
            Comms::Local => Ok(x),
            Comms::Nccl { group, .. } => group.max_f64(x),
        }
    }

    /// Every rank's `x`, in rank order.
    pub(crate) fn gather_u64(&self, x: u64) -> Result<Vec<u64>, WorkerError> {
        match &self.comms {
            Comms::Local => Ok(vec![x]),
            Comms::Nccl { group, .. } => group.gather_u64(x),
        }
    }

    /// Sum and sum of squares of the fp32 master weights (padding is zero), comparable
    /// with [`param_checksum`] of a plain run: under FSDP summed over all ranks' slices,
    /// under DDP this rank's own copy (which must equal every other rank's).
    pub(crate) fn param_checksum(&self) -> Result<(f64, f64), WorkerError> {
        let (s, q) = tch::no_grad(|| {
            let d = self.shard32.to_kind(Kind::Double);
            (d.sum(Kind::Double), d.square().sum(Kind::Double))
        });
        let both = Tensor::stack(&[s, q], 0);
        let both = match (&self.comms, self.sharding) {
            (Comms::Nccl { group, .. }, Sharding::Sharded) => group.sum(&both)?,
            _ => both,
        };
        let v = Vec::<f64>::try_from(&both.to_device(Device::Cpu))
            .map_err(|e| WorkerError::from_device(e.to_string()))?;
        Ok((v[0], v[1]))
    }
}
