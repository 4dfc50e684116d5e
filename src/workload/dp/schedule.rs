//! The per-micro-batch schedule of data-parallel training: gathering each unit's
//! parameters before use and releasing them after (FSDP), flattening and reducing each
//! unit's gradients as soon as its backward is queued, and the streams and events that
//! order the collectives against the compute (see the parent module's doc).

use std::ffi::c_void;

use tch::Tensor;

use super::{internal, AdamW, Comms, DataParallel, Sharding, State, Update};
use crate::dist::nccl::{DataType, RedOp};
use crate::workload::error::WorkerError;
use crate::workload::ffi;
use crate::workload::group::nccl_dtype;
use crate::workload::models::Model;
use crate::workload::precision::Ctx;
use crate::workload::sac;

impl DataParallel<'_> {
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
    /// adding into it (12 bytes a bf16 parameter then, 4 now). The buffer is the unit's
    /// `reduced` slice where the reduction happens in place (one rank, or DDP's
    /// all-reduce), else the unit's full gradient buffer for FSDP's reduce-scatter.
    fn flatten_grads(&self, u: usize) -> Result<Tensor, WorkerError> {
        let unit = &self.units[u];
        let l = &unit.layout;
        let reduced = unit.reduced_buffer(self.elt())?;
        let in_place = self.sharding == Sharding::Replicated || matches!(self.comms, Comms::Local);
        let flat = if in_place {
            // One rank or DDP: the slice is the whole unit (`shard == padded`).
            reduced.shallow_clone()
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

    /// Queues the average of unit `u`'s gradients over the ranks into this rank's slice,
    /// `reduced` (an all-reduce in place under DDP, a reduce-scatter under FSDP, which
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
        let recv = unit.reduced.data_ptr();
        let send = flat.data_ptr();
        // SAFETY: `flat` holds `padded` elements and `recv` this rank's `shard` elements
        // (`padded` under DDP, where they are the same memory: NCCL reduces in place), both
        // live (`flatten_grads` allocated `reduced`); the full buffer is recorded on the
        // communication stream before release, and `reduced` is read, and released, only
        // after the compute stream waited for the communication stream.
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

    /// Under the split update: marks the communication stream once every collective but
    /// block 0's and the embeddings' is queued.
    fn mark_early_reduced(&self) -> Result<(), WorkerError> {
        if let (Some(split), Comms::Nccl { stream, .. }) = (&self.split, &self.comms) {
            // SAFETY: the communication stream is live.
            unsafe { split.early_reduced.record(*stream) }.map_err(WorkerError::from_device)?;
        }
        Ok(())
    }

    /// The optimizer step split around the last collectives ([`Self::enable_split_update`]):
    /// the entries of every unit reduced by then, once the compute stream has waited for
    /// those collectives, then, after all of them, block 0's and the embeddings'. The same
    /// kernel over the same reduced gradients as [`AdamW::step`], in two launches.
    pub(crate) fn split_step(&self, opt: &mut AdamW) -> Result<(), WorkerError> {
        let (Some(split), Comms::Nccl { stream, .. }) = (&self.split, &self.comms) else {
            return Err(internal("the split update needs several ranks"));
        };
        let cur = self.compute_stream()?;
        opt.count_step().map_err(internal)?;
        // SAFETY: both are live streams of this rank's device.
        unsafe { split.early_reduced.block(cur) }.map_err(WorkerError::from_device)?;
        opt.update_entries(&split.early, cur).map_err(internal)?;
        unsafe { ffi::cuda_stream_wait(cur, *stream) }.map_err(WorkerError::from_device)?;
        opt.update_entries(&split.late, cur).map_err(internal)
    }

    /// Adds the reduced gradient slices of this micro-batch into the fp32 gradients.
    fn accumulate(&self) -> Result<(), WorkerError> {
        if self.split_update() {
            // The split step waits for the collectives itself, the first ones early.
            return Ok(());
        }
        if let Comms::Nccl { stream, .. } = &self.comms {
            let cur = self.compute_stream()?;
            // SAFETY: both are live streams of this device.
            unsafe { ffi::cuda_stream_wait(cur, *stream) }.map_err(WorkerError::from_device)?;
        }
        // The kernel reads the reduced slices itself (and sums them under accumulation).
        if let (Update::Separate, Some(g32)) = (self.update, &self.grad32) {
            tch::no_grad(|| {
                for unit in &self.units {
                    let _ = g32
                        .narrow(0, unit.shard_off as i64, unit.layout.shard as i64)
                        .g_add_(&unit.reduced);
                }
            });
        }
        Ok(())
    }

    /// Zeroes this rank's fp32 gradient slices (once per optimizer step); the kernel's
    /// first micro-batch overwrites its sums instead.
    pub(crate) fn zero_grads(&self) {
        if let (Update::Separate, Some(g32)) = (self.update, &self.grad32) {
            let _ = g32.shallow_clone().zero_();
        }
    }

    /// After the optimizer step: refreshes the compute-dtype copy of the masters, which
    /// the next all-gathers send (FSDP) or which are the working parameters (DDP) (the
    /// kernel has written it already), and hands the reduced gradients' memory back until
    /// the next backward.
    pub(crate) fn after_step(&self) -> Result<(), WorkerError> {
        if self.update == Update::Separate {
            tch::no_grad(|| self.work.shallow_clone().copy_(&self.shard32));
        }
        for unit in &self.units {
            unit.release_reduced()?;
        }
        Ok(())
    }

    /// Forward and backward of one micro-batch, block by block, with the loss scaled by
    /// `scale`; every checkpointed block (`sac_every`) is recomputed in the backward.
    /// Returns the unscaled loss, detached. The reduced gradients are in the fp32 slices
    /// when it returns (queued on the compute stream).
    pub(crate) fn forward_backward(
        &self,
        model: &dyn Model,
        ctx: &Ctx,
        x: &Tensor,
        y: &Tensor,
        sac_every: Option<usize>,
        scale: f64,
    ) -> Result<Tensor, WorkerError> {
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
            let checkpointed = sac_every.is_some_and(|k| sac::is_checkpointed(i, k));
            let (output, kept) = sac::block_forward(model, ctx, i, &cur, checkpointed);
            cur = output;
            saved.push(kept);
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
            let kept = saved
                .pop()
                .ok_or_else(|| internal("backward ran out of saved blocks"))?;
            grad = sac::block_backward(model, ctx, i, kept, &grad)
                .map_err(WorkerError::from_device)?;
            if i == 0 {
                self.mark_early_reduced()?;
            }
            self.reduce(i)?;
            self.reshard(i)?;
        }
        ffi::backward_with(&emb, &grad).map_err(WorkerError::from_device)?;
        self.reduce(embed)?;
        self.reshard(embed)?;
        self.accumulate()?;
        Ok(loss.detach())
    }
}
