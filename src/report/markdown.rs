//! `summary.md` and the pull-request comment body: regressions first (with the numbers),
//! then failed cells and improvements, then a table of every cell (tokens/s per GPU,
//! TFLOP/s per GPU beside MFU, change against the baseline, verdict), then the hardware,
//! commit and bench version the numbers come from.
//!
//! The same renderer serves both: [`render_markdown`] folds the table into a `<details>`
//! block and links the CI artifacts (for comments, where space is precious), while the
//! `summary.md` sink shows the table open (for job summaries and the run folder).

use crate::baseline::compare::{CellComparison, CellStatus, Comparison, Counts, Verdict};
use crate::baseline::store::hardware_words;
use crate::report::text::{
    cell_change, grouped, metric_label, metric_value, one_line, pct, pct_change, three_digits,
};
use crate::report::{Exporter, ReportError, ReportInput};
use crate::results::RunResults;

/// The `summary.md` sink.
pub struct MarkdownExporter;

impl Exporter for MarkdownExporter {
    fn file_name(&self) -> &'static str {
        "summary.md"
    }

    fn render(&self, input: &ReportInput<'_>) -> Result<String, ReportError> {
        Ok(render_summary(input))
    }
}

/// The Markdown of `summary.md` (and of `$GITHUB_STEP_SUMMARY`): the table of cells open.
pub fn render_summary(input: &ReportInput<'_>) -> String {
    render(input.results, input.comparison, None, false)
}

/// The Markdown body of a pull-request / merge-request comment: regressions first, a
/// collapsible table of every cell, the hardware and commit, and a link to the CI run's
/// artifacts when `artifacts_url` is given.
pub fn render_markdown(
    results: &RunResults,
    comparison: &Comparison,
    artifacts_url: Option<&str>,
) -> String {
    render(results, comparison, artifacts_url, true)
}

/// Text safe inside a Markdown table cell (and not taken for HTML).
fn esc(s: &str) -> String {
    one_line(s)
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('|', "\\|")
}

fn headline(c: &Counts) -> String {
    let mut bad = Vec::new();
    let plural =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    if c.regression > 0 {
        bad.push(plural(c.regression, "regression", "regressions"));
    }
    if c.failed > 0 {
        bad.push(plural(c.failed, "failed cell", "failed cells"));
    }
    if c.timed_out > 0 {
        bad.push(plural(c.timed_out, "timed-out cell", "timed-out cells"));
    }
    if bad.is_empty() {
        "no regressions".into()
    } else {
        bad.join(", ")
    }
}

fn counts_line(c: &Counts) -> String {
    let parts = [
        (c.regression, "regression"),
        (c.improvement, "improved"),
        (c.unchanged, "unchanged"),
        (c.new, "new"),
        (c.failed, "failed"),
        (c.timed_out, "timed out"),
        (c.skipped, "skipped"),
        (c.dropped, "dropped"),
        (c.missing, "missing"),
        (c.flaky, "flaky"),
    ];
    parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| {
            if *what == "regression" {
                format!("**{n} {what}{}**", if *n == 1 { "" } else { "s" })
            } else {
                format!("{n} {what}")
            }
        })
        .collect::<Vec<_>>()
        .join(" · ")
}

fn verdict_cell(cell: &CellComparison) -> String {
    let mut v = match cell.status {
        CellStatus::Regression | CellStatus::Failed | CellStatus::TimedOut => {
            format!("**{}**", cell.status.as_str())
        }
        other => other.as_str().to_string(),
    };
    if let (
        CellStatus::Failed | CellStatus::TimedOut | CellStatus::Skipped | CellStatus::Dropped,
        Some(r),
    ) = (cell.status, &cell.reason)
    {
        v.push_str(&format!(": {}", esc(r)));
    }
    if cell.flaky {
        v.push_str(" (flaky)");
    }
    v
}

fn metric_cell(cell: &CellComparison, metric: &str) -> String {
    cell.metric(metric)
        .and_then(|m| m.current)
        .map(|v| match metric {
            "tokens_per_s_per_gpu" => crate::report::text::si(v),
            "tflops_per_gpu" => three_digits(v),
            _ => metric_value(metric, v),
        })
        .unwrap_or_else(|| "–".into())
}

