//! Llama 3 (and Qwen 2.5, which adds q/k/v biases): RMSNorm, rotary position embeddings,
//! SwiGLU MLP, grouped-query attention, untied output head.

use tch::{Device, Kind, Tensor};

use super::model::{Init, Model, Param, Place};
use super::ops::{cross_entropy, fused_rms_norm_enabled, fused_swiglu_enabled};
use super::presets::ModelConfig;
use crate::workload::ffi;
use crate::workload::precision::{Ctx, Site};

struct Block {
    n1: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    bqkv: Option<(Tensor, Tensor, Tensor)>,
    wo: Tensor,
    n2: Tensor,
    w1: Tensor,
    w3: Tensor,
    w2: Tensor,
}

pub(crate) struct Llama {
    cfg: ModelConfig,
    params: Vec<Param>,
    emb: Tensor,
    blocks: Vec<Block>,
    norm: Tensor,
    head: Tensor,
    /// RoPE tables `[1, T, 1, D/2]` in the compute dtype.
    cos: Tensor,
    sin: Tensor,
}

impl Llama {
    pub(crate) fn new(cfg: ModelConfig, seq_len: i64, device: Device, kind: Kind) -> Llama {
        let (e, f) = (cfg.hidden, cfg.ffn);
        let d = cfg.head_dim();
        let kv = cfg.kv_heads * d;
        let mut init = Init::new(device, cfg.layers);
        let rstd = init.residual_std;
        let emb = init.normal("emb".into(), &[cfg.vocab, e], 0.02);
        let blocks = (0..cfg.layers)
            .map(|i| {
                init.place = Place::Block(i as usize);
                let n = |s: &str| format!("h.{i}.{s}");
                let n1 = init.ones(n("n1"), &[e]);
                let wq = init.normal(n("q"), &[e, e], 0.02);
                let wk = init.normal(n("k"), &[kv, e], 0.02);
                let wv = init.normal(n("v"), &[kv, e], 0.02);
                let bqkv = cfg.qkv_bias.then(|| {
                    (
                        init.zeros(n("q.b"), &[e]),
                        init.zeros(n("k.b"), &[kv]),
                        init.zeros(n("v.b"), &[kv]),
                    )
                });
                Block {
                    n1,
                    wq,
                    wk,
                    wv,
                    bqkv,
                    wo: init.normal(n("o"), &[e, e], rstd),
                    n2: init.ones(n("n2"), &[e]),
                    w1: init.normal(n("w1"), &[f, e], 0.02),
                    w3: init.normal(n("w3"), &[f, e], 0.02),
                    w2: init.normal(n("w2"), &[e, f], rstd),
                }
            })
            .collect();
        init.place = Place::Head;
        let norm = init.ones("norm".into(), &[e]);
        let head = init.normal("head".into(), &[cfg.vocab, e], 0.02);
        let inv = Tensor::arange_start_step(0, d, 2, (Kind::Float, device))
            .divide_scalar(d as f64)
            .multiply_scalar(-(cfg.rope_theta.ln()))
            .exp();
        let pos = Tensor::arange(seq_len, (Kind::Float, device));
        let angles = pos.outer(&inv).view([1, seq_len, 1, d / 2]);
        Llama {
            cos: angles.cos().to_kind(kind),
            sin: angles.sin().to_kind(kind),
            cfg,
            params: init.params,
            emb,
            blocks,
            norm,
            head,
        }
    }

    /// Rotary embedding of `[B, T, H, D]` in the half-split layout (as Hugging Face and the
    /// PyTorch peer do).
    fn rope(&self, z: &Tensor) -> Tensor {
        let d = self.cfg.head_dim();
        let t = z.size()[1];
        let (cos, sin) = (self.cos.narrow(1, 0, t), self.sin.narrow(1, 0, t));
        let z1 = z.narrow(-1, 0, d / 2);
        let z2 = z.narrow(-1, d / 2, d / 2);
        Tensor::cat(&[&z1 * &cos - &z2 * &sin, &z2 * &cos + &z1 * &sin], -1)
    }
}

