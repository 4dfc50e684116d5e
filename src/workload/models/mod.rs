//! Decoder-only models on libtorch: GPT-2 ([`gpt2`]) and Llama 3 ([`llama`]), built from the
//! shapes in [`presets`].
//!
//! A model exposes its forward pass in three stages (embedding, one block, head + loss)
//! rather than one call, so that selective activation checkpointing ([`crate::workload::sac`])
//! can cut the graph at block boundaries. Parameters are built as fp32 leaves that require
//! grad; the precision context casts them per op (see [`crate::workload::precision`]), unless
//! the optimizer re-points them at bf16 working copies of flat fp32 masters
//! ([`crate::workload::optim::AdamW::with_masters`], the default on a GPU) or DDP/FSDP do.

#[cfg(feature = "builtin")]
pub mod gpt2;
#[cfg(feature = "builtin")]
pub mod llama;
#[cfg(feature = "builtin")]
pub mod model;
#[cfg(feature = "builtin")]
pub mod ops;
pub mod presets;

#[cfg(feature = "builtin")]
use tch::{Device, Kind, Tensor};

#[cfg(feature = "builtin")]
pub use model::{Model, Param, Place};
#[cfg(feature = "builtin")]
pub use ops::IGNORE_INDEX;
#[cfg(feature = "builtin")]
pub(crate) use presets::{Family, ModelConfig};

#[cfg(feature = "builtin")]
/// Builds a model with freshly initialised parameters on `device`, for sequences of
/// `seq_len` tokens, computing in `kind` (used for the RoPE tables).
pub fn build(cfg: &ModelConfig, seq_len: i64, device: Device, kind: Kind) -> Box<dyn Model> {
    match cfg.family {
        Family::Gpt2 => Box::new(gpt2::Gpt2::new(cfg.clone(), device)),
        Family::Llama => Box::new(llama::Llama::new(cfg.clone(), seq_len, device, kind)),
    }
}

#[cfg(feature = "builtin")]
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

#[cfg(feature = "builtin")]
#[cfg(test)]
mod tests {
    use super::ops::{
        cross_entropy, fused_bias_gelu_enabled, fused_cross_entropy_enabled,
        fused_layer_norm_enabled, fused_linear_bias_enabled, fused_rms_norm_enabled,
        fused_swiglu_enabled,
    };
    use super::*;
    use crate::workload::precision::{Ctx, Precision};

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
