//! Unit tests of the baseline store (parse, load, save, update), beside the code.

use super::*;

fn parse_str(text: &str) -> Result<BaselineDoc, BaselineError> {
    parse(Path::new("baselines/cpu-x86_64.yaml"), text)
}

const GOOD: &str = "\
schema_version: 1
hardware_key: cpu-x86_64
cells:
  gpt2-tiny.fp32.1gpu.single.base:
    provenance:
      date: 2026-11-22T10:15:00Z
      commit: 1a2b3c4
      bench_version: 0.1.0
      run_id: r1
      hardware: cpu
    metrics:
      tokens_per_s:
        value: 12000
        spread: 0.004
      peak_mem_bytes:
        value: 1.5e9
        tolerance: 0.2
        floor: 1.0e7
      custom_score:
        value: 3.5
        direction: higher
";

#[test]
fn parses_with_defaults() {
    let doc = parse_str(GOOD).unwrap();
    let cell = &doc.cells["gpt2-tiny.fp32.1gpu.single.base"];
    let tps = &cell.metrics["tokens_per_s"];
    assert_eq!(tps.value, 12000.0);
    assert_eq!(tps.direction, Direction::Higher);
    assert_eq!(tps.tolerance, None);
    assert_eq!(tps.effective_tolerance("tokens_per_s"), 0.03);
    assert_eq!(tps.spread, 0.004);
    let mem = &cell.metrics["peak_mem_bytes"];
    assert_eq!(mem.direction, Direction::Lower);
    assert_eq!(mem.effective_tolerance("peak_mem_bytes"), 0.2);
    assert_eq!(mem.floor, Some(1.0e7));
    assert_eq!(
        cell.provenance.as_ref().unwrap().commit.as_deref(),
        Some("1a2b3c4")
    );
}

#[test]
fn save_then_load_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let doc = parse_str(GOOD).unwrap();
    let b = Baselines {
        path: file_for(dir.path(), "cpu-x86_64"),
        existed: false,
        doc: doc.clone(),
    };
    b.save().unwrap();
    let back = Baselines::load_for(dir.path(), "cpu-x86_64").unwrap();
    assert!(back.existed);
    assert_eq!(back.doc, doc);
}

#[test]
fn missing_file_is_empty_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baselines::load_for(dir.path(), "h100-sxm-80gb").unwrap();
    assert!(!b.existed);
    assert!(b.doc.cells.is_empty());
}

