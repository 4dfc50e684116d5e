//! Decoder-only models on libtorch: GPT-2 ([`gpt2`]) and Llama 3 ([`llama`]), built from the
//! shapes in [`presets`].
//!
//! A model exposes its forward pass in three stages (embedding, one block, head + loss)
//! rather than one call, so that selective activation checkpointing ([`crate::workload::sac`])
//! can cut the graph at block boundaries. Parameters are built as fp32 leaves that require
//! grad; the precision context casts them per op (see [`crate::workload::precision`]), unless
//! the optimizer re-points them at bf16 working copies of flat fp32 masters
//! ([`crate::workload::optim::AdamW::with_masters`], the default on a GPU) or DDP/FSDP do.

pub mod gpt2;
pub mod llama;
pub mod presets;

use tch::{Device, Kind, Tensor};

pub(crate) use presets::{Family, ModelConfig};

use super::precision::Ctx;

/// One trainable tensor.
pub struct Param {
    pub name: String,
    pub tensor: Tensor,
    /// Whether AdamW decays it (matrices and embeddings yes; norms and biases no).
    pub decay: bool,
    /// Where the forward pass uses it. DDP and FSDP group parameters by it: each block's
    /// are reduced (and under FSDP gathered) together, the head's right after the head's
    /// backward, the embedding's at the very end.
    pub place: Place,
}

/// The stage of the forward pass a parameter belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The embeddings (a token embedding tied to the output head stays here: its gradient
    /// is complete only after the embedding's backward).
    Embed,
    /// Transformer block `i`.
    Block(usize),
    /// The final norm and the output head.
    Head,
}

/// A decoder-only language model cut at block boundaries.
pub trait Model {
    fn config(&self) -> &ModelConfig;
    fn params(&self) -> &[Param];
    /// Token ids `[B, T]` (int64) to the residual stream `[B, T, E]` in the compute dtype.
    fn embed(&self, ctx: &Ctx, x: &Tensor) -> Tensor;
    /// Block `i` applied to the residual stream.
    fn block(&self, ctx: &Ctx, i: usize, h: &Tensor) -> Tensor;
    /// Final norm, output head and mean cross-entropy (fp32) against targets `[B, T]`.
    fn head_loss(&self, ctx: &Ctx, h: &Tensor, y: &Tensor) -> Tensor;

    /// The whole forward pass, keeping every activation for the backward.
    fn forward_loss(&self, ctx: &Ctx, x: &Tensor, y: &Tensor) -> Tensor {
        let mut h = self.embed(ctx, x);
        for i in 0..self.config().layers as usize {
            h = self.block(ctx, i, &h);
        }
        self.head_loss(ctx, &h, y)
    }

    /// Number of elements over all parameters (what the tests compare with the formula).
    fn numel(&self) -> u64 {
        self.params().iter().map(|p| p.tensor.numel() as u64).sum()
    }
}

/// Builds a model with freshly initialised parameters on `device`, for sequences of
/// `seq_len` tokens, computing in `kind` (used for the RoPE tables).
pub fn build(cfg: &ModelConfig, seq_len: i64, device: Device, kind: Kind) -> Box<dyn Model> {
    match cfg.family {
        Family::Gpt2 => Box::new(gpt2::Gpt2::new(cfg.clone(), device)),
        Family::Llama => Box::new(llama::Llama::new(cfg.clone(), seq_len, device, kind)),
    }
}

/// Collects parameters as they are created, GPT-2-style initialised: N(0, 0.02), residual
/// output projections scaled by 1/sqrt(2 * layers), norms at one, biases at zero.
pub(crate) struct Init {
    pub device: Device,
    pub params: Vec<Param>,
    pub residual_std: f64,
    /// Where the parameters being created belong (set by the model's constructor).
    pub place: Place,
}

