//! Model presets (published shapes, proxies with fewer layers, tiny CPU models) and the
//! analytic parameter counts that the FLOPs figures and the tests rely on.

/// Which decoder the preset builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// GPT-2: learned positions, LayerNorm, GELU MLP, biases, tied embeddings.
    Gpt2,
    /// Llama 3: RMSNorm, RoPE, SwiGLU, grouped-query attention, untied output head.
    Llama,
}

/// The shape of one model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub name: &'static str,
    pub family: Family,
    pub layers: i64,
    pub hidden: i64,
    pub heads: i64,
    pub kv_heads: i64,
    pub ffn: i64,
    pub vocab: i64,
    /// GPT-2's learned position table length; the longest sequence the model accepts.
    /// Llama models (RoPE) accept any length; this is their published context.
    pub max_seq: i64,
    pub rope_theta: f64,
    /// Biases on the q, k and v projections (Qwen 2.5).
    pub qkv_bias: bool,
    pub tied_embeddings: bool,
    pub norm_eps: f64,
}

impl ModelConfig {
    pub(crate) fn head_dim(&self) -> i64 {
        self.hidden / self.heads
    }

    /// Parameter count computed from the shape alone (tests check that the built tensors
    /// agree).
    pub(crate) fn n_params(&self) -> u64 {
        let (l, e, f, v) = (self.layers, self.hidden, self.ffn, self.vocab);
        let kv = self.kv_heads * self.head_dim();
        let n = match self.family {
            Family::Gpt2 => {
                let block =
                    2 * e + (3 * e * e + 3 * e) + (e * e + e) + 2 * e + (e * f + f) + (f * e + e);
                v * e + self.max_seq * e + l * block + 2 * e
            }
            Family::Llama => {
                let bias = if self.qkv_bias { e + 2 * kv } else { 0 };
                let block = 2 * e + e * e + 2 * e * kv + bias + e * e + 3 * e * f;
                let head = if self.tied_embeddings { 0 } else { v * e };
                v * e + l * block + e + head
            }
        };
        n as u64
    }

    /// Parameters that take part in matmuls (the `N` of `6N`): all but the position table
    /// and, for untied models, the input embedding (a lookup, not a matmul).
    pub(crate) fn n_matmul_params(&self) -> u64 {
        let (e, v) = (self.hidden as u64, self.vocab as u64);
        match self.family {
            Family::Gpt2 => self.n_params() - self.max_seq as u64 * e,
            Family::Llama if self.tied_embeddings => self.n_params(),
            Family::Llama => self.n_params() - v * e,
        }
    }
}

const fn gpt2(name: &'static str, layers: i64, hidden: i64, heads: i64) -> ModelConfig {
    ModelConfig {
        name,
        family: Family::Gpt2,
        layers,
        hidden,
        heads,
        kv_heads: heads,
        ffn: 4 * hidden,
        // 50257 padded to a multiple of 128, as nanoGPT, llm.c and the PyTorch peer do:
        // the output matmul runs markedly faster and the extra rows are never targets.
        vocab: 50304,
        max_seq: 1024,
        rope_theta: 0.0,
        qkv_bias: true,
        tied_embeddings: true,
        norm_eps: 1e-5,
    }
}

#[allow(clippy::too_many_arguments)]
const fn llama(
    name: &'static str,
    layers: i64,
    hidden: i64,
    heads: i64,
    kv_heads: i64,
    ffn: i64,
    vocab: i64,
    rope_theta: f64,
) -> ModelConfig {
    ModelConfig {
        name,
        family: Family::Llama,
        layers,
        hidden,
        heads,
        kv_heads,
        ffn,
        vocab,
        max_seq: 131_072,
        rope_theta,
        qkv_bias: false,
        tied_embeddings: false,
        norm_eps: 1e-5,
    }
}

