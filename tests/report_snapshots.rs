//! Snapshot tests of every report format, rendered from the hand-made fixture runs in
//! tests/fixtures (see make_fixtures.py) against tests/fixtures/baselines. Durations and
//! dates are redacted so that the snapshots pin the content, not the clock.

#[path = "common/energy.rs"]
mod energy;

use std::path::Path;

use bench::baseline::{compare, Baselines, CellStatus, Comparison};
use bench::report::frameworks::FrameworksExporter;
use bench::report::human::HumanExporter;
use bench::report::json::JsonExporter;
use bench::report::junit::JunitExporter;
use bench::report::markdown::MarkdownExporter;
use bench::report::{render_markdown, Exporter, ReportInput};
use bench::results::RunResults;

fn load(run: &str) -> (RunResults, Comparison) {
    let results = RunResults::load(&Path::new("tests/fixtures/runs").join(run)).unwrap();
    let baselines = Baselines::load_for(
        Path::new("tests/fixtures/baselines"),
        &results.environment.hardware_key,
    )
    .unwrap();
    let comparison = compare(&results, &baselines);
    (results, comparison)
}

fn render(exporter: &dyn Exporter, run: &str) -> String {
    let (results, comparison) = load(run);
    exporter
        .render(&ReportInput {
            results: &results,
            comparison: &comparison,
            trends: None,
            history: None,
            findings: &[],
        })
        .unwrap()
}

/// The fixture exercises every status; this pins which cell gets which, so the snapshots
/// below show each status's rendering.
#[test]
fn mixed_fixture_has_every_status() {
    let (_, cmp) = load("mixed");
    let status = |id: &str| cmp.cell(id).map(|c| c.status);
    assert_eq!(
        status("gpt2-125m.bf16.1gpu.single.base"),
        Some(CellStatus::Unchanged)
    );
    assert_eq!(
        status("gpt2-125m.bf16.1gpu.single.compile"),
        Some(CellStatus::Regression)
    );
    assert_eq!(
        status("gpt2-125m.bf16.1gpu.single.sac"),
        Some(CellStatus::Improvement)
    );
    assert_eq!(
        status("gpt2-125m.bf16.2gpu.ddp.base"),
        Some(CellStatus::Unchanged)
    );
    assert_eq!(
        status("gpt2-125m.fp8.1gpu.single.base"),
        Some(CellStatus::New)
    );
    assert_eq!(
        status("gpt2-1_5b.bf16.1gpu.single.base"),
        Some(CellStatus::Failed)
    );
    assert_eq!(
        status("gpt2-1_5b.bf16.2gpu.fsdp.base"),
        Some(CellStatus::TimedOut)
    );
    assert_eq!(
        status("llama-3_1-8b-proxy.bf16.8gpu.fsdp.base"),
        Some(CellStatus::Skipped)
    );
    assert_eq!(
        status("gpt2-125m.fp8.2gpu.ddp.sac"),
        Some(CellStatus::Dropped)
    );
    assert_eq!(
        status("gpt2-125m.bf16.1gpu.single.compile+sac"),
        Some(CellStatus::Missing)
    );
    assert_eq!(cmp.exit_code(), 1);
    // The regression's speed-up factor is the throughput ratio.
    let f = cmp
        .cell("gpt2-125m.bf16.1gpu.single.compile")
        .unwrap()
        .speedup()
        .unwrap();
    assert!((f - 0.94).abs() < 1e-9, "{f}");
}

