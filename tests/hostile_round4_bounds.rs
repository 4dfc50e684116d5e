//! Issue 42, hostile round 4, through the built binary: what a shard folder's results may
//! not claim beyond its metrics. A cell measured with other parameters than the run's plan
//! (`shard.json`), shards measured on another GPU model or count under one hardware key,
//! and a repeat's steps or summary that no worker can report (a step of 1e308 s, 0 s or
//! -1 s, a summary of -1 tok/s) are refused with exit 2 naming the file and key path, by
//! `bench report merge` (writing nothing), and for the steps and summaries by
//! `bench report` and `bench history import` too: the same rule the worker's door holds
//! every event to.

mod common;

use std::path::{Path, PathBuf};

use serde_json::Value;

use common::cli::{bench, read_json, text, write_json};
use common::shards::{copy_shard, merge, night_repeated, refused};

/// A copy of the shard folder `from` under `dir/name/night` (results and plan) with `edit`
/// applied to its results.
fn edited(from: &Path, dir: &Path, name: &str, edit: impl FnOnce(&mut Value)) -> PathBuf {
    let to = copy_shard(from, dir, name);
    let mut r = read_json(&to.join("results.json"));
    edit(&mut r);
    write_json(&to.join("results.json"), &r);
    to
}

/// A cell whose results carry other parameters (or axis values) than the plan gave it is
/// refused naming the results file, the key path, the value and what the plan says; the
/// shards as they ran merge.
#[test]
fn a_cell_run_with_other_params_than_its_plan_is_refused_naming_the_key_path() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (s1, s2) = night_repeated(dir, 2);
    let out = dir.join("out");
    let id = read_json(&s1.join("results.json"))["cells"][1]["id"]
        .as_str()
        .unwrap()
        .to_string();
    for (name, key, value, says) in [
        (
            "repeats",
            &["params", "repeats"][..],
            Value::from(5),
            "is 5",
        ),
        ("steps", &["params", "steps"][..], 50.into(), "is 50"),
        (
            "seq_len",
            &["params", "seq_len"][..],
            4096.into(),
            "is 4096",
        ),
        (
            "extra",
            &["params", "extra", "step_time"][..],
            "0.02".into(),
            "is \"0.02\"",
        ),
        ("values", &["values", "gpus"][..], 8.into(), "is 8"),
    ] {
        let d = edited(&s1, dir, name, |r| {
            let mut at = &mut r["cells"][1];
            for k in &key[..key.len() - 1] {
                at = &mut at[*k];
            }
            at[key[key.len() - 1]] = value;
        });
        let plan = d.join("shard.json");
        let o = merge(dir, &[&d, &s2], &out, &[]);
        refused(
            &o,
            &out,
            &[
                &format!(
                    "{name}/night/results.json: cells[1] ({id}).{}",
                    key.join(".")
                ),
                says,
                &format!("while {} plans", plan.display()),
            ],
        );
    }
    let o = merge(dir, &[&s1, &s2], &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// Shards under one hardware key measured on another GPU model or another GPU count are
/// refused naming both shards' files and both values.
#[test]
fn shards_on_another_gpu_model_or_count_under_one_key_are_refused_naming_both() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (s1, s2) = night_repeated(dir, 2);
    let out = dir.join("out");
    let env = read_json(&s1.join("results.json"))["environment"].clone();
    // A host without a GPU has no model, which the message says as `none`.
    let model = match &env["gpu_model"] {
        Value::Null => "none".to_string(),
        m => m.to_string(),
    };
    let count = env["gpu_count"].to_string();
    for (name, field, value, ours) in [
        (
            "model",
            "gpu_model",
            Value::from("NVIDIA H100 80GB HBM3"),
            model,
        ),
        ("count", "gpu_count", Value::from(8), count),
    ] {
        let d = edited(&s2, dir, name, |r| r["environment"][field] = value.clone());
        let o = merge(dir, &[&s1, &d], &out, &[]);
        refused(
            &o,
            &out,
            &[
                &format!(
                    "{name}/night/results.json: environment.{field} is {}",
                    value
                ),
                &format!("while {} has {ours}", s1.join("results.json").display()),
                "one GPU model and count",
            ],
        );
    }
}

