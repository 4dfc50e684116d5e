//! What every model is made of: its trainable tensors ([`Param`]) and where the forward
//! pass uses them ([`Place`]), the forward pass cut at block boundaries ([`Model`]), and
//! how parameters are created and initialised ([`Init`]). The models implement and build
//! with these, and the facade in `mod.rs` builds the models, so these live apart from the
//! facade.

use tch::{Device, Kind, Tensor};

use super::presets::ModelConfig;
use crate::workload::precision::Ctx;

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
