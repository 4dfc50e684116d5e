//! AdamW over fp32 master weights with fp32 state, in one of two layouts:
//!
//! - the parameters are the fp32 masters and the precision context casts them per op:
//!   libtorch's fused CUDA kernel on GPUs (through the shim), the same update written with
//!   tensor ops elsewhere;
//! - [`AdamW::with_masters`] (bf16 on a GPU): the masters and moments move into flat fp32
//!   buffers and the model's parameters become bf16 working copies (views of one flat bf16
//!   buffer), so the forward casts nothing and the backward leaves bf16 gradients. The
//!   shim's own kernel (csrc/fused_adamw.cpp) updates the masters from those gradients and
//!   writes the working copy in the same pass: 28 bytes a parameter a step instead of the 40
//!   of a gradient cast, libtorch's fused update and a weight cast. With gradient
//!   accumulation each micro-batch's bf16 gradients are added into an fp32 buffer, so the
//!   sum keeps fp32 precision as it does in the first layout.

use std::cell::Cell;
use std::ffi::c_void;

use tch::{Kind, Tensor};

use super::ffi::{self, MasterBuffers, MasterMode};
use super::models::Param;

/// Alignment of every parameter in the flat master buffers, in elements (128 bytes of
/// bf16), so the kernel's vector accesses and the working views stay aligned.
const MASTER_ALIGN: i64 = 64;

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
    /// The flat-buffer layout ([`AdamW::with_masters`]); `groups` is empty then.
    masters: Option<Masters>,
}

/// The flat buffers DDP and FSDP already keep for a rank's slices, for
/// [`AdamW::over_slices`].
pub(crate) struct Slices {
    /// The rank's fp32 masters.
    pub master: Tensor,
    /// Their bf16 copy (FSDP's all-gather source, DDP's working parameters), which the
    /// kernel writes in the same pass as the masters.
    pub work: Tensor,
    /// fp32 gradient sums across micro-batches, when the step accumulates.
    pub acc: Option<Tensor>,
}

/// fp32 masters, moments and (with accumulation) gradient sums in flat buffers, behind the
/// model's bf16 working parameters.
struct Masters {
    /// The model's parameters, now bf16 views of `work`.
    params: Vec<Tensor>,
    /// Whether the parameters' `.grad` are fixed views that the caller refills (DDP's and
    /// FSDP's reduced slices), so they stay attached after each accumulation instead of
    /// being handed back for the next backward to allocate afresh.
    fixed_grads: bool,
    offsets: Vec<i64>,
    numels: Vec<i64>,
    weight_decays: Vec<f64>,
    master: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    work: Tensor,
    acc: Option<Tensor>,
    step: Tensor,
    /// Micro-batches added into `acc` since the last update.
    accumulated: Cell<u32>,
}

impl Masters {
    /// Zeroed moments and step count beside the given flat buffers, with no entries yet:
    /// the constructors fill those in.
    fn moments_for(master: Tensor, work: Tensor, acc: Option<Tensor>) -> Masters {
        let f32opt = (Kind::Float, master.device());
        let total = master.numel() as i64;
        Masters {
            params: Vec::new(),
            fixed_grads: false,
            offsets: Vec::new(),
            numels: Vec::new(),
            weight_decays: Vec::new(),
            exp_avg: Tensor::zeros([total], f32opt),
            exp_avg_sq: Tensor::zeros([total], f32opt),
            acc,
            step: Tensor::zeros([], f32opt),
            master,
            work,
            accumulated: Cell::new(0),
        }
    }

