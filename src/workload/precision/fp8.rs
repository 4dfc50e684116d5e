//! fp8 linear layers: `_scaled_mm` with per-tensor scaling, e4m3 for activations and
//! weights in the forward pass and e5m2 for the incoming gradients, as a libtorch custom
//! autograd Function in the C++ shim (tch has no custom autograd functions).
//!
//! Scaling is delayed by default, as Transformer Engine's and torchao's delayed recipes do:
//! each tensor is scaled by the largest absolute maximum its linear saw for that operand
//! over the last 16 steps, its own maximum recorded by the quantization kernel in the same
//! pass, so no separate reduction runs (the first step, before any history exists, scales
//! dynamically). `BENCH_FP8_SCALING=dynamic` scales every tensor by its own absolute
//! maximum instead, one reduction pass before each quantization. Delayed became the
//! default after H100 runs (2026-11-27, docs/perf-notes.md) measured it 2.0-3.0% faster on
//! the Llama proxy and 10.4% on gpt2-1.5b, with losses within 0.1% of dynamic scaling's.

use std::cell::Cell;

use tch::{Device, Kind, Tensor};

use crate::workload::ffi;

/// Linear layers a block may have (the Llama block's seven, GPT-2's four, and room).
const SITES_PER_BLOCK: usize = 8;

/// How tensors are scaled into fp8 (`BENCH_FP8_SCALING`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scaling {
    /// By the amax history of earlier steps, recorded during quantization (the default).
    Delayed,
    /// By each tensor's own amax, one reduction before each quantization.
    Dynamic,
}

impl Scaling {
    /// The scaling `BENCH_FP8_SCALING` asks for (`delayed` when unset).
    pub fn from_env() -> Result<Scaling, String> {
        Scaling::parse(std::env::var("BENCH_FP8_SCALING").ok().as_deref())
    }

    /// The scaling a `BENCH_FP8_SCALING` value names.
    pub fn parse(value: Option<&str>) -> Result<Scaling, String> {
        match value {
            None | Some("") | Some("delayed") => Ok(Scaling::Delayed),
            Some("dynamic") => Ok(Scaling::Dynamic),
            Some(other) => Err(format!(
                "BENCH_FP8_SCALING={other:?}: expected `delayed` (the default) or `dynamic`"
            )),
        }
    }
}

/// Which linear of the model a matmul is: its delayed-scaling state is per linear.
#[derive(Debug, Clone, Copy)]
pub enum Site {
    /// Block `i`'s `k`-th linear (k below 8, in the block's call order).
    Block(usize, usize),
    /// The output head.
    Head,
}

/// The delayed-scaling state of every fp8 linear of one model: `[sites, 3, cols]` fp32 on
/// the device, a row per operand (x, w, the incoming gradient) of [scale, 1 / scale, this
/// step's amax, the amax of the steps before] (csrc/shim.cpp's quantize_t). One tensor, so
/// that one roll per optimizer step turns every row over, and its address never changes,
/// so a captured CUDA graph reads and writes the same state on every replay.
pub struct DelayedScaling {
    st: Tensor,
    layers: usize,
    /// Whether a roll has filled the scales; until then the linears scale dynamically.
    primed: Cell<bool>,
}

impl DelayedScaling {
    pub fn new(layers: usize, device: Device) -> DelayedScaling {
        let sites = (layers * SITES_PER_BLOCK + 1) as i64;
        DelayedScaling {
            st: Tensor::zeros([sites, 3, ffi::fp8_scaling_cols()], (Kind::Float, device)),
            layers,
            primed: Cell::new(false),
        }
    }

    fn index(&self, site: Site) -> i64 {
        match site {
            Site::Block(i, k) => {
                assert!(
                    i < self.layers && k < SITES_PER_BLOCK,
                    "fp8 site {site:?} outside the model's {} blocks",
                    self.layers
                );
                (i * SITES_PER_BLOCK + k) as i64
            }
            Site::Head => (self.layers * SITES_PER_BLOCK) as i64,
        }
    }

    /// After an optimizer step: the next step's scales from the history, this step's amax
    /// into it.
    pub fn roll(&self) -> Result<(), String> {
        ffi::fp8_roll(&self.st)?;
        self.primed.set(true);
        Ok(())
    }

    /// The state of every linear, for tests.
    pub fn state(&self) -> &Tensor {
        &self.st
    }
}

