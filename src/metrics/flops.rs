//! Model FLOPs per token, the peak dense FLOP/s table, MFU and derived throughput figures
//! (formulas and sources in DESIGN.md). Pure functions: every caller (the built-in worker,
//! reports of external workers) computes these figures here and nowhere else.

use crate::axes::Dtype;

/// The shape of a dense decoder-only transformer, as far as FLOPs are concerned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct DenseShape {
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    /// Key/value heads (the number of query groups); equal to `heads` without GQA.
    pub kv_heads: u64,
    pub ffn: u64,
    pub vocab: u64,
    /// True for gated MLPs (SwiGLU: three matrices), false for GELU MLPs (two).
    pub gated_mlp: bool,
}

/// Model FLOPs per token in the DESIGN.md form: `6 * N_matmul + 12 * layers * hidden * seq`
/// (forward and backward, causal mask not discounted, recomputation not counted).
pub(crate) fn flops_per_token(n_matmul_params: u64, layers: u64, hidden: u64, seq_len: u64) -> f64 {
    6.0 * n_matmul_params as f64 + 12.0 * (layers * hidden * seq_len) as f64
}

/// Model FLOPs per token in the per-layer form of the published recipes (Megatron-LM's
/// `num_floating_point_operations`): `12 L h^2 (1 + kv_heads/heads + seq/h)` for attention,
/// `18 L ffn h` (gated) or `12 L ffn h` (plain MLP), and `6 vocab h` for the output head.
/// `bench ingest` judges the published recipes' runs with it (`crate::ingest::model`).
pub(crate) fn recipe_flops_per_token(s: &DenseShape, seq_len: u64) -> f64 {
    let (l, h) = (s.layers as f64, s.hidden as f64);
    let attn = 12.0 * l * h * h * (1.0 + s.kv_heads as f64 / s.heads as f64 + seq_len as f64 / h);
    let mlp_mult = if s.gated_mlp { 18.0 } else { 12.0 };
    let mlp = mlp_mult * l * s.ffn as f64 * h;
    let head = 6.0 * s.vocab as f64 * h;
    attn + mlp + head
}

/// A peak dense FLOP/s figure and the words that name it in reports.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Peak {
    pub tflops: f64,
    /// E.g. "H100 SXM bf16 dense 989.4 TFLOP/s".
    pub policy: String,
}

/// Peak dense TFLOP/s of a device for a matmul dtype, from its reported name (e.g.
/// "NVIDIA H100 80GB HBM3"). `None` for devices not in the table (CPUs, unknown GPUs) and
/// for fp32, whose tensor-core peak depends on TF32 settings that we do not use.
///
/// Sources: NVIDIA H100 and H200 datasheets (SXM, dense: bf16 989.4, fp8 1978.9), A100
/// datasheet (bf16 312), AMD MI300X (bf16 1307.4, fp8 2614.9) and MI250X (bf16 383 per
/// module) product pages.
pub(crate) fn peak_tflops(device_name: &str, dtype: Dtype) -> Option<Peak> {
    let n = device_name.to_ascii_uppercase();
    let (label, bf16, fp8): (&str, f64, Option<f64>) = if n.contains("H100") {
        ("H100 SXM", 989.4, Some(1978.9))
    } else if n.contains("H200") {
        ("H200", 989.4, Some(1978.9))
    } else if n.contains("A100") {
        ("A100", 312.0, None)
    } else if n.contains("MI300X") {
        ("MI300X", 1307.4, Some(2614.9))
    } else if n.contains("MI250X") {
        ("MI250X", 383.0, None)
    } else {
        return None;
    };
    let tflops = match dtype {
        Dtype::Bf16 => bf16,
        Dtype::Fp8 => fp8?,
        Dtype::Fp32 => return None,
    };
    Some(Peak {
        tflops,
        policy: format!("{label} {} dense {tflops} TFLOP/s", dtype.name()),
    })
}

/// The peak dense TFLOP/s a device the table does not know (a CPU, a GPU newer than the
/// table) is held to when a framework's figures are checked (`external::bounds`): ten
/// times the fastest peak in the table (MI300X fp8, 2614.9). Loose enough for any
/// accelerator of the next years, and a forged figure (1e302 tokens/s) is still far beyond.
pub(crate) use crate::bounds::UNKNOWN_DEVICE_TFLOPS;

/// Tokens per second of a step: `seq_len * global_batch / step_time`.
pub(crate) fn tokens_per_s(tokens_per_step: u64, step_time_s: f64) -> f64 {
    tokens_per_step as f64 / step_time_s
}

/// Achieved model TFLOP/s per GPU.
pub(crate) fn tflops_per_gpu(tokens_per_s_per_gpu: f64, flops_per_token: f64) -> f64 {
    tokens_per_s_per_gpu * flops_per_token / 1e12
}

