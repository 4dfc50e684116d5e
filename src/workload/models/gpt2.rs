//! GPT-2: learned position embeddings, pre-LayerNorm blocks, GELU (tanh) MLP, biases, and
//! the token embedding tied to the output head.

use tch::{Device, Tensor};

use super::model::{Init, Model, Param, Place};
use super::ops::{
    cross_entropy, fused_bias_gelu_enabled, fused_layer_norm_enabled, fused_linear_bias_enabled,
};
use super::presets::ModelConfig;
use crate::workload::ffi;
use crate::workload::precision::{Ctx, Site};

struct Block {
    ln1_w: Tensor,
    ln1_b: Tensor,
    attn_w: Tensor,
    attn_b: Tensor,
    proj_w: Tensor,
    proj_b: Tensor,
    ln2_w: Tensor,
    ln2_b: Tensor,
    fc_w: Tensor,
    fc_b: Tensor,
    fc2_w: Tensor,
    fc2_b: Tensor,
}

pub(crate) struct Gpt2 {
    cfg: ModelConfig,
    params: Vec<Param>,
    wte: Tensor,
    wpe: Tensor,
    blocks: Vec<Block>,
    lnf_w: Tensor,
    lnf_b: Tensor,
}

impl Gpt2 {
    pub(crate) fn new(cfg: ModelConfig, device: Device) -> Gpt2 {
        let (e, f) = (cfg.hidden, cfg.ffn);
        let mut init = Init::new(device, cfg.layers);
        let rstd = init.residual_std;
        let wte = init.normal("wte".into(), &[cfg.vocab, e], 0.02);
        let wpe = init.normal("wpe".into(), &[cfg.max_seq, e], 0.01);
        let blocks = (0..cfg.layers)
            .map(|i| {
                init.place = Place::Block(i as usize);
                let n = |s: &str| format!("h.{i}.{s}");
                Block {
                    ln1_w: init.ones(n("ln1.w"), &[e]),
                    ln1_b: init.zeros(n("ln1.b"), &[e]),
                    attn_w: init.normal(n("attn.w"), &[3 * e, e], 0.02),
                    attn_b: init.zeros(n("attn.b"), &[3 * e]),
                    proj_w: init.normal(n("proj.w"), &[e, e], rstd),
                    proj_b: init.zeros(n("proj.b"), &[e]),
                    ln2_w: init.ones(n("ln2.w"), &[e]),
                    ln2_b: init.zeros(n("ln2.b"), &[e]),
                    fc_w: init.normal(n("fc.w"), &[f, e], 0.02),
                    fc_b: init.zeros(n("fc.b"), &[f]),
                    fc2_w: init.normal(n("fc2.w"), &[e, f], rstd),
                    fc2_b: init.zeros(n("fc2.b"), &[e]),
                }
            })
            .collect();
        init.place = Place::Head;
        let lnf_w = init.ones("lnf.w".into(), &[e]);
        let lnf_b = init.zeros("lnf.b".into(), &[e]);
        Gpt2 {
            cfg,
            params: init.params,
            wte,
            wpe,
            blocks,
            lnf_w,
            lnf_b,
        }
    }
}

