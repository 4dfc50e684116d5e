//! Unit tests of the torchtitan adapter (command lines, log parsing), beside the code.

use super::*;
use crate::external::declared::TORCHTITAN as FRAMEWORK;
use crate::external::log::checks::{Captured, Case, Edit::*, Fixture, Then::*};
use crate::external::log::Asked;
use crate::external::tests::{prepared, refuses_cell};

#[test]
fn ffn_width_is_exact() {
    for name in [
        "llama-3.1-8b-proxy",
        "llama-3.1-70b",
        "llama-3.1-405b",
        "llama-tiny",
    ] {
        let cfg = crate::workload::models::presets::get(name).unwrap();
        let a = model_args(&cfg);
        // torchtitan's FeedForward: int(2*4*dim/3), times the multiplier, rounded up to
        // a multiple of `multiple_of`.
        let mut h = (2 * 4 * cfg.hidden) / 3;
        if let Some(m) = a["ffn_dim_multiplier"].as_f64() {
            h = (m * h as f64) as i64;
        }
        let m = a["multiple_of"].as_i64().unwrap();
        assert_eq!(m * ((h + m - 1) / m), cfg.ffn, "{name}");
    }
}

#[test]
fn mapping_of_a_fsdp_fp8_cell() {
    let mut c =
        crate::external::tests::cell("llama-3.1-8b-proxy", "fp8", 2, "fsdp", &["compile", "sac"]);
    c.params.sac_every = 2;
    let p = prepared(&FRAMEWORK, &c);
    for want in [
        "data_parallel_shard_degree = 2",
        "data_parallel_replicate_degree = 1",
        "converters = [\"quantize.linear.float8\"]",
        "selective_ac_option = \"2\"",
        "[compile]\nenable = true",
        "global_batch_size = 4",
        "seq_len = 256",
        "log_freq = 1",
    ] {
        assert!(
            p.config_text.contains(want),
            "{want} missing in\n{}",
            p.config_text
        );
    }
    assert_eq!(
        &p.argv[..6],
        &[
            "py",
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2"
        ]
    );
    let gpt = crate::external::tests::cell("gpt2-125m", "bf16", 1, "single", &[]);
    refuses_cell(&FRAMEWORK, &gpt, "Llama");
}

#[test]
fn synthetic_text_is_json_lines_and_seeded() {
    let a = synthetic_text(1, 3, 5);
    assert_eq!(a, synthetic_text(1, 3, 5));
    assert_ne!(a, synthetic_text(2, 3, 5));
    for l in a.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["text"].as_str().unwrap().split(' ').count(), 5);
    }
}

#[test]
fn timestamps_to_millis() {
    assert_eq!(
        millis("2026-11-22 10:00:01,250").unwrap() - millis("2026-11-22 10:00:00,000").unwrap(),
        1250
    );
    assert_eq!(millis("yesterday"), None);
}

/// A log built from torchtitan's logging code: 8 steps on 2 ranks (the reader takes the
/// tokens of a step from torchtitan's own config line).
const SOURCE_2RANK: Fixture<TitanLog> = Fixture {
    file: "torchtitan-0.2.2-2rank-from-source.log",
    asked: Asked {
        steps: 8,
        global_batch: 1,
        seq_len: 1,
        gpus: 1,
    },
    lines: TitanLog::default,
};

