//! `summary.md` and the pull-request comment body: regressions first (with the numbers and
//! a small Mermaid `xychart-beta` chart of each regressed cell's recent values, which GitHub
//! and GitLab both render in comments), then failed cells and improvements, then one line
//! per matrix rule that dropped cells, then a table of every cell (tokens/s per GPU, tokens
//! per joule when the cells' GPU power was read, TFLOP/s per GPU beside MFU, change against
//! the baseline, verdict), then the hardware, commit and bench version the numbers come
//! from, with what the energy figures count and leave out when there are any.
//!
//! The same renderer serves both: [`render_markdown`] folds the table into a `<details>`
//! block and links the CI artifacts (for comments, where space is precious), while the
//! `summary.md` sink shows the table open (for job summaries and the run folder).
//!
//! Both stay under [`MAX_BYTES`] whatever the matrix's size: regressions, failures and
//! improvements always come complete (only a pathological run with thousands of them is
//! cut, saying so); the charts, the table of every cell and the ids of dropped cells come
//! after them in that order, each only when it still fits, and otherwise a line points to
//! `report.html`, which has everything. Cells `--filter` removed appear only as a count.
//!
//! The charts are drawn in [`chart`]; this file lays out the sections and their budget.

mod chart;

use self::chart::regression_chart;
use crate::baseline::compare::{CellComparison, CellStatus, Comparison, Counts, Verdict};
use crate::baseline::store::hardware_words;
use crate::history::gate::GateReport;
use crate::report::escape::{code, code_cell, text};
use crate::report::input::{Exporter, ReportError, ReportInput};
use crate::report::text::{
    cell_change, filtered_out, grouped, metric_label, metric_value, pct, pct_change, rule_drops,
    three_digits,
};
use crate::results::RunResults;
use crate::trend::Trends;

/// The most a comment or job summary may take, in bytes. GitHub caps comments at 65,536
/// characters and GitLab notes at 1,000,000; a reader scrolling a PR wants far less than
/// either, so a 300-cell nightly must fit in this.
pub const MAX_BYTES: usize = 20_000;

/// Regressions that get a chart (the rest are in the table, and charted in report.html).
const MAX_CHARTS: usize = 6;

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
    render(
        input.results,
        input.comparison,
        input.trends,
        input.history,
        input.findings,
        None,
        false,
    )
}

/// The Markdown body of a pull-request / merge-request comment: regressions first, a
/// collapsible table of every cell, the hardware and commit, and a link to the CI run's
/// artifacts (where `report.html` is) when `artifacts_url` is given. The charts show
/// `trends` (earlier runs) when given, else this run's repeats or steps.
pub fn render_markdown(
    results: &RunResults,
    comparison: &Comparison,
    trends: Option<&Trends>,
    artifacts_url: Option<&str>,
) -> String {
    render(results, comparison, trends, None, &[], artifacts_url, true)
}

/// [`render_markdown`] for a run judged against its history: the history's section (every
/// remarkable cell's verdict line, the `bench bisect` commands) follows the headline.
pub fn render_comment(
    results: &RunResults,
    comparison: &Comparison,
    trends: Option<&Trends>,
    history: Option<&GateReport>,
    findings: &[crate::triage::Finding],
    artifacts_url: Option<&str>,
) -> String {
    render(
        results,
        comparison,
        trends,
        history,
        findings,
        artifacts_url,
        true,
    )
}

/// The findings section: one line per cause (its id, the axis values that separate its
/// cells, its suspects), its cells beneath it, and the evidence against an attribution.
fn findings_section(findings: &[crate::triage::Finding]) -> String {
    if findings.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "#### Findings

",
    );
    for f in findings {
        out.push_str(&format!(
            "- **{}**: {}
",
            text(&f.id),
            text(&f.headline_body())
        ));
        const SHOWN: usize = 8;
        let cells: Vec<String> = f
            .cells
            .iter()
            .take(SHOWN)
            .map(|(c, s)| format!("{} {}", code(c), pct_change(*s)))
            .collect();
        let more = f.cells.len().saturating_sub(SHOWN);
        out.push_str(&format!(
            "  - cells: {}{}
",
            cells.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ));
        for a in &f.against {
            out.push_str(&format!(
                "  - against: {}
",
                text(a)
            ));
        }
        if let Some(b) = &f.bisected {
            out.push_str(&bisected_line(b));
        }
        if let Some(k) = &f.kernels {
            out.push_str(&kernels_lines(k));
        } else if let Some(why) = &f.kernels_missing {
            out.push_str(&format!("  - kernels: not diffed: {}\n", text(why)));
        }
    }
    out.push('\n');
    out
}