/// LayerNorm over the last dimension. On CUDA the shim's fused kernels take the weights in
/// whatever dtype they are (fp32 masters, or the bf16 working copies; no per-step cast,
/// gradients in the weights' dtype) and fold the weight and bias gradients into the
/// input-gradient pass; elsewhere libtorch's, on cast weights.
fn layer_norm(ctx: &Ctx, x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Tensor {
    let e = *x.size().last().unwrap_or(&0);
    if fused_layer_norm_enabled(x) {
        let y = match ffi::fused_layer_norm(&x.reshape([-1, e]), w, b, eps) {
            Ok(y) => y,
            // As with every libtorch failure in the step: a panic, reported by the worker.
            Err(err) => panic!("fused layer norm failed: {err} (BENCH_FUSED_LN=0 avoids it)"),
        };
        return y.view(x.size().as_slice());
    }
    x.layer_norm([e], Some(ctx.cast(w)), Some(ctx.cast(b)), eps, true)
}

/// gelu(h @ w^T + b), the first half of the MLP. On CUDA the matmul runs without its bias and
/// the shim's fused kernel adds it (the fp32 master) and applies GELU in one pass; its
/// backward also sums the bias gradient, which saves that gradient's own pass over the
/// [tokens, 4 x hidden] gradient. Elsewhere the bias rides in the matmul and libtorch's GELU
/// follows.
fn mlp_in(ctx: &Ctx, site: Site, h: &Tensor, w: &Tensor, b: &Tensor) -> Tensor {
    if !fused_bias_gelu_enabled(h.device()) {
        return ctx.linear(site, h, w, Some(b)).gelu("tanh");
    }
    let pre = ctx.linear(site, h, w, None);
    if !ffi::fused_bias_gelu_supported(&pre) {
        return (pre + ctx.cast(b)).gelu("tanh");
    }
    let f = *pre.size().last().unwrap_or(&0);
    let y = match ffi::fused_bias_gelu(&pre.reshape([-1, f]), b) {
        Ok(y) => y,
        // As with every libtorch failure in the step: a panic, reported by the worker.
        Err(err) => panic!("fused bias+GELU failed: {err} (BENCH_FUSED_GELU=0 avoids it)"),
    };
    y.view(pre.size().as_slice())
}

/// `x @ w^T + b` for the attn, proj and fc2 layers. On CUDA, outside fp8, the shim's fused
/// linear runs the same addmm and matmul gradients as libtorch's and sums the bias gradient
/// in its own column-sum kernel, at bandwidth where libtorch's reduction runs at about half
/// of it; elsewhere the precision context's linear.
fn linear_bias(ctx: &Ctx, site: Site, x: &Tensor, w: &Tensor, b: &Tensor) -> Tensor {
    if ctx.fp8 || !fused_linear_bias_enabled(x.device()) {
        return ctx.linear(site, x, w, Some(b));
    }
    let (xc, wc) = (ctx.cast(x), ctx.cast(w));
    if !ffi::fused_linear_supported(&xc, w.size()[0]) {
        return ctx.linear(site, x, w, Some(b));
    }
    match ffi::fused_linear(&xc, &wc, b) {
        Ok(y) => y,
        // As with every libtorch failure in the step: a panic, reported by the worker.
        Err(err) => panic!("fused linear failed: {err} (BENCH_FUSED_BIAS=0 avoids it)"),
    }
}

impl Model for Gpt2 {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn params(&self) -> &[Param] {
        &self.params
    }

    fn embed(&self, ctx: &Ctx, x: &Tensor) -> Tensor {
        let t = x.size()[1];
        // Look up in the table's own dtype (fp32 masters, or the bf16 working copy) and cast
        // the (small) result rather than the whole table.
        let tok = Tensor::embedding(&self.wte, x, -1, false, false);
        let pos = self.wpe.narrow(0, 0, t);
        ctx.cast(&(tok + pos))
    }

    fn block(&self, ctx: &Ctx, i: usize, x: &Tensor) -> Tensor {
        let b = &self.blocks[i];
        let (e, nh) = (self.cfg.hidden, self.cfg.heads);
        let sz = x.size();
        let (bsz, t) = (sz[0], sz[1]);
        let eps = self.cfg.norm_eps;
        let h = layer_norm(ctx, x, &b.ln1_w, &b.ln1_b, eps);
        let qkv = linear_bias(ctx, Site::Block(i, 0), &h, &b.attn_w, &b.attn_b);
        let heads = |z: &Tensor| z.view([bsz, t, nh, e / nh]).transpose(1, 2);
        let parts = qkv.split(e, 2);
        let y = Tensor::scaled_dot_product_attention::<Tensor>(
            &heads(&parts[0]),
            &heads(&parts[1]),
            &heads(&parts[2]),
            None,
            0.0,
            true,
            None,
            false,
        );
        let y = y.transpose(1, 2).reshape([bsz, t, e]);
        let x = x + linear_bias(ctx, Site::Block(i, 1), &y, &b.proj_w, &b.proj_b);
        let h = layer_norm(ctx, &x, &b.ln2_w, &b.ln2_b, eps);
        let m = mlp_in(ctx, Site::Block(i, 2), &h, &b.fc_w, &b.fc_b);
        x + linear_bias(ctx, Site::Block(i, 3), &m, &b.fc2_w, &b.fc2_b)
    }

    fn head_loss(&self, ctx: &Ctx, h: &Tensor, y: &Tensor) -> Tensor {
        let h = layer_norm(ctx, h, &self.lnf_w, &self.lnf_b, self.cfg.norm_eps);
        let logits = ctx.linear_head(&h, &self.wte);
        cross_entropy(&logits, y, self.cfg.vocab)
    }
}