    fn buffers(&self) -> MasterBuffers<'_> {
        MasterBuffers {
            master: &self.master,
            exp_avg: &self.exp_avg,
            exp_avg_sq: &self.exp_avg_sq,
            work: &self.work,
            acc: self.acc.as_ref(),
            step: &self.step,
        }
    }

    /// The parameters' current gradients; every parameter must have one.
    fn grads(&self) -> Result<Vec<Tensor>, String> {
        (0..self.params.len()).map(|i| self.grad(i)).collect()
    }

    /// Parameter `i`'s current gradient, which must exist.
    fn grad(&self, i: usize) -> Result<Tensor, String> {
        let p = self
            .params
            .get(i)
            .ok_or_else(|| format!("master AdamW: no entry {i}"))?;
        let g = p.grad();
        if g.defined() {
            Ok(g)
        } else {
            Err(format!("master AdamW: parameter {i} got no gradient"))
        }
    }
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
            masters: None,
        }
    }

    /// The flat-buffer layout (module doc): copies the fp32 `params` (contiguous, on one
    /// CUDA device) into flat masters and re-points each at its bf16 view of the working
    /// buffer. `accumulate` keeps an fp32 gradient-sum buffer for [`AdamW::accumulate`].
    pub fn with_masters(
        params: &[Param],
        cfg: AdamWConfig,
        accumulate: bool,
    ) -> Result<AdamW, String> {
        let first = params
            .first()
            .ok_or("master AdamW: no parameters")?
            .tensor
            .shallow_clone();
        let device = first.device();
        if !device.is_cuda() {
            return Err("master AdamW: the kernel needs CUDA parameters".into());
        }
        let (mut offsets, mut numels, mut weight_decays) = (vec![], vec![], vec![]);
        let mut end = 0i64;
        for p in params {
            let t = &p.tensor;
            if t.kind() != Kind::Float || t.device() != device || !t.is_contiguous() {
                return Err(format!(
                    "master AdamW: {} is not a contiguous fp32 tensor on {device:?}",
                    p.name
                ));
            }
            let off = (end + MASTER_ALIGN - 1) / MASTER_ALIGN * MASTER_ALIGN;
            offsets.push(off);
            numels.push(t.numel() as i64);
            weight_decays.push(if p.decay { cfg.weight_decay } else { 0.0 });
            end = off + t.numel() as i64;
        }
        let total = (end + MASTER_ALIGN - 1) / MASTER_ALIGN * MASTER_ALIGN;
        let f32opt = (Kind::Float, device);
        let master = Tensor::zeros([total], f32opt);
        let work = tch::no_grad(|| {
            for ((p, &off), &n) in params.iter().zip(&offsets).zip(&numels) {
                master.narrow(0, off, n).copy_(&p.tensor.reshape([-1]));
            }
            master.to_kind(Kind::BFloat16)
        });
        let mut views = Vec::with_capacity(params.len());
        for ((p, &off), &n) in params.iter().zip(&offsets).zip(&numels) {
            let mut t = p.tensor.shallow_clone();
            // The old fp32 storage goes with the last reference to it; the model's own
            // handle shares this TensorImpl and sees the bf16 view.
            t.set_data(&work.narrow(0, off, n).view(p.tensor.size().as_slice()));
            views.push(t);
        }
        let acc = accumulate.then(|| Tensor::zeros([total], f32opt));
        Ok(AdamW::flat(
            cfg,
            Masters {
                params: views,
                fixed_grads: false,
                offsets,
                numels,
                weight_decays,
                ..Masters::moments_for(master, work, acc)
            },
        ))
    }

    /// The kernel's layout over buffers DDP or FSDP already own: entry i is `pieces[i]`, a
    /// bf16 view of `slices.work` starting at `offsets[i]` whose `.grad` is a fixed bf16
    /// view of the reduced gradients. Only the moments (and the step count) are new.
    pub(crate) fn over_slices(
        pieces: &[Param],
        offsets: Vec<i64>,
        slices: Slices,
        cfg: AdamWConfig,
    ) -> Result<AdamW, String> {
        let Slices { master, work, acc } = slices;
        if pieces.len() != offsets.len() {
            return Err("master AdamW: one offset per slice piece is needed".into());
        }
        if !master.device().is_cuda() || work.kind() != Kind::BFloat16 {
            return Err("master AdamW: the kernel needs CUDA masters and a bf16 copy".into());
        }
        Ok(AdamW::flat(
            cfg,
            Masters {
                params: pieces.iter().map(|p| p.tensor.shallow_clone()).collect(),
                fixed_grads: true,
                numels: pieces.iter().map(|p| p.tensor.numel() as i64).collect(),
                weight_decays: pieces
                    .iter()
                    .map(|p| if p.decay { cfg.weight_decay } else { 0.0 })
                    .collect(),
                offsets,
                ..Masters::moments_for(master, work, acc)
            },
        ))
    }

    /// The flat layout over `masters`.
    fn flat(cfg: AdamWConfig, masters: Masters) -> AdamW {
        AdamW {
            cfg,
            groups: Vec::new(),
            fused: true,
            steps: 0,
            masters: Some(masters),
        }
    }

    /// After a micro-batch's backward under gradient accumulation: adds the parameters'
    /// gradients into the fp32 sum (the first micro-batch of a step overwrites it) and drops
    /// them, so the next backward hands fresh ones over. Nothing to do in the first layout,
    /// where the backward itself adds into the fp32 `.grad`.
    pub fn accumulate(&self) -> Result<(), String> {
        let Some(m) = &self.masters else {
            return Ok(());
        };
        if m.acc.is_none() {
            return Err("master AdamW: built without an accumulation buffer".into());
        }
        let mode = match m.accumulated.get() {
            0 => MasterMode::AccAssign,
            _ => MasterMode::AccAdd,
        };
        let grads = m.grads()?;
        ffi::master_adamw(
            &grads,
            &m.offsets,
            &m.numels,
            &m.weight_decays,
            &m.buffers(),
            self.cfg.lr,
            self.cfg.betas,
            self.cfg.eps,
            mode,
            None,
        )?;
        drop(grads);
        if !m.fixed_grads {
            for p in &m.params {
                ffi::set_grad_none(&mut p.shallow_clone())?;
            }
        }
        m.accumulated.set(m.accumulated.get() + 1);
        Ok(())
    }

    /// Whether the update can overlap the backward ([`super::overlap`]): the flat layout
    /// over the model's own parameters (the plain loop's), without gradient accumulation.
    pub(crate) fn can_overlap(&self) -> bool {
        matches!(&self.masters, Some(m) if !m.fixed_grads && m.acc.is_none())
    }

    /// Counts a step on the device (on the current stream) before its first
    /// [`AdamW::update_entries`]: the kernel's bias corrections read the count.
    pub(crate) fn count_step(&mut self) -> Result<(), String> {
        let m = self
            .masters
            .as_ref()
            .ok_or("master AdamW: counting a step needs the flat layout")?;
        self.steps += 1;
        tch::no_grad(|| {
            let _ = m.step.shallow_clone().g_add_scalar_(1.0);
        });
        Ok(())
    }

    /// Updates the entries `idx` (indices into the parameters given to
    /// [`AdamW::with_masters`]) from their gradients, queued on `stream`; the step must be
    /// counted already. Every entry must have its gradient.
    pub(crate) fn update_entries(&self, idx: &[usize], stream: *mut c_void) -> Result<(), String> {
        let m = self
            .masters
            .as_ref()
            .ok_or("master AdamW: a partial update needs the flat layout")?;
        let mut grads = Vec::with_capacity(idx.len());
        let (mut offsets, mut numels, mut decays) = (vec![], vec![], vec![]);
        for &i in idx {
            grads.push(m.grad(i)?);
            offsets.push(m.offsets[i]);
            numels.push(m.numels[i]);
            decays.push(m.weight_decays[i]);
        }
        ffi::master_adamw(
            &grads,
            &offsets,
            &numels,
            &decays,
            &m.buffers(),
            self.cfg.lr,
            self.cfg.betas,
            self.cfg.eps,
            MasterMode::UpdateCounted,
            Some(stream),
        )
    }

    /// Views of the fp32 masters, one per parameter in the order given, when they live in
    /// flat buffers; `None` in the first layout (the parameters are the masters).
    pub fn master_views(&self) -> Option<Vec<Tensor>> {
        let m = self.masters.as_ref()?;
        Some(
            m.params
                .iter()
                .zip(m.offsets.iter().zip(&m.numels))
                .map(|(p, (&off, &n))| m.master.narrow(0, off, n).view(p.size().as_slice()))
                .collect(),
        )
    }

    /// The sum and the sum of squares of the fp32 masters when they live in flat buffers
    /// (their padding is zero), `None` in the first layout.
    pub(crate) fn master_checksum(&self) -> Option<(f64, f64)> {
        let m = self.masters.as_ref()?;
        tch::no_grad(|| {
            let d = m.master.to_kind(Kind::Double);
            Some((
                d.sum(Kind::Double).double_value(&[]),
                d.square().sum(Kind::Double).double_value(&[]),
            ))
        })
    }

    /// Applies one update from the parameters' `.grad` (parameters without one are skipped
    /// by the unfused path; the fused path expects every gradient to exist).
    pub fn step(&mut self) -> Result<(), String> {
        self.steps += 1;
        let c = self.cfg;
        if let Some(m) = &self.masters {
            let (grads, mode) = match m.accumulated.replace(0) {
                0 => (m.grads()?, MasterMode::Update),
                _ => (Vec::new(), MasterMode::UpdateFromAcc),
            };
            return ffi::master_adamw(
                &grads,
                &m.offsets,
                &m.numels,
                &m.weight_decays,
                &m.buffers(),
                c.lr,
                c.betas,
                c.eps,
                mode,
                None,
            );
        }
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
        let params = match &mut self.masters {
            // The caller owns fixed gradient views and refills them every micro-batch.
            Some(m) if m.fixed_grads => {
                m.accumulated.set(0);
                return Ok(());
            }
            Some(m) => {
                m.accumulated.set(0);
                m.params.iter_mut().collect::<Vec<_>>()
            }
            None => self
                .groups
                .iter_mut()
                .flat_map(|g| g.params.iter_mut())
                .collect(),
        };
        for p in params {
            if set_to_none {
                ffi::set_grad_none(p)?;
                continue;
            }
            let mut grad = p.grad();
            if grad.defined() {
                let _ = grad.zero_();
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
