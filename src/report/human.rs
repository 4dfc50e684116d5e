//! The terminal summary printed after a run: one line per cell (throughput, tokens per
//! joule when the cells' GPU power was read, TFLOP/s beside MFU, speed-up factor against
//! the baseline, time, verdict), then regressions with their
//! numbers, failed and skipped cells with their reasons, one line per matrix rule with the
//! number of cells it dropped (their ids with `--verbose`), the counts and the total time.
//!
//! Every text it did not write (ids, names, reasons, verdict lines, a finding's commit
//! subject and author) is shown through [`shown`], cut to
//! [`crate::sanitize::MAX_SHOWN_CHARS`] characters as the Markdown and the site cut it, so
//! one 50 MB value makes no 50 MB terminal summary.

use crate::baseline::compare::{CellComparison, CellStatus, Comparison};
use crate::baseline::store::hardware_words;
use crate::report::input::{run_duration_s, Exporter, ReportError, ReportInput};
use crate::report::text::{
    cell_change, duration, filtered_out, group_changes, one_line, pct, rule_drops, si, three_digits,
};
use crate::results::RunResults;
use crate::sanitize::{bounded, inline, MAX_SHOWN_CHARS};

/// A text bench did not write, cut to [`MAX_SHOWN_CHARS`] characters (saying how many were
/// left out); borrowed, as every real one is short enough.
fn shown(s: &str) -> std::borrow::Cow<'_, str> {
    bounded(s, MAX_SHOWN_CHARS)
}

/// The terminal summary sink (printed, and kept in the run folder as `summary.txt`),
/// without the ids of dropped cells.
pub struct HumanExporter;

impl Exporter for HumanExporter {
    fn file_name(&self) -> &'static str {
        "summary.txt"
    }

    fn render(&self, input: &ReportInput<'_>) -> Result<String, ReportError> {
        Ok(render(input, false))
    }
}

/// The terminal summary as `--verbose` prints it: every dropped cell's id under its rule.
pub(crate) fn render_verbose(input: &ReportInput<'_>) -> String {
    render(input, true)
}

fn figure(cell: &CellComparison, metric: &str) -> String {
    cell.metric(metric)
        .and_then(|m| m.current)
        .map(|v| match metric {
            "mfu" => pct(v),
            "tflops_per_gpu" => three_digits(v),
            _ => si(v),
        })
        .unwrap_or_else(|| "-".into())
}

/// Whether the cell measured its energy (its GPUs' power was read).
fn has_energy(cell: &CellComparison) -> bool {
    cell.metric("tokens_per_joule")
        .is_some_and(|m| m.current.is_some())
}

fn status_word(cell: &CellComparison) -> String {
    let s = match cell.status {
        CellStatus::Regression => "REGRESSION".to_string(),
        CellStatus::Failed => "FAILED".to_string(),
        CellStatus::TimedOut => "TIMED OUT".to_string(),
        other => other.as_str().to_string(),
    };
    if cell.flaky {
        format!("{s} (flaky)")
    } else {
        s
    }
}

fn section(
    out: &mut String,
    title: &str,
    cells: &[&CellComparison],
    body: impl Fn(&CellComparison) -> Vec<String>,
) {
    if cells.is_empty() {
        return;
    }
    out.push_str(&format!("\n{title}:\n"));
    for c in cells {
        out.push_str(&format!("  {}\n", shown(&c.id)));
        for line in body(c) {
            out.push_str(&format!("    {line}\n"));
        }
    }
}

/// The cells the matrix's rules dropped, one line per rule with its count and reason (as
/// `bench matrix --dry-run` and the Markdown summary show them), their ids under it with
/// `verbose`; then how many combinations `--filter` did not select, only counted since
/// nobody meant to run them.
fn dropped(out: &mut String, results: &RunResults, verbose: bool) {
    let drops = rule_drops(results);
    if !drops.is_empty() {
        let n: usize = drops.iter().map(|g| g.ids.len()).sum();
        out.push_str(&format!("\nDropped by the matrix's rules ({n}):\n"));
        let w = drops
            .iter()
            .map(|g| g.ids.len().to_string().len())
            .max()
            .unwrap_or(1);
        for g in &drops {
            let cells = if g.ids.len() == 1 { "cell " } else { "cells" };
            out.push_str(&format!(
                "  {:>w$} {cells}  {}: {}\n",
                g.ids.len(),
                shown(g.by),
                one_line(&shown(g.reason))
            ));
            if verbose {
                for id in &g.ids {
                    out.push_str(&format!("      {}\n", shown(id)));
                }
            }
        }
        if !verbose {
            out.push_str("  (--verbose lists their ids)\n");
        }
    }
    let filtered = filtered_out(results);
    if filtered > 0 {
        out.push_str(&format!(
            "\nFilter {}: {filtered} other combinations of the matrix not selected\n",
            shown(&results.filters.join(" and "))
        ));
    }
}

