//! The plain loop's AdamW update overlapped with its backward: each stage of the model is
//! updated as soon as its gradients are complete, on a second stream, while the backward
//! of the stages before it runs.
//!
//! Why: the master-weight update moves 28 bytes a parameter (fp32 masters and moments,
//! bf16 gradients and working copy), about 18 ms a step for the Llama proxy's 1.9 B
//! parameters on an H100, and in the serial loop nothing else runs meanwhile; the pure-bf16
//! peer moves half of that. Memory-bound update kernels beside compute-bound backward
//! matmuls use bandwidth the matmuls leave idle.
//!
//! How: the forward and backward are driven block by block as under DDP and FSDP
//! ([`super::dp`], the technique of [`super::sac`]): each block is its own autograd
//! segment, so the backward returns to Rust after the head and after every block. Each
//! stage's parameters ([`Place`]: the head, block i, the embeddings with a tied head) then
//! get one launch of the master-weight kernel over their entries
//! ([`AdamW::update_entries`]) on the update stream, which first waits for the compute
//! stream; the step count rises once, on the compute stream, before the backward
//! ([`AdamW::count_step`]). At the end of the micro-batch the compute stream waits for the
//! update stream, so the next step (and, under graph capture, the capture's end) sees every
//! update. The gradients the kernel reads stay attached to their parameters until the next
//! step drops them, after that wait, so the caching allocator never hands their memory to
//! another stream too early. The kernel is elementwise per entry: the updated masters,
//! moments and working copy equal the serial update's bit for bit (tests/worker_gpu.rs).
//!
//! Only without gradient accumulation (each micro-batch's gradients are summed first) and
//! only in the flat-master layout (bf16 compute on a GPU), and only when asked for with
//! `BENCH_OVERLAP_ADAMW=1`: on one H100 (2026-11-26, scripts/gpu-bench.sh, same run) it
//! changed the Llama proxy's tokens/s by +0.5% in bf16 and +0.2% in fp8 and GPT-2 124M's
//! by -0.1%, inside the run-to-run spread, so the serial update stays the default.
//! docs/perf-notes.md has the figures and what stands in the way.

use std::ffi::c_void;

use tch::Tensor;

use super::error::WorkerError;
use super::ffi::{self, CudaEvent};
use super::models::{Model, Place};
use super::optim::AdamW;
use super::precision::Ctx;
use super::sac;

/// The update stream, the events that order it against the compute stream, and which
/// optimizer entries each stage owns.
pub(crate) struct Overlap {
    device_index: i64,
    stream: *mut c_void,
    fork: CudaEvent,
    join: CudaEvent,
    /// Entries (parameter indices) of the head, of block i, of the embeddings.
    head: Vec<usize>,
    blocks: Vec<Vec<usize>>,
    embed: Vec<usize>,
}

/// `BENCH_OVERLAP_ADAMW`: `Some(true)` for `1`, `Some(false)` for `0`, `None` when unset or
/// empty (each path's default: off in the plain loop, where it measured within the spread;
/// on under DDP and FSDP, where the split update measured faster, docs/perf-notes.md).
pub(crate) fn switch() -> Result<Option<bool>, String> {
    parse_switch(std::env::var("BENCH_OVERLAP_ADAMW").ok().as_deref())
}

fn parse_switch(value: Option<&str>) -> Result<Option<bool>, String> {
    match value {
        None | Some("") => Ok(None),
        Some("1") => Ok(Some(true)),
        Some("0") => Ok(Some(false)),
        Some(other) => Err(format!(
            "BENCH_OVERLAP_ADAMW={other:?}: expected 1 (overlap the update) or 0 (do not)"
        )),
    }
}

impl Overlap {
    /// Whether the overlapped update is asked for (`switch`, from [`switch`]: on only when
    /// `BENCH_OVERLAP_ADAMW=1` in the plain loop) and possible: the flat-master layout over
    /// the plain loop's parameters without accumulation.
    pub(crate) fn wanted(opt: &AdamW, grad_accum: u32, switch: Option<bool>) -> bool {
        grad_accum == 1 && opt.can_overlap() && switch == Some(true)
    }