#[test]
fn junit_xml() {
    let xml = render(&JunitExporter, "mixed");
    insta::with_settings!({filters => vec![
        (r#"time="[0-9.e-]+""#, r#"time="[duration]""#),
        (r#"timestamp="[^"]+""#, r#"timestamp="[date]""#),
    ]}, {
        insta::assert_snapshot!(xml);
    });
}

#[test]
fn summary_md() {
    insta::assert_snapshot!(render(&MarkdownExporter, "mixed"));
}

#[test]
fn pr_comment_markdown() {
    let (results, comparison) = load("mixed");
    let md = render_markdown(
        &results,
        &comparison,
        None,
        Some("https://github.com/acme/train/actions/runs/42"),
    );
    assert!(md.contains("<details>"));
    // Regressions come before the table of every cell.
    let reg = md.find("#### Regressions").unwrap();
    assert!(reg < md.find("<details>").unwrap());
    insta::assert_snapshot!(md);
}

#[test]
fn summary_md_without_baselines() {
    // The CPU fixture's hardware key has no baseline file: every cell is new, exit 0.
    let (_, cmp) = load("cpu-ok");
    assert!(!cmp.baseline_exists);
    assert_eq!(cmp.exit_code(), 0);
    insta::assert_snapshot!(render(&MarkdownExporter, "cpu-ok"));
}

#[test]
fn report_json() {
    let json: serde_json::Value = serde_json::from_str(&render(&JsonExporter, "mixed")).unwrap();
    assert_eq!(json["exit_code"], 1);
    assert_eq!(json["counts"]["regression"], 1);
    insta::assert_json_snapshot!(json, {
        ".started_at" => "[date]",
        ".finished_at" => "[date]",
        ".cells[].duration_s" => "[duration]",
        ".cells[].baseline_provenance.date" => "[date]",
    });
}

#[test]
fn human_summary() {
    let text = render(&HumanExporter, "mixed");
    insta::with_settings!({filters => vec![
        // The time column (just before the verdict) and the total.
        (r"(\d+(\.\d+)? m?s|\d+m \d\ds|\d+h \d\dm)  (REGRESSION|FAILED|TIMED OUT|[a-z]+)", "[dur]  $3"),
        (r"took .*", "took [duration]"),
    ]}, {
        insta::assert_snapshot!(text);
    });
}

/// The data report.html embeds (and its script draws), for the mixed fixture: every cell
/// that was meant to run with its metrics against the baseline and its step traces, and the
/// dropped cells by rule.
#[test]
fn html_report_data() {
    let page = render(&bench::report::html::HtmlExporter, "mixed");
    assert!(page.starts_with("<!doctype html>"));
    // Self-contained: nothing loaded from elsewhere.
    assert!(!page.contains("src=\"http") && !page.contains("href=\"http"));
    let data = bench::report::html::embedded_data(&page).expect("the page embeds its data");
    insta::assert_json_snapshot!(data, {
        ".runs[].started_at" => "[date]",
        ".runs[].finished_at" => "[date]",
        ".cells[].duration_s" => "[duration]",
        ".cells[].traces[].step_time_s" => "[durations]",
    });
}

/// The framework comparison of a real GPU run (two H200s, DeepSpeed and Megatron-Core, three
/// repeats each, 2026-11-27): each figure's range over the repeats, and the "What ran" table
/// from the runs' own records, DeepSpeed's compile that hit dynamo's recompile limit included.
#[test]
fn frameworks_md_of_a_gpu_run() {
    let dir = Path::new("docs/results/frameworks-2026-11-27/h200x2-deepspeed-megatron");
    let results = RunResults::load(dir).unwrap();
    let none = tempfile::tempdir().unwrap();
    let baselines = Baselines::load_for(none.path(), &results.environment.hardware_key).unwrap();
    let comparison = compare(&results, &baselines);
    let md = FrameworksExporter {
        gpu_hour_price: Some(2.5),
    }
    .render(&ReportInput {
        results: &results,
        comparison: &comparison,
        trends: None,
        history: None,
        findings: &[],
    })
    .unwrap();
    assert!(
        md.contains("partly eager: dynamo hit its recompile limit \\(8\\)"),
        "{md}"
    );
    assert!(md.contains("30,086–30,773 (3)"), "{md}");
    insta::assert_snapshot!(md);
}

/// The mixed fixture's findings (one per cause: its regression and its improvement, each
/// with the axis values that separate it from the unchanged cells) lead `summary.md`, and
/// JUnit's failure names the regression's finding.
#[test]
fn summary_md_with_findings() {
    let (results, comparison) = load("mixed");
    let verdicts = bench::judge::Verdicts {
        comparison,
        history: None,
        trends: None,
    };
    let findings = bench::triage::findings(&results, &verdicts);
    assert!(!findings.is_empty());
    let input = ReportInput::new(&results, &verdicts, &findings);
    let md = MarkdownExporter.render(&input).unwrap();
    let lead = md.find("#### Findings").expect("a findings section");
    assert!(lead < md.find("<details>").unwrap_or(md.len()), "{md}");
    let xml = JunitExporter.render(&input).unwrap();
    assert!(xml.contains("[finding F1: "), "{xml}");
    insta::assert_snapshot!(md
        .lines()
        .take_while(|l| !l.starts_with("<details>"))
        .collect::<Vec<_>>()
        .join("\n"));
}

/// The mixed fixture with its GPU cells' power read (tests/common/energy.rs), against the
/// mixed fixture's baselines, which predate the energy metrics: the terminal summary and
/// `summary.md` put a tokens/J column beside tokens/s per GPU and say what the figure does
/// not count; the cells' energy is new against baselines without it.
#[test]
fn summaries_with_energy() {
    let (results, _) = energy::energy_run();
    let baselines = Baselines::load_for(
        Path::new("tests/fixtures/baselines"),
        &results.environment.hardware_key,
    )
    .unwrap();
    let comparison = compare(&results, &baselines);
    let input = ReportInput {
        results: &results,
        comparison: &comparison,
        trends: None,
        history: None,
        findings: &[],
    };
    let text = HumanExporter.render(&input).unwrap();
    let md = MarkdownExporter.render(&input).unwrap();
    // 465,300 tokens/s on one GPU at 600 W: 775.5 tokens per joule.
    assert!(text.contains("  776  "), "{text}");
    assert!(md.contains("| 465K | 776 |"), "{md}");
    insta::with_settings!({filters => vec![
        (r"(\d+(\.\d+)? m?s|\d+m \d\ds|\d+h \d\dm)  (REGRESSION|FAILED|TIMED OUT|[a-z]+)", "[dur]  $3"),
        (r"took .*", "took [duration]"),
    ]}, {
        insta::assert_snapshot!("human_summary_with_energy", text);
    });
    insta::assert_snapshot!("summary_md_with_energy", md);
}

/// A fleet of two runs on different hardware (the H100 fixture and a CPU run), each judged
/// against its own key: the fleet's summary, JUnit, HTML and PR comment.
#[test]
fn fleet_reports() {
    use bench::report::fleet::{self, FleetPart};
    let (mixed, mixed_cmp) = load("mixed");
    let (cpu, cpu_cmp) = load("cpu-ok");
    let part = |folder: &str, results, comparison, exit| FleetPart {
        folder: folder.into(),
        input: ReportInput {
            results,
            comparison,
            trends: None,
            history: None,
            findings: &[],
        },
        exit,
        shards: if folder == "cpu-x86_64" {
            vec!["shard 1/2: finished, 2 of 2 planned cells".into()]
        } else {
            Vec::new()
        },
    };
    let parts = vec![
        part("h100-sxm-80gb", &mixed, &mixed_cmp, 1),
        part("cpu-x86_64", &cpu, &cpu_cmp, 0),
    ];
    assert_eq!(fleet::exit_code(&parts, &[]), 1);
    let summaries = vec![
        MarkdownExporter.render(&parts[0].input).unwrap(),
        MarkdownExporter.render(&parts[1].input).unwrap(),
    ];
    insta::assert_snapshot!(
        "fleet_summary_md",
        fleet::render_summary(&parts, &summaries, &[])
    );
    insta::assert_snapshot!("fleet_comment_md", fleet::render_comment(&parts, &[], None));
    insta::assert_snapshot!("fleet_report_html", fleet::render_html(&parts, &[]));
    insta::with_settings!({filters => vec![
        (r#"time="[0-9.e-]+""#, r#"time="[duration]""#),
        (r#"timestamp="[^"]+""#, r#"timestamp="[date]""#),
    ]}, {
        insta::assert_snapshot!("fleet_junit_xml", fleet::render_junit(&parts, &[]).unwrap());
    });
}

/// A fleet of many runs whose comments are long still posts one comment within the size a
/// pull request takes, every failing run's row first in its table.
#[test]
fn a_fleet_comment_of_many_runs_stays_within_its_size() {
    use bench::report::fleet::{self, FleetPart};
    let (mixed, cmp) = load("mixed");
    for n in [2, 8, 40, 200] {
        let parts: Vec<FleetPart<'_>> = (0..n)
            .map(|i| FleetPart {
                folder: format!("{}-{i}", "k".repeat(120)),
                input: ReportInput {
                    results: &mixed,
                    comparison: &cmp,
                    trends: None,
                    history: None,
                    findings: &[],
                },
                exit: 1,
                shards: Vec::new(),
            })
            .collect();
        let body = fleet::render_comment(&parts, &[], Some("https://ci.example/artifacts"));
        assert!(
            body.len() <= bench::report::markdown::MAX_BYTES,
            "{n} runs: {} bytes",
            body.len()
        );
        assert!(body.starts_with("### bench fleet"), "{body}");
        if n == 2 {
            // Two runs fit whole: each keeps its regressions.
            assert_eq!(body.matches("Regressions").count(), 2, "{body}");
        }
    }
}
