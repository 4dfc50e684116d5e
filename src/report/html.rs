//! `report.html`: one self-contained page per run folder (and `bench report html RUN_DIR...`
//! over several runs) that opens offline, with charts: per cell tokens/s per GPU, tokens
//! per joule (when the cell's GPU power was read) and MFU against the baseline with the
//! cell's noise band, the loss and step-time trace of every
//! repeat (warm-up shaded), weak-scaling efficiency and memory per rank against the GPU
//! count, trends over earlier runs with change points and commits (when a history is
//! given), the framework comparison (when `framework` is an axis), and the dropped cells
//! grouped by rule. Filters and sorting by axis work in the page.
//!
//! # How it is built, and why
//!
//! This module only builds [`HtmlData`], the page's data model, and embeds it as JSON in
//! the page (`<script type="application/json" id="bench-data">`), so the model is what the
//! snapshot tests pin. The page's own script (`html/app.js`) draws it with uPlot, vendored
//! from the npm registry (`html/vendor/uplot/`, MIT, re-fetched by
//! `scripts/vendor-uplot.sh`) and inlined with its stylesheet: no CDN, nothing fetched when
//! the file is opened. uPlot rather than SVG drawn in Rust because the page needs a
//! script anyway (filters, sorting), because a 300-cell nightly has some 600 step traces
//! that a canvas library draws lazily in milliseconds from compact JSON where pre-drawn SVG
//! would be megabytes, and because readers get cursor values and zoom for free; uPlot is
//! the smallest maintained library that does this (about 50 KB minified, no dependencies).
//! The per-cell comparison bars are small SVGs the script draws itself.
//!
//! The trend section takes [`crate::trend::Trends`] (a list of points per cell and
//! metric), the one seam to the run history.

use std::path::Path;

use indexmap::IndexMap;
use serde::Serialize;

use crate::baseline::compare::{CellComparison, CellStatus, Comparison, Counts};
use crate::baseline::store::hardware_words;
use crate::metrics::stats::is_warmup;
use crate::report::input::{Exporter, ReportError, ReportInput};
use crate::report::text::{filtered_out, rule_drops};
use crate::results::{CellResult, RunResults};
use crate::trend::{TrendSeries, Trends};

/// Steps kept per repeat trace; longer runs are thinned evenly (a chart has fewer pixels).
const MAX_TRACE_POINTS: usize = 1000;

const TEMPLATE: &str = include_str!("html/template.html");
const APP_JS: &str = include_str!("html/app.js");
const APP_CSS: &str = include_str!("html/app.css");
const UPLOT_JS: &str = include_str!("html/vendor/uplot/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("html/vendor/uplot/uPlot.min.css");

/// The `report.html` sink.
pub struct HtmlExporter;

impl Exporter for HtmlExporter {
    fn file_name(&self) -> &'static str {
        "report.html"
    }

    fn render(&self, input: &ReportInput<'_>) -> Result<String, ReportError> {
        let mut data = HtmlData::build(&[(input.results, input.comparison)], input.trends);
        data.findings = input.findings.iter().map(FindingView::of).collect();
        render_page(&data)
    }
}

/// One run of the page.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunInfo {
    pub run_id: String,
    pub matrix: String,
    pub hardware: String,
    pub hardware_key: String,
    pub commit: Option<String>,
    pub git_dirty: bool,
    pub bench_version: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub interrupted: bool,
    pub filters: Vec<String>,
    /// Cells `--filter` removed (only counted: nobody meant to run them).
    pub filtered_out: usize,
    pub mfu_policies: Vec<String>,
    pub baseline_file: String,
    pub baseline_exists: bool,
    /// The runs the history judged this run against, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history_scope: Option<String>,
    /// What the energy figures count and leave out (`metrics::energy::CAVEAT`), when a
    /// cell of the run has them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub energy_note: Option<String>,
    pub counts: Counts,
}