/// RMSNorm over the last dimension. On CUDA the shim's fused kernels (csrc/fused_rms.cpp)
/// take the weight as it is (the fp32 master, or DDP/FSDP's bf16 working copy; its gradient
/// comes back in that dtype), read x once forward and x and dy once backward, with the
/// weight gradient folded in; elsewhere, and for widths the kernels do not take,
/// libtorch's, on the cast weight.
fn rms_norm(ctx: &Ctx, x: &Tensor, w: &Tensor, eps: f64) -> Tensor {
    let e = *x.size().last().unwrap_or(&0);
    if fused_rms_norm_enabled(x) {
        let y = match ffi::fused_rms_norm(&x.reshape([-1, e]), w, eps) {
            Ok(y) => y,
            // As with every libtorch failure in the step: a panic, reported by the worker.
            Err(err) => panic!("fused RMSNorm failed: {err} (BENCH_FUSED_RMS=0 avoids it)"),
        };
        return y.view(x.size().as_slice());
    }
    x.rms_norm([e], Some(ctx.cast(w)), eps)
}

/// `silu(gate) * up`, the SwiGLU of the MLP. On CUDA the shim's fused kernels
/// (csrc/fused_swiglu.cpp) do it in one pass each way and save only the two inputs;
/// elsewhere libtorch's silu and product.
fn swiglu(gate: &Tensor, up: &Tensor) -> Tensor {
    if !fused_swiglu_enabled(gate) || gate.kind() != up.kind() {
        return gate.silu() * up;
    }
    match ffi::fused_swiglu(gate, up) {
        Ok(y) => y,
        // As with every libtorch failure in the step: a panic, reported by the worker.
        Err(err) => panic!("fused SwiGLU failed: {err} (BENCH_FUSED_SWIGLU=0 avoids it)"),
    }
}

impl Model for Llama {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn params(&self) -> &[Param] {
        &self.params
    }

    fn embed(&self, ctx: &Ctx, x: &Tensor) -> Tensor {
        ctx.cast(&Tensor::embedding(&self.emb, x, -1, false, false))
    }

    fn block(&self, ctx: &Ctx, i: usize, x: &Tensor) -> Tensor {
        let b = &self.blocks[i];
        let c = &self.cfg;
        let (e, d) = (c.hidden, c.head_dim());
        let sz = x.size();
        let (bsz, t) = (sz[0], sz[1]);
        let h = rms_norm(ctx, x, &b.n1, c.norm_eps);
        let (bq, bk, bv) = match &b.bqkv {
            Some((q, k, v)) => (Some(q), Some(k), Some(v)),
            None => (None, None, None),
        };
        let q = ctx
            .linear(Site::Block(i, 0), &h, &b.wq, bq)
            .view([bsz, t, c.heads, d]);
        let k = ctx
            .linear(Site::Block(i, 1), &h, &b.wk, bk)
            .view([bsz, t, c.kv_heads, d]);
        let v = ctx
            .linear(Site::Block(i, 2), &h, &b.wv, bv)
            .view([bsz, t, c.kv_heads, d]);
        let q = self.rope(&q).transpose(1, 2);
        let k = self.rope(&k).transpose(1, 2);
        let y = Tensor::scaled_dot_product_attention::<Tensor>(
            &q,
            &k,
            &v.transpose(1, 2),
            None,
            0.0,
            true,
            None,
            c.kv_heads != c.heads,
        );
        let y = y.transpose(1, 2).reshape([bsz, t, e]);
        let x = x + ctx.linear(Site::Block(i, 3), &y, &b.wo, None);
        let h = rms_norm(ctx, &x, &b.n2, c.norm_eps);
        let m = swiglu(
            &ctx.linear(Site::Block(i, 4), &h, &b.w1, None),
            &ctx.linear(Site::Block(i, 5), &h, &b.w3, None),
        );
        x + ctx.linear(Site::Block(i, 6), &m, &b.w2, None)
    }

    fn head_loss(&self, ctx: &Ctx, h: &Tensor, y: &Tensor) -> Tensor {
        let h = rms_norm(ctx, h, &self.norm, self.cfg.norm_eps);
        let logits = ctx.linear_head(&h, &self.head);
        cross_entropy(&logits, y, self.cfg.vocab)
    }
}