/// The automatic bisection of a finding: its first bad commit, or how it ended and the
/// command that finishes it.
fn bisected_line(b: &crate::triage::culprit::Bisected) -> String {
    use crate::triage::culprit::BisectStatus;
    match (&b.status, &b.first_bad) {
        (BisectStatus::Found, Some(c)) => format!(
            "  - **first bad commit** {} {} ({}): {}; bisected on {}, {} commits measured of the {} in the range and its good end ({} rounds run, {} from the history), {:.0} GPU-s of {:.0}\n",
            code(&c.sha[..c.sha.len().min(12)]),
            text(&c.subject),
            text(&c.author),
            text(&b.evidence),
            code(&b.cell),
            b.measured,
            b.commits,
            b.rounds_run,
            b.rounds_reused,
            b.gpu_s,
            b.budget_gpu_s
        ),
        _ => {
            let mut line = format!(
                "  - bisection {}: {} ({:.0} of {:.0} GPU-s)",
                b.status.as_str(),
                text(&b.evidence),
                b.gpu_s,
                b.budget_gpu_s
            );
            if !b.command.is_empty() {
                line.push_str(&format!("; finish it with {}", code(&b.command)));
            }
            line.push('\n');
            line
        }
    }
}

/// The kernel diff of a finding: the step's device time, the kinds and the kernels that
/// moved most, and where the traces are.
fn kernels_lines(k: &crate::triage::kernels::KernelDiff) -> String {
    let mut out = format!(
        "  - **kernels** of {} ({} -> {}{}): device time per step {:.2} -> {:.2} ms ({:+.2} ms)\n",
        code(&k.cell),
        text(&k.before),
        text(&k.after),
        if k.ranks > 1 {
            format!(", mean of {} ranks", k.ranks)
        } else {
            String::new()
        },
        k.before_ms,
        k.after_ms,
        k.after_ms - k.before_ms
    );
    if !k.kinds.is_empty() {
        let kinds: Vec<String> = k
            .kinds
            .iter()
            .take(4)
            .map(|d| format!("{:+.2} ms {}", d.delta_ms(), text(&d.name)))
            .collect();
        out.push_str(&format!("    - by kind: {}\n", kinds.join(", ")));
    }
    if !k.kernels.is_empty() {
        let top: Vec<String> = k.kernels.iter().map(|d| text(&d.render())).collect();
        out.push_str(&format!("    - top kernels: {}\n", top.join(", ")));
    }
    if let Some([b, a]) = k.exposed_collective_ms {
        out.push_str(&format!(
            "    - exposed collectives: {b:.2} -> {a:.2} ms per step\n"
        ));
    }
    if !k.traces.is_empty() {
        let t: Vec<String> = k.traces.iter().map(|p| code(p)).collect();
        out.push_str(&format!("    - traces: {}\n", t.join(", ")));
    }
    out
}

/// `s` with its first letter in upper case (a caveat that starts a sentence of its own).
fn upper_first(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

/// [`headline`], led by the failures of the run beyond its cells (a merged run's shard
/// that did not finish) and the exit code they give: such a run never reads "no
/// regressions".
fn run_headline(c: &Counts, stopped: Option<&str>, failures: &[String]) -> String {
    let cells = headline(c, stopped);
    if failures.is_empty() {
        return cells;
    }
    let n = failures.len();
    let lead = format!(
        "failed (exit {}): {n} {} of the run did not finish",
        crate::exit::bench::FAILED,
        if n == 1 { "part" } else { "parts" }
    );
    if cells == "no regressions" {
        lead
    } else {
        format!("{lead}, {cells}")
    }
}

/// What ended the run early, as its headline says it: with the exit code when it is the
/// 130 of a run a signal stopped (the code the command returns, which the job summary
/// and the PR comment must not contradict), `None` for a run that ran to its end.
fn stopped(results: &RunResults, cmp: &Comparison) -> Option<String> {
    let code = results.exit_code(cmp.exit_code());
    if code == crate::exit::bench::INTERRUPTED {
        let stage = results
            .interrupted_in
            .unwrap_or(crate::results::Interruption::Cells);
        Some(format!("interrupted {} (exit {code})", stage.words()))
    } else if results.interrupted {
        Some("stopped before every cell ran".to_string())
    } else {
        None
    }
}

fn headline(c: &Counts, stopped: Option<&str>) -> String {
    let mut bad = Vec::new();
    // A cancelled nightly must not read as green in a job summary or a PR comment.
    if let Some(stopped) = stopped {
        bad.push(stopped.to_string());
    }
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
    // A breach nobody could confirm is not a pass: the headline says so, never "no
    // regressions" (the exit code stays 0: the evidence is not in).
    if c.suspect > 0 {
        bad.push(plural(
            c.suspect,
            "unconfirmed suspect",
            "unconfirmed suspects",
        ));
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
        (c.environment, "environment"),
        (c.suspect, "suspect"),
        (c.unknown, "unknown"),
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
        v.push_str(&format!(": {}", text(r)));
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
            "tokens_per_s_per_gpu" | "tokens_per_joule" => crate::report::text::si(v),
            "tflops_per_gpu" => three_digits(v),
            _ => metric_value(metric, v),
        })
        .unwrap_or_else(|| "–".into())
}

