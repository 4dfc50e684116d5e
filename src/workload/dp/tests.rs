//! CPU tests of the data-parallel mechanics over one rank: the block-by-block schedule and
//! the optimizer over the slices against plain training.

use super::*;
use crate::workload::models::{self, presets, Model};
use crate::workload::precision::{Ctx, Precision};

/// Two models with equal weights. Tests run on parallel threads and the seed is
/// global, so the second copies the first instead of relying on the seed.
fn twins(cfg: &presets::ModelConfig) -> (Box<dyn Model>, Box<dyn Model>) {
    let a = models::build(cfg, 16, Device::Cpu, Kind::Float);
    let b = models::build(cfg, 16, Device::Cpu, Kind::Float);
    tch::no_grad(|| {
        for (pa, pb) in a.params().iter().zip(b.params()) {
            pb.tensor.shallow_clone().copy_(&pa.tensor);
        }
    });
    (a, b)
}

/// Takes over `model`'s fp32 parameters as one rank on the CPU: local copies for
/// collectives and libtorch's AdamW over the slices (the kernel needs CUDA).
fn one_rank_on_cpu(sharding: Sharding, model: &dyn Model) -> DataParallel<'static> {
    DataParallel::new(
        Comms::Local,
        sharding,
        Update::Separate,
        model.params(),
        model.config().layers as usize,
        Kind::Float,
        Device::Cpu,
    )
    .unwrap()
}

fn grads_of(model: &dyn Model) -> Vec<Tensor> {
    model
        .params()
        .iter()
        .map(|p| p.tensor.grad().copy())
        .collect()
}

/// One rank on the CPU: the block-by-block forward and backward, sharded or not, give
/// the plain run's loss and gradients, with and without checkpointing; under FSDP the
/// storage of every unit is released between uses.
#[test]
fn one_rank_matches_plain_training_on_cpu() {
    for (name, sharding) in [
        ("gpt2-tiny", Sharding::Sharded),
        ("llama-tiny", Sharding::Sharded),
        ("llama-tiny", Sharding::Replicated),
    ] {
        let mut cfg = presets::get(name).unwrap();
        cfg.layers = 3;
        let (plain, sharded) = twins(&cfg);
        let ctx = Ctx::new(Precision::Fp32);
        let x = Tensor::randint(cfg.vocab, [2, 16], (Kind::Int64, Device::Cpu));
        let y = Tensor::randint(cfg.vocab, [2, 16], (Kind::Int64, Device::Cpu));
        let want_loss = plain.forward_loss(&ctx, &x, &y);
        want_loss.backward();
        let want = grads_of(plain.as_ref());

        let f = one_rank_on_cpu(sharding, sharded.as_ref());
        let released = |t: &Tensor| ffi::storage_nbytes(t).unwrap() == 0;
        for u in &f.units {
            assert_eq!(released(&u.full), sharding == Sharding::Sharded);
            // No memory for the reduced gradients before the first backward.
            assert!(released(&u.reduced) && !u.reduced_live.get());
        }
        for sac_every in [None, Some(1), Some(2)] {
            f.zero_grads();
            let loss = f
                .forward_backward(sharded.as_ref(), &ctx, &x, &y, sac_every, 1.0)
                .unwrap();
            assert!(
                (loss.double_value(&[]) - want_loss.double_value(&[])).abs() < 1e-6,
                "{name} {sac_every:?}: {} vs {}",
                loss.double_value(&[]),
                want_loss.double_value(&[])
            );
            for u in &f.units {
                assert_eq!(released(&u.full), sharding == Sharding::Sharded);
                assert!(released(&u.grad));
                // The reduced gradients hold memory from the backward to the step.
                assert_eq!(
                    ffi::storage_nbytes(&u.reduced).unwrap(),
                    u.layout.shard * 4,
                    "{name}"
                );
                // The backward's own gradients were copied out and dropped.
                assert!(u.params.iter().all(|p| !p.grad().defined()));
                // The padding stays zero, so the masters' padding does too.
                for gap in &u.gaps {
                    let g = f.grad32.as_ref().unwrap().narrow(
                        0,
                        (u.shard_off + gap.start) as i64,
                        gap.len() as i64,
                    );
                    assert_eq!(g.abs().sum(Kind::Double).double_value(&[]), 0.0);
                }
            }
            // Scatter the fp32 gradient slices back to parameter order and compare.
            for (unit, _) in f.units.iter().zip(0..) {
                for s in &unit.layout.slots {
                    let got = f.grad32.as_ref().unwrap().narrow(
                        0,
                        (unit.shard_off + s.offset) as i64,
                        s.numel as i64,
                    );
                    let w = want[s.param].reshape([-1]);
                    let diff = (&got - &w).abs().max().double_value(&[]);
                    let scale = w.abs().max().double_value(&[]).max(1e-12);
                    assert!(
                        diff <= 1e-5 * scale,
                        "{name} {sac_every:?} {}: {diff} (scale {scale})",
                        plain.params()[s.param].name
                    );
                }
            }
        }
    }
}

/// The optimizer over the slices moves the masters as AdamW over the whole parameters
/// does, and the gathered weights follow after `after_step`.
#[test]
fn one_rank_optimizer_steps_match_plain_adamw_on_cpu() {
    let mut cfg = presets::get("gpt2-tiny").unwrap();
    cfg.layers = 2;
    for sharding in [Sharding::Sharded, Sharding::Replicated] {
        optimizer_steps_match(&cfg, sharding);
    }
}

fn optimizer_steps_match(cfg: &presets::ModelConfig, sharding: Sharding) {
    let (plain, sharded) = twins(cfg);
    let ctx = Ctx::new(Precision::Fp32);
    let f = one_rank_on_cpu(sharding, sharded.as_ref());
    let mut opt_plain = AdamW::new(plain.params(), AdamWConfig::new(1e-2), false);
    let mut opt_sharded = f.optimizer(AdamWConfig::new(1e-2)).unwrap();
    for step in 0..3 {
        let x = Tensor::randint(cfg.vocab, [2, 16], (Kind::Int64, Device::Cpu));
        opt_plain.zero_grad(true).unwrap();
        plain.forward_loss(&ctx, &x, &x).backward();
        opt_plain.step().unwrap();
        f.zero_grads();
        let _ = f
            .forward_backward(sharded.as_ref(), &ctx, &x, &x, None, 1.0)
            .unwrap();
        opt_sharded.step().unwrap();
        f.after_step().unwrap();
        // The step handed the reduced gradients' memory back until the next backward.
        assert!(f
            .units
            .iter()
            .all(|u| ffi::storage_nbytes(&u.reduced).unwrap() == 0 && !u.reduced_live.get()));
        let (s, q) = f.param_checksum().unwrap();
        let (ws, wq) = param_checksum(plain.params());
        let close = |a: f64, b: f64| (a - b).abs() < 1e-6 * b.abs().max(1.0);
        assert!(close(s, ws), "{sharding:?} step {step}: {s} vs {ws}");
        assert!(close(q, wq), "{sharding:?} step {step}: {q} vs {wq}");
        // DDP's working weights are the masters, refreshed after the step.
        if sharding == Sharding::Replicated {
            let (ps, pq) = param_checksum(sharded.params());
            assert!(close(ps, ws) && close(pq, wq), "{ps} {pq} vs {ws} {wq}");
        }
    }
}
