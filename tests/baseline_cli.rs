//! `bench baseline update` and the baseline files as `bench report` reads them: runs the
//! built binary on fixture run folders (tests/fixtures/runs) in temporary directories.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use bench::baseline::Baselines;

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(args)
        .env_remove("GITHUB_STEP_SUMMARY")
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A temporary folder with copies of the fixture runs and an empty baselines folder.
struct Setup {
    _tmp: tempfile::TempDir,
    root: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        for run in ["cpu-ok", "cpu-slow"] {
            std::fs::create_dir_all(root.join(run)).unwrap();
            std::fs::copy(
                Path::new("tests/fixtures/runs")
                    .join(run)
                    .join("results.json"),
                root.join(run).join("results.json"),
            )
            .unwrap();
        }
        Setup { _tmp: tmp, root }
    }
    fn p(&self, rel: &str) -> String {
        self.root.join(rel).to_str().unwrap().to_string()
    }
    fn update(&self, run: &str, extra: &[&str]) -> Output {
        let (run, b) = (self.p(run), self.p("baselines"));
        let mut args = vec!["baseline", "update", &run, "--baselines", &b];
        args.extend_from_slice(extra);
        bench(&args)
    }
    fn report(&self, run: &str) -> Output {
        bench(&["report", &self.p(run), "--baselines", &self.p("baselines")])
    }
    fn file(&self) -> PathBuf {
        self.root.join("baselines/cpu-x86_64.yaml")
    }
}

const TINY: &str = "gpt2-tiny.fp32.1gpu.single.base";

#[test]
fn update_then_report_shows_no_regression() {
    let s = Setup::new();
    let out = s.update("cpu-ok", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("3 added, 0 updated, 1 kept"),
        "{}",
        text(&out.stdout)
    );
    let b = Baselines::load_file(&s.file()).unwrap();
    assert_eq!(b.doc.cells.len(), 3);
    let cell = &b.doc.cells[TINY];
    let p = cell.provenance.as_ref().unwrap();
    assert_eq!(
        (p.run_id.as_str(), p.commit.as_deref(), p.git_dirty),
        ("20261122T090000Z", Some("1a2b3c4d5e6f"), true)
    );
    assert_eq!(cell.metrics["tokens_per_s"].value, 52_000.0);
    assert!((cell.metrics["tokens_per_s"].spread - 0.004).abs() < 1e-12);

    let out = s.report("cpu-ok");
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("3 unchanged"), "{stdout}");
    assert!(!stdout.contains("REGRESSION"), "{stdout}");
    let junit = std::fs::read_to_string(s.root.join("cpu-ok/junit.xml")).unwrap();
    assert!(!junit.contains("<failure"));
}

