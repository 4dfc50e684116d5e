//! Unit tests of the torchtitan adapter (command lines, log parsing), beside the code.

use super::*;
use crate::external::declared::TORCHTITAN as FRAMEWORK;
use crate::external::log::Reader;

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
    assert_eq!(FRAMEWORK.unexpressible(&c), None);
    let p = FRAMEWORK.prepare(
        &c,
        &FrameworkOpts::default(),
        &crate::external::tests::files(),
    );
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
    assert!(FRAMEWORK.unexpressible(&gpt).unwrap().contains("Llama"));
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

use crate::external::tests::{asked, fixture};

fn parser(steps: u32) -> Reader<TitanLog> {
    Reader::new(asked(steps, 1, 1, 1), TitanLog::default())
}

const SOURCE_2RANK: &str = "torchtitan-0.2.2-2rank-from-source.log";

#[test]
fn two_rank_log_from_torchtitans_logging_code() {
    let (steps, end) = log::read_all(&mut parser(8), &fixture(SOURCE_2RANK), true).unwrap();
    assert_eq!(steps.len(), 8, "rank 0's steps only");
    assert!(
        (steps[0].step_time_s - 4.0).abs() < 1e-9,
        "2048 tokens at 512 tps"
    );
    for s in &steps[1..] {
        assert!((s.step_time_s - 0.5).abs() < 1e-9, "{s:?}");
        assert_eq!(s.tokens_per_s_per_gpu, Some(4096.0));
    }
    assert!((steps[7].loss - 9.2).abs() < 1e-9);
    let gib = (1u64 << 30) as f64;
    assert_eq!(
        end.peak_mem_bytes,
        vec![(10.08 * gib).round() as u64, (10.58 * gib).round() as u64]
    );
    assert_eq!(end.info.version, "0.2.2");
    assert_eq!(end.info.world_size, 2);
}

#[test]
fn interleaved_ranks_without_prefixes_are_refused() {
    let text: String = fixture(SOURCE_2RANK)
        .lines()
        .map(|l| log::split_rank(l).1 + "\n")
        .collect();
    let e = log::refusal(parser(8), &text);
    assert!(e.message.contains("mixed"), "{e}");
    assert!(e.line.contains("step:  1"), "{e}");
}

#[test]
fn truncated_logs_are_refused() {
    let text = fixture(SOURCE_2RANK);
    let lines: Vec<&str> = text.lines().collect();
    // The tail cut after step 7: the framework "exited 0" but step 8 never came.
    let cut = lines.iter().position(|l| l.contains("step:  8")).unwrap();
    let head = lines[..cut].join("\n");
    let e = log::refusal(parser(8), &head);
    assert!(e.message.contains("ends after step 7 of 8"), "{e}");
    // A cut inside a step line is a malformed line, not a short number.
    let partial = format!("{}\n{}", head, &lines[cut][..lines[cut].len() - 12]);
    let e = log::refusal(parser(8), &partial);
    assert_eq!(e.line_no, cut + 1);
    // The head lost: no driver line.
    let tail = lines[6..].join("\n");
    let e = log::refusal(parser(8), &tail);
    assert!(e.message.contains("bench-framework"), "{e}");
    // A lost line in the middle.
    let mut gap: Vec<&str> = lines.clone();
    gap.retain(|l| !l.starts_with("[rank0]") || !l.contains("step:  4"));
    let e = log::refusal(parser(8), &gap.join("\n"));
    assert!(e.message.contains("step 5 follows step 3"), "{e}");
}

#[test]
fn malformed_step_lines_are_refused() {
    let text = fixture(SOURCE_2RANK).replacen("tps: 4,096", "tps: fast", 1);
    let e = log::refusal(parser(8), &text);
    assert!(e.to_string().contains("tps: fast"), "{e}");
    let text = fixture(SOURCE_2RANK).replacen("total steps 8", "total steps 9", 1);
    let e = log::refusal(parser(8), &text);
    assert!(e.message.contains("did not take"), "{e}");
}

#[test]
fn captured_two_rank_h200_log() {
    let text = fixture("torchtitan-0.2.2-h200x2-fsdp.log");
    let (steps, end) = log::read_all(&mut parser(12), &text, true).unwrap();
    assert_eq!(steps.len(), 12);
    // Rank 0's timestamps 01:30:09,724 and 01:30:09,914 (rank 1 printed first).
    assert!(
        (steps[11].step_time_s - 0.190).abs() < 1e-9,
        "{:?}",
        steps[11]
    );
    assert_eq!(steps[11].tokens_per_s_per_gpu, Some(43315.0));
    assert!((steps[11].loss - 3.45591).abs() < 1e-12);
    let gib = (1u64 << 30) as f64;
    assert_eq!(end.peak_mem_bytes, vec![(25.67 * gib).round() as u64; 2]);
    assert_eq!(end.info.device, "NVIDIA H200");
    // The same lines without torchrun's prefixes cannot be attributed: refused.
    let bare: String = text.lines().map(|l| log::split_rank(l).1 + "\n").collect();
    assert!(log::read_all(&mut parser(12), &bare, true).is_err());
}
