//! The ops the models share: the mean cross-entropy of the head, and whether each fused
//! kernel of the shim is taken for a tensor (the environment switches that turn each one
//! off, to compare it with libtorch's). The models call them and the facade in `mod.rs`
//! builds the models, so they live apart from the facade.

use tch::{Device, Kind, Tensor};

use crate::workload::ffi;

/// Targets with this value count neither in the loss nor in its mean (PyTorch's default).
pub const IGNORE_INDEX: i64 = -100;

/// Whether [`cross_entropy`] takes the fused kernels for logits on `device`: CUDA only (the
/// kernels are CUDA; CPU runs, CI's among them, keep libtorch's path), unless
/// `BENCH_FUSED_CE=0` asks for the unfused path (to compare the two).
pub(crate) fn fused_cross_entropy_enabled(device: Device) -> bool {
    device.is_cuda() && std::env::var("BENCH_FUSED_CE").map_or(true, |v| v != "0")
}

/// Whether the models' LayerNorms take the fused kernels for `x`: on CUDA, for the row
/// widths the kernels handle (see [`ffi::fused_layer_norm_supported`]), unless
/// `BENCH_FUSED_LN=0` asks for libtorch's LayerNorm (to compare the two).
pub(crate) fn fused_layer_norm_enabled(x: &Tensor) -> bool {
    x.device().is_cuda()
        && std::env::var("BENCH_FUSED_LN").map_or(true, |v| v != "0")
        && ffi::fused_layer_norm_supported(x)
}

/// Whether GPT-2's MLP takes the fused bias+GELU kernels on `device`: CUDA only, unless
/// `BENCH_FUSED_GELU=0` asks for the matmul's bias epilogue and libtorch's GELU (to compare
/// the two). The row width is checked on the pre-activation itself
/// ([`ffi::fused_bias_gelu_supported`]).
pub(crate) fn fused_bias_gelu_enabled(device: Device) -> bool {
    device.is_cuda() && std::env::var("BENCH_FUSED_GELU").map_or(true, |v| v != "0")
}

/// Whether GPT-2's attn, proj and fc2 linears take the shim's fused linear (its own
/// bias-gradient column sum) on `device`: CUDA only, unless `BENCH_FUSED_BIAS=0` asks for
/// libtorch's linear (to compare the two). The output width is checked per call
/// ([`ffi::fused_linear_supported`]).
pub(crate) fn fused_linear_bias_enabled(device: Device) -> bool {
    device.is_cuda() && std::env::var("BENCH_FUSED_BIAS").map_or(true, |v| v != "0")
}

/// Whether the Llama blocks' RMSNorms take the fused kernels for `x`: on CUDA, for the row
/// widths the kernels handle (see [`ffi::fused_rms_norm_supported`]; others fall back
/// to libtorch's), unless `BENCH_FUSED_RMS=0` asks for libtorch's RMSNorm (to compare the
/// two).
pub(crate) fn fused_rms_norm_enabled(x: &Tensor) -> bool {
    x.device().is_cuda()
        && std::env::var("BENCH_FUSED_RMS").map_or(true, |v| v != "0")
        && ffi::fused_rms_norm_supported(x)
}

/// Whether the Llama MLP's `silu(gate) * up` takes the fused kernels for `gate`: on CUDA, for
/// the row widths the kernels handle ([`ffi::fused_swiglu_supported`]), unless
/// `BENCH_FUSED_SWIGLU=0` asks for libtorch's silu and product (to compare the two).
pub(crate) fn fused_swiglu_enabled(gate: &Tensor) -> bool {
    gate.device().is_cuda()
        && std::env::var("BENCH_FUSED_SWIGLU").map_or(true, |v| v != "0")
        && ffi::fused_swiglu_supported(gate)
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
        return match ffi::fused_cross_entropy(&logits, &y, IGNORE_INDEX, true, 0) {
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