    /// The stages of `model`'s parameters on CUDA device `device_index`.
    pub(crate) fn new(model: &dyn Model, device_index: i64) -> Result<Overlap, WorkerError> {
        let layers = model.config().layers as usize;
        let (mut head, mut embed, mut blocks) = (vec![], vec![], vec![Vec::new(); layers]);
        for (i, p) in model.params().iter().enumerate() {
            match p.place {
                Place::Head => head.push(i),
                Place::Embed => embed.push(i),
                Place::Block(b) if b < layers => blocks[b].push(i),
                Place::Block(b) => {
                    return Err(WorkerError::Internal(format!(
                        "{} is in block {b} of {layers}",
                        p.name
                    )))
                }
            }
        }
        let dev = |e: String| WorkerError::from_device(e);
        Ok(Overlap {
            device_index,
            // A stream of the high-priority pool: never the low-priority pool stream the
            // graph capture runs on, which would serialise the two.
            stream: ffi::cuda_comm_stream(device_index).map_err(dev)?,
            fork: CudaEvent::new().map_err(dev)?,
            join: CudaEvent::new().map_err(dev)?,
            head,
            blocks,
            embed,
        })
    }

    /// Queues the update of `entries` on the update stream after the work queued so far on
    /// the compute stream (their gradients).
    fn update(&self, opt: &AdamW, entries: &[usize]) -> Result<(), WorkerError> {
        if entries.is_empty() {
            return Ok(());
        }
        let dev = WorkerError::from_device;
        let cur = ffi::cuda_current_stream(self.device_index).map_err(dev)?;
        // SAFETY: both are live streams of this device.
        unsafe {
            self.fork.record(cur).map_err(dev)?;
            self.fork.block(self.stream).map_err(dev)?;
        }
        opt.update_entries(entries, self.stream).map_err(dev)
    }

    /// Makes the compute stream wait for every update queued so far.
    fn join(&self) -> Result<(), WorkerError> {
        let dev = WorkerError::from_device;
        let cur = ffi::cuda_current_stream(self.device_index).map_err(dev)?;
        // SAFETY: both are live streams of this device.
        unsafe {
            self.join.record(self.stream).map_err(dev)?;
            self.join.block(cur).map_err(dev)
        }
    }

    /// Forward, backward and the whole AdamW step of one micro-batch (the loss scaled by
    /// `scale`), every `sac_every`-th block recomputed in the backward. Returns the
    /// unscaled loss, detached.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn step(
        &self,
        opt: &mut AdamW,
        model: &dyn Model,
        ctx: &Ctx,
        x: &Tensor,
        y: &Tensor,
        sac_every: Option<usize>,
        scale: f64,
    ) -> Result<Tensor, WorkerError> {
        let dev = WorkerError::from_device;
        opt.count_step().map_err(dev)?;
        let layers = self.blocks.len();
        let emb = model.embed(ctx, x);
        let mut cur = emb.shallow_clone();
        let mut saved = Vec::with_capacity(layers);
        for i in 0..layers {
            let checkpointed = sac_every.is_some_and(|k| sac::is_checkpointed(i, k));
            let (output, kept) = sac::block_forward(model, ctx, i, &cur, checkpointed);
            cur = output;
            saved.push(kept);
        }
        let head_in = cur.detach().set_requires_grad(true);
        drop(cur);
        let loss = model.head_loss(ctx, &head_in, y);
        (&loss * scale).backward();
        self.update(opt, &self.head)?;
        let mut grad = head_in.grad();
        drop(head_in);
        for i in (0..layers).rev() {
            let kept = saved
                .pop()
                .ok_or_else(|| WorkerError::Internal("backward ran out of blocks".into()))?;
            grad = sac::block_backward(model, ctx, i, kept, &grad).map_err(dev)?;
            self.update(opt, &self.blocks[i])?;
        }
        ffi::backward_with(&emb, &grad).map_err(dev)?;
        self.update(opt, &self.embed)?;
        self.join()?;
        Ok(loss.detach())
    }
}

#[cfg(test)]
mod tests {
    use super::parse_switch;

    #[test]
    fn the_overlap_switch_is_on_off_or_the_default_and_nothing_else() {
        assert_eq!(parse_switch(None), Ok(None));
        assert_eq!(parse_switch(Some("")), Ok(None));
        assert_eq!(parse_switch(Some("1")), Ok(Some(true)));
        assert_eq!(parse_switch(Some("0")), Ok(Some(false)));
        let e = parse_switch(Some("yes")).unwrap_err();
        assert!(
            e.contains("BENCH_OVERLAP_ADAMW") && e.contains("\"yes\""),
            "{e}"
        );
    }
}
