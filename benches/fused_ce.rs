//! Kernel benchmark of the fused cross-entropy (csrc/fused_ce.cpp) against libtorch's path
//! (fp32 cast, log_softmax, nll_loss and their backwards), at the heads of the built-in
//! workload: gpt2-125m at 16x1024 tokens (V = 50304, and the unpadded 50257 whose rows are
//! off the 16-byte grid) and the Llama proxy at 1x8192 (V = 128256), for several block sizes;
//! and of the fused LayerNorm (csrc/fused_ln.cpp) and bias+GELU (csrc/fused_gelu.cpp)
//! against libtorch's at GPT-2's shapes ([16384, 768] and [16384, 1024] norms, the
//! [16384, 3072] MLP pre-activation, bf16). The small ones include the host's launch and
//! autograd overhead; the step profile (`BENCH_PROFILE`) has the kernels alone.
//! Needs a CUDA device (prints a note and exits without one). Reports milliseconds per call
//! (median of 20 timed calls after warm-up, device synchronised around each) and the
//! bandwidth the fused kernels reach counting the bytes they must move: forward one read of
//! the logits, backward one read and one write.
//!
//! `cargo bench --bench fused_ce`, or the built binary on a GPU host.

use std::time::Instant;

use bench::workload::ffi;
use bench::workload::models::IGNORE_INDEX;
use tch::{Cuda, Device, Kind, Tensor};

