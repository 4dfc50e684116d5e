//! The reports of a fleet: several runs of one night on different hardware (an H100 pool's
//! nightly beside an MI300X pool's), each merged and judged in a folder of its own against
//! its own hardware key, shown as one: `summary.md` (a table of the runs, then each run's
//! own summary), `junit.xml` (one testsuite per run), `report.json` (each run's report
//! under its key), `report.html` (the runs, their findings and regressions, linking each
//! run's full report) and the PR comment. The renderers take each run's already judged
//! input and its own rendered files; they judge nothing and read no file.

use quick_junit::Report;
use serde::Serialize;

use crate::report::escape;
use crate::report::escape::html as esc;
use crate::report::input::{Exporter, ReportError, ReportInput};
use crate::report::markdown::MAX_BYTES;

/// One run of the fleet, as its reports need it.
pub struct FleetPart<'a> {
    /// The run's folder, relative to the fleet folder.
    pub folder: String,
    pub input: ReportInput<'a>,
    /// The run's own exit code (a shard that did not finish fails it).
    pub exit: i32,
    /// Its shards, `finished` or what became of them, one line each.
    pub shards: Vec<String>,
}

impl FleetPart<'_> {
    fn key(&self) -> &str {
        &self.input.results.environment.hardware_key
    }

    fn verdict(&self) -> &'static str {
        if self.exit == crate::exit::bench::OK {
            "pass"
        } else {
            "fail"
        }
    }

    fn heading(&self) -> String {
        let r = self.input.results;
        format!(
            "{} on {} (run {})",
            escape::code(&r.matrix_name),
            escape::code(self.key()),
            escape::code(&r.run_id)
        )
    }
}