const CHANGE_HEADER: &str = "| cell | metric | baseline | now | change | tolerance | noise |\n|---|---|---:|---:|---:|---:|---:|\n";

/// The rows of a regressions or improvements table, one per cell and metric group.
fn change_rows(cells: &[&CellComparison], wanted: Verdict) -> Vec<String> {
    let mut out = Vec::new();
    for cell in cells {
        for (m, also) in grouped(cell.metrics.iter().filter(|m| m.verdict == wanted)) {
            let fmt = |v: Option<f64>| v.map(|v| metric_value(&m.metric, v)).unwrap_or_default();
            let mut label = metric_label(&m.metric).to_string();
            if !also.is_empty() {
                label.push_str(&format!(" (also {})", also.join(", ")));
            }
            out.push(format!(
                "| {} | {} | {} | {} | {} | {} | {} |\n",
                code_cell(cell.id.as_str()),
                text(&label),
                fmt(m.baseline),
                fmt(m.current),
                m.change.map(pct_change).unwrap_or_default(),
                m.tolerance.map(pct).unwrap_or_default(),
                m.noise.map(pct).unwrap_or_default(),
            ));
        }
    }
    out
}

/// Rows of one section, as many as fit in `left` bytes (all of them in any run a person
/// would read); the rest are counted in a line pointing to report.html.
fn section(heading: &str, table_head: &str, rows: &[String], left: &mut usize) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut out = format!("{heading}{table_head}");
    let mut shown = 0;
    for row in rows {
        // A last line saying what was cut must still fit after this row.
        if out.len() + row.len() + 80 > *left && shown < rows.len() - 1 {
            break;
        }
        out.push_str(row);
        shown += 1;
    }
    if shown < rows.len() {
        out.push_str(&format!(
            "\n… and {} more, every one in `report.html` (in the run's artifacts).\n",
            rows.len() - shown
        ));
    }
    out.push('\n');
    *left = left.saturating_sub(out.len());
    out
}

