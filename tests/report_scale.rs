//! A 300-cell nightly with regressions, improvements, failed and timed-out cells, rule drops
//! and filter drops (tests/common/nightly.rs): the PR comment and the job summary each stay
//! under 20 KB with every regression, failure and improvement in them; dropped cells are one
//! line per rule (ids only in a collapsed block, never the filter's); JUnit has a testcase
//! per cell that was meant to run and one property per rule; the HTML page has every cell.

#[path = "common/nightly.rs"]
mod nightly;

use bench::baseline::{compare, CellStatus};
use bench::report::html::HtmlData;
use bench::report::junit::JunitExporter;
use bench::report::markdown::{render_summary, MAX_BYTES};
use bench::report::{render_markdown, Exporter, ReportInput};

fn check_markdown(md: &str, n: &nightly::Nightly, what: &str) {
    assert!(
        md.len() < MAX_BYTES && MAX_BYTES <= 20_000,
        "{what} is {} bytes",
        md.len()
    );
    for id in n.regressed.iter().chain(&n.improved).chain(&n.failed) {
        assert!(md.contains(&format!("`{id}`")), "{what} lacks {id}");
    }
    for id in &n.filtered {
        assert!(!md.contains(id.as_str()), "{what} names filtered cell {id}");
    }
    assert!(
        !md.contains("did not match"),
        "{what} lists the filter's drops"
    );
    // One line per rule, with its count (the rule's words are the matrix author's text,
    // so their Markdown specials are escaped in the source).
    assert!(
        md.contains("- rules\\[0\\] \\(single-is-one-gpu\\): single runs on one GPU: 180 cells\n"),
        "{md}"
    );
    assert!(md.contains(
        "- rules\\[1\\] \\(fp32-small-only\\): fp32 is measured on the smallest model only: 144 cells\n"
    ));
    assert!(md.contains("- rules\\[2\\] \\(fp8-no-sac\\): "));
    // Regressions first, each of the first ones with a chart of its steps.
    let reg = md.find("#### Regressions").unwrap();
    assert!(reg < md.find("#### Failed cells").unwrap());
    assert!(md.find("#### Failed cells").unwrap() < md.find("#### Improvements").unwrap());
    let charts = md.matches("```mermaid\nxychart-beta\n").count();
    assert!((1..=6).contains(&charts), "{charts} charts");
    assert!(md.contains("tokens/s per measured step of this run"));
}

#[test]
fn comment_and_summary_of_a_300_cell_nightly_stay_under_20_kb() {
    let n = nightly::nightly();
    assert_eq!(n.results.cells.len(), 300);
    let cmp = compare(&n.results, &n.baselines);
    let count = |s: CellStatus| cmp.with_status(s).count();
    assert_eq!(count(CellStatus::Regression), n.regressed.len());
    assert_eq!(count(CellStatus::Improvement), n.improved.len());
    assert_eq!(
        count(CellStatus::Failed) + count(CellStatus::TimedOut),
        n.failed.len()
    );
    assert!(n.regressed.len() >= 15 && n.improved.len() >= 10 && n.failed.len() >= 8);

    let comment = render_markdown(
        &n.results,
        &cmp,
        None,
        Some("https://github.com/acme/train/actions/runs/42"),
    );
    check_markdown(&comment, &n, "the comment");
    let input = ReportInput {
        results: &n.results,
        comparison: &cmp,
        trends: None,
        history: None,
        findings: &[],
    };
    let summary = render_summary(&input);
    check_markdown(&summary, &n, "the job summary");
    eprintln!(
        "300 cells: comment {} bytes, summary {} bytes",
        comment.len(),
        summary.len()
    );

    // JUnit: one testcase per cell meant to run; rule drops as suite properties only.
    let xml = JunitExporter.render(&input).unwrap();
    assert_eq!(xml.matches("<testcase ").count(), 300);
    assert!(xml.contains(
        r#"<property name="dropped rules[0] (single-is-one-gpu)" value="180 cells: single runs on one GPU"/>"#
    ));
    for id in &n.filtered {
        assert!(!xml.contains(id.as_str()));
    }

    // The page's data has every cell that ran, and no filtered one.
    let data = HtmlData::build(&[(&n.results, &cmp)], None);
    assert_eq!(data.cells.len(), 300);
    assert_eq!(data.dropped.len(), 3);
    assert!(data.cells.iter().all(|c| !n.filtered.contains(&c.id)));
    // Every ddp/fsdp configuration ran at 1, 2, 4 and 8 GPUs: a scaling line each.
    assert!(!data.scaling.is_empty());
    assert!(data.scaling.iter().all(|g| g.points.len() >= 2));
}