impl Init {
    pub(crate) fn new(device: Device, layers: i64) -> Init {
        Init {
            device,
            params: Vec::new(),
            residual_std: 0.02 / (2.0 * layers as f64).sqrt(),
            place: Place::Embed,
        }
    }

    fn push(&mut self, name: String, t: Tensor, decay: bool) -> Tensor {
        let t = t.set_requires_grad(true);
        self.params.push(Param {
            name,
            tensor: t.shallow_clone(),
            decay,
            place: self.place,
        });
        t
    }

    pub(crate) fn normal(&mut self, name: String, dims: &[i64], std: f64) -> Tensor {
        let t = Tensor::randn(dims, (Kind::Float, self.device)) * std;
        self.push(name, t, true)
    }

    pub(crate) fn ones(&mut self, name: String, dims: &[i64]) -> Tensor {
        let t = Tensor::ones(dims, (Kind::Float, self.device));
        self.push(name, t, false)
    }

    pub(crate) fn zeros(&mut self, name: String, dims: &[i64]) -> Tensor {
        let t = Tensor::zeros(dims, (Kind::Float, self.device));
        self.push(name, t, false)
    }
}

/// The kernel libtorch's `scaled_dot_product_attention` picks for the models' attention at
/// this shape, dtype and device: asked of libtorch's own dispatcher (`_fused_sdp_choice`,
/// what SDPA itself calls) with tensors of the real sizes, so the record says what ran and
/// not what was hoped for. Llama presets ask with grouped-query heads, as their blocks do.
pub(crate) fn attention_kernel(
    cfg: &ModelConfig,
    seq_len: i64,
    micro_batch: i64,
    device: Device,
    kind: Kind,
) -> String {
    let d = cfg.head_dim();
    let gqa = cfg.family == presets::Family::Llama && cfg.kv_heads != cfg.heads;
    let kv = if gqa { cfg.kv_heads } else { cfg.heads };
    let q = Tensor::empty([micro_batch, cfg.heads, seq_len, d], (kind, device));
    let k = Tensor::empty([micro_batch, kv, seq_len, d], (kind, device));
    let choice =
        Tensor::f_internal_fused_sdp_choice::<Tensor>(&q, &k, &k, None, 0.0, true, None, gqa);
    // torch's SDPBackend enum (aten/src/ATen/native/transformers/sdp_utils_cpp.h).
    let kernel = match choice {
        Ok(0) => "math (unfused: the score matrix is materialised)",
        Ok(1) => "flash attention",
        Ok(2) => "memory-efficient attention",
        Ok(3) => "cuDNN attention",
        Ok(4) => "an overrideable backend",
        Ok(_) => "no kernel (libtorch reports an error choice)",
        Err(_) => "unknown (libtorch could not say)",
    };
    format!("SDPA: {kernel}")
}

/// Targets with this value count neither in the loss nor in its mean (PyTorch's default).
pub const IGNORE_INDEX: i64 = -100;

/// Whether [`cross_entropy`] takes the fused kernels for logits on `device`: CUDA only (the
/// kernels are CUDA; CPU runs, CI's among them, keep libtorch's path), unless
/// `BENCH_FUSED_CE=0` asks for the unfused path (to compare the two).
pub(crate) fn fused_cross_entropy_enabled(device: Device) -> bool {
    device.is_cuda() && std::env::var("BENCH_FUSED_CE").map_or(true, |v| v != "0")
}

/// Whether the models' LayerNorms take the fused kernels for `x`: on CUDA, for the row
/// widths the kernels handle (see [`super::ffi::fused_layer_norm_supported`]), unless
/// `BENCH_FUSED_LN=0` asks for libtorch's LayerNorm (to compare the two).
pub(crate) fn fused_layer_norm_enabled(x: &Tensor) -> bool {
    x.device().is_cuda()
        && std::env::var("BENCH_FUSED_LN").map_or(true, |v| v != "0")
        && super::ffi::fused_layer_norm_supported(x)
}