#[test]
fn two_rank_log_from_torchtitans_logging_code() {
    // Rank 0's steps only: the first one's time is 2048 tokens at 512 tps, the others' the
    // 0.5 s between their timestamps (`tps: 4,096  tflops: 10.24  mfu: 1.04%`), the loss
    // 0.1 lower each step from 9.9.
    let read: Vec<LoggedStep> = (1..=8)
        .map(|n| {
            let (time, tps, tflops, mfu_percent) = if n == 1 {
                (2048.0 / 512.0, 512.0, 1.28, 0.13)
            } else {
                (0.5, 4096.0, 10.24, 1.04)
            };
            LoggedStep {
                step: n,
                step_time_s: time,
                loss: (100 - n) as f64 / 10.0,
                tokens_per_s_per_gpu: Some(tps),
                tflops_per_gpu: Some(tflops),
                mfu: Some(mfu_percent / 100.0),
            }
        })
        .collect();
    // Each rank's largest `memory: ..GiB`.
    let gib = (1u64 << 30) as f64;
    let peaks = [10.08, 10.58].map(|g: f64| (g * gib).round() as u64);
    SOURCE_2RANK.reads_as(&Captured {
        steps: 8,
        own_tokens_from: Some(1),
        read: &read,
        name: "torchtitan",
        version: "0.2.2",
        device: "NVIDIA H200",
        world_size: 2,
        peak_mem_bytes: &peaks,
        run_tokens_per_s_per_gpu: None,
    });
}

#[test]
fn interleaved_ranks_without_prefixes_are_refused() {
    SOURCE_2RANK.check(&[Case {
        edit: Unprefixed,
        then: RefusedAt {
            says: "mixed",
            line: "step:  1",
        },
    }]);
}

#[test]
fn truncated_logs_are_refused() {
    SOURCE_2RANK.check(&[
        // The tail cut after step 7: the framework "exited 0" but step 8 never came.
        Case {
            edit: CutBefore("step:  8"),
            then: Refused("ends after step 7 of 8"),
        },
        // A cut inside a step line is a malformed line, not a short number.
        Case {
            edit: CutAfter("memory: 10.08GiB(7.20%)  tps: 4,096  tflops: 10.24"),
            then: RefusedAt {
                says: "does not read as",
                line: "step:  8",
            },
        },
        // The head lost: no driver line.
        Case {
            edit: StartAt("Trainer is initialized"),
            then: Refused("bench-framework"),
        },
        // A lost line in the middle.
        Case {
            edit: Drop("10:00:05,500 - root - INFO - step:  4"),
            then: Refused("step 5 follows step 3"),
        },
    ]);
}

#[test]
fn malformed_step_lines_are_refused() {
    SOURCE_2RANK.check(&[
        // Rank 0's step 2 with a garbled throughput.
        Case {
            edit: Replace {
                from: "memory: 10.02GiB(7.16%)  tps: 4,096",
                to: "memory: 10.02GiB(7.16%)  tps: fast",
            },
            then: RefusedAt {
                says: "does not read as",
                line: "tps: fast",
            },
        },
        Case {
            edit: Replace {
                from: "total steps 8",
                to: "total steps 9",
            },
            then: Refused("did not take"),
        },
    ]);
}

#[test]
fn captured_two_rank_h200_log() {
    let h200 = Fixture {
        file: "torchtitan-0.2.2-h200x2-fsdp.log",
        asked: Asked {
            steps: 12,
            global_batch: 1,
            seq_len: 1,
            gpus: 1,
        },
        lines: TitanLog::default,
    };
    let gib = (1u64 << 30) as f64;
    h200.reads_as(&Captured {
        steps: 12,
        own_tokens_from: Some(1),
        read: &[LoggedStep {
            step: 12,
            // Rank 0's timestamps 01:30:09,724 and 01:30:09,914 (rank 1 printed first).
            step_time_s: 0.190,
            loss: 3.45591,
            tokens_per_s_per_gpu: Some(43315.0),
            tflops_per_gpu: Some(433.03),
            mfu: Some(43.79 / 100.0),
        }],
        name: "torchtitan",
        version: "0.2.2",
        device: "NVIDIA H200",
        world_size: 2,
        peak_mem_bytes: &[(25.67 * gib).round() as u64; 2],
        run_tokens_per_s_per_gpu: None,
    });
    // The same lines without torchrun's prefixes cannot be attributed: refused.
    h200.check(&[Case {
        edit: Unprefixed,
        then: Refused("mixed"),
    }]);
}
