//! Precision policies: which dtype the model computes in, with fp32 master weights always.
//!
//! Parameters (and the AdamW state) stay fp32. Under bf16 each op casts the weights it uses
//! to bf16 inside the autograd graph, so gradients arrive in the fp32 parameters' `.grad`
//! exactly as autocast would deliver them, and recomputation (sac) repeats the casts. Under
//! fp8 the block linears' matmuls additionally run through `_scaled_mm` (see [`fp8`]);
//! embeddings, norms and attention stay bf16, and so does the output head unless
//! `BENCH_FP8_HEAD=1` (the head is the widest GEMM of a large-vocabulary model, and the
//! one torchao and torchtitan leave in bf16 by default for the loss's sake).

pub mod fp8;

use std::rc::Rc;

use tch::{Device, Kind, Tensor};

pub use fp8::Site;

/// The `--dtype` of a cell: the shared [`crate::axes::Dtype`], with the libtorch facts the
/// workload needs added here.
pub use crate::axes::Dtype as Precision;

impl Precision {
    /// The dtype activations and matmul inputs are in.
    pub fn compute_kind(self) -> Kind {
        match self {
            Precision::Fp32 => Kind::Float,
            Precision::Bf16 | Precision::Fp8 => Kind::BFloat16,
        }
    }
}

/// What a forward pass needs to know about precision.
#[derive(Clone)]
pub struct Ctx {
    pub kind: Kind,
    pub fp8: bool,
    /// The output head's matmul in fp8 too (`BENCH_FP8_HEAD=1`, fp8 only).
    pub fp8_head: bool,
    /// The fp8 linears' delayed-scaling state (fp8 on a GPU, the default); dynamic scaling
    /// without it (`BENCH_FP8_SCALING=dynamic`, on the CPU, or a forward pass on its own).
    pub delayed: Option<Rc<fp8::DelayedScaling>>,
}

impl Ctx {
    /// Dynamic fp8 scaling, if fp8: for a forward pass on its own (tests, checks).
    pub fn new(p: Precision) -> Ctx {
        let fp8 = p == Precision::Fp8;
        Ctx {
            kind: p.compute_kind(),
            fp8,
            fp8_head: fp8 && std::env::var("BENCH_FP8_HEAD").is_ok_and(|v| v == "1"),
            delayed: None,
        }
    }

    /// For training a model of `layers` blocks on `device`: fp8 scaling as `scaling` says.
    pub fn for_training(p: Precision, layers: usize, device: Device, scaling: fp8::Scaling) -> Ctx {
        let mut ctx = Ctx::new(p);
        if ctx.fp8 && device.is_cuda() && scaling == fp8::Scaling::Delayed {
            ctx.delayed = Some(Rc::new(fp8::DelayedScaling::new(layers, device)));
        }
        ctx
    }

    /// At the end of an optimizer step (inside a captured step too): turns the delayed
    /// scaling's history over.
    pub fn end_step(&self) -> Result<(), String> {
        match &self.delayed {
            Some(d) => d.roll(),
            None => Ok(()),
        }
    }

    /// The tensor in the compute dtype (a differentiable cast, or the tensor itself).
    pub fn cast(&self, t: &Tensor) -> Tensor {
        if t.kind() == self.kind {
            t.shallow_clone()
        } else {
            t.to_kind(self.kind)
        }
    }

    /// A transformer-block linear layer, the `site`-th of its block: fp8 matmul under fp8,
    /// else a plain one.
    pub(crate) fn linear(&self, site: Site, x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Tensor {
        if self.fp8 {
            // The weight goes in as it is (an fp32 master or a bf16 working copy): the shim
            // quantizes it directly, without a cast first.
            let y = fp8::linear(x, w, self.delayed.as_deref(), site);
            match b {
                Some(b) => y + self.cast(b),
                None => y,
            }
        } else {
            self.linear_hp(x, w, b)
        }
    }

    /// The output head: in fp8 only when asked for ([`Ctx::fp8_head`]).
    pub(crate) fn linear_head(&self, x: &Tensor, w: &Tensor) -> Tensor {
        if self.fp8_head {
            fp8::linear(x, w, self.delayed.as_deref(), Site::Head)
        } else {
            self.linear_hp(x, w, None)
        }
    }

    /// A linear layer that never runs in fp8.
    pub(crate) fn linear_hp(&self, x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Tensor {
        x.linear(&self.cast(w), b.map(|b| self.cast(b)))
    }
}