/// One metric of one cell against its baseline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricData {
    pub current: Option<f64>,
    pub baseline: Option<f64>,
    pub change: Option<f64>,
    pub verdict: String,
    /// Relative spread of this run's repeats (half their range over the median).
    pub spread: Option<f64>,
    /// The noise band the comparison used: this run's spread plus the baseline's.
    pub noise: Option<f64>,
    pub tolerance: Option<f64>,
    /// One value per repeat.
    pub samples: Vec<f64>,
}

/// One repeat's steps, warm-up included (`warmup` of them, the first ones).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Trace {
    pub step: Vec<u64>,
    pub step_time_s: Vec<f64>,
    pub loss: Vec<f64>,
    /// The last warm-up step's number, when there were warm-up steps.
    pub warmup_until: Option<u64>,
}

/// One cell of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CellData {
    pub run_id: String,
    pub id: String,
    /// Axis values as they appear in the cell id (empty for a cell only the baseline has).
    pub values: IndexMap<String, String>,
    pub gpus: u32,
    pub status: String,
    pub reason: Option<String>,
    pub flaky: bool,
    pub duration_s: Option<f64>,
    pub metrics: IndexMap<String, MetricData>,
    pub traces: Vec<Trace>,
}

/// Cells one matrix rule dropped.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DropGroup {
    pub run_id: String,
    pub by: String,
    pub reason: String,
    pub ids: Vec<String>,
}

/// One point of a weak-scaling line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScalingPoint {
    pub gpus: u32,
    pub id: String,
    pub tokens_per_s_per_gpu: f64,
    /// Tokens/s per GPU over that of the group's smallest GPU count.
    pub efficiency: f64,
    pub peak_mem_bytes: Option<f64>,
}

/// Cells that differ only in their GPU count.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScalingGroup {
    /// The other axes' values, e.g. `gpt2-1.5b bf16 ddp base`.
    pub label: String,
    pub points: Vec<ScalingPoint>,
}

/// One framework's figures for one configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FrameworkEntry {
    pub id: String,
    pub tokens_per_s_per_gpu: Option<f64>,
    pub mfu: Option<f64>,
    pub status: String,
}

/// Cells that differ only in their `framework` value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FrameworkRow {
    pub label: String,
    pub entries: IndexMap<String, FrameworkEntry>,
}

/// The framework comparison: one column per framework.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FrameworkTable {
    pub frameworks: Vec<String>,
    pub rows: Vec<FrameworkRow>,
}

/// Everything the page shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HtmlData {
    pub title: String,
    pub runs: Vec<RunInfo>,
    /// Axis names of every run, in order of first appearance.
    pub axes: Vec<String>,
    pub cells: Vec<CellData>,
    pub dropped: Vec<DropGroup>,
    pub scaling: Vec<ScalingGroup>,
    pub frameworks: Option<FrameworkTable>,
    pub trends: Vec<TrendSeries>,
    /// The triage's findings, one per cause, as the header shows them.
    #[serde(default)]
    pub findings: Vec<FindingView>,
}

/// One finding as the page shows it: its line, its cells, the evidence against.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FindingView {
    pub direction: String,
    pub headline: String,
    pub cells: Vec<String>,
    pub against: Vec<String>,
    /// The automatic bisection's line (first bad commit, or how it ended).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bisected: Option<String>,
    /// The kernel diff: its summary line and rows (kind or kernel, before, after, ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernels: Option<KernelsView>,
}

/// A finding's kernel diff as the page draws it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelsView {
    pub title: String,
    pub summary: String,
    /// `[name, kind, before ms, after ms]`, kinds first, then the top kernels.
    pub rows: Vec<(String, String, f64, f64)>,
    pub traces: Vec<String>,
}

