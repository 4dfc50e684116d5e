//! Selective activation checkpointing: every k-th transformer block keeps only its input in
//! the forward pass and recomputes its activations during the backward.
//!
//! tch has no custom autograd Function, so the backward is driven segment by segment from
//! Rust. The forward cuts the model at each checkpointed block: the block runs under
//! `no_grad` and its output re-enters autograd as a fresh leaf. The backward then walks the
//! segments in reverse: it back-propagates the loss through the last segment, and for each
//! earlier one back-propagates `sum(output * grad_output)`, whose gradient with respect to
//! `output` is exactly `grad_output`, so parameters receive the same gradients as one
//! uncut backward. Checkpointed blocks are first recomputed from their saved input.

use tch::Tensor;

use super::ffi;
use super::models::Model;
use super::precision::Ctx;

/// A piece of the forward pass between two cuts.
enum Segment {
    /// Blocks run with autograd; `input` is the leaf that starts it (`None` for the segment
    /// that starts at the embedding) and `output` is its last activation.
    Kept {
        input: Option<Tensor>,
        output: Tensor,
        blocks: usize,
    },
    /// A checkpointed block and its saved input (no graph).
    Checkpointed { block: usize, input: Tensor },
}

/// Whether block `i` is checkpointed when every `every`-th block is.
pub(crate) fn is_checkpointed(i: usize, every: usize) -> bool {
    every > 0 && i.is_multiple_of(every)
}

/// Forward and backward of one micro-batch with the loss scaled by `scale`; gradients
/// accumulate into the parameters' `.grad`. Returns the unscaled loss, detached.
pub fn forward_backward(
    model: &dyn Model,
    ctx: &Ctx,
    x: &Tensor,
    y: &Tensor,
    every: usize,
    scale: f64,
) -> Tensor {
    let layers = model.config().layers as usize;
    let mut segments: Vec<Segment> = Vec::new();
    let mut input: Option<Tensor> = None;
    let mut out = model.embed(ctx, x);
    let mut blocks = 0;
    for i in 0..layers {
        if !is_checkpointed(i, every) {
            out = model.block(ctx, i, &out);
            blocks += 1;
            continue;
        }
        segments.push(Segment::Kept {
            input: input.take(),
            output: out.shallow_clone(),
            blocks,
        });
        let saved = out.detach();
        let o = tch::no_grad(|| model.block(ctx, i, &saved));
        segments.push(Segment::Checkpointed {
            block: i,
            input: saved,
        });
        let leaf = o.detach().set_requires_grad(true);
        input = Some(leaf.shallow_clone());
        out = leaf;
        blocks = 0;
    }
    let loss = model.head_loss(ctx, &out, y);
    (&loss * scale).backward();
    let Some(last_input) = input else {
        // Nothing was checkpointed: that was an ordinary backward.
        return loss.detach();
    };
    let mut grad = last_input.grad();
    for seg in segments.into_iter().rev() {
        match seg {
            Segment::Checkpointed { block, input } => {
                let leaf = input.set_requires_grad(true);
                let o = model.block(ctx, block, &leaf);
                (o * &grad).sum(o_kind(&grad)).backward();
                grad = leaf.grad();
            }
            Segment::Kept {
                input,
                output,
                blocks,
            } => {
                match input {
                    // An empty segment between two checkpointed blocks passes the
                    // gradient through unchanged.
                    Some(_) if blocks == 0 => {}
                    Some(inp) => {
                        (output * &grad).sum(o_kind(&grad)).backward();
                        grad = inp.grad();
                    }
                    None => (output * &grad).sum(o_kind(&grad)).backward(),
                }
            }
        }
    }
    loss.detach()
}

/// One block of a schedule that drives every block as its own autograd segment (DDP and
/// FSDP's, and the overlapped AdamW update's): what its forward kept for the backward.
pub(crate) enum Saved {
    /// The block ran with autograd from `input`, a fresh leaf.
    Kept { input: Tensor, output: Tensor },
    /// The block ran without a graph; the backward recomputes it from `input`.
    Checkpointed { input: Tensor },
}

/// Runs block `i` on `h` as its own segment, checkpointed or not; returns its output (the
/// next block's input) and what the backward needs.
pub(crate) fn block_forward(
    model: &dyn Model,
    ctx: &Ctx,
    i: usize,
    h: &Tensor,
    checkpointed: bool,
) -> (Tensor, Saved) {
    let input = h.detach();
    if checkpointed {
        let output = tch::no_grad(|| model.block(ctx, i, &input));
        (output, Saved::Checkpointed { input })
    } else {
        let input = input.set_requires_grad(true);
        let output = model.block(ctx, i, &input);
        (output.shallow_clone(), Saved::Kept { input, output })
    }
}

/// Back-propagates `grad` (the gradient of block `i`'s output) through the block, recomputing
/// it first if it was checkpointed; its parameters' gradients accumulate, and the gradient of
/// its input is returned.
pub(crate) fn block_backward(
    model: &dyn Model,
    ctx: &Ctx,
    i: usize,
    saved: Saved,
    grad: &Tensor,
) -> Result<Tensor, String> {
    let (input, output) = match saved {
        Saved::Kept { input, output } => (input, output),
        Saved::Checkpointed { input } => {
            let leaf = input.set_requires_grad(true);
            let output = model.block(ctx, i, &leaf);
            (leaf, output)
        }
    };
    ffi::backward_with(&output, grad)?;
    Ok(input.grad())
}

/// Sums in the gradient's own dtype; the value is never used, only its gradient.
fn o_kind(g: &Tensor) -> tch::Kind {
    g.kind()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::models::{build, presets};
    use crate::workload::precision::Precision;
    use tch::{Device, Kind};

    fn grads(model: &dyn Model) -> Vec<Tensor> {
        model
            .params()
            .iter()
            .map(|p| p.tensor.grad().copy())
            .collect()
    }

    fn zero(model: &dyn Model) {
        for p in model.params() {
            let mut g = p.tensor.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
    }

    #[test]
    fn checkpointed_gradients_equal_plain_ones() {
        for name in ["gpt2-tiny", "llama-tiny"] {
            let mut cfg = presets::get(name).unwrap();
            cfg.layers = 4;
            tch::manual_seed(3);
            let model = build(&cfg, 16, Device::Cpu, Kind::Float);
            let ctx = Ctx::new(Precision::Fp32);
            let x = Tensor::randint(cfg.vocab, [2, 16], (Kind::Int64, Device::Cpu));
            let y = Tensor::randint(cfg.vocab, [2, 16], (Kind::Int64, Device::Cpu));
            let plain_loss = model.forward_loss(&ctx, &x, &y);
            plain_loss.backward();
            let plain = grads(model.as_ref());
            for every in [1, 2, 3] {
                zero(model.as_ref());
                let loss = forward_backward(model.as_ref(), &ctx, &x, &y, every, 1.0);
                assert_eq!(loss.double_value(&[]), plain_loss.double_value(&[]));
                for (p, (a, b)) in model
                    .params()
                    .iter()
                    .zip(plain.iter().zip(grads(model.as_ref())))
                {
                    let diff = (a - &b).abs().max().double_value(&[]);
                    let scale = a.abs().max().double_value(&[]).max(1e-12);
                    assert!(
                        diff <= 1e-6 * scale,
                        "{name} every={every} {}: {diff} (scale {scale})",
                        p.name
                    );
                }
            }
        }
    }
}