/// Whether GPT-2's MLP takes the fused bias+GELU kernels on `device`: CUDA only, unless
/// `BENCH_FUSED_GELU=0` asks for the matmul's bias epilogue and libtorch's GELU (to compare
/// the two). The row width is checked on the pre-activation itself
/// ([`super::ffi::fused_bias_gelu_supported`]).
pub(crate) fn fused_bias_gelu_enabled(device: Device) -> bool {
    device.is_cuda() && std::env::var("BENCH_FUSED_GELU").map_or(true, |v| v != "0")
}

/// Whether GPT-2's attn, proj and fc2 linears take the shim's fused linear (its own
/// bias-gradient column sum) on `device`: CUDA only, unless `BENCH_FUSED_BIAS=0` asks for
/// libtorch's linear (to compare the two). The output width is checked per call
/// ([`super::ffi::fused_linear_supported`]).
pub(crate) fn fused_linear_bias_enabled(device: Device) -> bool {
    device.is_cuda() && std::env::var("BENCH_FUSED_BIAS").map_or(true, |v| v != "0")
}

/// Whether the Llama blocks' RMSNorms take the fused kernels for `x`: on CUDA, for the row
/// widths the kernels handle (see [`super::ffi::fused_rms_norm_supported`]; others fall back
/// to libtorch's), unless `BENCH_FUSED_RMS=0` asks for libtorch's RMSNorm (to compare the
/// two).
pub(crate) fn fused_rms_norm_enabled(x: &Tensor) -> bool {
    x.device().is_cuda()
        && std::env::var("BENCH_FUSED_RMS").map_or(true, |v| v != "0")
        && super::ffi::fused_rms_norm_supported(x)
}

/// Whether the Llama MLP's `silu(gate) * up` takes the fused kernels for `gate`: on CUDA, for
/// the row widths the kernels handle ([`super::ffi::fused_swiglu_supported`]), unless
/// `BENCH_FUSED_SWIGLU=0` asks for libtorch's silu and product (to compare the two).
pub(crate) fn fused_swiglu_enabled(gate: &Tensor) -> bool {
    gate.device().is_cuda()
        && std::env::var("BENCH_FUSED_SWIGLU").map_or(true, |v| v != "0")
        && super::ffi::fused_swiglu_supported(gate)
}

