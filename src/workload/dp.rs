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
//! buffer is this rank's region of the reduced-gradient buffer where the reduction can
//! happen in place (DDP's all-reduce, one rank), else a full-size buffer that exists only
//! until FSDP's reduce-scatter has read it.
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
//! local copies for collectives, on any device, so a one-GPU cell measures the same code
//! path as a many-GPU one (as torchrun with one process does for the PyTorch peer), and
//! the CPU tests exercise the layout, the re-pointing, the storage release and the
//! segment-wise schedule.

use std::cell::Cell;
use std::ffi::c_void;
use std::ops::Range;

use tch::{Device, Kind, Tensor};

use super::ffi::{self, CudaEvent};
use super::group::{nccl_dtype, Group};
use super::models::{Model, Param, Place};
use super::optim::{AdamW, AdamWConfig, Slices};
use super::precision::Ctx;
use super::{sac, WorkerError};
use crate::dist::nccl::{DataType, RedOp};

/// Alignment of every parameter and every rank's slice in a unit's flat buffer, in
/// elements: 128 bytes in bf16, so views keep the alignment vectorised kernels want.
pub const ALIGN: usize = 64;

/// One parameter's place in its unit's flat buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// Index into the model's parameter list.
    pub param: usize,
    pub offset: usize,
    pub numel: usize,
}

/// How one unit's parameters are laid out and split across the ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitLayout {
    /// Decayed parameters first, in model order, then the others.
    pub slots: Vec<Slot>,
    /// Elements below this offset belong to decayed parameters (or their padding).
    pub decay_end: usize,
    /// Length of the flat buffer: a multiple of `world x ALIGN`.
    pub padded: usize,
    /// Length of each rank's slice (`padded / world`).
    pub shard: usize,
}

fn round_up(n: usize, m: usize) -> usize {
    n.div_ceil(m) * m
}

impl UnitLayout {
    /// Lays out parameters given as `(param index, numel, decay)` for `world` ranks.
    pub fn new(params: &[(usize, usize, bool)], world: usize) -> UnitLayout {
        let world = world.max(1);
        let mut slots = Vec::with_capacity(params.len());
        let (mut off, mut decay_end) = (0, 0);
        for pass in [true, false] {
            for &(param, numel, decay) in params {
                if decay == pass {
                    slots.push(Slot {
                        param,
                        offset: off,
                        numel,
                    });
                    off = round_up(off + numel, ALIGN);
                }
            }
            if pass {
                // Offsets stay aligned, so the decayed region ends on an aligned offset.
                decay_end = off;
            }
        }
        let padded = round_up(off.max(1), world * ALIGN);
        UnitLayout {
            slots,
            decay_end,
            padded,
            shard: padded / world,
        }
    }

    /// The padding of the flat buffer: between the parameters and after the last.
    pub fn gaps(&self) -> Vec<Range<usize>> {
        let mut slots: Vec<&Slot> = self.slots.iter().collect();
        slots.sort_by_key(|s| s.offset);
        let mut out = Vec::new();
        let mut end = 0;
        for s in slots {
            if s.offset > end {
                out.push(end..s.offset);
            }
            end = s.offset + s.numel;
        }
        if self.padded > end {
            out.push(end..self.padded);
        }
        out
    }

    /// The parts of rank `rank`'s slice, relative to the slice's start, with whether AdamW
    /// decays them: at most one decayed and one undecayed range, empty ones left out.
    pub fn pieces(&self, rank: usize) -> Vec<(Range<usize>, bool)> {
        let (lo, hi) = (rank * self.shard, (rank + 1) * self.shard);
        let mut out = Vec::with_capacity(2);
        let cut = self.decay_end.clamp(lo, hi);
        if cut > lo {
            out.push((0..cut - lo, true));
        }
        if hi > cut {
            out.push((cut - lo..hi - lo, false));
        }
        out
    }
}

