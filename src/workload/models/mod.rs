//! Decoder-only models on libtorch: GPT-2 ([`gpt2`]) and Llama 3 ([`llama`]), built from the
//! shapes in [`presets`].
//!
//! A model exposes its forward pass in three stages (embedding, one block, head + loss)
//! rather than one call, so that selective activation checkpointing ([`crate::workload::sac`])
//! can cut the graph at block boundaries. Parameters are fp32 leaves that require grad; the
//! precision context casts them per op (see [`crate::workload::precision`]).

pub mod gpt2;
pub mod llama;
pub mod presets;

use tch::{Device, Kind, Tensor};

pub use presets::{Family, ModelConfig};

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
    pub fn new(device: Device, layers: i64) -> Init {
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

    pub fn normal(&mut self, name: String, dims: &[i64], std: f64) -> Tensor {
        let t = Tensor::randn(dims, (Kind::Float, self.device)) * std;
        self.push(name, t, true)
    }

    pub fn ones(&mut self, name: String, dims: &[i64]) -> Tensor {
        let t = Tensor::ones(dims, (Kind::Float, self.device));
        self.push(name, t, false)
    }

    pub fn zeros(&mut self, name: String, dims: &[i64]) -> Tensor {
        let t = Tensor::zeros(dims, (Kind::Float, self.device));
        self.push(name, t, false)
    }
}

/// Mean cross-entropy in fp32 over `[B, T, V]` logits.
pub(crate) fn cross_entropy(logits: &Tensor, y: &Tensor, vocab: i64) -> Tensor {
    logits
        .view([-1, vocab])
        .to_kind(Kind::Float)
        .cross_entropy_loss::<Tensor>(&y.view([-1]), None, tch::Reduction::Mean, -100, 0.0)
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