fn footer(results: &RunResults, cmp: &Comparison, artifacts_url: Option<&str>) -> String {
    let env = &results.environment;
    let mut out = format!(
        "**Hardware** {} ({})",
        text(&hardware_words(env)),
        code(&env.hardware_key)
    );
    for (name, v) in [
        ("driver", &env.driver),
        ("CUDA", &env.cuda),
        ("ROCm", &env.rocm),
        ("libtorch", &env.libtorch),
        ("NCCL", &env.nccl),
    ] {
        if let Some(v) = v {
            out.push_str(&format!(", {name} {}", text(v)));
        }
    }
    out.push_str("  \n");
    let commit = match &env.git_commit {
        Some(c) if env.git_dirty => format!("{} (uncommitted changes)", code(c)),
        Some(c) => code(c),
        None => "unknown".into(),
    };
    out.push_str(&format!(
        "**Commit** {commit} · **bench** {} · run {} · baselines {}  \n",
        text(&env.bench_version),
        code(&results.run_id),
        code(&cmp.baseline_file)
    ));
    let filtered = filtered_out(results);
    if filtered > 0 {
        out.push_str(&format!(
            "Filter {}: {filtered} other combinations of the matrix not selected.  \n",
            results
                .filters
                .iter()
                .map(|f| code(f))
                .collect::<Vec<_>>()
                .join(" and ")
        ));
    }
    let policies = crate::report::input::mfu_policies(results);
    if !policies.is_empty() {
        out.push_str(&format!(
            "MFU is against {}.  \n",
            policies
                .iter()
                .map(|p| text(p))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    // What the energy figures are, wherever they are shown (see `metrics::energy`).
    if results
        .cells
        .iter()
        .any(|c| c.metrics.contains_key("tokens_per_joule"))
    {
        out.push_str(&format!(
            "{}.  \n",
            text(&upper_first(crate::metrics::energy::CAVEAT))
        ));
    }
    match artifacts_url {
        Some(url) => out.push_str(&format!(
            "[Charts (`report.html`), results, logs and reports]({url})  \n"
        )),
        None => out.push_str("Charts of every cell: `report.html` in the run folder.  \n"),
    }
    out
}

fn render(
    results: &RunResults,
    cmp: &Comparison,
    trends: Option<&Trends>,
    history: Option<&GateReport>,
    findings: &[crate::triage::Finding],
    artifacts_url: Option<&str>,
    collapse: bool,
) -> String {
    let env = &results.environment;
    let stopped = stopped(results, cmp);
    let mut counts = cmp.counts();
    // The filter's drops are a count in the footer, not a status of this run.
    counts.dropped = counts.dropped.saturating_sub(filtered_out(results));
    let mut head = format!(
        "### bench: {} on {}: {}\n\n",
        code(&results.matrix_name),
        code(&env.hardware_key),
        run_headline(&counts, stopped.as_deref(), &cmp.run_failures)
    );
    head.push_str(&counts_line(&counts));
    head.push_str("\n\n");
    if let Some(stopped) = &stopped {
        head.push_str(&format!("> The run was {stopped}.\n\n"));
    }
    for why in &cmp.run_failures {
        head.push_str(&format!(
            "> **The run fails (exit {}): {}**\n\n",
            results.exit_code(cmp.exit_code()),
            text(why)
        ));
    }
    if !cmp.baseline_exists && history.is_none_or(|h| h.cells.is_empty()) {
        head.push_str(&format!(
            "> No baselines for {} yet: every cell is new. Write them with `bench baseline update`.\n\n",
            code(&env.hardware_key)
        ));
    }
    // One finding per cause leads: a reader sees the causes before the cells.
    head.push_str(&findings_section(findings));
    let foot = footer(results, cmp, artifacts_url);
    // The history's verdict lines come complete: they are the run's verdicts.
    let hist = history
        .map(crate::report::history::markdown)
        .unwrap_or_default();
    head.push_str(&hist);
    if history.is_some_and(|h| !h.cells.is_empty()) {
        // What the verdict cost: a gate that confirms side by side and bisects says what
        // its evidence took.
        let input = ReportInput {
            results,
            comparison: cmp,
            trends,
            history,
            findings,
        };
        head.push_str(&format!("{}\n\n", input.cost().sentence()));
        head.push_str(&cell_costs_table(&input.cell_costs()));
    }

    let drops = rule_drops(results);
    let mut drop_lines = String::new();
    let mut drop_ids = String::new();
    if !drops.is_empty() {
        let n: usize = drops.iter().map(|g| g.ids.len()).sum();
        drop_lines.push_str("#### Dropped by the matrix's rules\n\n");
        drop_ids.push_str(&format!(
            "<details><summary>Ids of the dropped cells ({n})</summary>\n\n"
        ));
        for g in &drops {
            let cells = if g.ids.len() == 1 { "cell" } else { "cells" };
            drop_lines.push_str(&format!(
                "- {}: {}: {} {cells}\n",
                text(g.by),
                text(g.reason),
                g.ids.len()
            ));
            let ids: Vec<String> = g.ids.iter().map(|id| code(id)).collect();
            drop_ids.push_str(&format!("{}: {}\n\n", text(g.by), ids.join(", ")));
        }
        drop_lines.push('\n');
        drop_ids.push_str("</details>\n\n");
    }

    // What is left for the sections after the header, the footer and the rule lines, with
    // room for the lines that say what was left out.
    let mut left = MAX_BYTES.saturating_sub(head.len() + foot.len() + drop_lines.len() + 400);

    let regressions: Vec<&CellComparison> = cmp.with_status(CellStatus::Regression).collect();
    let reg_rows = change_rows(&regressions, Verdict::Regression);
    let mut regs = section("#### Regressions\n\n", CHANGE_HEADER, &reg_rows, &mut left);
    let failed_rows: Vec<String> = cmp
        .cells
        .iter()
        .filter(|c| matches!(c.status, CellStatus::Failed | CellStatus::TimedOut))
        .map(|c| {
            format!(
                "- {} {}: {}\n",
                code(c.id.as_str()),
                c.status.as_str(),
                text(c.reason.as_deref().unwrap_or("no reason given"))
            )
        })
        .collect();
    let failed = section("#### Failed cells\n\n", "", &failed_rows, &mut left);
    let improved: Vec<&CellComparison> = cmp.with_status(CellStatus::Improvement).collect();
    let imp_rows = change_rows(&improved, Verdict::Improvement);
    let improvements = section("#### Improvements\n\n", CHANGE_HEADER, &imp_rows, &mut left);

    // Charts after the tables they illustrate, while they fit.
    for cell in regressions.iter().take(MAX_CHARTS) {
        if let Some(chart) = regression_chart(results, cell, trends) {
            if chart.len() <= left {
                left -= chart.len();
                regs.push_str(&chart);
            }
        }
    }

    let shown: Vec<&CellComparison> = cmp
        .cells
        .iter()
        .filter(|c| c.status != CellStatus::Dropped)
        .collect();
    let mut table = if collapse {
        format!("<details><summary>All {} cells</summary>\n\n", shown.len())
    } else {
        "#### All cells\n\n".to_string()
    };
    // Tokens per joule beside the throughput when some cell measured its GPUs' power; a run
    // without GPU telemetry keeps the table it always had.
    let energy = shown.iter().any(|c| {
        c.metric("tokens_per_joule")
            .is_some_and(|m| m.current.is_some())
    });
    let (energy_head, energy_rule) = if energy {
        (" tokens/J |", "---:|")
    } else {
        ("", "")
    };
    table.push_str(&format!(
        "| cell | tokens/s/GPU |{energy_head} TFLOP/s/GPU | MFU | change vs baseline | verdict |\n"
    ));
    table.push_str(&format!("|---|---:|{energy_rule}---:|---:|---|---|\n"));
    for cell in &shown {
        let tok_j = if energy {
            format!(" {} |", metric_cell(cell, "tokens_per_joule"))
        } else {
            String::new()
        };
        table.push_str(&format!(
            "| {} | {} |{tok_j} {} | {} | {} | {} |\n",
            code_cell(cell.id.as_str()),
            metric_cell(cell, "tokens_per_s_per_gpu"),
            metric_cell(cell, "tflops_per_gpu"),
            metric_cell(cell, "mfu"),
            cell_change(cell),
            verdict_cell(cell),
        ));
    }
    table.push('\n');
    if collapse {
        table.push_str("</details>\n\n");
    }
    if table.len() <= left {
        left -= table.len();
    } else {
        table = format!(
            "The table of all {} cells is in `report.html` (in the run's artifacts), with charts of each.\n\n",
            shown.len()
        );
    }
    if drop_ids.len() > left {
        drop_ids = "The dropped cells' ids are in `report.html`.\n\n".into();
    }

    let mut out = head;
    for part in [
        regs,
        failed,
        improvements,
        drop_lines,
        drop_ids,
        table,
        foot,
    ] {
        out.push_str(&part);
    }
    out
}

/// The cost of each cell whose verdict took more than measuring it (pairs, re-runs or a
/// bisection), GPU-seconds; empty when no cell's did: a quiet night's summary stays one
/// sentence long.
fn cell_costs_table(costs: &[crate::report::input::CellCost]) -> String {
    let extra: Vec<_> = costs.iter().filter(|c| c.confirmed()).collect();
    if extra.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "The cells whose verdict took more than measuring them, GPU-s:\n\n\
         | cell | measuring | side by side | re-runs | triage | total |\n\
         |---|---:|---:|---:|---:|---:|\n",
    );
    // One decimal below 10 GPU-s: a CPU cell's pairs cost a few seconds, which whole
    // seconds round to 0 or 1.
    let g = |x: f64| {
        if x < 10.0 {
            format!("{x:.1}")
        } else {
            format!("{x:.0}")
        }
    };
    for c in extra {
        let figures: Vec<String> = c
            .cost
            .parts()
            .into_iter()
            .chain([c.cost.total()])
            .map(g)
            .collect();
        out.push_str(&format!(
            "| {} | {} |\n",
            code_cell(&c.cell_id),
            figures.join(" | ")
        ));
    }
    out.push('\n');
    out
}