/// The summary with every terminal escape and control character other than newline and
/// tab removed: it holds text bench did not write (the matrix's name, commit subjects and
/// authors of a triage.json, kernel names of a trace, failure reasons, host names), and
/// bench writes no escape of its own, so the whole document is cleaned at once rather than
/// each value on its way in, where one forgotten value would reach the reader's terminal.
fn render(input: &ReportInput<'_>, verbose: bool) -> String {
    crate::sanitize::clean(&render_raw(input, verbose))
}

fn render_raw(input: &ReportInput<'_>, verbose: bool) -> String {
    let r = input.results;
    let cmp: &Comparison = input.comparison;
    let env = &r.environment;
    let mut out = format!(
        "bench {}: matrix {} on {} ({}), commit {}{}, bench {}\n",
        shown(&r.run_id),
        shown(&r.matrix_name),
        shown(&env.hardware_key),
        shown(&hardware_words(env)),
        shown(env.git_commit.as_deref().unwrap_or("unknown")),
        if env.git_dirty { " (dirty)" } else { "" },
        shown(&env.bench_version)
    );
    if let Some(stage) = r.interrupted_in {
        out.push_str(&format!("the run was interrupted {}\n", stage.words()));
    } else if r.interrupted {
        out.push_str("the run was stopped before every cell ran\n");
    }
    if let Some(h) = input.history.filter(|h| !h.cells.is_empty()) {
        out.push_str(&format!(
            "judged against the history in {} ({})\n",
            shown(&h.store),
            shown(&h.scope)
        ));
    } else if !cmp.baseline_exists {
        out.push_str(&format!(
            "no baselines at {}: every cell is new (write them with `bench baseline update`)\n",
            shown(&cmp.baseline_file)
        ));
    }

    for f in input.findings {
        // The headline holds a culprit's subject and author, each of which can be long,
        // and several cell ids: cut whole at a few values' worth.
        // Each is one line: a commit subject or a reason read from a run folder may hold a
        // newline, which printed a line of its own that read as bench's (issue 42).
        out.push_str(&format!(
            "finding {}\n",
            inline(&bounded(&f.headline(), 4 * MAX_SHOWN_CHARS))
        ));
        // The first bad commit is in the headline; any other ending says what happened.
        if let Some(b) = f.bisected.as_ref().filter(|b| b.first_bad.is_none()) {
            out.push_str(&format!("  {}\n", inline(&shown(&b.line()))));
        }
        if let (None, Some(why)) = (&f.kernels, &f.kernels_missing) {
            out.push_str(&format!("  kernels not diffed: {}\n", inline(&shown(why))));
        }
    }
    // Dropped cells get a line per rule below, not a row of dashes each: a filtered
    // nightly drops hundreds, which would bury the few cells that ran.
    let rows: Vec<&CellComparison> = cmp
        .cells
        .iter()
        .filter(|c| c.status != CellStatus::Dropped)
        .collect();
    // Each id as shown, so that one long id widens the column by at most its cut.
    let ids: Vec<std::borrow::Cow<'_, str>> = rows.iter().map(|c| shown(&c.id)).collect();
    let width = ids
        .iter()
        .map(|id| id.chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    // Tokens per joule sits beside the throughput when some cell measured its GPUs' power;
    // a run without GPU telemetry keeps the table it always had.
    let energy = rows.iter().any(|c| has_energy(c));
    let tok_j = |v: String| {
        if energy {
            format!("  {v:>7}")
        } else {
            String::new()
        }
    };
    out.push_str(&format!(
        "\n  {:<width$}  {:>9}{}  {:>11}  {:>6}  {:<24}  {:>8}  {}\n",
        "cell",
        "tok/s/GPU",
        tok_j("tok/J".into()),
        "TFLOP/s/GPU",
        "MFU",
        "vs baseline",
        "time",
        "verdict"
    ));
    for (c, id) in rows.iter().zip(&ids) {
        out.push_str(&format!(
            "  {:<width$}  {:>9}{}  {:>11}  {:>6}  {:<24}  {:>8}  {}\n",
            id,
            figure(c, "tokens_per_s_per_gpu"),
            tok_j(figure(c, "tokens_per_joule")),
            figure(c, "tflops_per_gpu"),
            figure(c, "mfu"),
            cell_change(c),
            match (c.status, c.duration_s) {
                (CellStatus::Skipped, _) | (_, None) => "-".to_string(),
                (_, Some(d)) => duration(d),
            },
            status_word(c),
        ));
    }
    if energy {
        out.push_str(&format!("  ({})\n", crate::metrics::energy::CAVEAT));
    }

    let of = |s: CellStatus| cmp.with_status(s).collect::<Vec<_>>();
    // A cell the history judged says its verdict line; the others their metrics' changes
    // against the baseline.
    let judged = |c: &CellComparison| {
        input
            .history
            .and_then(|h| h.cell(&c.id))
            .filter(|j| !j.line.is_empty())
            .map(|j| shown(&j.line).into_owned())
    };
    section(&mut out, "Regressions", &of(CellStatus::Regression), |c| {
        let mut lines: Vec<String> = judged(c).into_iter().collect();
        if lines.is_empty() {
            lines = group_changes(c.regressions());
        }
        if let Some(cmd) = input
            .history
            .and_then(|h| h.cell(&c.id))
            .and_then(|j| j.bisect.clone())
        {
            lines.push(format!("find the commit: {}", shown(&cmd)));
        }
        lines
    });
    for (title, status) in [
        ("Blamed on the environment", CellStatus::Environment),
        ("Suspect (not confirmed)", CellStatus::Suspect),
        ("Unknown (too few repeats to tell)", CellStatus::Unknown),
    ] {
        section(&mut out, title, &of(status), |c| {
            judged(c).into_iter().collect()
        });
    }
    let failed: Vec<&CellComparison> = cmp
        .cells
        .iter()
        .filter(|c| matches!(c.status, CellStatus::Failed | CellStatus::TimedOut))
        .collect();
    let reason = |c: &CellComparison| {
        vec![format!(
            "{}: {}",
            c.status.as_str(),
            one_line(&shown(c.reason.as_deref().unwrap_or("no reason given")))
        )]
    };
    section(&mut out, "Failed", &failed, reason);
    section(
        &mut out,
        "Improvements",
        &of(CellStatus::Improvement),
        |c| {
            if let Some(line) = judged(c) {
                return vec![line];
            }
            let improved = c
                .metrics
                .iter()
                .filter(|m| m.verdict == crate::baseline::Verdict::Improvement);
            group_changes(improved)
        },
    );
    section(&mut out, "Not run", &of(CellStatus::Skipped), reason);
    dropped(&mut out, r, verbose);

    let n = cmp.counts();
    let parts = [
        (n.regression, "regressed"),
        (n.improvement, "improved"),
        (n.unchanged, "unchanged"),
        (n.new, "new"),
        (n.environment, "environment"),
        (n.suspect, "suspect"),
        (n.unknown, "unknown"),
        (n.failed, "failed"),
        (n.timed_out, "timed out"),
        (n.skipped, "skipped"),
        (n.dropped, "dropped"),
        (n.missing, "missing from this run"),
        (n.flaky, "flaky"),
    ];
    let counts: Vec<String> = parts
        .iter()
        .filter(|(k, _)| *k > 0)
        .map(|(k, what)| format!("{k} {what}"))
        .collect();
    let total = run_duration_s(r)
        .or_else(|| Some(r.cells.iter().map(|c| c.duration_s).sum::<f64>()))
        .map(duration)
        .unwrap_or_default();
    out.push_str(&format!(
        "\n{} cells: {}; took {total}\n",
        n.cells,
        counts.join(", ")
    ));
    // The code the command returns, whichever stage a signal stopped: the last line must
    // never state another.
    let code = input.exit_code();
    // An interrupted run is never a pass: its last line is what a job log or a person
    // reads first, and the cells it did not run were judged by nobody.
    out.push_str(&if code == crate::exit::bench::INTERRUPTED {
        let stage = match r.interrupted_in {
            Some(s) if !r.interrupted => format!(" {}", s.words()),
            _ => String::new(),
        };
        format!(
            "result: INTERRUPTED (exit {code}){stage}: {} regressed, {} failed, {} timed out{}\n",
            n.regression,
            n.failed,
            n.timed_out,
            if r.interrupted {
                " among the cells that ran"
            } else {
                ""
            }
        )
    } else if code == 0 && n.suspect > 0 {
        // Not a pass either: a breach the confirmation could not settle.
        format!(
            "result: ok (exit 0), {} unconfirmed suspect{}: not confirmed and not cleared\n",
            n.suspect,
            if n.suspect == 1 { "" } else { "s" }
        )
    } else if code == 0 {
        "result: ok (exit 0)\n".to_string()
    } else if !cmp.run_failures.is_empty() {
        // A merged run's shard that did not finish: named with the code it gives.
        format!(
            "result: FAILED (exit {code}): {}; {} regressed, {} failed, {} timed out\n",
            // From the merged folder's shards.json: shown, never sent to the terminal.
            cmp.run_failures
                .iter()
                .map(|f| crate::sanitize::terminal(&one_line(&shown(f))).into_owned())
                .collect::<Vec<_>>()
                .join("; "),
            n.regression,
            n.failed,
            n.timed_out
        )
    } else {
        format!(
            "result: FAILED (exit {code}): {} regressed, {} failed, {} timed out\n",
            n.regression, n.failed, n.timed_out
        )
    });
    out
}
