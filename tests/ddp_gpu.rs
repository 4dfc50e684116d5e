//! GPU checks of data-parallel training (`bench worker --parallel ddp|fsdp`) with two ranks
//! on two GPUs of this host: DDP's parameters bit-identical on both ranks after several
//! steps; DDP's and FSDP's loss and parameters equal (within bf16 tolerance: gradients are
//! averaged in bf16) to one GPU training on the same global batch, with checkpointing and
//! fp8 too; DDP and FSDP over one rank on one GPU equal to the plain loop; and a rank that
//! dies brings the other down with the distributed exit code instead of leaving it in a
//! collective. On hosts with fewer than two CUDA devices every test is skipped (CI has no
//! GPU) but the one-rank check, which needs one, unless `BENCH_GPU_TESTS=1` says the host has them, when it fails (tests/gpu_gate);
//! scripts/gpu-dist-bench.sh runs this binary.
// The built-in workload only exists in the default build (Cargo feature `builtin`).
#![cfg(feature = "builtin")]

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use bench::events::Event;
use bench::exit::worker as exit;

mod gpu_gate;

fn two_gpus() -> bool {
    gpu_gate::cuda_devices(2, "the two-GPU DDP check")
}

fn bin() -> String {
    // On a GPU host without the Rust toolchain the cargo-built path of `bench` does not
    // exist; BENCH_BIN names the copied binary.
    std::env::var("BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_bench").to_string())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

const COMMON: [&str; 10] = [
    "--model",
    "gpt2-tiny",
    "--warmup",
    "1",
    "--seq-len",
    "64",
    "--micro-batch",
    "4",
    "--synthetic",
    "pattern",
];

/// A worker of `steps` steps, in bf16 unless `extra` names a dtype (clap refuses a flag
/// given twice, so these are set only here).
fn worker(steps: u32, extra: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.arg("worker")
        .args(COMMON)
        .args(["--steps", &steps.to_string()])
        .args(extra)
        .env("BENCH_PARAM_CHECKSUM", "1")
        .env("NCCL_NVLS_ENABLE", "0");
    if !extra.contains(&"--dtype") {
        c.args(["--dtype", "bf16"]);
    }
    for v in bench::dist::rendezvous::ENV_VARS {
        c.env_remove(v);
    }
    c
}

fn rank(parallel: &str, steps: u32, extra: &[&str], r: u32, world: u32, port: u16) -> Command {
    let mut c = worker(steps, extra);
    c.args(["--parallel", parallel])
        .env("RANK", r.to_string())
        .env("LOCAL_RANK", r.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string());
    c
}

fn events(out: &Output) -> Vec<Event> {
    Event::parse_text(&String::from_utf8_lossy(&out.stdout))
}

fn losses(evs: &[Event]) -> Vec<f64> {
    evs.iter()
        .filter_map(|e| match e {
            Event::Step(s) => Some(s.loss),
            _ => None,
        })
        .collect()
}

/// The `(sum, sum of squares)` line the worker prints with BENCH_PARAM_CHECKSUM set.
fn checksum(out: &Output) -> (f64, f64) {
    let err = String::from_utf8_lossy(&out.stderr);
    bench::workload::dp::parse_checksum_line(&err)
        .unwrap_or_else(|| panic!("no checksum line in:\n{err}"))
}

fn wait_all(children: Vec<Child>) -> Vec<Output> {
    children
        .into_iter()
        .map(|c| c.wait_with_output().expect("rank output"))
        .collect()
}

fn spawn(mut c: Command) -> Child {
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("rank starts")
}

/// DDP's two ranks and a one-GPU run of the same global batch, plain, with checkpointing
/// (recomputed blocks) and with fp8.
#[test]
fn two_ranks_stay_identical_and_match_one_gpu_on_the_same_global_batch() {
    if !two_gpus() {
        return;
    }
    let sac: &[&str] = &["--features", "sac", "--sac-every", "1"];
    let fp8: &[&str] = &["--dtype", "fp8"];
    for (extra, tol) in [(&[][..], 1e-2), (sac, 1e-2), (fp8, 3e-2)] {
        println!("ddp {extra:?}");
        check_against_one_gpu("ddp", extra, tol);
    }
}