impl FindingView {
    pub(crate) fn of(f: &crate::triage::Finding) -> FindingView {
        FindingView {
            direction: f.direction.to_string(),
            headline: f.headline(),
            cells: f
                .cells
                .iter()
                .map(|(c, s)| format!("{c} {}", crate::format::pct_change(*s)))
                .collect(),
            against: f.against.clone(),
            bisected: f.bisected.as_ref().map(|b| b.line()),
            kernels: f.kernels.as_ref().map(|k| KernelsView {
                title: format!("kernels of {} ({} -> {})", k.cell, k.before, k.after),
                summary: k.summary(),
                rows: k
                    .kinds
                    .iter()
                    .map(|d| (d.name.clone(), "kind".to_string(), d.before_ms, d.after_ms))
                    .chain(k.kernels.iter().map(|d| {
                        (
                            crate::triage::kernels::short_name(&d.name),
                            d.kind.clone(),
                            d.before_ms,
                            d.after_ms,
                        )
                    }))
                    .collect(),
                traces: k.traces.clone(),
            }),
        }
    }
}

fn metric_data(cell: &CellComparison, result: Option<&CellResult>) -> IndexMap<String, MetricData> {
    cell.metrics
        .iter()
        .map(|m| {
            let samples = result
                .and_then(|r| r.metrics.get(&m.metric))
                .map(|v| v.samples.clone())
                .unwrap_or_default();
            let data = MetricData {
                current: m.current,
                baseline: m.baseline,
                change: m.change,
                verdict: serde_json::to_value(m.verdict)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                spread: m.current_spread,
                noise: m.noise,
                tolerance: m.tolerance,
                samples,
            };
            (m.metric.clone(), data)
        })
        .collect()
}

fn traces(result: &CellResult) -> Vec<Trace> {
    result
        .repeats
        .iter()
        .filter(|r| !r.steps.is_empty())
        .map(|r| {
            let n = r.steps.len();
            let stride = n.div_ceil(MAX_TRACE_POINTS).max(1);
            let kept: Vec<_> = r
                .steps
                .iter()
                .enumerate()
                .filter(|(i, _)| i % stride == 0 || *i == n - 1)
                .map(|(_, s)| s)
                .collect();
            Trace {
                step: kept.iter().map(|s| s.step).collect(),
                step_time_s: kept.iter().map(|s| s.step_time_s).collect(),
                loss: kept.iter().map(|s| s.loss).collect(),
                warmup_until: r
                    .steps
                    .iter()
                    .filter(|s| is_warmup(s, result.params.warmup))
                    .map(|s| s.step)
                    .max(),
            }
        })
        .collect()
}

fn cell_data(run_id: &str, cell: &CellComparison, result: Option<&CellResult>) -> CellData {
    CellData {
        run_id: run_id.to_string(),
        id: cell.id.clone(),
        values: result
            .map(|r| {
                r.values
                    .iter()
                    .map(|(k, v)| (k.clone(), v.id_fragment()))
                    .collect()
            })
            .unwrap_or_default(),
        gpus: result
            .and_then(|r| r.values.get("gpus"))
            .and_then(crate::cell::Value::as_f64)
            .map(|g| g.max(1.0) as u32)
            .unwrap_or(1),
        status: cell.status.as_str().to_string(),
        reason: cell.reason.clone(),
        flaky: cell.flaky,
        duration_s: cell.duration_s,
        metrics: metric_data(cell, result),
        traces: result.map(traces).unwrap_or_default(),
    }
}

fn current(cell: &CellData, metric: &str) -> Option<f64> {
    cell.metrics.get(metric).and_then(|m| m.current)
}