fn change_table(out: &mut String, cells: &[&CellComparison], wanted: Verdict) {
    out.push_str("| cell | metric | baseline | now | change | tolerance | noise |\n");
    out.push_str("|---|---|---:|---:|---:|---:|---:|\n");
    for cell in cells {
        for (m, also) in grouped(cell.metrics.iter().filter(|m| m.verdict == wanted)) {
            let fmt = |v: Option<f64>| v.map(|v| metric_value(&m.metric, v)).unwrap_or_default();
            let mut label = metric_label(&m.metric).to_string();
            if !also.is_empty() {
                label.push_str(&format!(" (also {})", also.join(", ")));
            }
            out.push_str(&format!(
                "| `{}` | {} | {} | {} | {} | {} | {} |\n",
                cell.id,
                label,
                fmt(m.baseline),
                fmt(m.current),
                m.change.map(pct_change).unwrap_or_default(),
                m.tolerance.map(pct).unwrap_or_default(),
                m.noise.map(pct).unwrap_or_default(),
            ));
        }
    }
    out.push('\n');
}

fn render(
    results: &RunResults,
    cmp: &Comparison,
    artifacts_url: Option<&str>,
    collapse: bool,
) -> String {
    let env = &results.environment;
    let counts = cmp.counts();
    let mut out = format!(
        "### bench: `{}` on `{}`: {}\n\n",
        results.matrix_name,
        env.hardware_key,
        headline(&counts)
    );
    out.push_str(&counts_line(&counts));
    out.push_str("\n\n");
    if results.interrupted {
        out.push_str("> The run was interrupted before every cell ran.\n\n");
    }
    if !cmp.baseline_exists {
        out.push_str(&format!(
            "> No baselines for `{}` yet: every cell is new. Write them with `bench baseline update`.\n\n",
            env.hardware_key
        ));
    }

    let regressions: Vec<&CellComparison> = cmp.with_status(CellStatus::Regression).collect();
    if !regressions.is_empty() {
        out.push_str("#### Regressions\n\n");
        change_table(&mut out, &regressions, Verdict::Regression);
    }
    let failed: Vec<&CellComparison> = cmp
        .cells
        .iter()
        .filter(|c| matches!(c.status, CellStatus::Failed | CellStatus::TimedOut))
        .collect();
    if !failed.is_empty() {
        out.push_str("#### Failed cells\n\n");
        for c in failed {
            out.push_str(&format!(
                "- `{}` {}: {}\n",
                c.id,
                c.status.as_str(),
                esc(c.reason.as_deref().unwrap_or("no reason given"))
            ));
        }
        out.push('\n');
    }
    let improved: Vec<&CellComparison> = cmp.with_status(CellStatus::Improvement).collect();
    if !improved.is_empty() {
        out.push_str("#### Improvements\n\n");
        change_table(&mut out, &improved, Verdict::Improvement);
    }

    if collapse {
        out.push_str(&format!(
            "<details><summary>All {} cells</summary>\n\n",
            cmp.cells.len()
        ));
    } else {
        out.push_str("#### All cells\n\n");
    }
    out.push_str("| cell | tokens/s/GPU | TFLOP/s/GPU | MFU | change vs baseline | verdict |\n");
    out.push_str("|---|---:|---:|---:|---|---|\n");
    for cell in &cmp.cells {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} |\n",
            cell.id,
            metric_cell(cell, "tokens_per_s_per_gpu"),
            metric_cell(cell, "tflops_per_gpu"),
            metric_cell(cell, "mfu"),
            cell_change(cell),
            verdict_cell(cell),
        ));
    }
    out.push('\n');
    if collapse {
        out.push_str("</details>\n\n");
    }

    let mut hw = format!(
        "**Hardware** {} (`{}`)",
        esc(&hardware_words(env)),
        env.hardware_key
    );
    for (name, v) in [
        ("driver", &env.driver),
        ("CUDA", &env.cuda),
        ("ROCm", &env.rocm),
        ("libtorch", &env.libtorch),
        ("NCCL", &env.nccl),
    ] {
        if let Some(v) = v {
            hw.push_str(&format!(", {name} {}", esc(v)));
        }
    }
    out.push_str(&hw);
    out.push_str("  \n");
    let commit = match &env.git_commit {
        Some(c) if env.git_dirty => format!("`{}` (uncommitted changes)", esc(c)),
        Some(c) => format!("`{}`", esc(c)),
        None => "unknown".into(),
    };
    out.push_str(&format!(
        "**Commit** {commit} · **bench** {} · run `{}` · baselines `{}`  \n",
        esc(&env.bench_version),
        esc(&results.run_id),
        esc(&cmp.baseline_file)
    ));
    let policies = crate::report::mfu_policies(results);
    if !policies.is_empty() {
        out.push_str(&format!(
            "MFU is against {}.  \n",
            policies
                .iter()
                .map(|p| esc(p))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    if let Some(url) = artifacts_url {
        out.push_str(&format!("[Results, logs and reports]({url})  \n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::esc;

    #[test]
    fn reasons_cannot_break_a_table_or_inject_html() {
        assert_eq!(
            esc("a | b\n<script>x</script> & c"),
            "a \\| b &lt;script&gt;x&lt;/script&gt; &amp; c"
        );
    }
}