#[test]
fn slowed_down_run_is_a_regression_and_exits_1() {
    let s = Setup::new();
    assert_eq!(s.update("cpu-ok", &[]).status.code(), Some(0));
    let out = s.report("cpu-slow");
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("-6.0% (1.06x slower)"), "{stdout}");
    assert!(stdout.contains("1 regressed, 2 unchanged"), "{stdout}");
    let junit = std::fs::read_to_string(s.root.join("cpu-slow/junit.xml")).unwrap();
    let at = junit.find(&format!(r#"<testcase name="{TINY}""#)).unwrap();
    let case = &junit[at..at + junit[at..].find("</testcase>").unwrap()];
    assert!(
        case.contains("<failure ") && case.contains(r#" type="regression"/>"#),
        "{case}"
    );
    assert!(case.contains("-6.0%"), "{case}");
}

#[test]
fn only_improvements_never_lowers_a_baseline() {
    let s = Setup::new();
    assert_eq!(s.update("cpu-ok", &[]).status.code(), Some(0));
    let before = std::fs::read(s.file()).unwrap();
    let out = s.update("cpu-slow", &["--only-improvements"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        text(&out.stdout).contains("0 added, 0 updated"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(std::fs::read(s.file()).unwrap(), before, "file rewritten");
    // Without the option the slower numbers become the baseline.
    assert_eq!(s.update("cpu-slow", &[]).status.code(), Some(0));
    let b = Baselines::load_file(&s.file()).unwrap();
    assert!((b.doc.cells[TINY].metrics["tokens_per_s"].value - 52_000.0 * 0.94).abs() < 1e-6);
    assert_eq!(s.report("cpu-slow").status.code(), Some(0));
}

#[test]
fn hand_set_tolerances_survive_an_update() {
    let s = Setup::new();
    assert_eq!(s.update("cpu-ok", &[]).status.code(), Some(0));
    // A reviewer widens the tolerance of one cell by hand.
    let mut b = Baselines::load_file(&s.file()).unwrap();
    for m in b.doc.cells.get_mut(TINY).unwrap().metrics.values_mut() {
        m.tolerance = Some(0.08);
        m.floor = Some(1.0);
    }
    b.save().unwrap();
    // With 8% allowed, the 6% slower run passes.
    assert_eq!(s.report("cpu-slow").status.code(), Some(0));
    assert_eq!(s.update("cpu-slow", &[]).status.code(), Some(0));
    let b = Baselines::load_file(&s.file()).unwrap();
    let m = &b.doc.cells[TINY].metrics["tokens_per_s"];
    assert_eq!((m.tolerance, m.floor), (Some(0.08), Some(1.0)));
    assert_eq!(
        b.doc.cells[TINY].provenance.as_ref().unwrap().run_id,
        "20261122T100000Z"
    );
}

#[test]
fn filter_selects_the_cells_to_update() {
    let s = Setup::new();
    let out = s.update("cpu-ok", &["--filter", "sac or model=llama-tiny"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let file = std::fs::read_to_string(s.file()).unwrap();
    assert!(file.contains("gpt2-tiny.fp32.1gpu.single.sac:"), "{file}");
    assert!(file.contains("llama-tiny.fp32.1gpu.single.base:"), "{file}");
    assert!(!file.contains(&format!("{TINY}:")), "{file}");
    // A filter naming an axis the run does not have is bad input, with a caret.
    let out = s.update("cpu-ok", &["--filter", "gpu=1"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("unknown axis or parameter `gpu`") && err.contains('^'),
        "{err}"
    );
}

const VALID: &str = "\
schema_version: 1
hardware_key: cpu-x86_64
cells:
  gpt2-tiny.fp32.1gpu.single.base:
    metrics:
      tokens_per_s:
        value: 52000
        direction: higher
        tolerance: 0.03
        spread: 0.004
      peak_mem_bytes:
        value: 310000000
";

/// Every malformed shape of a baseline file makes both `bench report` and `bench baseline
/// update` exit 2 with the file, line and column (and the key path where it applies).
#[test]
fn each_malformed_baseline_exits_2_with_its_location() {
    let shapes: &[(&str, String, &str)] = &[
        (
            "bad YAML",
            VALID.replace("value: 52000", "value: [52000"),
            ":7:",
        ),
        (
            "wrong type",
            VALID.replace("value: 52000", "value: fast"),
            ":7:16",
        ),
        (
            "unknown key",
            VALID.replace("spread:", "sprad:"),
            ":10:9: malformed baseline file: unknown field `sprad`",
        ),
        (
            "negative tolerance",
            VALID.replace("tolerance: 0.03", "tolerance: -0.03"),
            ":9:20: cells.gpt2-tiny.fp32.1gpu.single.base.metrics.tokens_per_s.tolerance",
        ),
        (
            "unknown direction",
            VALID.replace("direction: higher", "direction: up"),
            ":8:20: malformed baseline file: unknown variant `up`",
        ),
        (
            "metric without value",
            VALID.replace("        value: 310000000\n", "        spread: 0.0\n"),
            ":12:9: malformed baseline file: missing field `value`",
        ),
        (
            "unknown top-level key",
            format!("{VALID}owner: perf-team\n"),
            ":13:1: malformed baseline file: unknown field `owner`",
        ),
        (
            "wrong hardware key",
            VALID.replace("hardware_key: cpu-x86_64", "hardware_key: h100-sxm-80gb"),
            "hardware_key: the file is named for `cpu-x86_64`",
        ),
        (
            "newer schema",
            VALID.replace("schema_version: 1", "schema_version: 7"),
            ":1:17: schema_version:",
        ),
        (
            "not a number",
            VALID.replace("value: 52000", "value: .nan"),
            ":7:16",
        ),
        (
            "negative floor",
            VALID.replace("tolerance: 0.03", "floor: -5"),
            "metrics.tokens_per_s.floor: must be a finite number >= 0",
        ),
        (
            "negative spread",
            VALID.replace("spread: 0.004", "spread: -0.004"),
            ":10:17: cells.gpt2-tiny.fp32.1gpu.single.base.metrics.tokens_per_s.spread",
        ),
        (
            "metric with no default direction",
            VALID.replace("peak_mem_bytes:", "loss_at_end:"),
            "metrics.loss_at_end.direction: `loss_at_end` has no default direction",
        ),
        (
            "duplicate cell",
            format!("{VALID}  gpt2-tiny.fp32.1gpu.single.base:\n    metrics: {{}}\n"),
            ":13:3: malformed baseline file: duplicate mapping key",
        ),
        (
            "cells not a mapping",
            "schema_version: 1\nhardware_key: cpu-x86_64\ncells: [a, b]\n".to_string(),
            ":3:8",
        ),
    ];
    for (what, yaml, located) in shapes {
        let s = Setup::new();
        std::fs::create_dir_all(s.root.join("baselines")).unwrap();
        std::fs::write(s.file(), yaml).unwrap();
        for out in [s.report("cpu-ok"), s.update("cpu-ok", &[])] {
            // miette draws a frame and wraps long lines (also at hyphens): compare the text
            // without its frame and whitespace.
            let squeeze = |s: &str| {
                s.replace(['│', '×'], "")
                    .split_whitespace()
                    .collect::<String>()
            };
            let stderr = squeeze(&text(&out.stderr));
            let located = squeeze(located);
            let located = located.as_str();
            assert_eq!(out.status.code(), Some(2), "{what}: {stderr}");
            assert!(stderr.contains("cpu-x86_64.yaml"), "{what}: {stderr}");
            assert!(
                stderr.contains(located),
                "{what}: `{located}` not in {stderr}"
            );
        }
        // Nothing was written over the broken file, and no report claims every cell new.
        assert_eq!(&std::fs::read_to_string(s.file()).unwrap(), yaml, "{what}");
        assert!(!s.root.join("cpu-ok/junit.xml").exists(), "{what}");
    }
}