/// `x @ w^T` for x `[.., K]` (bf16) and w `[N, K]` (bf16 or the fp32 master); the result is
/// `[.., N]` in x's dtype and w's gradient comes back in w's dtype. With `delayed`, the
/// linear at `site` scales by its history.
///
/// Panics with the shim's message when the matmul fails (e.g. shapes not multiples of 16);
/// the worker's panic boundary turns that into an error event.
pub(crate) fn linear(
    x: &Tensor,
    w: &Tensor,
    delayed: Option<&DelayedScaling>,
    site: Site,
) -> Tensor {
    let size = x.size();
    let k = *size.last().unwrap_or(&0);
    let x2 = x.reshape([-1, k]);
    let state = delayed.map(|d| (d.st.get(d.index(site)), d.primed.get()));
    let y = match ffi::fp8_linear(&x2, w, state.as_ref().map(|(st, p)| (st, *p))) {
        Ok(y) => y,
        Err(e) => panic!("fp8 linear failed: {e}"),
    };
    let mut out = size.clone();
    if let Some(last) = out.last_mut() {
        *last = w.size()[0];
    }
    y.reshape(out.as_slice())
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use tch::{Device, Kind, Tensor};

    use super::*;
    use crate::workload::models::{self, presets, Model};
    use crate::workload::precision::{Ctx, Precision};

    /// Loss and gradients of one forward and backward (libtorch has a CPU `_scaled_mm`, and
    /// the shim quantizes by libtorch's product and cast where its kernels do not run).
    fn loss_and_grads(model: &dyn Model, ctx: &Ctx, x: &Tensor, y: &Tensor) -> (f64, Vec<Tensor>) {
        for p in model.params() {
            let mut g = p.tensor.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        let loss = model.forward_loss(ctx, x, y);
        loss.backward();
        let grads = model
            .params()
            .iter()
            .map(|p| p.tensor.grad().copy())
            .collect();
        (loss.double_value(&[]), grads)
    }

    #[test]
    fn delayed_scaling_by_a_history_of_the_same_tensors_equals_dynamic_scaling() {
        // Unprimed, delayed scaling is dynamic scaling that also records every operand's
        // amax at its own site; after a roll, a step over the same batch and weights is
        // scaled by exactly those maxima, so losses and gradients are dynamic's to the bit.
        // Two linears sharing a site would take the larger maximum of the two and differ.
        for (name, used) in [("gpt2-tiny", 4), ("llama-tiny", 7)] {
            let cfg = presets::get(name).unwrap();
            tch::manual_seed(3);
            let model = models::build(&cfg, 32, Device::Cpu, Kind::BFloat16);
            let x = Tensor::randint(cfg.vocab, [2, 32], (Kind::Int64, Device::Cpu));
            let y = Tensor::randint(cfg.vocab, [2, 32], (Kind::Int64, Device::Cpu));
            // The head stays in bf16 whatever BENCH_FP8_HEAD says in this process.
            let mut dynamic = Ctx::new(Precision::Fp8);
            dynamic.fp8_head = false;
            let state = Rc::new(DelayedScaling::new(cfg.layers as usize, Device::Cpu));
            let mut delayed = dynamic.clone();
            delayed.delayed = Some(state.clone());
            let (l0, g0) = loss_and_grads(model.as_ref(), &dynamic, &x, &y);
            let (l1, g1) = loss_and_grads(model.as_ref(), &delayed, &x, &y);
            assert_eq!(l0, l1, "{name}: unprimed");
            // Every block linear recorded its three operands' maxima; nothing else did.
            let st = state.state();
            for site in 0..st.size()[0] {
                let (block, k) = (
                    site as usize / SITES_PER_BLOCK,
                    site as usize % SITES_PER_BLOCK,
                );
                let want = block < cfg.layers as usize && k < used;
                for operand in 0..3 {
                    let amax = st.double_value(&[site, operand, 2]);
                    assert_eq!(
                        amax > 0.0,
                        want,
                        "{name} site {site} operand {operand}: {amax}"
                    );
                }
            }
            state.roll().unwrap();
            let (l2, g2) = loss_and_grads(model.as_ref(), &delayed, &x, &y);
            assert_eq!(l0, l2, "{name}: primed by the same tensors' history");
            for (i, p) in model.params().iter().enumerate() {
                assert!(g0[i].equal(&g1[i]), "{name} {}: unprimed gradient", p.name);
                assert!(g0[i].equal(&g2[i]), "{name} {}: primed gradient", p.name);
            }
            // Primed, the state's scales are what the quantizations use: 2^-10 of them for
            // one operand (and 2^10 of the inverses) pushes small values under fp8's
            // smallest and changes the results, in the forward for x and w, in the backward
            // only for the incoming gradient. Each roll restores the scales from the
            // history, which holds the same maxima.
            for operand in 0..3i64 {
                state.roll().unwrap();
                tch::no_grad(|| {
                    let row = st.narrow(1, operand, 1);
                    let _ = row.narrow(2, 0, 1).multiply_scalar_(2f64.powi(-10));
                    let _ = row.narrow(2, 1, 1).multiply_scalar_(2f64.powi(10));
                });
                let (l, g) = loss_and_grads(model.as_ref(), &delayed, &x, &y);
                let grads_differ = g.iter().zip(&g0).any(|(a, b)| !a.equal(b));
                if operand < 2 {
                    assert_ne!(l, l0, "{name}: operand {operand}'s scale unused");
                } else {
                    assert_eq!(l, l0, "{name}: the gradient's scale in the forward");
                }
                assert!(grads_differ, "{name}: operand {operand}'s scale unused");
            }
        }
    }

    #[test]
    fn the_scaling_switch_names_its_values() {
        assert_eq!(Scaling::parse(None), Ok(Scaling::Delayed));
        assert_eq!(Scaling::parse(Some("")), Ok(Scaling::Delayed));
        assert_eq!(Scaling::parse(Some("dynamic")), Ok(Scaling::Dynamic));
        assert_eq!(Scaling::parse(Some("delayed")), Ok(Scaling::Delayed));
        let e = Scaling::parse(Some("late")).unwrap_err();
        assert!(
            e.contains("BENCH_FP8_SCALING") && e.contains("delayed"),
            "{e}"
        );
    }
}
