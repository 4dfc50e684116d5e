//! `bench worker` end to end on CPU: the built binary, tiny presets, real libtorch.
// The built-in workload only exists in the default build (Cargo feature `builtin`).
#![cfg(feature = "builtin")]

use std::process::Output;

use assert_cmd::Command;
use bench::events::{ErrorKind, Event};
use bench::exit::worker as exit;

/// A worker on the CPU in fp32 unless `args` names a dtype: the worker's own default is
/// the cells' (bf16), but these checks compare losses with fp32 tolerances (clap refuses a
/// flag given twice, so the default is added only here).
fn worker(args: &[&str]) -> Output {
    let dtype: &[&str] = if args.contains(&"--dtype") {
        &[]
    } else {
        &["--dtype", "fp32"]
    };
    Command::new(env!("CARGO_BIN_EXE_bench"))
        .arg("worker")
        .args(["--device", "cpu"])
        .args(dtype)
        .args(args)
        // One intra-op thread: tiny models gain nothing from more, and on a loaded two-core
        // CI machine a thread pool that waits on descheduled threads is ten times slower.
        .env("OMP_NUM_THREADS", "1")
        .output()
        .expect("bench worker runs")
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

#[test]
fn every_family_dtype_and_checkpointing_runs() {
    for model in ["gpt2-tiny", "llama-tiny"] {
        for dtype in ["fp32", "bf16"] {
            for features in ["", "sac"] {
                let mut args = vec![
                    "--model",
                    model,
                    "--dtype",
                    dtype,
                    "--steps",
                    "4",
                    "--warmup",
                    "1",
                    "--seq-len",
                    "32",
                    "--micro-batch",
                    "2",
                    "--grad-accum",
                    "2",
                ];
                if !features.is_empty() {
                    args.extend(["--features", features, "--sac-every", "2"]);
                }
                let out = worker(&args);
                let what = format!("{model} {dtype} {features:?}");
                assert!(
                    out.status.success(),
                    "{what}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let evs = events(&out);
                assert!(matches!(evs.first(), Some(Event::Start { .. })), "{what}");
                let steps: Vec<_> = evs
                    .iter()
                    .filter_map(|e| {
                        if let Event::Step(s) = e {
                            Some(s)
                        } else {
                            None
                        }
                    })
                    .collect();
                assert_eq!(steps.len(), 4, "{what}");
                assert_eq!(steps[0].warmup, Some(true));
                assert!(steps[1..].iter().all(|s| s.warmup.is_none()));
                assert!(steps
                    .iter()
                    .all(|s| s.tokens == 2 * 2 * 32 && s.loss.is_finite() && s.step_time_s > 0.0));
                let Some(Event::Summary(sum)) = evs.last() else {
                    panic!("{what}: no summary last");
                };
                assert!(sum.tokens_per_s.unwrap() > 0.0 && sum.tflops_per_gpu.unwrap() > 0.0);
                // No peak for CPUs: MFU and its policy are absent, memory too.
                assert_eq!((sum.mfu, sum.mfu_policy.as_deref()), (None, None));
                assert!(sum.peak_mem_bytes.is_empty());
                assert_eq!(sum.device.as_deref(), Some("cpu"));
            }
        }
    }
}

#[test]
fn loss_falls_on_the_learnable_pattern() {
    for model in ["gpt2-tiny", "llama-tiny"] {
        let out = worker(&[
            "--model",
            model,
            "--synthetic",
            "pattern",
            "--steps",
            "50",
            "--warmup",
            "2",
            "--seq-len",
            "64",
            "--micro-batch",
            "4",
            "--lr",
            "3e-3",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let l = losses(&events(&out));
        assert_eq!(l.len(), 50);
        let first = l[0];
        let last = l[45..].iter().sum::<f64>() / 5.0;
        // From ln(512) = 6.2 at initialisation to well under half of it.
        assert!(last < first / 2.0, "{model}: {first} -> {last}");
    }
}

#[test]
fn same_seed_same_losses_with_and_without_checkpointing() {
    let base = [
        "--model",
        "llama-tiny",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--seq-len",
        "16",
        "--micro-batch",
        "2",
    ];
    let plain = losses(&events(&worker(&base)));
    let mut sac_args = base.to_vec();
    sac_args.extend(["--features", "sac", "--sac-every", "1"]);
    let sac = losses(&events(&worker(&sac_args)));
    assert_eq!(plain.len(), 3);
    for (a, b) in plain.iter().zip(&sac) {
        assert!((a - b).abs() <= 1e-5 * a.abs(), "{plain:?} vs {sac:?}");
    }
}

#[test]
fn trains_on_a_token_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.bin");
    let toks: Vec<u8> = (0..2000u32)
        .flat_map(|i| ((i * 13) % 512).to_le_bytes())
        .collect();
    std::fs::write(&path, toks).unwrap();
    let p = path.to_str().unwrap();
    let out = worker(&[
        "--data",
        p,
        "--data-bytes",
        "4",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--seq-len",
        "32",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(losses(&events(&out)).len(), 3);
    // Read as uint16 the same bytes hold zeros and large ids, some past the vocabulary.
    std::fs::write(
        &path,
        (0..200u32)
            .flat_map(|i| (60000 + i).to_le_bytes())
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    let bad = worker(&[
        "--data",
        p,
        "--data-bytes",
        "4",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--seq-len",
        "32",
    ]);
    assert_eq!(bad.status.code(), Some(exit::BAD_INPUT));
    let evs = events(&bad);
    assert!(
        matches!(&evs[..], [Event::Error { kind: ErrorKind::BadInput, message }] if message.contains("tokens.bin"))
    );
}

#[test]
fn compile_on_cpu_falls_back_and_says_so() {
    let out = worker(&[
        "--features",
        "compile",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--seq-len",
        "16",
    ]);
    assert!(out.status.success());
    let evs = events(&out);
    assert!(evs.iter().any(|e| matches!(e, Event::Notice { message } if message.contains("compile") && message.contains("eager"))));
    assert_eq!(losses(&evs).len(), 2);
}

#[test]
fn failures_have_their_own_exit_codes() {
    let cases: [(&[&str], i32, ErrorKind); 4] = [
        (
            &["--dtype", "fp8"],
            exit::UNSUPPORTED,
            ErrorKind::Unsupported,
        ),
        (
            &["--features", "warp-drive"],
            exit::UNSUPPORTED,
            ErrorKind::Unsupported,
        ),
        (&["--model", "gpt5"], exit::BAD_INPUT, ErrorKind::BadInput),
        // A learning rate this large drives the loss to NaN within a few steps.
        (
            &[
                "--lr",
                "1e30",
                "--steps",
                "20",
                "--warmup",
                "1",
                "--seq-len",
                "16",
            ],
            exit::NAN_LOSS,
            ErrorKind::NanLoss,
        ),
    ];
    for (args, code, kind) in cases {
        let out = worker(args);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let evs = events(&out);
        assert!(
            matches!(evs.last(), Some(Event::Error { kind: k, .. }) if *k == kind),
            "{args:?}: {evs:?}"
        );
    }
    // `--dtype` and `--parallel` are typed flags: a value outside them is bad input that
    // the argument parser refuses (exit 2) before any training starts. The runner never
    // sends one, because matrix expansion refuses it first.
    for args in [&["--parallel", "tensor"][..], &["--dtype", "fp16"][..]] {
        let out = worker(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(exit::BAD_INPUT), "{args:?}: {err}");
        assert!(
            err.contains(args[1]) && err.contains("possible values"),
            "{err}"
        );
    }
}

#[test]
fn lists_models() {
    let out = worker(&["--list-models"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for name in [
        "gpt2-125m",
        "gpt2-1.5b",
        "llama-3.1-8b-proxy",
        "llama-3.1-405b",
        "qwen-2.5-7b",
        "llama-tiny",
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
}

fn dist_worker(parallel: &str, env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bench"));
    c.arg("worker")
        .args(["--device", "cpu", "--dtype", "fp32", "--parallel", parallel])
        .args(["--steps", "2", "--warmup", "1", "--seq-len", "16"])
        .env("OMP_NUM_THREADS", "1");
    for v in bench::dist::rendezvous::ENV_VARS {
        c.env_remove(v);
    }
    c.envs(env.iter().copied());
    c.output().expect("bench worker runs")
}

/// A DDP or FSDP rank on a device without CUDA is unsupported here (exit 3, skipped by
/// the runner) and says why, before it joins any rendezvous: a peer-less rank must never
/// wait.
#[test]
fn multi_rank_on_cpu_is_unsupported_before_the_rendezvous() {
    for parallel in ["ddp", "fsdp"] {
        let out = dist_worker(
            parallel,
            &[
                ("RANK", "1"),
                ("WORLD_SIZE", "2"),
                ("LOCAL_RANK", "1"),
                ("MASTER_ADDR", "127.0.0.1"),
                // Nobody listens here: reaching the rendezvous would fail with exit 6.
                ("MASTER_PORT", "9"),
            ],
        );
        assert_eq!(
            out.status.code(),
            Some(exit::UNSUPPORTED),
            "{parallel}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let evs = events(&out);
        assert!(
            matches!(evs.last(), Some(Event::Error { kind: ErrorKind::Unsupported, message })
                if message.contains(parallel) && message.contains("CUDA")),
            "{evs:?}"
        );
    }
}

/// `--parallel ddp|fsdp` started alone (no WORLD_SIZE > 1) runs its own schedule over one
/// rank (working weights from fp32 masters, FSDP's units whole since a world of one has
/// nothing to shard, which its run says; gradients reduced into fp32 slices, AdamW over the
/// slices) and trains exactly as the plain loop does: same losses step by step, with
/// gradient accumulation and with checkpointing, and the same final weights.
#[test]
fn data_parallel_with_one_rank_trains_like_the_plain_loop() {
    let base = [
        "--model",
        "llama-tiny",
        "--steps",
        "4",
        "--warmup",
        "1",
        "--seq-len",
        "16",
        "--micro-batch",
        "2",
        "--grad-accum",
        "2",
    ];
    let checksum = |out: &Output| -> (f64, f64) {
        let err = String::from_utf8_lossy(&out.stderr);
        bench::workload::dp::parse_checksum_line(&err)
            .unwrap_or_else(|| panic!("no checksum line in:\n{err}"))
    };
    let run = |extra: &[&str]| -> Output {
        Command::new(env!("CARGO_BIN_EXE_bench"))
            .arg("worker")
            .args(["--device", "cpu", "--dtype", "fp32"])
            .args(base)
            .args(extra)
            .env("OMP_NUM_THREADS", "1")
            .env("BENCH_PARAM_CHECKSUM", "1")
            .output()
            .expect("bench worker runs")
    };
    let cases = [
        ("fsdp", &[][..]),
        ("fsdp", &["--features", "sac", "--sac-every", "2"][..]),
        ("ddp", &[][..]),
    ];
    for (parallel, sac) in cases {
        let plain = run(sac);
        let fsdp = run(&[sac, &["--parallel", parallel][..]].concat());
        for o in [&plain, &fsdp] {
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
        let said_whole = String::from_utf8_lossy(&fsdp.stdout).contains("nothing to shard");
        assert_eq!(
            said_whole,
            parallel == "fsdp",
            "{parallel}: the one-rank notice"
        );
        let (a, b) = (losses(&events(&plain)), losses(&events(&fsdp)));
        assert_eq!(a.len(), 4);
        for (x, y) in a.iter().zip(&b) {
            assert!(
                (x - y).abs() <= 1e-5 * x.abs(),
                "{parallel} {sac:?}: {a:?} vs {b:?}"
            );
        }
        // The loss moved, so equal losses say the updates were equal too.
        assert!(a[3] < a[0], "{a:?}");
        let (cp, cf) = (checksum(&plain), checksum(&fsdp));
        assert!(
            (cp.1 - cf.1).abs() <= 1e-6 * cp.1,
            "{sac:?}: sum of squares {cp:?} vs {cf:?}"
        );
        assert!(
            (cp.0 - cf.0).abs() <= 1e-5 * cp.1.sqrt(),
            "{sac:?}: sum {cp:?} vs {cf:?}"
        );
        let summary = events(&fsdp)
            .into_iter()
            .find_map(|e| match e {
                Event::Summary(s) => Some(s),
                _ => None,
            })
            .expect("a summary");
        assert_eq!(summary.world_size, Some(1));
    }
}