/// Mean cross-entropy in fp32 over `[B, T, V]` logits against `[B, T]` targets.
///
/// On a CUDA device the shim's fused kernels compute it: one read of the logits forward,
/// one read and one write backward, no fp32 copy of the logits (csrc/fused_ce.cpp). They
/// write the gradient into the logits' own buffer, which is safe because every caller (the
/// models' `head_loss`) hands over logits that nothing but the loss reads. Elsewhere the
/// logits are cast to fp32 and go through libtorch's log_softmax and nll_loss.
pub(crate) fn cross_entropy(logits: &Tensor, y: &Tensor, vocab: i64) -> Tensor {
    let logits = logits.view([-1, vocab]);
    let y = y.view([-1]);
    if fused_cross_entropy_enabled(logits.device()) {
        // Like every libtorch failure inside the step, a kernel failure panics with its
        // message; the worker's panic boundary reports it.
        return match super::ffi::fused_cross_entropy(&logits, &y, IGNORE_INDEX, true, 0) {
            Ok(loss) => loss,
            Err(e) => panic!("fused cross-entropy failed: {e} (BENCH_FUSED_CE=0 avoids it)"),
        };
    }
    logits.to_kind(Kind::Float).cross_entropy_loss::<Tensor>(
        &y,
        None,
        tch::Reduction::Mean,
        IGNORE_INDEX,
        0.0,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::precision::Precision;

    #[test]
    fn tiny_models_tensor_counts_agree_with_formula() {
        for name in ["gpt2-tiny", "llama-tiny"] {
            let cfg = presets::get(name).unwrap();
            let m = build(&cfg, 32, Device::Cpu, Kind::Float);
            assert_eq!(m.numel(), cfg.n_params(), "{name}");
        }
        // A Qwen-style block (qkv biases) through the same check, at tiny width.
        let mut q = presets::get("llama-tiny").unwrap();
        q.qkv_bias = true;
        let m = build(&q, 32, Device::Cpu, Kind::Float);
        assert_eq!(m.numel(), q.n_params());
    }

    #[test]
    fn fused_kernels_are_never_taken_on_the_cpu() {
        assert!(!fused_cross_entropy_enabled(Device::Cpu));
        let x = Tensor::zeros([4, 768], (Kind::BFloat16, Device::Cpu));
        assert!(!fused_layer_norm_enabled(&x));
        assert!(!fused_bias_gelu_enabled(Device::Cpu));
        assert!(!fused_linear_bias_enabled(Device::Cpu));
        // The rows themselves would fit the kernels.
        assert!(crate::workload::ffi::fused_layer_norm_supported(&x));
        // The Llama proxy's RMSNorm and SwiGLU rows fit the kernels too, and are still not
        // taken on the CPU.
        let h = Tensor::zeros([4, 4096], (Kind::BFloat16, Device::Cpu));
        let m = Tensor::zeros([4, 14336], (Kind::BFloat16, Device::Cpu));
        assert!(crate::workload::ffi::fused_rms_norm_supported(&h));
        assert!(crate::workload::ffi::fused_swiglu_supported(&m));
        assert!(!fused_rms_norm_enabled(&h));
        assert!(!fused_swiglu_enabled(&m));
        // Rows the RMSNorm kernels cannot take fall back to libtorch's (widths off the
        // 16-byte grid, or wider than 8192 bf16).
        let odd = Tensor::zeros([4, 4100], (Kind::BFloat16, Device::Cpu));
        let wide = Tensor::zeros([4, 16384], (Kind::BFloat16, Device::Cpu));
        assert!(!crate::workload::ffi::fused_rms_norm_supported(&odd));
        assert!(!crate::workload::ffi::fused_rms_norm_supported(&wide));
    }

    #[test]
    fn cpu_cross_entropy_skips_ignored_targets() {
        // Row 0 is ignored: the mean is row 1's loss alone, ln(2) for two equal logits.
        let logits = Tensor::from_slice(&[5.0f32, -3.0, 1.0, 1.0]).view([1, 2, 2]);
        let y = Tensor::from_slice(&[IGNORE_INDEX, 1]).view([1, 2]);
        let loss = cross_entropy(&logits, &y, 2).double_value(&[]);
        assert!((loss - std::f64::consts::LN_2).abs() < 1e-6, "{loss}");
    }

    #[test]
    fn fused_kernels_compile_for_hopper() {
        // NVRTC needs no GPU: the kernel source is checked on every host, CI's included.
        let bytes = crate::workload::ffi::jit_compile_check(90).unwrap();
        assert!(bytes > 1000, "cubin of {bytes} bytes");
    }

    #[test]
    fn forward_gives_finite_loss_near_log_vocab() {
        tch::manual_seed(0);
        for name in ["gpt2-tiny", "llama-tiny"] {
            let cfg = presets::get(name).unwrap();
            for p in [Precision::Fp32, Precision::Bf16] {
                let m = build(&cfg, 16, Device::Cpu, p.compute_kind());
                let x = Tensor::randint(cfg.vocab, [2, 16], (Kind::Int64, Device::Cpu));
                let y = Tensor::randint(cfg.vocab, [2, 16], (Kind::Int64, Device::Cpu));
                let loss = m.forward_loss(&Ctx::new(p), &x, &y).double_value(&[]);
                // Freshly initialised models predict nearly uniformly: loss ~ ln(vocab).
                let uniform = (cfg.vocab as f64).ln();
                assert!(
                    (loss - uniform).abs() < 0.5,
                    "{name} {p:?}: {loss} vs {uniform}"
                );
            }
        }
    }
}