/// The values of every axis but `skip`, as a label and a grouping key.
fn label_without(cell: &CellData, skip: &str) -> String {
    cell.values
        .iter()
        .filter(|(k, _)| k.as_str() != skip)
        .map(|(_, v)| v.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Weak scaling: cells measured at two or more GPU counts that agree on every other axis.
fn scaling(cells: &[CellData]) -> Vec<ScalingGroup> {
    let mut groups: IndexMap<String, Vec<&CellData>> = IndexMap::new();
    for c in cells.iter().filter(|c| c.values.contains_key("gpus")) {
        if current(c, "tokens_per_s_per_gpu").is_some() {
            groups.entry(label_without(c, "gpus")).or_default().push(c);
        }
    }
    let mut out = Vec::new();
    for (label, mut members) in groups {
        members.sort_by_key(|c| c.gpus);
        members.dedup_by_key(|c| c.gpus);
        if members.len() < 2 {
            continue;
        }
        let base = current(members[0], "tokens_per_s_per_gpu").unwrap_or(0.0);
        let points = members
            .iter()
            .map(|c| {
                let tps = current(c, "tokens_per_s_per_gpu").unwrap_or(0.0);
                ScalingPoint {
                    gpus: c.gpus,
                    id: c.id.clone(),
                    tokens_per_s_per_gpu: tps,
                    efficiency: if base > 0.0 { tps / base } else { 0.0 },
                    peak_mem_bytes: current(c, "peak_mem_bytes"),
                }
            })
            .collect();
        out.push(ScalingGroup { label, points });
    }
    out
}

/// The framework comparison, when any cell has a `framework` axis value.
fn frameworks(cells: &[CellData]) -> Option<FrameworkTable> {
    let mut names: Vec<String> = Vec::new();
    let mut rows: IndexMap<String, IndexMap<String, FrameworkEntry>> = IndexMap::new();
    for c in cells {
        let Some(fw) = c.values.get("framework") else {
            continue;
        };
        if !names.contains(fw) {
            names.push(fw.clone());
        }
        rows.entry(label_without(c, "framework"))
            .or_default()
            .entry(fw.clone())
            .or_insert_with(|| FrameworkEntry {
                id: c.id.clone(),
                tokens_per_s_per_gpu: current(c, "tokens_per_s_per_gpu"),
                mfu: current(c, "mfu"),
                status: c.status.clone(),
            });
    }
    (!names.is_empty()).then(|| FrameworkTable {
        frameworks: names,
        rows: rows
            .into_iter()
            .map(|(label, entries)| FrameworkRow { label, entries })
            .collect(),
    })
}

impl HtmlData {
    /// The page's data for one or more runs (each with its comparison), with the trends of
    /// their cells when a history is given.
    pub fn build(runs: &[(&RunResults, &Comparison)], trends: Option<&Trends>) -> HtmlData {
        let mut infos = Vec::new();
        let mut axes: Vec<String> = Vec::new();
        let mut cells = Vec::new();
        let mut dropped = Vec::new();
        for (results, cmp) in runs {
            let env = &results.environment;
            let mut counts = cmp.counts();
            counts.dropped = counts.dropped.saturating_sub(filtered_out(results));
            infos.push(RunInfo {
                run_id: results.run_id.clone(),
                matrix: results.matrix_name.clone(),
                hardware: hardware_words(env),
                hardware_key: env.hardware_key.clone(),
                commit: env.git_commit.clone(),
                git_dirty: env.git_dirty,
                bench_version: env.bench_version.clone(),
                started_at: results.started_at.clone(),
                finished_at: results.finished_at.clone(),
                interrupted: results.interrupted || results.interrupted_in.is_some(),
                filters: results.filters.clone(),
                filtered_out: filtered_out(results),
                mfu_policies: crate::report::input::mfu_policies(results),
                baseline_file: cmp.baseline_file.clone(),
                baseline_exists: cmp.baseline_exists,
                history_scope: cmp.history_scope.clone(),
                energy_note: results
                    .cells
                    .iter()
                    .any(|c| c.metrics.contains_key("tokens_per_joule"))
                    .then(|| crate::metrics::energy::CAVEAT.to_string()),
                counts,
            });
            for r in &results.cells {
                for k in r.values.keys() {
                    if !axes.contains(k) {
                        axes.push(k.clone());
                    }
                }
            }
            for cell in cmp.cells.iter().filter(|c| c.status != CellStatus::Dropped) {
                let result = results.cells.iter().find(|r| r.id.as_str() == cell.id);
                cells.push(cell_data(&results.run_id, cell, result));
            }
            for g in rule_drops(results) {
                dropped.push(DropGroup {
                    run_id: results.run_id.clone(),
                    by: g.by.to_string(),
                    reason: g.reason.to_string(),
                    ids: g.ids.iter().map(|s| s.to_string()).collect(),
                });
            }
        }
        let trends = trends
            .map(|t| {
                t.series
                    .iter()
                    .filter(|s| !s.points.is_empty() && cells.iter().any(|c| c.id == s.cell))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let mut matrices: Vec<&str> = infos.iter().map(|r| r.matrix.as_str()).collect();
        matrices.dedup();
        HtmlData {
            title: format!("bench: {}", matrices.join(", ")),
            runs: infos,
            axes,
            scaling: scaling(&cells),
            frameworks: frameworks(&cells),
            cells,
            dropped,
            trends,
            findings: Vec::new(),
        }
    }
}

/// The page: the template with the data, the script, uPlot and the styles inlined.
pub(crate) fn render_page(data: &HtmlData) -> Result<String, ReportError> {
    // Every string cut to a few thousand characters, as `bench site` cuts its pages' data:
    // one 50 MB matrix name or failure reason makes no 50 MB page.
    let json = crate::sanitize::bounded_json(data).map_err(|e| ReportError::Render {
        format: "report.html",
        message: e.to_string(),
    })?;
    // `<` only occurs inside JSON strings, where `\u003c` means the same; so no value (a
    // failure reason quoting HTML, say) can close the script element early.
    let json = json.replace('<', "\\u003c");
    // Each placeholder is replaced once, data last, so nothing inside the data or the
    // scripts is taken for a placeholder.
    Ok(TEMPLATE
        // A brace in the title could make a placeholder that a later replacement fills.
        .replacen(
            "{{TITLE}}",
            // A matrix name from a results file is foreign text: its control characters
            // are written out (`\x1b`), as in every other output, and it is cut.
            &crate::report::escape::html(&crate::sanitize::inline(&crate::sanitize::bounded(
                &data.title,
                crate::sanitize::MAX_SHOWN_CHARS,
            )))
            .replace('{', "&#123;"),
            1,
        )
        .replacen("{{UPLOT_CSS}}", UPLOT_CSS, 1)
        .replacen("{{APP_CSS}}", APP_CSS, 1)
        .replacen(
            "{{UPLOT_JS}}",
            &UPLOT_JS.replace("</script", "<\\/script"),
            1,
        )
        .replacen("{{APP_JS}}", APP_JS, 1)
        .replacen("{{DATA}}", &json, 1))
}

/// The JSON embedded in a page [`render_page`] wrote (for tests and tools).
pub fn embedded_data(page: &str) -> Option<serde_json::Value> {
    let start_tag = r#"<script type="application/json" id="bench-data">"#;
    let start = page.find(start_tag)? + start_tag.len();
    let end = start + page[start..].find("</script>")?;
    serde_json::from_str(&page[start..end]).ok()
}

/// Writes the page of several runs to `out`.
pub(crate) fn write_page(out: &Path, data: &HtmlData) -> Result<(), ReportError> {
    let page = render_page(data)?;
    crate::atomic::write(out, page.as_bytes()).map_err(|source| ReportError::Write {
        path: out.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_cannot_close_the_script_element() {
        let data = HtmlData {
            title: "<b>".into(),
            runs: Vec::new(),
            axes: vec!["</script><script>alert(1)</script>".into()],
            cells: Vec::new(),
            dropped: Vec::new(),
            scaling: Vec::new(),
            frameworks: None,
            trends: Vec::new(),
            findings: Vec::new(),
        };
        let page = render_page(&data).unwrap();
        assert!(!page.contains("</script><script>alert"));
        // A title with terminal controls (a forged matrix name) shows them written out.
        let titled = HtmlData {
            title: "bench: smoke\u{1b}]0;t\u{7}".into(),
            ..data.clone()
        };
        let shown = render_page(&titled).unwrap();
        assert!(
            shown.contains("<title>bench: smoke\\x1b]0;t\\x07</title>"),
            "{shown}"
        );
        assert!(!shown.contains('\u{1b}') && !shown.contains('\u{7}'));
        assert!(page.contains("<title>bench &lt;b&gt;</title>") || page.contains("&lt;b&gt;"));
        let back = embedded_data(&page).unwrap();
        assert_eq!(back["axes"][0], "</script><script>alert(1)</script>");
    }
}