/// The update split around the step's last collectives (the default under DDP and FSDP:
/// every unit already reduced is updated while block 0's and the embeddings' collectives
/// run, then those two) gives the serial update's (`BENCH_OVERLAP_ADAMW=0`) losses and
/// parameters on two GPUs: the same kernel over the same reduced gradients, in two launches.
#[test]
fn split_update_equals_the_serial_update_on_two_gpus() {
    if !two_gpus() {
        return;
    }
    for parallel in ["ddp", "fsdp"] {
        let run = |split: bool| -> Vec<Output> {
            // The free port is probed, then used: another process may take it in between
            // (seen once on a GPU host after the dead-rank test), so a taken port is tried
            // again with another.
            for _ in 0..3 {
                let port = free_port();
                let children = (0..2)
                    .map(|r| {
                        let mut c = rank(parallel, 6, &[], r, 2, port);
                        if split {
                            c.env_remove("BENCH_OVERLAP_ADAMW");
                        } else {
                            c.env("BENCH_OVERLAP_ADAMW", "0");
                        }
                        spawn(c)
                    })
                    .collect();
                let out = wait_all(children);
                let taken = out.iter().any(|o| {
                    String::from_utf8_lossy(&o.stdout).contains("cannot listen on port")
                        || String::from_utf8_lossy(&o.stderr).contains("cannot listen on port")
                });
                if !taken {
                    return out;
                }
            }
            panic!("{parallel}: three free ports were taken before rank 0 could listen");
        };
        let (serial, split) = (run(false), run(true));
        for o in serial.iter().chain(&split) {
            assert!(
                o.status.success(),
                "{parallel}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let said = |o: &Output| String::from_utf8_lossy(&o.stdout).contains("update is split");
        assert!(
            said(&split[0]) && !said(&serial[0]),
            "{parallel}: the notice"
        );
        let (a, b) = (losses(&events(&serial[0])), losses(&events(&split[0])));
        println!("{parallel} serial {a:?}\n{parallel} split {b:?}");
        assert_eq!(a.len(), 6);
        assert!(a[5] < a[0], "{parallel}: {a:?}");
        // On the H200s the two runs agreed to the last digit (2026-11-27, three times); the
        // tolerance only allows for kernels that vary from run to run. An update that read a
        // gradient before its collective ended would move the parameters by far more. On a
        // model this small the collectives end in microseconds, so a missing wait seldom
        // shows here; DDP's ranks below are the sharper check.
        for (x, y) in a.iter().zip(&b) {
            assert!(
                (x - y).abs() <= 1e-6 * x.abs(),
                "{parallel}: {a:?} vs {b:?}"
            );
        }
        let (cs, cp) = (checksum(&serial[0]), checksum(&split[0]));
        println!("{parallel} checksums serial {cs:?} split {cp:?}");
        assert!(
            (cs.0 - cp.0).abs() <= 1e-9 * cs.1.abs().sqrt().max(1.0)
                && (cs.1 - cp.1).abs() <= 1e-9 * cs.1.abs(),
            "{parallel}: parameters {cs:?} vs {cp:?}"
        );
        if parallel == "ddp" {
            // Both DDP ranks update from the same averaged gradients, so they stay
            // bit-identical; a rank that updated block 0 or the embeddings from its own
            // gradients, before their all-reduce, would not.
            assert_eq!(checksum(&split[0]), checksum(&split[1]), "ddp ranks");
        }
    }
}

/// FSDP's two ranks against one GPU on the same global batch: the gathered weights are
/// the bf16 rounding of the fp32 masters the plain loop casts per op, but the gradients
/// are averaged in bf16 (the plain loop accumulates them in fp32), hence a tolerance.
#[test]
fn fsdp_two_ranks_match_one_gpu_on_the_same_global_batch() {
    if !two_gpus() {
        return;
    }
    let sac: &[&str] = &["--features", "sac", "--sac-every", "2"];
    let fp8: &[&str] = &["--dtype", "fp8"];
    for (extra, tol) in [(&[][..], 1e-2), (sac, 1e-2), (fp8, 3e-2)] {
        println!("fsdp {extra:?}");
        check_against_one_gpu("fsdp", extra, tol);
    }
}

/// The plain loop's fused LayerNorm and bias+GELU kernels read the fp32 master norm
/// weights and biases, while DDP/FSDP hand every kernel their bf16 working weights: two
/// valid precision policies whose parameters drift apart by about a bf16 rounding of the
/// norm weights per step (the parameters' plain sum moved 0.06 in 8 steps of gpt2-tiny).
/// This check is about the data-parallel mechanics, so both sides run those two kernels'
/// libtorch fallbacks, which cast every weight to bf16 alike; the fused kernels have their
/// own checks in tests/worker_gpu.rs, and the fused cross-entropy stays on here.
const SAME_PRECISION: [(&str, &str); 2] = [("BENCH_FUSED_LN", "0"), ("BENCH_FUSED_GELU", "0")];

fn check_against_one_gpu(parallel: &str, extra: &[&str], tol: f64) {
    let port = free_port();
    let outs = wait_all(
        (0..2)
            .map(|r| {
                let mut c = rank(parallel, 8, extra, r, 2, port);
                c.envs(SAME_PRECISION);
                spawn(c)
            })
            .collect(),
    );
    for (r, o) in outs.iter().enumerate() {
        assert!(
            o.status.success(),
            "rank {r}: {:?}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // Only rank 0 reports events.
    assert!(events(&outs[1]).is_empty(), "rank 1 printed events");
    let evs = events(&outs[0]);
    let ddp_losses = losses(&evs);
    assert_eq!(ddp_losses.len(), 8);
    let summary = evs
        .iter()
        .find_map(|e| match e {
            Event::Summary(s) => Some(s.clone()),
            _ => None,
        })
        .expect("a summary");
    assert_eq!(summary.world_size, Some(2));
    assert_eq!(summary.peak_mem_bytes.len(), 2, "{summary:?}");
    assert!(summary.peak_mem_bytes.iter().all(|&b| b > 0));
    let tokens: Vec<u64> = evs
        .iter()
        .filter_map(|e| match e {
            Event::Step(s) => Some(s.tokens),
            _ => None,
        })
        .collect();
    assert!(tokens.iter().all(|&t| t == 2 * 4 * 64), "{tokens:?}");

    // DDP: each rank's own weights, which must agree bit for bit. FSDP: the masters'
    // sums over all ranks' slices, which every rank prints alike.
    let (c0, c1) = (checksum(&outs[0]), checksum(&outs[1]));
    println!("{parallel} checksums: rank 0 {c0:?}, rank 1 {c1:?}");
    assert_eq!(c0, c1, "parameters differ between ranks");

    // One GPU with grad_accum 2 sees the same eight sequences per step.
    let single = worker(
        8,
        &[&["--grad-accum", "2", "--device", "cuda:0"][..], extra].concat(),
    )
    .envs(SAME_PRECISION)
    .output()
    .expect("single run");
    assert!(
        single.status.success(),
        "{}",
        String::from_utf8_lossy(&single.stderr)
    );
    let single_losses = losses(&events(&single));
    println!("losses {parallel} {ddp_losses:?}\n    single {single_losses:?}");
    for (a, b) in ddp_losses.iter().zip(&single_losses) {
        assert!(
            (a - b).abs() <= tol * b.abs(),
            "{parallel} {a} vs single {b}"
        );
    }
    // The loss must have moved, or equality would prove nothing about the updates.
    assert!(ddp_losses[7] < ddp_losses[0] * 0.98, "{ddp_losses:?}");
    let cs = checksum(&single);
    println!("single checksum {cs:?}");
    let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-12);
    assert!(
        rel(c0.1, cs.1) < tol / 10.0,
        "sum of squares {} vs {}",
        c0.1,
        cs.1
    );
    assert!(
        (c0.0 - cs.0).abs() < tol / 10.0 * cs.1.sqrt().max(1.0),
        "sum {} vs {}",
        c0.0,
        cs.0
    );
}

/// DDP and FSDP over one rank (local copies for collectives) on one GPU train as the plain
/// loop: under FSDP the caching allocator's memory comes and goes under the weights. Both
/// sides update with the master-weight kernel (DDP/FSDP over their slices), with and
/// without gradient accumulation (the kernel's fp32 sums over the reduced slices). Needs
/// one GPU only.
#[test]
fn one_rank_matches_the_plain_loop_on_one_gpu() {
    if !gpu_gate::cuda_devices(1, "the one-rank DDP/FSDP check") {
        return;
    }
    let run = |extra: &[&str]| {
        let out = worker(8, &[&["--device", "cuda:0"][..], extra].concat())
            .output()
            .expect("worker runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    for accum in [&[][..], &["--grad-accum", "2"][..]] {
        let plain = run(accum);
        let a = losses(&events(&plain));
        assert!(a[7] < a[0] * 0.98, "{a:?}");
        let cs = checksum(&plain);
        for parallel in ["ddp", "fsdp"] {
            let out = run(&[&["--parallel", parallel][..], accum].concat());
            let b = losses(&events(&out));
            println!("accum {accum:?} plain {a:?}\n {parallel} {b:?}");
            assert_eq!(b.len(), a.len());
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 1e-2 * x.abs(), "{parallel}: {x} vs {y}");
            }
            // The same kernel from the same gradients: the masters agree closely.
            let c = checksum(&out);
            println!("checksums plain {cs:?} {parallel} {c:?}");
            assert!(
                (c.1 - cs.1).abs() <= 1e-3 * cs.1.abs(),
                "{parallel} {accum:?}: sum of squares {} vs {}",
                c.1,
                cs.1
            );
        }
    }
}

#[test]
fn a_dead_rank_brings_the_other_down_with_the_distributed_exit_code() {
    if !two_gpus() {
        return;
    }
    for parallel in ["ddp", "fsdp"] {
        println!("{parallel}");
        dead_rank(parallel);
    }
}

fn dead_rank(parallel: &str) {
    let port = free_port();
    let mut r0 = spawn(rank(parallel, 100_000, &[], 0, 2, port));
    let mut r1 = spawn(rank(parallel, 100_000, &[], 1, 2, port));
    // Wait until training runs (rank 0's first step event), then kill rank 1.
    let stdout = r0.stdout.take().expect("rank 0 stdout");
    let mut lines = BufReader::new(stdout).lines();
    let started = Instant::now();
    loop {
        let Some(Ok(line)) = lines.next() else {
            let _ = r1.kill();
            let err = r0.wait_with_output().expect("rank 0 output").stderr;
            panic!(
                "rank 0 ended before its first step:\n{}",
                String::from_utf8_lossy(&err)
            );
        };
        if matches!(Event::parse_line(&line), Some(Event::Step(_))) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(120));
    }
    r1.kill().expect("kill rank 1");
    let _ = r1.wait();
    // Drain stdout so rank 0 never blocks on a full pipe, then it must exit on its own.
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = r0.wait().expect("rank 0 exits");
    assert_eq!(status.code(), Some(exit::DISTRIBUTED), "{rest:?}");
    assert!(
        rest.iter().any(|l| l.contains("\"distributed\"")),
        "no distributed error event in {rest:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(240));
}