/// Whether the ranks split the model or each keep all of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharding {
    /// DDP: every rank keeps the whole model; gradients are all-reduced.
    Replicated,
    /// FSDP: every rank keeps a slice; parameters are all-gathered before each use and
    /// gradients reduce-scattered.
    Sharded,
}

/// How the optimizer updates the rank's fp32 slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Update {
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
pub enum Comms<'a> {
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
    state: Cell<State>,
    /// Recorded on the communication stream after this unit's all-gather.
    gathered: Option<CudaEvent>,
}

/// One rank's data-parallel state.
pub struct DataParallel<'a> {
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
    /// the kernel's sums under accumulation), the masters in the compute dtype and the
    /// reduced gradients. The compute-dtype copy is what FSDP's all-gathers send; under
    /// DDP the units' working parameters are views of it.
    shard32: Tensor,
    grad32: Option<Tensor>,
    work: Tensor,
    rs_out: Tensor,
    /// The optimizer's view of the slices, with their decay flags: fp32 views of the
    /// masters with fp32 gradients ([`Update::Separate`]), or compute-dtype views of
    /// `work` whose `.grad` are fixed views of `rs_out` ([`Update::Kernel`]).
    pieces: Vec<Param>,
    /// Where each piece starts in the flat slice buffers.
    piece_offsets: Vec<i64>,
    /// Reused to make the communication stream wait for the compute stream.
    compute_ready: Option<CudaEvent>,
    device_index: i64,
}

fn internal(e: impl std::fmt::Display) -> WorkerError {
    WorkerError::Internal(format!("data parallel: {e}"))
}

impl<'a> DataParallel<'a> {
    /// Takes over `params` (the model's freshly built fp32 parameters, identical on every
    /// rank after rank 0's are broadcast): keeps this rank's fp32 slices of them and
    /// re-points them at their units' full buffers in the compute dtype `kind`. Under FSDP
    /// only the slices hold memory afterwards.
    pub fn new(
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
        let rs_out = Tensor::zeros([total as i64], (kind, device));
        let (mut pieces, mut piece_offsets) = (Vec::new(), Vec::new());
        for (u, unit) in units.iter().enumerate() {
            for (range, decay) in unit.layout.pieces(slice_rank) {
                let (start, len) = ((unit.shard_off + range.start) as i64, range.len() as i64);
                let (value, grad) = match (update, &grad32) {
                    (Update::Separate, Some(g32)) => (&shard32, g32),
                    _ => (&work, &rs_out),
                };
                let mut t = value.narrow(0, start, len).detach().set_requires_grad(true);
                ffi::set_grad(&mut t, &grad.narrow(0, start, len)).map_err(internal)?;
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
            rs_out,
            pieces,
            piece_offsets,
            compute_ready,
            device_index,
        })
    }

    pub fn rank(&self) -> u32 {
        self.rank as u32
    }

    pub fn world_size(&self) -> u32 {
        self.world as u32
    }

    /// What the optimizer updates: this rank's slices, with their gradients (see
    /// [`DataParallel::optimizer`]).
    pub fn optim_params(&self) -> &[Param] {
        &self.pieces
    }