/// Every preset, in the order `--list-models` prints them.
pub(crate) fn all() -> Vec<ModelConfig> {
    let l8 = llama("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128_256, 500_000.0);
    let l70 = llama("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128_256, 500_000.0);
    let l405 = llama(
        "llama-3.1-405b",
        126,
        16384,
        128,
        8,
        53248,
        128_256,
        500_000.0,
    );
    let mut qwen = llama("qwen-2.5-7b", 28, 3584, 28, 4, 18944, 152_064, 1_000_000.0);
    qwen.qkv_bias = true;
    qwen.norm_eps = 1e-6;
    qwen.max_seq = 32_768;
    // Proxies keep the full width (so kernels and FLOPs per token per layer are those of the
    // real model) with fewer layers, so one GPU (or a few) can hold them.
    let proxy = |base: &ModelConfig, name: &'static str, layers: i64| ModelConfig {
        name,
        layers,
        ..base.clone()
    };
    let mut gpt2_tiny = gpt2("gpt2-tiny", 2, 64, 4);
    gpt2_tiny.vocab = 512;
    gpt2_tiny.max_seq = 256;
    let mut llama_tiny = llama("llama-tiny", 2, 64, 4, 2, 176, 512, 10_000.0);
    llama_tiny.max_seq = 4096;
    vec![
        gpt2("gpt2-125m", 12, 768, 12),
        gpt2("gpt2-350m", 24, 1024, 16),
        gpt2("gpt2-774m", 36, 1280, 20),
        gpt2("gpt2-1.5b", 48, 1600, 25),
        proxy(&l8, "llama-3.1-8b-proxy", 4),
        proxy(&l70, "llama-3.1-70b-proxy", 2),
        proxy(&l405, "llama-3.1-405b-proxy", 1),
        l8,
        l70,
        l405,
        qwen,
        gpt2_tiny,
        llama_tiny,
    ]
}

/// The preset called `name`.
pub fn get(name: &str) -> Option<ModelConfig> {
    all().into_iter().find(|c| c.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn millions(n: u64) -> f64 {
        n as f64 / 1e6
    }

    #[test]
    fn gpt2_counts_match_published() {
        // The published counts use the unpadded vocabulary of 50257.
        for (name, published_m) in [
            ("gpt2-125m", 124.44),
            ("gpt2-350m", 354.82),
            ("gpt2-774m", 774.03),
            ("gpt2-1.5b", 1557.61),
        ] {
            let mut c = get(name).unwrap();
            c.vocab = 50257;
            let got = millions(c.n_params());
            assert!(
                (got - published_m).abs() < 0.01,
                "{name}: {got}M vs {published_m}M"
            );
        }
    }

    #[test]
    fn llama_counts_match_published() {
        for (name, published_b) in [
            ("llama-3.1-8b", 8.030),
            ("llama-3.1-70b", 70.554),
            ("llama-3.1-405b", 405.853),
            ("qwen-2.5-7b", 7.616),
        ] {
            let got = get(name).unwrap().n_params() as f64 / 1e9;
            assert!(
                (got - published_b).abs() < 0.0015,
                "{name}: {got}B vs {published_b}B"
            );
        }
    }

    #[test]
    fn proxies_keep_width() {
        let p = get("llama-3.1-8b-proxy").unwrap();
        let full = get("llama-3.1-8b").unwrap();
        assert_eq!(
            (p.hidden, p.ffn, p.kv_heads, p.layers),
            (full.hidden, full.ffn, full.kv_heads, 4)
        );
        assert!(all()
            .iter()
            .all(|c| c.hidden % c.heads == 0 && c.heads % c.kv_heads == 0));
    }

    #[test]
    fn matmul_params_exclude_lookups() {
        let g = get("gpt2-125m").unwrap();
        assert_eq!(g.n_params() - g.n_matmul_params(), 1024 * 768);
        let l = get("llama-3.1-8b").unwrap();
        assert_eq!(l.n_params() - l.n_matmul_params(), 128_256 * 4096);
    }
}
