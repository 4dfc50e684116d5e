//! Integration tests: the built `bench` binary against real matrix files.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_bench"))
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn dry_run_json(file: &str, filters: &[&str]) -> Value {
    let mut cmd = bench();
    cmd.args(["matrix", file, "--dry-run", "--format", "json"]);
    for f in filters {
        cmd.args(["--filter", f]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn has(cell: &Value, flag: &str) -> bool {
    cell["values"]["features"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f == flag)
}

#[test]
fn nightly_h100_lists_exactly_the_cells_the_rules_allow() {
    let doc = dry_run_json("matrix/nightly-h100.yaml", &[]);
    let cells = doc["cells"].as_array().unwrap();
    let dropped = doc["dropped"].as_array().unwrap();
    assert_eq!(doc["counts"]["combinations"], 288);
    assert_eq!(cells.len() + dropped.len(), 288);
    // Re-derive the rules independently of the implementation.
    let allowed = |c: &Value| {
        let v = &c["values"];
        let dtype = v["dtype"].as_str().unwrap();
        let gpus = v["gpus"].as_i64().unwrap();
        let par = v["parallel"].as_str().unwrap();
        let model = v["model"].as_str().unwrap();
        // Each line is one shipped rule; a cell is allowed when none applies.
        // fp8 runs with compile and with sac (the workload supports both; no rule drops
        // them), so neither feature appears here.
        let dropped_by = [
            par == "single" && gpus > 1,
            par != "single" && gpus == 1,
            model == "llama-3.1-70b-proxy" && par != "fsdp",
            model == "gpt2-125m" && par == "fsdp" && gpus == 8,
            model == "gpt2-125m" && dtype == "fp8",
        ];
        !dropped_by.contains(&true)
    };
    for c in cells {
        assert!(allowed(c), "cell should have been dropped: {}", c["id"]);
        assert!(c["params"]["global_batch"].as_u64().unwrap() > 0);
    }
    for d in dropped {
        assert!(!allowed(d), "cell should run: {}", d["id"]);
        assert!(!d["reason"].as_str().unwrap().is_empty());
        assert!(d["by"].as_str().unwrap().starts_with("rules["));
    }
    assert_eq!(cells.len(), 112);
    assert!(cells
        .iter()
        .any(|c| c["id"] == "llama-3.1-8b-proxy.fp8.1gpu.single.compile+sac"));
    // Per-model overrides reach the parameters.
    let llama = cells
        .iter()
        .find(|c| c["id"] == "llama-3.1-8b-proxy.bf16.1gpu.single.base")
        .unwrap();
    assert_eq!(llama["params"]["seq_len"], 8192);
    assert_eq!(llama["params"]["micro_batch"], 1);
}

#[test]
fn shipped_matrices_expand_without_warnings() {
    for m in [
        "matrix/smoke.yaml",
        "matrix/nightly-h100.yaml",
        "matrix/nightly-mi300x.yaml",
    ] {
        let out = bench().args(["matrix", m, "--dry-run"]).output().unwrap();
        assert!(
            out.status.success(),
            "{m}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stderr.is_empty(),
            "{m}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let first = std::fs::read_to_string(m).unwrap();
        assert!(
            first.starts_with("# yaml-language-server: $schema=../schema/matrix.schema.json"),
            "{m} must start with the schema comment"
        );
    }
}

#[test]
fn filters_combine_with_and_and_report_what_they_dropped() {
    let doc = dry_run_json("matrix/nightly-h100.yaml", &["fsdp", "gpus>=8"]);
    let cells = doc["cells"].as_array().unwrap();
    assert!(!cells.is_empty());
    for c in cells {
        assert_eq!(c["values"]["parallel"], "fsdp");
        assert_eq!(c["values"]["gpus"], 8);
    }
    let by_filter = doc["dropped"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["by"].as_str().unwrap().starts_with("--filter"))
        .count();
    assert_eq!(doc["counts"]["dropped_by_filters"], by_filter);
    assert_eq!(doc["counts"]["run"], cells.len());
    let doc = dry_run_json(
        "matrix/nightly-h100.yaml",
        &["(gpt2 or llama-3.1-70b-proxy) and not has(compile) and model~1.5b"],
    );
    for c in doc["cells"].as_array().unwrap() {
        assert_eq!(c["values"]["model"], "gpt2-1.5b");
        assert!(!has(c, "compile"));
    }
}

#[test]
fn human_dry_run_reads_well() {
    let out = bench()
        .args(["matrix", "matrix/smoke.yaml", "--dry-run"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("matrix smoke (matrix/smoke.yaml)\n"),
        "{text}"
    );
    assert!(text.contains("Cells to run ("), "{text}");
    assert!(text.contains("gpt2-tiny.fp32.1gpu.single.base"), "{text}");
    assert!(text.contains("Dropped ("), "{text}");
}

#[test]
fn bad_filter_gets_a_caret_and_exit_2() {
    let out = bench()
        .args([
            "matrix",
            "matrix/smoke.yaml",
            "--dry-run",
            "--filter",
            "model=gpt2-tiny and (gpus>",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("model=gpt2-tiny and (gpus>\n"), "{err}");
    let caret_line = err.lines().last().unwrap();
    assert_eq!(
        caret_line.find('^'),
        Some(4 + "model=gpt2-tiny and (gpus>".len()),
        "{err}"
    );
    let out = bench()
        .args([
            "matrix",
            "matrix/smoke.yaml",
            "--dry-run",
            "--filter",
            "modle=gpt2-tiny",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown axis or parameter `modle`"));
}

#[test]
fn each_kind_of_bad_input_is_located_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str, &str)] = &[
        (
            "syntax.yaml",
            "axes:\n  model: [a, b\n",
            ":2:10: unclosed bracket",
        ),
        (
            "unknown-key.yaml",
            "axes:\n  model: [a]\nrulez: []\n",
            ":3:1:",
        ),
        (
            "wrong-type.yaml",
            "axes:\n  model: [a]\ndefaults:\n  steps: lots\n",
            ":4:",
        ),
        (
            "empty-axis.yaml",
            "axes:\n  model: []\n",
            ":2:3: axes.model: axis `model` has no values",
        ),
        (
            "dup-value.yaml",
            "axes:\n  model: [a, a]\n",
            ":2:14: axes.model[1]: duplicate value",
        ),
        (
            "rule-axis.yaml",
            "axes:\n  model: [a]\nrules:\n  - exclude: {gpus: 8}\n    reason: r\n",
            ":4:15: rules[0].exclude.gpus: unknown axis",
        ),
        (
            "rule-value.yaml",
            "axes:\n  model: [a]\nrules:\n  - exclude: {model: b}\n    reason: r\n",
            ":4:15: rules[0].exclude.model: axis `model` has no value `b`",
        ),
        (
            "rule-reason.yaml",
            "axes:\n  model: [a]\nrules:\n  - exclude: {model: a}\n",
            ":4:",
        ),
        ("dup-key.yaml", "axes:\n  model: [a]\n  model: [b]\n", ":3:"),
        (
            "dtype.yaml",
            "axes:\n  dtype: [bf16, fp16]\n",
            ":2:17: axes.dtype[1]: `dtype` value `fp16` must be one of fp32, bf16, fp8",
        ),
        (
            "include-parallel.yaml",
            "axes:\n  model: [gpt2-tiny]\ninclude:\n  - parallel: tensor\n",
            "include: cell `gpt2-tiny.tensor`: `parallel` value `tensor` must be one of single, ddp, fsdp",
        ),
        (
            "model.yaml",
            "axes:\n  model: [gpt2-tiny, gpt5]\n",
            ":2:22: axes.model[1]: cell `gpt5`: the built-in workload has no model `gpt5`",
        ),
        ("empty.yaml", "", "empty"),
    ];
    for (name, text, want) in cases {
        let p = write(&dir, name, text);
        let out = bench()
            .args(["matrix", p.to_str().unwrap(), "--dry-run"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(
            err.contains(p.to_str().unwrap()),
            "{name}: file not named: {err}"
        );
        assert!(err.contains(want), "{name}: want {want:?} in {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
    }
    let out = bench()
        .args(["matrix", "no/such/file.yaml", "--dry-run"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no/such/file.yaml"));
    let out = bench().args(["matrix", "--no-such-flag"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn rule_matching_nothing_is_a_warning_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        &dir,
        "m.yaml",
        "axes:\n  model: [gpt2-tiny, llama-tiny]\nrules:\n  - when: model=gpt2-tiny and model=llama-tiny\n    reason: never\n",
    );
    let out = bench()
        .args(["matrix", p.to_str().unwrap(), "--dry-run"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning:") && err.contains(":4:5: rules[0] when matches no cell"),
        "{err}"
    );
}

#[test]
fn checked_in_schema_is_fresh() {
    let out = bench().arg("schema").output().unwrap();
    assert!(out.status.success());
    let checked_in = std::fs::read_to_string("schema/matrix.schema.json").unwrap();
    assert!(
        String::from_utf8(out.stdout).unwrap() == checked_in,
        "schema/matrix.schema.json is stale: run `cargo run -- schema > schema/matrix.schema.json`"
    );
}

#[test]
fn ten_thousand_cells_expand() {
    // 10 x 10 x 10 x 4 x 8 = 32,000 combinations, with rules of every kind. The time is a
    // benchmark figure (see the closing note), not asserted here; this checks the result.
    let dir = tempfile::tempdir().unwrap();
    let models: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    let text = format!(
        "axes:\n  model: [{}]\n  seq_len: [128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]\n  micro_batch: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n  gpus: [1, 2, 4, 8]\n  features: {{subsets_of: [compile, sac, fp8]}}\nrules:\n  - incompatible: [compile, fp8]\n    reason: a\n  - when: seq_len>=32768 and micro_batch>4\n    reason: b\n  - exclude: {{model: m0, gpus: 8}}\n    reason: c\n  - requires: {{if: has(sac), then: gpus>=2}}\n    reason: d\ndefaults:\n  workload: {{kind: command, argv: [\"true\"]}}\n",
        models.join(", ")
    );
    let p = write(&dir, "big.yaml", &text);
    let out = bench()
        .args([
            "matrix",
            p.to_str().unwrap(),
            "--dry-run",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["counts"]["combinations"], 32000);
    assert!(doc["counts"]["run"].as_u64().unwrap() > 10_000);
}

#[test]
fn dry_run_counts_dropped_cells_per_rule_and_lists_ids_only_with_verbose() {
    let text = |extra: &[&str]| {
        let out = bench()
            .args([
                "matrix",
                "matrix/nightly-h100.yaml",
                "--dry-run",
                "--filter",
                "fsdp",
            ])
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0));
        String::from_utf8(out.stdout).unwrap()
    };
    let (short, long) = (text(&[]), text(&["--verbose"]));
    let doc = dry_run_json("matrix/nightly-h100.yaml", &["fsdp"]);
    let dropped = doc["dropped"].as_array().unwrap();
    assert!(dropped.len() > 20, "{}", dropped.len());
    let mut groups: Vec<(String, String, usize)> = Vec::new();
    for d in dropped {
        let (by, reason) = (d["by"].as_str().unwrap(), d["reason"].as_str().unwrap());
        match groups.iter_mut().find(|g| g.0 == by && g.1 == reason) {
            Some(g) => g.2 += 1,
            None => groups.push((by.into(), reason.into(), 1)),
        }
    }
    // The short form: one line per rule or filter with its count, and no ids.
    let section = &short[short.find("Dropped (").unwrap()..];
    assert_eq!(section.lines().count(), 1 + groups.len() + 1, "{section}");
    for (by, reason, n) in &groups {
        assert!(
            section
                .lines()
                .any(|l| l.ends_with(&format!("{by}: {reason}"))
                    && l.trim_start().starts_with(&format!("{n} cell"))),
            "{by}: {section}"
        );
    }
    for d in dropped {
        let id = d["id"].as_str().unwrap();
        assert!(
            !section.contains(&format!(" {id}\n")),
            "{id} listed without --verbose"
        );
        assert!(
            long.contains(&format!("      {id}\n")),
            "{id} not listed with --verbose"
        );
    }
}

#[test]
fn a_bad_triage_block_fails_the_dry_run_as_it_fails_the_run() {
    let dir = tempfile::tempdir().unwrap();
    for (block, key, want) in [
        (
            "budget_gpu_s: -1",
            "triage.budget_gpu_s",
            "not a number of GPU-seconds",
        ),
        (
            "budget_gpu_s: 1e300",
            "triage.budget_gpu_s",
            "not a number of GPU-seconds",
        ),
        ("max_repeats: 1", "triage.max_repeats", "at least 2 repeats"),
    ] {
        let m = write(
            &dir,
            "m.yaml",
            &format!("name: t\naxes:\n  model: [gpt2-tiny]\ntriage:\n  {block}\n"),
        );
        let out = bench()
            .args(["matrix", m.to_str().unwrap(), "--dry-run"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{block}: {err}");
        assert!(
            err.contains("m.yaml:5:"),
            "{block}: the line is named: {err}"
        );
        assert!(err.contains(key) && err.contains(want), "{block}: {err}");
    }
}

/// A matrix name is one line of printable text: a newline in it printed a line of its own
/// that read as bench's, an escape reached the terminal (issue 42).
#[test]
fn a_matrix_name_with_a_control_character_is_refused_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["toy\\nerror: forged", "toy\\e]0;title\\a", "toy\\u202eevil"] {
        let path = write(
            &dir,
            "m.yaml",
            &format!("name: \"{name}\"\naxes:\n  model: [gpt2-tiny]\n"),
        );
        let o = bench()
            .args(["matrix", path.to_str().unwrap(), "--dry-run"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        assert!(
            err.contains("m.yaml:1:1: name: the matrix name"),
            "{name}: {err}"
        );
        assert!(!err.contains('\x1b') && !err.lines().any(|l| l.starts_with("error: forged")));
        assert!(o.stdout.is_empty(), "{name}");
    }
}