/// Days to train on 1e12 tokens at a throughput.
pub(crate) fn days_per_1t_tokens(tokens_per_s: f64) -> f64 {
    1e12 / tokens_per_s / 86_400.0
}

/// The figures that follow from a cell's throughput, computed here once: by the built-in
/// worker for its own summary and by the runner for a cell's metrics, from the same inputs
/// by the same formulas, so that tokens/s, TFLOP/s and MFU of one cell cannot disagree.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Throughput {
    pub tokens_per_s: f64,
    pub tokens_per_s_per_gpu: f64,
    /// Known when the FLOPs of a token are.
    pub tflops_per_gpu: Option<f64>,
    /// Known when the FLOPs of a token and the device's peak are.
    pub mfu: Option<f64>,
    pub days_per_1t_tokens: f64,
}

/// [`Throughput`] of `tokens_per_s` over `world_size` GPUs, with `flops_per_token` and the
/// peak TFLOP/s of one GPU when known.
pub(crate) fn throughput(
    tokens_per_s: f64,
    world_size: u32,
    flops_per_token: Option<f64>,
    peak_tflops: Option<f64>,
) -> Throughput {
    let per_gpu = tokens_per_s / f64::from(world_size.max(1));
    let tflops = flops_per_token.map(|f| tflops_per_gpu(per_gpu, f));
    Throughput {
        tokens_per_s,
        tokens_per_s_per_gpu: per_gpu,
        tflops_per_gpu: tflops,
        mfu: tflops
            .zip(peak_tflops.filter(|p| *p > 0.0))
            .map(|(t, p)| t / p),
        days_per_1t_tokens: days_per_1t_tokens(tokens_per_s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(a: f64, b: f64) -> f64 {
        (a - b).abs() / b
    }

    #[test]
    fn gpt3_175b_per_sequence_matches_published() {
        // GPT-3 175B: 96 layers, hidden 12288, 96 heads, ffn 4h, vocab 50257, seq 2048.
        let s = DenseShape {
            layers: 96,
            hidden: 12288,
            heads: 96,
            kv_heads: 96,
            ffn: 4 * 12288,
            vocab: 50257,
            gated_mlp: false,
        };
        let recipe = recipe_flops_per_token(&s, 2048) * 2048.0;
        assert!(rel(recipe, 2.20e15) < 0.005, "{recipe:e}");
        // The 6N form with N = 174.6e9 matmul parameters agrees.
        let n = 96 * 12 * 12288u64 * 12288 + 50257 * 12288;
        let six_n = flops_per_token(n, 96, 12288, 2048) * 2048.0;
        assert!(rel(six_n, 2.20e15) < 0.005, "{six_n:e}");
    }

    #[test]
    fn llama31_405b_per_sequence_matches_published() {
        // Llama 3.1 405B: 126 layers, hidden 16384, 128 heads, 8 kv heads, ffn 53248,
        // vocab 128256, seq 8192. The published figure is quoted to three digits
        // (2.17e16); the Megatron per-layer form gives 2.151e16, within 1%.
        let s = DenseShape {
            layers: 126,
            hidden: 16384,
            heads: 128,
            kv_heads: 8,
            ffn: 53248,
            vocab: 128256,
            gated_mlp: true,
        };
        let per_seq = recipe_flops_per_token(&s, 8192) * 8192.0;
        assert!(rel(per_seq, 2.17e16) < 0.01, "{per_seq:e}");
    }

    #[test]
    fn peak_table_and_mfu() {
        let p = peak_tflops("NVIDIA H100 80GB HBM3", Dtype::Bf16).unwrap();
        assert_eq!(p.tflops, 989.4);
        assert_eq!(p.policy, "H100 SXM bf16 dense 989.4 TFLOP/s");
        let p8 = peak_tflops("NVIDIA H200", Dtype::Fp8).unwrap();
        assert_eq!(p8.tflops, 1978.9);
        assert!(peak_tflops("NVIDIA A100-SXM4-80GB", Dtype::Fp8).is_none());
        assert!(peak_tflops("cpu", Dtype::Bf16).is_none());
        let t = throughput(2.0 * 494.7e6, 2, Some(1e6), Some(p.tflops));
        assert!((t.tflops_per_gpu.unwrap() - 494.7).abs() < 1e-9);
        assert!((t.mfu.unwrap() - 0.5).abs() < 1e-12);
        assert_eq!(throughput(1.0, 1, None, Some(p.tflops)).mfu, None);
    }

    #[test]
    fn throughput_figures() {
        assert_eq!(tokens_per_s(16 * 1024, 0.5), 32768.0);
        assert!((tflops_per_gpu(1e6, 1e9) - 1000.0).abs() < 1e-9);
        // 1e12 tokens at 1e6 tokens/s take 1e6 s = 11.574 days.
        assert!((days_per_1t_tokens(1e6) - 11.574_074).abs() < 1e-5);
    }
}