/// Each malformed shape is an error that names the file and the line and column of the
/// fault (and, for values that parse but make no sense, the key path).
fn assert_located(text: &str, line: u32, needle: &str) {
    let err = parse_str(text).expect_err("should be rejected");
    let shown = err.to_string();
    assert!(shown.starts_with("baselines/cpu-x86_64.yaml:"), "{shown}");
    match &err {
        BaselineError::Parse {
            line: l, column, ..
        }
        | BaselineError::Invalid {
            line: l, column, ..
        } => {
            assert_eq!(*l, line, "{shown}");
            assert!(*column > 0, "{shown}");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(shown.contains(needle), "`{needle}` not in: {shown}");
}

#[test]
fn bad_yaml_is_located() {
    // Unterminated quoted scalar: a syntax error, reported where the parser gave up.
    assert_located("schema_version: 1\nhardware_key: \"cpu\ncells: {}\n", 2, "");
}

#[test]
fn duplicate_cell_is_located() {
    let dup = "  gpt2-tiny.fp32.1gpu.single.base:\n    metrics:\n      tokens_per_s: {value: 1}\n";
    let text = format!("{GOOD}{dup}");
    assert_located(&text, 22, "");
}

#[test]
fn newer_schema_version_is_located() {
    let text = GOOD.replace("schema_version: 1", "schema_version: 99");
    assert_located(&text, 1, "upgrade bench");
}

#[test]
fn wrong_type_is_located() {
    let text = GOOD.replace("value: 12000", "value: fast");
    assert_located(&text, 13, "");
}

#[test]
fn unknown_key_is_located() {
    let text = GOOD.replace("        spread: 0.004", "        sprad: 0.004");
    assert_located(&text, 14, "sprad");
}

#[test]
fn negative_tolerance_is_located_with_key_path() {
    let text = GOOD.replace("tolerance: 0.2", "tolerance: -0.2");
    assert_located(
        &text,
        17,
        "cells.gpt2-tiny.fp32.1gpu.single.base.metrics.peak_mem_bytes.tolerance",
    );
}

#[test]
fn zero_negative_and_nan_values_are_located_with_key_path() {
    for bad in ["0", "-12000", ".nan", ".inf", "-0.0"] {
        let text = GOOD.replace("value: 12000", &format!("value: {bad}"));
        assert_located(
                &text,
                13,
                "cells.gpt2-tiny.fp32.1gpu.single.base.metrics.tokens_per_s.value: must be a finite number above 0",
            );
    }
}

#[test]
fn update_never_writes_a_value_it_could_not_read_back() {
    let m = MetricValue {
        value: 0.0,
        samples: vec![0.0],
        rel_spread: 0.0,
    };
    assert_eq!(entry_from("tokens_per_s", &m, None, None), None);
    let m = MetricValue { value: 2.0, ..m };
    assert!(entry_from("tokens_per_s", &m, None, None).is_some());
}

#[test]
fn unknown_direction_is_located() {
    let text = GOOD.replace("direction: higher", "direction: bigger");
    assert_located(&text, 21, "bigger");
}

#[test]
fn metric_without_value_is_located() {
    let text = GOOD.replace("        value: 3.5\n", "");
    assert_located(&text, 20, "value");
}

#[test]
fn unknown_metric_without_direction_is_located() {
    let text = GOOD.replace("        direction: higher\n", "");
    assert_located(&text, 20, "custom_score.direction");
}

fn run(cells: &[(&str, f64)]) -> RunResults {
    use crate::results::{CellResult, Environment, MetricValue};
    RunResults {
        schema_version: crate::results::SCHEMA_VERSION,
        run_id: "r2".into(),
        matrix: "matrix/smoke.yaml".into(),
        matrix_name: "smoke".into(),
        matrix_sha256: None,
        filters: vec![],
        started_at: "2026-11-22T12:00:00Z".into(),
        finished_at: None,
        interrupted: false,
        interrupted_in: None,
        environment: Environment {
            cpu: "cpu".into(),
            hardware_key: "cpu-x86_64".into(),
            bench_version: "0.1.0".into(),
            git_commit: Some("5e6f7a8".into()),
            ..Default::default()
        },
        environment_source: None,
        launcher: None,
        cells: cells
            .iter()
            .map(|(id, tps)| CellResult {
                id: crate::cell::CellId(id.to_string()),
                values: Default::default(),
                params: Default::default(),
                outcome: Outcome::Passed,
                flaky: false,
                attempts: vec![],
                repeats: vec![],
                metrics: [(
                    "tokens_per_s".to_string(),
                    MetricValue {
                        value: *tps,
                        samples: vec![*tps],
                        rel_spread: 0.002,
                    },
                )]
                .into_iter()
                .collect(),
                logs: vec![],
                duration_s: 1.0,
                telemetry: None,
            })
            .collect(),
        dropped: vec![],
    }
}

#[test]
fn merge_keeps_other_cells_and_custom_tolerances() {
    let mut b = Baselines {
        path: "b/cpu-x86_64.yaml".into(),
        existed: true,
        doc: parse_str(GOOD).unwrap(),
    };
    b.doc
        .cells
        .get_mut("gpt2-tiny.fp32.1gpu.single.base")
        .unwrap()
        .metrics
        .get_mut("tokens_per_s")
        .unwrap()
        .tolerance = Some(0.07);
    let results = run(&[
        ("gpt2-tiny.fp32.1gpu.single.base", 11000.0),
        ("new.cell", 5.0),
    ]);
    let s = merge_run(&mut b, &results, &|_| true, &|_| false, false);
    assert_eq!(s.added, vec!["new.cell".to_string()]);
    assert_eq!(
        s.updated,
        vec!["gpt2-tiny.fp32.1gpu.single.base".to_string()]
    );
    let cell = &b.doc.cells["gpt2-tiny.fp32.1gpu.single.base"];
    let tps = &cell.metrics["tokens_per_s"];
    assert_eq!(tps.value, 11000.0);
    assert_eq!(tps.spread, 0.002);
    assert_eq!(tps.tolerance, Some(0.07), "hand-set tolerance survives");
    // Metrics this run did not measure keep their baseline.
    assert_eq!(cell.metrics["peak_mem_bytes"].floor, Some(1.0e7));
    assert_eq!(cell.provenance.as_ref().unwrap().run_id, "r2");
    assert_eq!(
        b.doc.cells["new.cell"].metrics["tokens_per_s"].direction,
        Direction::Higher
    );
}

#[test]
fn only_improvements_keeps_unimproved_cells_but_adds_new_ones() {
    let mut b = Baselines {
        path: "b/cpu-x86_64.yaml".into(),
        existed: true,
        doc: parse_str(GOOD).unwrap(),
    };
    let results = run(&[
        ("gpt2-tiny.fp32.1gpu.single.base", 9000.0),
        ("new.cell", 5.0),
    ]);
    let s = merge_run(&mut b, &results, &|_| true, &|_| false, true);
    assert_eq!(s.added, vec!["new.cell".to_string()]);
    assert!(s.updated.is_empty());
    let tps = &b.doc.cells["gpt2-tiny.fp32.1gpu.single.base"].metrics["tokens_per_s"];
    assert_eq!(tps.value, 12000.0);
    // An improved cell is raised.
    let results = run(&[("gpt2-tiny.fp32.1gpu.single.base", 13000.0)]);
    let s = merge_run(
        &mut b,
        &results,
        &|_| true,
        &|id| id.starts_with("gpt2"),
        true,
    );
    assert_eq!(s.updated.len(), 1);
    let tps = &b.doc.cells["gpt2-tiny.fp32.1gpu.single.base"].metrics["tokens_per_s"];
    assert_eq!(tps.value, 13000.0);
}

#[test]
fn unselected_and_failed_cells_are_kept() {
    let mut b = Baselines::empty("b/cpu-x86_64.yaml".into(), "cpu-x86_64");
    let mut results = run(&[("a", 1.0), ("b", 2.0)]);
    results.cells[1].outcome = Outcome::Failed {
        reason: "oom".into(),
    };
    let s = merge_run(
        &mut b,
        &results,
        &|c| c.id.as_str() != "a",
        &|_| false,
        false,
    );
    assert!(s.added.is_empty());
    assert_eq!(s.kept.len(), 2);
    assert!(b.doc.cells.is_empty());
}

#[test]
fn a_value_no_measurement_can_give_is_located_with_key_path() {
    let text = GOOD.replace("value: 12000", "value: 1e308");
    assert_located(
        &text,
        13,
        "cells.gpt2-tiny.fp32.1gpu.single.base.metrics.tokens_per_s.value: tokens_per_s is 1e308, outside its plausible range",
    );
}