/// `bench report DIR` and `bench history import DIR` of a folder: exit 2 with `says`.
fn every_reader_refuses(dir: &Path, d: &Path, says: &[&str]) {
    let store = dir.join(format!(
        "{}.sqlite",
        d.parent().unwrap().file_name().unwrap().to_str().unwrap()
    ));
    for args in [
        vec![
            "report",
            d.to_str().unwrap(),
            "--baselines",
            dir.join("baselines").to_str().unwrap(),
        ],
        vec![
            "history",
            "import",
            d.to_str().unwrap(),
            "--history",
            store.to_str().unwrap(),
        ],
    ] {
        let o = bench(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        for s in says {
            assert!(text(&o).contains(s), "{args:?}: {s:?} not in {}", text(&o));
        }
    }
}

/// A step time or a repeat's summary figure no worker can report is refused by merge,
/// report and import alike, naming the file and the key path down to the step.
#[test]
fn impossible_steps_and_repeat_summaries_are_refused_by_every_reader() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (s1, s2) = night_repeated(dir, 2);
    let out = dir.join("out");
    // Each forged value, where it goes (a JSON pointer below repeats[1] of cells[0]), and
    // what the refusal says after the key path down to it.
    for (name, pointer, value, says) in [
        (
            "huge",
            "steps/4/step_time_s",
            Value::from(1e308),
            "steps[4].step_time_s: step_time_s is 1e308, outside its plausible range",
        ),
        (
            "negative",
            "steps/4/step_time_s",
            (-1.0).into(),
            "steps[4].step_time_s: step_time_s -1: it must be a finite number above 0",
        ),
        (
            "zero",
            "steps/4/step_time_s",
            0.into(),
            "steps[4].step_time_s: step_time_s 0: it must be a finite number above 0",
        ),
        (
            "tokens",
            "steps/2/tokens",
            (1u64 << 60).into(),
            "steps[2].tokens: tokens 1152921504606846976: more than 2^53",
        ),
        (
            "rate",
            "summary/tokens_per_s",
            (-1.0).into(),
            "summary.tokens_per_s: tokens_per_s -1: it must be a finite number above 0",
        ),
        (
            "first",
            "summary/time_to_first_step_s",
            (-1.0).into(),
            "summary.time_to_first_step_s: time_to_first_step_s -1: it must be a finite number, 0 or more",
        ),
        (
            "memory",
            "summary/peak_mem_bytes/0",
            (1u64 << 50).into(),
            "summary.peak_mem_bytes[0]: peak_mem_bytes is 1.125899906842624e15, outside its plausible range",
        ),
    ] {
        let edit = |r: &mut Value| {
            // The parent is there; the figure may not be (a summary figure the worker did
            // not report), so it is set through its parent.
            let (parent, key) = pointer.rsplit_once('/').unwrap();
            let at = r
                .pointer_mut(&format!("/cells/0/repeats/1/{parent}"))
                .unwrap();
            match key.parse::<usize>() {
                Ok(i) => at[i] = value,
                Err(_) => at[key] = value,
            }
        };
        let field = format!("cells[0] (a.1gpu).repeats[1].{says}");
        let d = edited(&s1, dir, name, edit);
        let file = format!("{name}/night/results.json: {field}");
        let o = merge(dir, &[&d, &s2], &out, &[]);
        refused(&o, &out, &[&file]);
        assert!(!text(&o).contains("improved"), "{}", text(&o));
        every_reader_refuses(dir, &d, &[&file]);
    }

    // Text where a number belongs (`NaN`, a string, a negative token count) does not
    // parse: refused naming the file, line and column.
    for (name, from, to) in [
        ("nan", "\"step_time_s\":0.01", "\"step_time_s\":NaN"),
        ("string", "\"step_time_s\":0.01", "\"step_time_s\":\"NaN\""),
        ("sign", "\"tokens\":1024", "\"tokens\":-1024"),
    ] {
        let d = edited(&s1, dir, name, |_| {});
        let doc = std::fs::read_to_string(d.join("results.json")).unwrap();
        assert!(doc.contains(from), "{from} not in {doc}");
        std::fs::write(d.join("results.json"), doc.replacen(from, to, 1)).unwrap();
        let file = format!("{name}/night/results.json:1:");
        refused(
            &merge(dir, &[&d, &s2], &out, &[]),
            &out,
            &[&file, "malformed results"],
        );
        every_reader_refuses(dir, &d, &[&file, "malformed results"]);
    }

    // The shards as they ran pass every reader.
    let o = merge(dir, &[&s1, &s2], &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}