fn median_ms(mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let mut ts: Vec<f64> = (0..20)
        .map(|_| {
            Cuda::synchronize(0);
            let t0 = Instant::now();
            f();
            Cuda::synchronize(0);
            t0.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ts.sort_by(f64::total_cmp);
    ts[ts.len() / 2]
}

fn main() {
    if !Cuda::is_available() {
        eprintln!("no CUDA device: fused cross-entropy benchmark not run");
        return;
    }
    let dev = Device::Cuda(0);
    println!("| shape | path | threads | fwd ms | fwd+bwd ms | fwd GB/s | bwd GB/s |");
    println!("|---|---|---|---|---|---|---|");
    for (name, n, v) in [
        ("gpt2 16x1024", 16384i64, 50304i64),
        ("gpt2 16x1024 V=50257", 16384, 50257),
        ("llama 1x8192", 8192, 128256),
    ] {
        tch::manual_seed(0);
        let logits = (Tensor::randn([n, v], (Kind::Float, dev)) * 3.0).to_kind(Kind::BFloat16);
        let y = Tensor::randint(v, [n], (Kind::Int64, dev));
        let bytes = (n * v * 2) as f64;

        let x = logits.detach().set_requires_grad(true);
        let mut xr = x.shallow_clone();
        let reference = |xr: &mut Tensor| {
            let loss = xr.to_kind(Kind::Float).cross_entropy_loss::<Tensor>(
                &y,
                None,
                tch::Reduction::Mean,
                IGNORE_INDEX,
                0.0,
            );
            loss.backward();
            ffi::set_grad_none(xr).unwrap();
        };
        let fwd = median_ms(|| {
            tch::no_grad(|| {
                let _ = logits.to_kind(Kind::Float).cross_entropy_loss::<Tensor>(
                    &y,
                    None,
                    tch::Reduction::Mean,
                    IGNORE_INDEX,
                    0.0,
                );
            })
        });
        let both = median_ms(|| reference(&mut xr));
        println!("| {name} | libtorch | | {fwd:.3} | {both:.3} | | |");

        for threads in [0i64, 256, 512, 1024] {
            let fwd = median_ms(|| {
                let _ =
                    ffi::fused_cross_entropy(&logits, &y, IGNORE_INDEX, false, threads).unwrap();
            });
            let mut xf = x.shallow_clone();
            let both = median_ms(|| {
                let loss = ffi::fused_cross_entropy(&xf, &y, IGNORE_INDEX, false, threads).unwrap();
                loss.backward();
                ffi::set_grad_none(&mut xf).unwrap();
            });
            let bwd = both - fwd;
            println!(
                "| {name} | fused | {} | {fwd:.3} | {both:.3} | {:.0} | {:.0} |",
                if threads == 0 {
                    "default".to_string()
                } else {
                    threads.to_string()
                },
                bytes / fwd / 1e6,
                2.0 * bytes / bwd / 1e6,
            );
        }
    }
    layer_norms(dev);
    bias_gelu(dev);
}

/// Forward: one read of x, one write of y. Backward: reads of dy and x, one write of dx.
fn bias_gelu(dev: Device) {
    println!("\n| bias+GELU | path | fwd ms | fwd+bwd ms | fwd GB/s | bwd GB/s |");
    println!("|---|---|---|---|---|---|");
    let (rows, cols) = (16384i64, 3072i64);
    tch::manual_seed(0);
    let x = Tensor::randn([rows, cols], (Kind::Float, dev)).to_kind(Kind::BFloat16);
    let dy = Tensor::randn([rows, cols], (Kind::Float, dev)).to_kind(Kind::BFloat16);
    let mut b = Tensor::zeros([cols], (Kind::Float, dev)).set_requires_grad(true);
    let mut xg = x.detach().set_requires_grad(true);
    let bytes = (rows * cols * 2) as f64;
    for fused in [false, true] {
        // libtorch's side as the model ran it: the bias added in the matmul's epilogue (not
        // timed here: an add stands in, outside the timed backward's bias gradient), GELU,
        // and the bias gradient as a column sum of GELU's input gradient.
        let run = |x: &Tensor, b: &Tensor| -> Tensor {
            if fused {
                ffi::fused_bias_gelu(x, b).unwrap()
            } else {
                (x + b.to_kind(Kind::BFloat16)).gelu("tanh")
            }
        };
        let fwd = median_ms(|| {
            let _ = tch::no_grad(|| run(&x, &b));
        });
        let both = median_ms(|| {
            ffi::backward_with_grad(&run(&xg, &b), &dy).unwrap();
            for t in [&mut xg, &mut b] {
                ffi::set_grad_none(t).unwrap();
            }
        });
        let bwd = both - fwd;
        println!(
            "| [{rows}, {cols}] bf16 | {} | {fwd:.3} | {both:.3} | {:.0} | {:.0} |",
            if fused {
                "fused"
            } else {
                "libtorch (add + GELU)"
            },
            2.0 * bytes / fwd / 1e6,
            3.0 * bytes / bwd / 1e6,
        );
    }
}

/// Forward: one read of x, one write of y. Backward: reads of dy and x, one write of dx.
fn layer_norms(dev: Device) {
    println!("\n| LayerNorm | path | fwd ms | fwd+bwd ms | fwd GB/s | bwd GB/s |");
    println!("|---|---|---|---|---|---|");
    for cols in [768i64, 1024] {
        tch::manual_seed(0);
        let rows = 16384i64;
        let x = Tensor::randn([rows, cols], (Kind::Float, dev)).to_kind(Kind::BFloat16);
        let dy = Tensor::randn([rows, cols], (Kind::Float, dev)).to_kind(Kind::BFloat16);
        let mut w = Tensor::ones([cols], (Kind::Float, dev)).set_requires_grad(true);
        let mut b = Tensor::zeros([cols], (Kind::Float, dev)).set_requires_grad(true);
        let mut xg = x.detach().set_requires_grad(true);
        let bytes = (rows * cols * 2) as f64;
        for fused in [false, true] {
            let run = |x: &Tensor, w: &Tensor, b: &Tensor| -> Tensor {
                if fused {
                    ffi::fused_layer_norm(x, w, b, 1e-5).unwrap()
                } else {
                    // As the model runs it: weights cast to the compute dtype.
                    let (wc, bc) = (w.to_kind(Kind::BFloat16), b.to_kind(Kind::BFloat16));
                    x.layer_norm([cols], Some(&wc), Some(&bc), 1e-5, true)
                }
            };
            let fwd = median_ms(|| {
                let _ = tch::no_grad(|| run(&x, &w, &b));
            });
            let both = median_ms(|| {
                ffi::backward_with_grad(&run(&xg, &w, &b), &dy).unwrap();
                for t in [&mut xg, &mut w, &mut b] {
                    ffi::set_grad_none(t).unwrap();
                }
            });
            let bwd = both - fwd;
            println!(
                "| [{rows}, {cols}] bf16 | {} | {fwd:.3} | {both:.3} | {:.0} | {:.0} |",
                if fused { "fused" } else { "libtorch" },
                2.0 * bytes / fwd / 1e6,
                3.0 * bytes / bwd / 1e6,
            );
        }
    }
}