    /// The optimizer over this rank's slices, in the layout `update` chose.
    pub fn optimizer(&self, cfg: AdamWConfig) -> Result<AdamW, WorkerError> {
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

    fn compute_stream(&self) -> Result<*mut c_void, WorkerError> {
        ffi::cuda_current_stream(self.device_index).map_err(WorkerError::from_device)
    }

    /// Makes the communication stream wait for the work queued on the compute stream.
    fn comm_after_compute(&self, comm: *mut c_void) -> Result<(), WorkerError> {
        let ev = self
            .compute_ready
            .as_ref()
            .ok_or_else(|| internal("no event for a multi-rank run"))?;
        let cur = self.compute_stream()?;
        // SAFETY: both are live streams of this rank's device.
        unsafe {
            ev.record(cur).map_err(WorkerError::from_device)?;
            ev.block(comm).map_err(WorkerError::from_device)
        }
    }

    fn elt(&self) -> usize {
        self.kind.elt_size_in_bytes()
    }

    /// Starts gathering unit `u`'s full parameters (no-op if it is already gathered).
    fn unshard(&self, u: usize) -> Result<(), WorkerError> {
        let unit = &self.units[u];
        if unit.state.get() != State::Sharded {
            return Ok(());
        }
        let l = &unit.layout;
        ffi::storage_allocate(&unit.full, l.padded * self.elt())
            .map_err(WorkerError::from_device)?;
        match &self.comms {
            Comms::Local => {
                tch::no_grad(|| {
                    unit.full.shallow_clone().copy_(&self.work.narrow(
                        0,
                        unit.shard_off as i64,
                        l.shard as i64,
                    ))
                });
                unit.state.set(State::Gathered);
            }
            Comms::Nccl { group, stream } => {
                // The new memory may have been in use by queued compute work until just
                // now; the all-gather writing it must come after that work.
                self.comm_after_compute(*stream)?;
                let dt = nccl_dtype(self.kind).unwrap_or(DataType::Bfloat16);
                let send =
                    (self.work.data_ptr() as usize + unit.shard_off * self.elt()) as *const c_void;
                // SAFETY: `send` is this rank's `shard` elements of the slice buffer and
                // `full` has `shard x world` elements, both live on this device; the
                // compute stream waits for `gathered` before reading `full`, and releases
                // it only after that.
                group.with_comm(|c| unsafe {
                    c.all_gather(send, unit.full.data_ptr(), l.shard, dt, *stream)
                })?;
                if let Some(ev) = &unit.gathered {
                    // SAFETY: the communication stream is live.
                    unsafe { ev.record(*stream) }.map_err(WorkerError::from_device)?;
                }
                unit.state.set(State::Gathering);
            }
        }
        Ok(())
    }

    /// Gathers unit `u` if needed and makes the compute stream wait for it.
    fn gathered(&self, u: usize) -> Result<(), WorkerError> {
        self.unshard(u)?;
        let unit = &self.units[u];
        if unit.state.get() == State::Gathering {
            if let Some(ev) = &unit.gathered {
                let cur = self.compute_stream()?;
                // SAFETY: the compute stream is live.
                unsafe { ev.block(cur) }.map_err(WorkerError::from_device)?;
            }
            unit.state.set(State::Gathered);
        }
        Ok(())
    }

    /// Drops unit `u`'s full parameters (FSDP). Their last reader is the compute stream,
    /// which orders any reuse of the memory after it.
    fn reshard(&self, u: usize) -> Result<(), WorkerError> {
        let unit = &self.units[u];
        if unit.state.get() == State::Sharded || self.sharding == Sharding::Replicated {
            return Ok(());
        }
        if unit.state.get() == State::Gathering {
            // Never read: still wait, so the all-gather is done before the memory goes.
            self.gathered(u)?;
        }
        // SAFETY: the autograd graph reads these weights again only after `gathered`.
        unsafe { ffi::storage_release(&unit.full, std::ptr::null_mut()) }
            .map_err(WorkerError::from_device)?;
        unit.state.set(State::Sharded);
        Ok(())
    }

    /// Gathers unit `u`'s gradients into one flat buffer (padding zeroed) and drops them,
    /// so the next backward hands each parameter a fresh gradient again, as the plain
    /// loop's does: one copy instead of zeroing a buffer of views before the backward and
    /// adding into it (12 bytes a bf16 parameter then, 4 now). The buffer is this rank's
    /// region of `rs_out` where the reduction happens in place (one rank, or DDP's
    /// all-reduce), else the unit's full gradient buffer for FSDP's reduce-scatter.
    fn flatten_grads(&self, u: usize) -> Result<Tensor, WorkerError> {
        let unit = &self.units[u];
        let l = &unit.layout;
        let in_place = self.sharding == Sharding::Replicated || matches!(self.comms, Comms::Local);
        let flat = if in_place {
            // One rank or DDP: the slice is the whole unit (`shard == padded`).
            self.rs_out
                .narrow(0, unit.shard_off as i64, l.padded as i64)
        } else {
            ffi::storage_allocate(&unit.grad, l.padded * self.elt())
                .map_err(WorkerError::from_device)?;
            unit.grad.shallow_clone()
        };
        tch::no_grad(|| {
            for (slot, p) in l.slots.iter().zip(&unit.params) {
                let mut dst = flat.narrow(0, slot.offset as i64, slot.numel as i64);
                let g = p.grad();
                if g.defined() {
                    dst.copy_(&g.reshape([-1]));
                } else {
                    // A parameter the loss does not reach gets no gradient.
                    let _ = dst.zero_();
                }
            }
            for gap in &unit.gaps {
                let _ = flat.narrow(0, gap.start as i64, gap.len() as i64).zero_();
            }
        });
        for p in &unit.params {
            ffi::set_grad_none(&mut p.shallow_clone()).map_err(internal)?;
        }
        Ok(flat)
    }

    /// Queues the average of unit `u`'s gradients over the ranks into this rank's slice of
    /// `rs_out` (an all-reduce in place under DDP, a reduce-scatter under FSDP, which
    /// then releases the full gradient buffer). With one rank the flattened gradients are
    /// the average already.
    fn reduce(&self, u: usize) -> Result<(), WorkerError> {
        let flat = self.flatten_grads(u)?;
        let Comms::Nccl { group, stream } = &self.comms else {
            return Ok(());
        };
        let unit = &self.units[u];
        let l = &unit.layout;
        self.comm_after_compute(*stream)?;
        let dt = nccl_dtype(self.kind).unwrap_or(DataType::Bfloat16);
        let recv = (self.rs_out.data_ptr() as usize + unit.shard_off * self.elt()) as *mut c_void;
        let send = flat.data_ptr();
        // SAFETY: `flat` holds `padded` elements and `recv` this rank's `shard` elements of
        // `rs_out` (`padded` under DDP, where they are the same memory: NCCL reduces in
        // place), both live; the full buffer is recorded on the communication stream
        // before release, and `rs_out` is read only after the compute stream waited for
        // the communication stream.
        group.with_comm(|c| unsafe {
            match self.sharding {
                Sharding::Sharded => c.reduce_scatter(send, recv, l.shard, dt, RedOp::Avg, *stream),
                Sharding::Replicated => c.all_reduce(send, recv, l.padded, dt, RedOp::Avg, *stream),
            }
        })?;
        if self.sharding == Sharding::Sharded {
            // SAFETY: nothing reads the full gradient buffer again before
            // `flatten_grads` allocates it for the next backward.
            unsafe { ffi::storage_release(&unit.grad, *stream) }
                .map_err(WorkerError::from_device)?;
        }
        Ok(())
    }

    /// Adds the reduced gradient slices of this micro-batch into the fp32 gradients.
    fn accumulate(&self) -> Result<(), WorkerError> {
        if let Comms::Nccl { stream, .. } = &self.comms {
            let cur = self.compute_stream()?;
            // SAFETY: both are live streams of this device.
            unsafe { ffi::cuda_stream_wait(cur, *stream) }.map_err(WorkerError::from_device)?;
        }
        // The kernel reads the reduced slices itself (and sums them under accumulation).
        if let (Update::Separate, Some(g32)) = (self.update, &self.grad32) {
            tch::no_grad(|| {
                let _ = g32.shallow_clone().g_add_(&self.rs_out);
            });
        }
        Ok(())
    }

    /// Zeroes this rank's fp32 gradient slices (once per optimizer step); the kernel's
    /// first micro-batch overwrites its sums instead.
    pub fn zero_grads(&self) {
        if let (Update::Separate, Some(g32)) = (self.update, &self.grad32) {
            let _ = g32.shallow_clone().zero_();
        }
    }

    /// After the optimizer step: refreshes the compute-dtype copy of the masters, which
    /// the next all-gathers send (FSDP) or which are the working parameters (DDP). The
    /// kernel has written it already.
    pub fn after_step(&self) {
        if self.update == Update::Separate {
            tch::no_grad(|| self.work.shallow_clone().copy_(&self.shard32));
        }
    }

    /// Forward and backward of one micro-batch, block by block, with the loss scaled by
    /// `scale`; every checkpointed block (`sac_every`) is recomputed in the backward.
    /// Returns the unscaled loss, detached. The reduced gradients are in the fp32 slices
    /// when it returns (queued on the compute stream).
    pub fn forward_backward(
        &self,
        model: &dyn Model,
        ctx: &Ctx,
        x: &Tensor,
        y: &Tensor,
        sac_every: Option<usize>,
        scale: f64,
    ) -> Result<Tensor, WorkerError> {
        enum Saved {
            Kept { input: Tensor, output: Tensor },
            Checkpointed { input: Tensor },
        }
        let layers = self.units.len() - 2;
        let (embed, head) = (layers, layers + 1);
        self.unshard(embed)?;
        self.unshard(if layers > 0 { 0 } else { head })?;
        self.gathered(embed)?;
        // The embedding's gradients (and a tied head's) accumulate until the very end.
        let emb = model.embed(ctx, x);
        let mut cur = emb.shallow_clone();
        let mut saved = Vec::with_capacity(layers);
        for i in 0..layers {
            self.unshard(if i + 1 < layers { i + 1 } else { head })?;
            self.gathered(i)?;
            let input = cur.detach();
            if sac_every.is_some_and(|k| sac::is_checkpointed(i, k)) {
                cur = tch::no_grad(|| model.block(ctx, i, &input));
                saved.push(Saved::Checkpointed { input });
            } else {
                let input = input.set_requires_grad(true);
                let output = model.block(ctx, i, &input);
                cur = output.shallow_clone();
                saved.push(Saved::Kept { input, output });
            }
            self.reshard(i)?;
        }
        let head_in = cur.detach().set_requires_grad(true);
        drop(cur);
        self.gathered(head)?;
        let loss = model.head_loss(ctx, &head_in, y);
        if layers > 0 {
            // Prefetch the last block for the backward while the head's runs.
            self.unshard(layers - 1)?;
        }
        (&loss * scale).backward();
        self.reduce(head)?;
        self.reshard(head)?;
        let mut grad = head_in.grad();
        drop(head_in);
        for i in (0..layers).rev() {
            if i > 0 {
                self.unshard(i - 1)?;
            }
            self.gathered(i)?;
            grad = match saved.pop() {
                Some(Saved::Kept { input, output }) => {
                    ffi::backward_with(&output, &grad).map_err(WorkerError::from_device)?;
                    input.grad()
                }
                Some(Saved::Checkpointed { input }) => {
                    let leaf = input.set_requires_grad(true);
                    let output = model.block(ctx, i, &leaf);
                    ffi::backward_with(&output, &grad).map_err(WorkerError::from_device)?;
                    leaf.grad()
                }
                None => return Err(internal("backward ran out of saved blocks")),
            };
            self.reduce(i)?;
            self.reshard(i)?;
        }
        ffi::backward_with(&emb, &grad).map_err(WorkerError::from_device)?;
        self.reduce(embed)?;
        self.reshard(embed)?;
        self.accumulate()?;
        Ok(loss.detach())
    }

    /// The mean of a device scalar over all ranks.
    pub fn mean(&self, t: &Tensor) -> Result<Tensor, WorkerError> {
        match &self.comms {
            Comms::Local => Ok(t.shallow_clone()),
            Comms::Nccl { group, .. } => group.mean(t),
        }
    }

    /// The largest of every rank's `x`.
    pub fn max_f64(&self, x: f64) -> Result<f64, WorkerError> {
        match &self.comms {
            Comms::Local => Ok(x),
            Comms::Nccl { group, .. } => group.max_f64(x),
        }
    }

    /// Every rank's `x`, in rank order.
    pub fn gather_u64(&self, x: u64) -> Result<Vec<u64>, WorkerError> {
        match &self.comms {
            Comms::Local => Ok(vec![x]),
            Comms::Nccl { group, .. } => group.gather_u64(x),
        }
    }

    /// Sum and sum of squares of the fp32 master weights (padding is zero), comparable
    /// with [`param_checksum`] of a plain run: under FSDP summed over all ranks' slices,
    /// under DDP this rank's own copy (which must equal every other rank's).
    pub fn param_checksum(&self) -> Result<(f64, f64), WorkerError> {
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

/// The stderr line `BENCH_PARAM_CHECKSUM=1` makes a worker print at the end.
pub fn checksum_line(rank: u32, sum: f64, sumsq: f64) -> String {
    format!("bench worker: param checksum rank {rank}: {sum:.17e} {sumsq:.17e}")
}

/// The `(sum, sum of squares)` of the first [`checksum_line`] in a worker's stderr.
pub fn parse_checksum_line(stderr: &str) -> Option<(f64, f64)> {
    let line = stderr.lines().find(|l| l.contains("param checksum"))?;
    let mut f = line.rsplit(':').next()?.split_whitespace().map(str::parse);
    Some((f.next()?.ok()?, f.next()?.ok()?))
}

/// Sum and sum of squares of every parameter, in f64: equal on every rank of a correct
/// data-parallel run; `BENCH_PARAM_CHECKSUM=1` prints it at the end for the GPU tests.
pub fn param_checksum(params: &[Param]) -> (f64, f64) {
    tch::no_grad(|| {
        params.iter().fold((0.0, 0.0), |(s, q), p| {
            let d = p.tensor.to_kind(Kind::Double);
            (
                s + d.sum(Kind::Double).double_value(&[]),
                q + d.square().sum(Kind::Double).double_value(&[]),
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::models::{self, presets};
    use crate::workload::precision::Precision;

    #[test]
    fn checksum_lines_read_back() {
        let text = format!("noise\n{}\n", checksum_line(1, 2.5, -3.25e-7));
        assert_eq!(parse_checksum_line(&text), Some((2.5, -3.25e-7)));
        assert_eq!(
            parse_checksum_line("bench worker: param checksum rank 0: x"),
            None
        );
    }

    #[test]
    fn layout_puts_decayed_params_first_aligned_and_padded() {
        // (index, numel, decay): a norm, a matrix, a bias, a matrix.
        let ps = [(0, 10, false), (1, 100, true), (2, 3, false), (3, 70, true)];
        let l = UnitLayout::new(&ps, 4);
        let offs: Vec<(usize, usize)> = l.slots.iter().map(|s| (s.param, s.offset)).collect();
        assert_eq!(offs, vec![(1, 0), (3, 128), (0, 256), (2, 320)]);
        assert_eq!(l.decay_end, 256);
        assert_eq!(l.padded, 512); // 323 rounded up to 4 x 64
        assert_eq!(l.shard, 128);
        for s in &l.slots {
            assert_eq!(s.offset % ALIGN, 0);
        }
    }

    #[test]
    fn pieces_cover_every_slice_and_split_at_the_decay_boundary() {
        let ps = [(0, 10, false), (1, 100, true), (2, 3, false), (3, 70, true)];
        for world in [1, 2, 3, 4, 8] {
            let l = UnitLayout::new(&ps, world);
            let mut covered = 0;
            for r in 0..world {
                let pieces = l.pieces(r);
                assert!(!pieces.is_empty() && pieces.len() <= 2);
                let mut next = 0;
                for (range, decay) in pieces {
                    assert_eq!(range.start, next, "world {world} rank {r}");
                    next = range.end;
                    let (lo, hi) = (r * l.shard + range.start, r * l.shard + range.end);
                    if decay {
                        assert!(hi <= l.decay_end);
                    } else {
                        assert!(lo >= l.decay_end);
                    }
                }
                assert_eq!(next, l.shard);
                covered += next;
            }
            assert_eq!(covered, l.padded);
        }
    }

    #[test]
    fn gaps_are_the_padding_between_and_after_the_parameters() {
        // 10 decayed elements at 0, 3 undecayed at 64; padded to a multiple of 4 x 64.
        let l = UnitLayout::new(&[(0, 10, true), (1, 3, false)], 4);
        assert_eq!(l.padded, 256);
        assert_eq!(l.gaps(), vec![10..64, 67..256]);
        // A parameter filling its aligned slot leaves no gap before the next.
        let l = UnitLayout::new(&[(0, 64, true), (1, 64, true)], 1);
        assert_eq!(l.gaps(), Vec::<Range<usize>>::new());
    }

    #[test]
    fn a_unit_without_decayed_params_is_all_undecayed() {
        let l = UnitLayout::new(&[(0, 5, false)], 2);
        assert_eq!(l.decay_end, 0);
        assert_eq!(l.pieces(0), vec![(0..64, false)]);
        assert_eq!(l.pieces(1), vec![(0..64, false)]);
    }

    /// Two models with equal weights. Tests run on parallel threads and the seed is
    /// global, so the second copies the first instead of relying on the seed.
    fn twins(cfg: &presets::ModelConfig) -> (Box<dyn Model>, Box<dyn Model>) {
        let a = models::build(cfg, 16, Device::Cpu, Kind::Float);
        let b = models::build(cfg, 16, Device::Cpu, Kind::Float);
        tch::no_grad(|| {
            for (pa, pb) in a.params().iter().zip(b.params()) {
                pb.tensor.shallow_clone().copy_(&pa.tensor);
            }
        });
        (a, b)
    }

    fn grads_of(model: &dyn Model) -> Vec<Tensor> {
        model
            .params()
            .iter()
            .map(|p| p.tensor.grad().copy())
            .collect()
    }

    /// One rank on the CPU: the block-by-block forward and backward, sharded or not, give
    /// the plain run's loss and gradients, with and without checkpointing; under FSDP the
    /// storage of every unit is released between uses.
    #[test]
    fn one_rank_matches_plain_training_on_cpu() {
        for (name, sharding) in [
            ("gpt2-tiny", Sharding::Sharded),
            ("llama-tiny", Sharding::Sharded),
            ("llama-tiny", Sharding::Replicated),
        ] {
            let mut cfg = presets::get(name).unwrap();
            cfg.layers = 3;
            let (plain, sharded) = twins(&cfg);
            let ctx = Ctx::new(Precision::Fp32);
            let x = Tensor::randint(cfg.vocab, [2, 16], (Kind::Int64, Device::Cpu));
            let y = Tensor::randint(cfg.vocab, [2, 16], (Kind::Int64, Device::Cpu));
            let want_loss = plain.forward_loss(&ctx, &x, &y);
            want_loss.backward();
            let want = grads_of(plain.as_ref());

            let f = DataParallel::new(
                Comms::Local,
                sharding,
                Update::Separate,
                sharded.params(),
                3,
                Kind::Float,
                Device::Cpu,
            )
            .unwrap();
            let released = |t: &Tensor| ffi::storage_nbytes(t).unwrap() == 0;
            for u in &f.units {
                assert_eq!(released(&u.full), sharding == Sharding::Sharded);
            }
            for sac_every in [None, Some(1), Some(2)] {
                f.zero_grads();
                let loss = f
                    .forward_backward(sharded.as_ref(), &ctx, &x, &y, sac_every, 1.0)
                    .unwrap();
                assert!(
                    (loss.double_value(&[]) - want_loss.double_value(&[])).abs() < 1e-6,
                    "{name} {sac_every:?}: {} vs {}",
                    loss.double_value(&[]),
                    want_loss.double_value(&[])
                );
                for u in &f.units {
                    assert_eq!(released(&u.full), sharding == Sharding::Sharded);
                    assert!(released(&u.grad));
                    // The backward's own gradients were copied out and dropped.
                    assert!(u.params.iter().all(|p| !p.grad().defined()));
                    // The padding stays zero, so the masters' padding does too.
                    for gap in &u.gaps {
                        let g = f.grad32.as_ref().unwrap().narrow(
                            0,
                            (u.shard_off + gap.start) as i64,
                            gap.len() as i64,
                        );
                        assert_eq!(g.abs().sum(Kind::Double).double_value(&[]), 0.0);
                    }
                }
                // Scatter the fp32 gradient slices back to parameter order and compare.
                for (unit, _) in f.units.iter().zip(0..) {
                    for s in &unit.layout.slots {
                        let got = f.grad32.as_ref().unwrap().narrow(
                            0,
                            (unit.shard_off + s.offset) as i64,
                            s.numel as i64,
                        );
                        let w = want[s.param].reshape([-1]);
                        let diff = (&got - &w).abs().max().double_value(&[]);
                        let scale = w.abs().max().double_value(&[]).max(1e-12);
                        assert!(
                            diff <= 1e-5 * scale,
                            "{name} {sac_every:?} {}: {diff} (scale {scale})",
                            plain.params()[s.param].name
                        );
                    }
                }
            }
        }
    }

    /// The optimizer over the slices moves the masters as AdamW over the whole parameters
    /// does, and the gathered weights follow after `after_step`.
    #[test]
    fn one_rank_optimizer_steps_match_plain_adamw_on_cpu() {
        let mut cfg = presets::get("gpt2-tiny").unwrap();
        cfg.layers = 2;
        for sharding in [Sharding::Sharded, Sharding::Replicated] {
            optimizer_steps_match(&cfg, sharding);
        }
    }

    fn optimizer_steps_match(cfg: &presets::ModelConfig, sharding: Sharding) {
        let (plain, sharded) = twins(cfg);
        let ctx = Ctx::new(Precision::Fp32);
        let f = DataParallel::new(
            Comms::Local,
            sharding,
            Update::Separate,
            sharded.params(),
            2,
            Kind::Float,
            Device::Cpu,
        )
        .unwrap();
        let mut opt_plain = AdamW::new(plain.params(), AdamWConfig::new(1e-2), false);
        let mut opt_sharded = f.optimizer(AdamWConfig::new(1e-2)).unwrap();
        for step in 0..3 {
            let x = Tensor::randint(cfg.vocab, [2, 16], (Kind::Int64, Device::Cpu));
            opt_plain.zero_grad(true).unwrap();
            plain.forward_loss(&ctx, &x, &x).backward();
            opt_plain.step().unwrap();
            f.zero_grads();
            let _ = f
                .forward_backward(sharded.as_ref(), &ctx, &x, &x, None, 1.0)
                .unwrap();
            opt_sharded.step().unwrap();
            f.after_step();
            let (s, q) = f.param_checksum().unwrap();
            let (ws, wq) = param_checksum(plain.params());
            let close = |a: f64, b: f64| (a - b).abs() < 1e-6 * b.abs().max(1.0);
            assert!(close(s, ws), "{sharding:?} step {step}: {s} vs {ws}");
            assert!(close(q, wq), "{sharding:?} step {step}: {q} vs {wq}");
            // DDP's working weights are the masters, refreshed after the step.
            if sharding == Sharding::Replicated {
                let (ps, pq) = param_checksum(sharded.params());
                assert!(close(ps, ws) && close(pq, wq), "{ps} {pq} vs {ws} {wq}");
            }
        }
    }
}