/// The fleet's exit code: the worst of its runs', and 1 when a hardware kind it was told
/// to expect is missing (`missing`, one line each).
pub fn exit_code(parts: &[FleetPart<'_>], missing: &[String]) -> i32 {
    let runs = parts.iter().map(|p| p.exit).max().unwrap_or(0);
    if missing.is_empty() {
        runs
    } else {
        runs.max(crate::exit::bench::FAILED)
    }
}

/// The lines naming what the fleet expected and did not get, for Markdown.
fn missing_lines(missing: &[String]) -> String {
    let mut out = String::new();
    for m in missing {
        out.push_str(&format!(
            "> **Missing (exit {}): {}**\n\n",
            crate::exit::bench::FAILED,
            escape::text(m)
        ));
    }
    out
}

/// The table of the runs: one row each, with its counts and verdict.
fn table(parts: &[FleetPart<'_>], link_reports: bool) -> String {
    let mut out = String::from(
        "| hardware | matrix | run | cells | regressed | failed | findings | verdict |\n|---|---|---|---:|---:|---:|---:|---|\n",
    );
    for p in parts {
        let c = p.input.comparison.counts();
        let r = p.input.results;
        let key = if link_reports {
            format!(
                "[{}]({}/summary.md)",
                escape::text(p.key()),
                escape::text(&p.folder)
            )
        } else {
            escape::code_cell(p.key())
        };
        let regressed = p
            .input
            .findings
            .iter()
            .filter(|f| f.direction == "regressed")
            .count();
        out.push_str(&format!(
            "| {key} | {} | {} | {} | {} | {} | {regressed} | {} |\n",
            escape::code_cell(&r.matrix_name),
            escape::code_cell(&r.run_id),
            c.cells - c.dropped,
            c.regression,
            c.failed + c.timed_out,
            if p.exit == 0 { "pass" } else { "**fail**" },
        ));
    }
    out
}

/// The fleet's verdict in words: how many runs failed, and how many expected kinds are
/// missing.
fn verdict_words(parts: &[FleetPart<'_>], missing: &[String]) -> String {
    let failing = parts.iter().filter(|p| p.exit != 0).count();
    let mut verdict = if failing == 0 {
        "every run passed".to_string()
    } else {
        format!("{failing} of {} runs failed", parts.len())
    };
    if !missing.is_empty() {
        verdict = format!(
            "{} missing, {verdict} (exit {})",
            missing.len(),
            crate::exit::bench::FAILED
        );
    }
    verdict
}

fn head(parts: &[FleetPart<'_>], missing: &[String]) -> String {
    format!(
        "### bench fleet: {} hardware kinds, {}\n\nEach run is judged against its own hardware key's baselines and history.\n\n{}",
        parts.len(),
        verdict_words(parts, missing),
        missing_lines(missing)
    )
}

/// Headings one level deeper, outside fenced blocks: a run's own summary nested under its
/// heading in the fleet's.
fn demote(markdown: &str) -> String {
    let mut fenced = false;
    let mut out = String::with_capacity(markdown.len() + 64);
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if !fenced && line.starts_with('#') {
            out.push('#');
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// `summary.md` of the fleet: the table, then each run's own summary (`summaries`, in the
/// order of `parts`) under its heading.
pub fn render_summary(parts: &[FleetPart<'_>], summaries: &[String], missing: &[String]) -> String {
    let mut out = head(parts, missing);
    out.push_str(&table(parts, true));
    for (p, s) in parts.iter().zip(summaries) {
        out.push_str(&format!("\n## {}\n\n", p.heading()));
        for line in &p.shards {
            out.push_str(&format!("- {}\n", escape::text(line)));
        }
        out.push_str(&demote(s));
    }
    out
}

/// The PR comment of the fleet: the table, then each run's comment, within
/// [`MAX_BYTES`] whatever the number of runs. The table keeps the failing runs' rows first
/// and takes at most half; the runs' comments share the rest, each cut at a section
/// boundary, a run that needs less leaving its share to the others (water-filling); when
/// even that leaves a run too little for its heading, the comments give way to one line
/// that points to report.html.
pub fn render_comment(
    parts: &[FleetPart<'_>],
    missing: &[String],
    artifacts_url: Option<&str>,
) -> String {
    let mut out = head(parts, missing);
    out.push_str(&table_within(parts, MAX_BYTES / 2));
    let bodies: Vec<String> = parts
        .iter()
        .map(|p| {
            let i = &p.input;
            demote(&crate::report::markdown::render_comment(
                i.results,
                i.comparison,
                i.trends,
                i.history,
                i.findings,
                artifacts_url,
            ))
        })
        .collect();
    // Room for the line a cut adds, per run.
    let left = MAX_BYTES.saturating_sub(out.len() + 200);
    let shares = water_fill(&bodies.iter().map(String::len).collect::<Vec<_>>(), left);
    let mut rest = String::new();
    for ((p, body), share) in parts.iter().zip(&bodies).zip(&shares) {
        // Each run's comment opens with its own heading (matrix, hardware key, verdict).
        rest.push('\n');
        rest.push_str(&cut(body, *share, &p.folder));
    }
    if out.len() + rest.len() <= MAX_BYTES {
        out.push_str(&rest);
    } else {
        out.push_str(
            "\n_Each run's own report (findings, regressions, charts) is in its folder's `report.html`, linked from the fleet's `report.html`._\n",
        );
    }
    out
}

/// Shares of `budget` for texts of `lengths`: each gets its length when the texts fit, and
/// otherwise the unused part of a short text's equal share goes to the longer ones.
fn water_fill(lengths: &[usize], budget: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| lengths[i]);
    let mut shares = vec![0; lengths.len()];
    let mut left = budget;
    for (k, &i) in order.iter().enumerate() {
        let equal = left / (lengths.len() - k);
        shares[i] = lengths[i].min(equal);
        left -= shares[i];
    }
    shares
}

/// [`table`] within `budget` bytes: the failing runs' rows first, then the passing ones,
/// and a line counting the rows left out.
fn table_within(parts: &[FleetPart<'_>], budget: usize) -> String {
    let full = table(parts, false);
    if full.len() <= budget {
        return full;
    }
    let mut lines = full.lines();
    let mut out = String::new();
    for _ in 0..2 {
        out.push_str(lines.next().unwrap_or(""));
        out.push('\n');
    }
    let rows: Vec<&str> = lines.collect();
    let (failing, passing): (Vec<_>, Vec<_>) = parts
        .iter()
        .zip(&rows)
        .partition(|(p, _)| p.exit != crate::exit::bench::OK);
    let mut shown = 0;
    for (_, row) in failing.iter().chain(&passing) {
        if out.len() + row.len() + 120 > budget {
            break;
        }
        out.push_str(row);
        out.push('\n');
        shown += 1;
    }
    out.push_str(&format!(
        "\n_{} more runs are in the fleet's `report.html`._\n",
        parts.len() - shown
    ));
    out
}

/// `text` whole when it fits in `budget` bytes, else up to its last section heading that
/// fits, and a line saying where the rest is.
fn cut(text: &str, budget: usize, folder: &str) -> String {
    if text.len() <= budget {
        return text.to_string();
    }
    let mut end = 0;
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if line.starts_with('#') && at > 0 && at <= budget.saturating_sub(200) {
            end = at;
        }
        at += line.len();
    }
    format!(
        "{}\n_The rest of this run's report is in `{}/report.html`._\n",
        &text[..end],
        escape::text(folder)
    )
}

/// `junit.xml` of the fleet: each run's testsuite, named for its hardware key so that a CI
/// test view keeps the runs apart.
pub fn render_junit(parts: &[FleetPart<'_>], missing: &[String]) -> Result<String, ReportError> {
    let mut report = Report::new("bench fleet");
    for p in parts {
        let mut suite = crate::report::junit::suite(&p.input)?;
        suite.name = format!("{} on {}", p.input.results.matrix_name, p.key()).into();
        report.add_test_suite(suite);
    }
    // An expected kind that never uploaded fails the check by name, not by its absence.
    if !missing.is_empty() {
        let mut suite = quick_junit::TestSuite::new("missing hardware kinds");
        for (i, m) in missing.iter().enumerate() {
            let mut status =
                quick_junit::TestCaseStatus::non_success(quick_junit::NonSuccessKind::Failure);
            status
                .set_type("missing")
                .set_message(format!("{m}; exit {}", crate::exit::bench::FAILED));
            let mut tc = quick_junit::TestCase::new(format!("fleet.missing.{}", i + 1), status);
            tc.set_classname("fleet");
            suite.add_test_case(tc);
        }
        report.add_test_suite(suite);
    }
    let out = report.to_string().map_err(|e| ReportError::Render {
        format: "junit.xml",
        message: e.to_string(),
    })?;
    Ok(crate::sanitize::xml_chars(&out).into_owned())
}

/// One run in `report.json` and `fleet.json`.
#[derive(Debug, Serialize)]
pub struct PartJson {
    pub hardware_key: String,
    pub matrix: String,
    pub run_id: String,
    /// The run's folder, relative to the fleet's.
    pub folder: String,
    pub exit_code: i32,
    pub shards: Vec<String>,
    /// The run's own `report.json`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report: Option<serde_json::Value>,
}

/// `report.json` of the fleet: `{"fleet": true, "exit_code", "runs": [...]}`, each run with
/// its own report as `bench report` writes it for one run.
pub fn render_json(parts: &[FleetPart<'_>], missing: &[String]) -> Result<String, ReportError> {
    let runs: Vec<PartJson> = parts
        .iter()
        .map(|p| {
            let text = crate::report::json::JsonExporter.render(&p.input)?;
            let report = serde_json::from_str(&text).map_err(|e| ReportError::Render {
                format: "report.json",
                message: e.to_string(),
            })?;
            Ok(part_json(p, Some(report)))
        })
        .collect::<Result<_, ReportError>>()?;
    serde_json::to_string_pretty(&serde_json::json!({
        "fleet": true,
        "exit_code": exit_code(parts, missing),
        "missing": missing,
        "runs": runs,
    }))
    .map_err(|e| ReportError::Render {
        format: "report.json",
        message: e.to_string(),
    })
}

pub fn part_json(p: &FleetPart<'_>, report: Option<serde_json::Value>) -> PartJson {
    PartJson {
        hardware_key: p.key().to_string(),
        matrix: p.input.results.matrix_name.clone(),
        run_id: p.input.results.run_id.clone(),
        folder: p.folder.clone(),
        exit_code: p.exit,
        shards: p.shards.clone(),
        report,
    }
}

/// A relative link to a file of a run's folder: each path segment percent-encoded, so a
/// folder name is never read as markup or as another URL.
fn href(folder: &str, file: &str) -> String {
    let enc = |s: &str| -> String {
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    };
    format!("{}/{}", enc(folder), enc(file))
}

/// `report.html` of the fleet: one page, no script, no request: the runs with their
/// verdicts, and under each its findings (with a bisection's first bad commit) and its
/// regressed and failed cells, linking the run's own report.html for the charts.
pub fn render_html(parts: &[FleetPart<'_>], missing: &[String]) -> String {
    let mut body = String::new();
    body.push_str(&format!(
        "<h1>bench fleet: {} hardware kinds, {}</h1>\n<p>Each run is judged against its own hardware key's baselines and history.</p>\n",
        parts.len(),
        esc(&verdict_words(parts, missing))
    ));
    if !missing.is_empty() {
        body.push_str("<ul class=\"missing\">");
        for m in missing {
            body.push_str(&format!("<li class=\"run fail\">missing: {}</li>", esc(m)));
        }
        body.push_str("</ul>\n");
    }
    body.push_str("<table id=\"runs\"><thead><tr><th>hardware</th><th>matrix</th><th>run</th><th>cells</th><th>regressed</th><th>failed</th><th>findings</th><th>verdict</th></tr></thead><tbody>\n");
    for p in parts {
        let c = p.input.comparison.counts();
        let r = p.input.results;
        body.push_str(&format!(
            "<tr class=\"run {}\"><td><a href=\"{}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
            p.verdict(),
            href(&p.folder, "report.html"),
            esc(p.key()),
            esc(&r.matrix_name),
            esc(&r.run_id),
            c.cells - c.dropped,
            c.regression,
            c.failed + c.timed_out,
            p.input.findings.len(),
            p.verdict(),
        ));
    }
    body.push_str("</tbody></table>\n");
    for p in parts {
        let r = p.input.results;
        body.push_str(&format!(
            "<section class=\"part\"><h2>{} on {} <small>(run {})</small></h2>\n<p><a href=\"{}\">full report with charts</a> · <a href=\"{}\">summary</a></p>\n",
            esc(&r.matrix_name),
            esc(p.key()),
            esc(&r.run_id),
            href(&p.folder, "report.html"),
            href(&p.folder, "summary.md"),
        ));
        if !p.shards.is_empty() {
            body.push_str("<ul class=\"shards\">");
            for s in &p.shards {
                body.push_str(&format!("<li>{}</li>", esc(s)));
            }
            body.push_str("</ul>\n");
        }
        if !p.input.findings.is_empty() {
            body.push_str("<h3>Findings</h3><ul class=\"findings\">");
            for f in p.input.findings {
                body.push_str(&format!("<li class=\"finding\">{}", esc(&f.headline())));
                if let Some(b) = &f.bisected {
                    body.push_str(&format!(
                        "<div class=\"bisection\">{}</div>",
                        esc(&b.line())
                    ));
                }
                body.push_str("</li>");
            }
            body.push_str("</ul>\n");
        }
        let counts = p.input.comparison.counts();
        if p.exit == crate::exit::bench::OK && p.input.findings.is_empty() {
            body.push_str(&format!(
                "<p class=\"ok\">No cell fails the run ({} cells).</p>\n",
                counts.cells - counts.dropped
            ));
        }
        let bad: Vec<_> = p
            .input
            .comparison
            .cells
            .iter()
            .filter(|c| {
                matches!(
                    c.status,
                    crate::baseline::compare::CellStatus::Regression
                        | crate::baseline::compare::CellStatus::Failed
                        | crate::baseline::compare::CellStatus::TimedOut
                )
            })
            .collect();
        if !bad.is_empty() {
            body.push_str("<h3>Cells that fail the run</h3><table class=\"cells\"><thead><tr><th>cell</th><th>verdict</th><th>why</th></tr></thead><tbody>");
            for c in bad {
                body.push_str(&format!(
                    "<tr class=\"cell\"><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
                    esc(&c.id),
                    esc(c.status.as_str()),
                    esc(&c.reason.clone().unwrap_or_else(|| {
                        crate::report::text::group_changes(c.regressions()).join("; ")
                    })),
                ));
            }
            body.push_str("</tbody></table>\n");
        }
        body.push_str("</section>\n");
    }
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n<title>bench fleet</title>\n<style>body{{font:14px/1.4 system-ui,sans-serif;margin:2em;max-width:1200px}}table{{border-collapse:collapse;margin:.5em 0}}td,th{{border:1px solid #ccc;padding:.25em .6em;text-align:left}}tr.fail td:last-child{{color:#b00;font-weight:bold}}tr.pass td:last-child{{color:#070}}.bisection{{color:#555;margin-left:1em}}</style>\n</head><body>\n{body}</body></html>\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demoting_leaves_fenced_lines_alone() {
        let md = "### a\ntext\n```mermaid\n# not a heading\n```\n#### b\n";
        assert_eq!(
            demote(md),
            "#### a\ntext\n```mermaid\n# not a heading\n```\n##### b\n"
        );
    }

    #[test]
    fn a_cut_ends_at_a_section_heading_and_names_the_report() {
        let text = format!(
            "#### one\n{}\n#### two\n{}\n",
            "x".repeat(300),
            "y".repeat(300)
        );
        let c = cut(&text, 550, "h100");
        assert!(c.starts_with("#### one"), "{c}");
        assert!(!c.contains("#### two"), "{c}");
        assert!(c.contains("`h100/report.html`"), "{c}");
        assert_eq!(cut(&text, 10_000, "h100"), text);
    }

    #[test]
    fn shares_fill_short_texts_and_pass_the_rest_on() {
        assert_eq!(water_fill(&[100, 200], 1000), vec![100, 200]);
        assert_eq!(water_fill(&[100, 5000], 1000), vec![100, 900]);
        assert_eq!(water_fill(&[600, 5000, 700], 1500), vec![500, 500, 500]);
        assert_eq!(water_fill(&[], 1000), Vec::<usize>::new());
    }

    #[test]
    fn links_encode_every_odd_byte() {
        assert_eq!(href("h100-sxm", "report.html"), "h100-sxm/report.html");
        assert_eq!(
            href("a\"><script>", "report.html"),
            "a%22%3E%3Cscript%3E/report.html"
        );
    }
}
