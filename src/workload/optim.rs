//! AdamW over fp32 master weights with fp32 state: libtorch's fused CUDA kernel on GPUs
//! (through the shim), the same update written with tensor ops elsewhere.

use tch::{Kind, Tensor};

use super::ffi;
use super::models::Param;

/// AdamW hyper-parameters (GPT-3 / Llama pre-training defaults).
#[derive(Debug, Clone, Copy)]
pub struct AdamWConfig {
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
}

impl AdamWConfig {
    pub fn new(lr: f64) -> Self {
        AdamWConfig {
            lr,
            betas: (0.9, 0.95),
            eps: 1e-8,
            weight_decay: 0.1,
        }
    }
}

/// One parameter group: tensors sharing a weight decay.
struct Group {
    params: Vec<Tensor>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    weight_decay: f64,
    /// The step count on the device, for the fused kernel (one per group so each group's
    /// kernel increments its own).
    step: Tensor,
}

pub struct AdamW {
    cfg: AdamWConfig,
    groups: Vec<Group>,
    fused: bool,
    steps: u64,
}

impl AdamW {
    /// `fused` selects libtorch's fused CUDA kernel; it needs every parameter on a GPU.
    pub fn new(params: &[Param], cfg: AdamWConfig, fused: bool) -> AdamW {
        let groups = [true, false]
            .into_iter()
            .filter_map(|decay| {
                let ps: Vec<Tensor> = params
                    .iter()
                    .filter(|p| p.decay == decay)
                    .map(|p| p.tensor.shallow_clone())
                    .collect();
                let first = ps.first()?;
                let device = first.device();
                Some(Group {
                    exp_avg: ps.iter().map(Tensor::zeros_like).collect(),
                    exp_avg_sq: ps.iter().map(Tensor::zeros_like).collect(),
                    params: ps,
                    weight_decay: if decay { cfg.weight_decay } else { 0.0 },
                    step: Tensor::zeros([], (Kind::Float, device)),
                })
            })
            .collect();
        AdamW {
            cfg,
            groups,
            fused,
            steps: 0,
        }
    }

    /// Applies one update from the parameters' `.grad` (parameters without one are skipped
    /// by the unfused path; the fused path expects every gradient to exist).
    pub fn step(&mut self) -> Result<(), String> {
        self.steps += 1;
        let c = self.cfg;
        tch::no_grad(|| {
            for g in &mut self.groups {
                if self.fused {
                    let grads: Vec<Tensor> = g.params.iter().map(Tensor::grad).collect();
                    ffi::fused_adamw(
                        &g.params,
                        &grads,
                        &g.exp_avg,
                        &g.exp_avg_sq,
                        &mut g.step,
                        c.lr,
                        c.betas,
                        g.weight_decay,
                        c.eps,
                    )?;
                    continue;
                }
                let t = self.steps as i32;
                let bc1 = 1.0 - c.betas.0.powi(t);
                let bc2 = 1.0 - c.betas.1.powi(t);
                for ((p, m), v) in g.params.iter().zip(&g.exp_avg).zip(&g.exp_avg_sq) {
                    let grad = p.grad();
                    if !grad.defined() {
                        continue;
                    }
                    let mut p = p.shallow_clone();
                    let (mut m, mut v) = (m.shallow_clone(), v.shallow_clone());
                    if g.weight_decay != 0.0 {
                        let _ = p.g_mul_scalar_(1.0 - c.lr * g.weight_decay);
                    }
                    let _ = m.lerp_(&grad, 1.0 - c.betas.0);
                    let _ = v.g_mul_scalar_(c.betas.1);
                    let _ = v.g_add_(&(grad.square() * (1.0 - c.betas.1)));
                    let denom = (v.sqrt() / bc2.sqrt()) + c.eps;
                    let _ = p.g_sub_(&(m.g_div(&denom) * (c.lr / bc1)));
                }
            }
            Ok(())
        })
    }

    /// Clears every gradient: drops them (`set_to_none`, cheapest for eager steps) or zeroes
    /// them in place, keeping the buffers at fixed addresses as CUDA graphs need.
    pub fn zero_grad(&mut self, set_to_none: bool) -> Result<(), String> {
        for g in &mut self.groups {
            for p in &mut g.params {
                if set_to_none {
                    ffi::set_grad_none(p)?;
                    continue;
                }
                let mut grad = p.grad();
                if grad.defined() {
                    let _ = grad.zero_();
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    #[test]
    fn matches_torch_adamw_formula_on_one_step() {
        // One step from zero state: m = (1-b1) g, v = (1-b2) g^2, bias-corrected
        // m_hat = g, v_hat = g^2, so p <- p (1 - lr wd) - lr g / (|g| + eps).
        let p = Tensor::from_slice(&[1.0f32, -2.0]).set_requires_grad(true);
        (&p * Tensor::from_slice(&[3.0f32, -0.5]))
            .sum(Kind::Float)
            .backward();
        let params = vec![Param {
            name: "p".into(),
            tensor: p.shallow_clone(),
            decay: true,
            place: crate::workload::models::Place::Embed,
        }];
        let cfg = AdamWConfig::new(0.1);
        let mut opt = AdamW::new(&params, cfg, false);
        opt.step().unwrap();
        let got = Vec::<f32>::try_from(&p.detach()).unwrap();
        let want = [
            1.0 * (1.0 - 0.01) - 0.1 * 3.0 / (3.0 + 1e-8),
            -2.0 * (1.0 - 0.01) + 0.1 * 0.5 / (0.5 + 1e-8),
        ];
        for (g, w) in got.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }
        assert_eq!(p.device(), Device::Cpu);
    }
}
