//! The site's pages: each page's data model (serialized into the page as JSON, as
//! report.html embeds its own) and the files: `index.html` (the fleet), `cells/NAME.html`
//! (one per cell), `runs/NAME.html` (one per run) and `assets/` (the script, the styles and
//! the vendored uPlot, written once and shared, so 1,400 pages do not each carry 50 KB of
//! uPlot).
//!
//! What every page of a kind would repeat is written once too: `assets/runs.js` (each run's
//! id, page, start and commit, which every cell page names for each of its points) and
//! `assets/cells.js` (each cell's id and page, which every run page names for each of its
//! cells). A point is then `[run, value, verdict]` and a run's cell `[cell, value, previous,
//! verdict]`, indices into those tables: at 1,000 cells x 365 runs the site shrank from
//! 158 MB to about a fifth, and a page opened from disk loads the tables with `<script
//! src>` as it loads uPlot (nothing is fetched).
//!
//! Every value from the store reaches a page only inside that JSON, with `<` written as
//! `\u003c` so nothing closes the script element, and the page's script sets it as text,
//! never as markup. File names are made here from the ids (see [`file_name`]), so no id
//! names a path outside the site.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::model::{host_levels, parts, Fleet, Series, SPARK_POINTS};

const PAGE: &str = include_str!("assets/page.html");
const SITE_JS: &str = include_str!("assets/site.js");
const SITE_CSS: &str = include_str!("assets/site.css");
const UPLOT_JS: &str = include_str!("../report/html/vendor/uplot/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../report/html/vendor/uplot/uPlot.min.css");

/// A file name for an id from the store: its safe characters (at most 80 of them) and a
/// hash of the whole id, so two ids never share a page and `../` or `<script>` name
/// nothing but a file of this folder.
pub(crate) fn file_name(id: &str) -> String {
    use sha2::Digest;
    let safe: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '+' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(80)
        .collect();
    let safe = safe.trim_start_matches('.');
    let hash = sha2::Sha256::digest(id.as_bytes());
    let tag: String = hash[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("{safe}-{tag}.html")
}

#[derive(Serialize)]
struct IndexData<'a> {
    page: &'static str,
    title: String,
    store: &'a str,
    metric: &'a str,
    branch: Option<&'a str>,
    generated_at: String,
    runs: usize,
    rows: Vec<Row<'a>>,
    findings: Vec<FindingView>,
    run_list: Vec<RunView<'a>>,
}

#[derive(Serialize)]
struct Row<'a> {
    cell: &'a str,
    page: String,
    key: &'a str,
    branch: &'a str,
    parts: Vec<&'a str>,
    last: f64,
    verdict: Option<&'a str>,
    last_run: &'a str,
    last_run_page: String,
    last_time: &'a str,
    runs: usize,
    open: bool,
    change_points: usize,
    spark: Vec<f64>,
    /// Indices into `spark` of the change points it shows.
    spark_changes: Vec<usize>,
}

#[derive(Serialize)]
struct FindingView {
    key: String,
    branch: String,
    cells: Vec<(String, String)>,
    first_bad_run: String,
    first_bad_page: String,
    first_bad_commit: Option<String>,
    last_good_run: Option<String>,
    last_good_page: Option<String>,
    last_good_commit: Option<String>,
    change: Option<f64>,
    attribution: Option<String>,
    suspects: Vec<String>,
    triage: Option<super::triage::Triage>,
}

#[derive(Serialize)]
struct RunView<'a> {
    run_id: &'a str,
    page: String,
    time: &'a str,
    key: &'a str,
    branch: Option<&'a str>,
    commit: Option<&'a str>,
    cells: usize,
    regressed: usize,
    report: Option<String>,
    /// GPU-seconds the run's verdict cost in all, and that against its measuring alone
    /// (`None`: the store kept no cost for the run).
    gpu_s: Option<f64>,
    times: Option<f64>,
}

#[derive(Serialize)]
struct CellData<'a> {
    page: &'static str,
    title: String,
    cell: &'a str,
    parts: Vec<&'a str>,
    metric: &'a str,
    series: Vec<SeriesView<'a>>,
}

#[derive(Serialize)]
struct SeriesView<'a> {
    key: &'a str,
    branch: &'a str,
    /// `[run, value, verdict]`, the run an index into `assets/runs.js`.
    points: Vec<(usize, f64, Option<&'a str>)>,
    change_points: Vec<ChangeView>,
    segments: Vec<SegmentView<'a>>,
    /// Where each host runs the cell since the last change point (two hosts or more).
    hosts: Vec<HostView>,
}

#[derive(Serialize)]
struct HostView {
    host: String,
    runs: usize,
    median: f64,
    rel: f64,
}

/// A run as `assets/runs.js` lists it for the cell pages.
#[derive(Serialize)]
struct RunRef<'a> {
    run: &'a str,
    /// Its page, relative to `cells/`; absent for a run with no page (a bisection's round).
    page: Option<String>,
    time: &'a str,
    commit: Option<&'a str>,
    host: &'a str,
}

/// A cell as `assets/cells.js` lists it for the run pages.
#[derive(Serialize)]
struct CellRef<'a> {
    cell: &'a str,
    /// Its page, relative to `runs/`.
    page: String,
}

#[derive(Serialize)]
struct ChangeView {
    index: usize,
    before: f64,
    after: f64,
    rel_change: f64,
    p_value: f64,
}

#[derive(Serialize)]
struct SegmentView<'a> {
    index: Option<usize>,
    first_run: &'a str,
    starts_at: &'a str,
    reason: &'a str,
    accepted_at: &'a str,
}

#[derive(Serialize)]
struct RunData<'a> {
    page: &'static str,
    title: String,
    run_id: &'a str,
    time: &'a str,
    key: &'a str,
    branch: Option<&'a str>,
    commit: Option<&'a str>,
    host: &'a str,
    matrix: &'a str,
    report: Option<String>,
    /// `Cost of this verdict: ...` as summary.md words it, when the store kept the cost.
    cost: Option<String>,
    /// The cells whose verdict took more than measuring them, costliest first: `[cell,
    /// [measuring, side by side, re-runs, triage]]`, GPU-seconds (summary.md's table).
    cell_costs: Vec<(&'a str, [f64; 4])>,
    metric: &'a str,
    /// `[cell, value, previous value, verdict]`, the cell an index into `assets/cells.js`.
    cells: Vec<(usize, f64, Option<f64>, Option<&'a str>)>,
}

/// What the pages need beside the fleet.
pub(crate) struct Context<'a> {
    pub store: &'a str,
    /// Per run (index of [`Fleet::runs`]), what its verdict cost, when the store kept it.
    pub costs: Vec<Option<crate::history::cost::RunCost>>,
    pub metric: &'a str,
    pub branch: Option<&'a str>,
    /// Per run (index of [`Fleet::runs`]), the link to its report from `runs/`, when known.
    pub reports: Vec<Option<String>>,
    /// Per finding, the suspects' lines.
    pub suspects: Vec<Vec<String>>,
    /// Per finding, its triage where it was kept.
    pub triage: Vec<Option<super::triage::Triage>>,
    pub generated_at: String,
}

/// How many pages of each kind were written.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Written {
    pub cells: usize,
    pub runs: usize,
    pub bytes: u64,
}

/// The script element that loads a shared table, for the pages that use one.
const RUNS_SCRIPT: &str = r#"<script src="../assets/runs.js"></script>"#;
const CELLS_SCRIPT: &str = r#"<script src="../assets/cells.js"></script>"#;

/// `assets/NAME.js`: a shared table as JSON text in a JavaScript string (`window[var]`),
/// which site.js parses as it parses a page's own data. A JSON string is a JavaScript
/// string literal, so no value can end it or run as code.
fn table_js(var: &str, table: &impl Serialize) -> Result<String, String> {
    // Every string cut (`sanitize::bounded_json`): the store's texts are whatever its
    // writers put there. Links and file names were made from the whole ids before this.
    let json = crate::sanitize::bounded_json(table).map_err(|e| e.to_string())?;
    // `<` as `\u003c`, as in the pages: the file holds no markup even as text.
    let literal = serde_json::to_string(&json)
        .map_err(|e| e.to_string())?
        .replace('<', "\\u003c");
    Ok(format!(
        "// Written by bench site: a table the pages share (see src/site/pages.rs).\nwindow.{var} = {literal};\n"
    ))
}

fn page(title: &str, data: &impl Serialize, root: &str, shared: &str) -> Result<String, String> {
    let json = crate::sanitize::bounded_json(data).map_err(|e| e.to_string())?;
    let title = crate::sanitize::bounded(title, 200);
    // As report.html does: `<` only occurs inside JSON strings, where `\u003c` means the
    // same, so no value can close the script element early.
    let json = json.replace('<', "\\u003c");
    let title = title
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('{', "&#123;");
    // Placeholders are filled once each, data last, so nothing in the data is taken for one.
    Ok(PAGE
        .replacen("{{TITLE}}", &title, 1)
        .replace("{{ROOT}}", root)
        .replacen("{{SHARED}}", shared, 1)
        .replacen("{{DATA}}", &json, 1))
}

fn write(path: &Path, text: &str, bytes: &mut u64) -> Result<(), String> {
    *bytes += text.len() as u64;
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

fn cell_page(cell: &str) -> String {
    format!("cells/{}", file_name(cell))
}

fn run_page(run: &str) -> String {
    format!("runs/{}", file_name(run))
}

/// Writes the whole site into `out` (created when missing).
pub(crate) fn write_site(out: &Path, fleet: &Fleet, cx: &Context<'_>) -> Result<Written, String> {
    let mut bytes = 0u64;
    for d in ["assets", "cells", "runs"] {
        let dir: PathBuf = out.join(d);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    write(&out.join("assets/uPlot.iife.min.js"), UPLOT_JS, &mut bytes)?;
    write(&out.join("assets/uPlot.min.css"), UPLOT_CSS, &mut bytes)?;
    write(&out.join("assets/site.js"), SITE_JS, &mut bytes)?;
    write(&out.join("assets/site.css"), SITE_CSS, &mut bytes)?;

    let index = index_data(fleet, cx);
    write(
        &out.join("index.html"),
        &page(&index.title, &index, "", "")?,
        &mut bytes,
    )?;

    // One page per cell, its series on every key and branch together.
    let mut by_cell: Vec<(&str, Vec<&Series>)> = Vec::new();
    for s in &fleet.series {
        match by_cell.last_mut() {
            Some((c, list)) if *c == s.cell => list.push(s),
            _ => by_cell.push((&s.cell, vec![s])),
        }
    }
    // The tables the pages share: every run a point may name, every cell a run may list.
    let mut paged = vec![false; fleet.runs.len()];
    for s in &fleet.series {
        for v in &s.values {
            paged[v.run] = true;
        }
    }
    let runs_table: Vec<RunRef<'_>> = fleet
        .runs
        .iter()
        .zip(&paged)
        .map(|(r, &has)| RunRef {
            run: &r.run_id,
            page: has.then(|| format!("../{}", run_page(&r.run_id))),
            time: &r.started_at,
            commit: r.commit.as_deref(),
            host: &r.host,
        })
        .collect();
    write(
        &out.join("assets/runs.js"),
        &table_js("benchRuns", &runs_table)?,
        &mut bytes,
    )?;
    let cells_table: Vec<CellRef<'_>> = by_cell
        .iter()
        .map(|(cell, _)| CellRef {
            cell,
            page: format!("../{}", cell_page(cell)),
        })
        .collect();
    write(
        &out.join("assets/cells.js"),
        &table_js("benchCells", &cells_table)?,
        &mut bytes,
    )?;

    for (cell, list) in &by_cell {
        let data = CellData {
            page: "cell",
            title: format!("bench site: {cell}"),
            cell,
            parts: parts(cell),
            metric: cx.metric,
            series: list.iter().map(|s| series_view(s, fleet)).collect(),
        };
        write(
            &out.join(cell_page(cell)),
            &page(&data.title, &data, "../", RUNS_SCRIPT)?,
            &mut bytes,
        )?;
    }

    // One page per run: the values of its cells, and each one's previous value.
    type RunCell<'a> = (usize, f64, Option<f64>, Option<&'a str>);
    let mut per_run: Vec<Vec<RunCell<'_>>> = fleet.runs.iter().map(|_| Vec::new()).collect();
    let mut cell_index = 0;
    for (i, s) in fleet.series.iter().enumerate() {
        // The series of one cell are together (the store's order), as `by_cell` is.
        if i > 0 && fleet.series[i - 1].cell != s.cell {
            cell_index += 1;
        }
        for (j, v) in s.values.iter().enumerate() {
            per_run[v.run].push((
                cell_index,
                v.value,
                j.checked_sub(1).map(|k| s.values[k].value),
                v.verdict.as_deref(),
            ));
        }
    }
    let mut runs = 0;
    for (((r, cells), report), cost) in fleet
        .runs
        .iter()
        .zip(per_run)
        .zip(&cx.reports)
        .zip(&cx.costs)
    {
        if cells.is_empty() {
            continue;
        }
        let data = RunData {
            page: "run",
            title: format!("bench site: run {}", r.run_id),
            run_id: &r.run_id,
            time: &r.started_at,
            key: &r.hardware_key,
            branch: r.branch.as_deref(),
            commit: r.commit.as_deref(),
            host: &r.host,
            matrix: &r.matrix_name,
            report: report.clone(),
            cost: cost.as_ref().map(|c| c.total.sentence()),
            cell_costs: cost.as_ref().map_or_else(Vec::new, |c| {
                c.cells
                    .iter()
                    .map(|c| (c.cell_id.as_str(), c.cost.parts()))
                    .collect()
            }),
            metric: cx.metric,
            cells,
        };
        write(
            &out.join(run_page(&r.run_id)),
            &page(&data.title, &data, "../", CELLS_SCRIPT)?,
            &mut bytes,
        )?;
        runs += 1;
    }
    Ok(Written {
        cells: by_cell.len(),
        runs,
        bytes,
    })
}

fn series_view<'a>(s: &'a Series, fleet: &Fleet) -> SeriesView<'a> {
    SeriesView {
        hosts: host_levels(s, &fleet.runs)
            .into_iter()
            .map(|h| HostView {
                host: h.host,
                runs: h.runs,
                median: h.median,
                rel: h.rel,
            })
            .collect(),
        key: &s.key,
        branch: &s.branch,
        points: s
            .values
            .iter()
            .map(|v| (v.run, v.value, v.verdict.as_deref()))
            .collect(),
        change_points: s
            .change_points
            .iter()
            .map(|c| ChangeView {
                index: c.index,
                before: c.mean_before,
                after: c.mean_after,
                rel_change: c.rel_change(),
                p_value: c.p_value,
            })
            .collect(),
        segments: s
            .segments
            .iter()
            .map(|(g, i)| SegmentView {
                index: *i,
                first_run: &g.first_run_id,
                starts_at: &g.starts_at,
                reason: &g.reason,
                accepted_at: &g.accepted_at,
            })
            .collect(),
    }
}

fn index_data<'a>(fleet: &'a Fleet, cx: &'a Context<'a>) -> IndexData<'a> {
    let rows = fleet
        .series
        .iter()
        .filter(|s| !s.values.is_empty())
        .map(|s| {
            let last = s.values.last().expect("a series has values");
            let r = &fleet.runs[last.run];
            let from = s.values.len().saturating_sub(SPARK_POINTS);
            Row {
                cell: &s.cell,
                page: cell_page(&s.cell),
                key: &s.key,
                branch: &s.branch,
                parts: parts(&s.cell),
                last: last.value,
                verdict: last.verdict.as_deref(),
                last_run: &r.run_id,
                last_run_page: run_page(&r.run_id),
                last_time: &r.started_at,
                runs: s.values.len(),
                open: s.open(),
                change_points: s.change_points.len(),
                spark: s.values[from..].iter().map(|v| v.value).collect(),
                spark_changes: s
                    .change_points
                    .iter()
                    .filter(|c| c.index >= from)
                    .map(|c| c.index - from)
                    .collect(),
            }
        })
        .collect();
    let findings = fleet
        .findings
        .iter()
        .zip(&cx.suspects)
        .zip(&cx.triage)
        .map(|((f, suspects), triage)| {
            let o = &f.cells[0];
            let s = &fleet.series[o.series];
            let bad = &fleet.runs[s.values[o.first_bad].run];
            let good = o.last_good.map(|g| &fleet.runs[s.values[g].run]);
            FindingView {
                key: s.key.clone(),
                branch: s.branch.clone(),
                cells: f
                    .cells
                    .iter()
                    .map(|o| {
                        let c = &fleet.series[o.series].cell;
                        (c.clone(), cell_page(c))
                    })
                    .collect(),
                first_bad_run: bad.run_id.clone(),
                first_bad_page: run_page(&bad.run_id),
                first_bad_commit: bad.commit.clone(),
                last_good_run: good.map(|g| g.run_id.clone()),
                last_good_page: good.map(|g| run_page(&g.run_id)),
                last_good_commit: good.and_then(|g| g.commit.clone()),
                change: o.change,
                attribution: super::model::attribution(fleet, f),
                suspects: suspects.clone(),
                triage: triage.clone().map(|mut t| {
                    t.run_page = t.run.as_deref().map(run_page);
                    t
                }),
            }
        })
        .collect();
    let mut counts = vec![(0usize, 0usize); fleet.runs.len()];
    for s in &fleet.series {
        for v in &s.values {
            counts[v.run].0 += 1;
            if v.verdict.as_deref() == Some("regressed") {
                counts[v.run].1 += 1;
            }
        }
    }
    let run_list = fleet
        .runs
        .iter()
        .zip(&counts)
        .zip(&cx.reports)
        .zip(&cx.costs)
        .filter(|(((_, c), _), _)| c.0 > 0)
        .map(|(((r, c), report), cost)| RunView {
            run_id: &r.run_id,
            page: run_page(&r.run_id),
            time: &r.started_at,
            key: &r.hardware_key,
            branch: r.branch.as_deref(),
            commit: r.commit.as_deref(),
            cells: c.0,
            regressed: c.1,
            // The index sits one folder above the run pages.
            report: report.as_ref().map(|l| {
                l.strip_prefix("../")
                    .map(str::to_string)
                    .unwrap_or(l.clone())
            }),
            gpu_s: cost.as_ref().map(|c| c.total.total()),
            times: cost.as_ref().and_then(|c| c.total.times_the_run()),
        })
        .collect::<Vec<_>>();
    IndexData {
        page: "index",
        title: "bench site: the fleet's history".into(),
        store: cx.store,
        metric: cx.metric,
        branch: cx.branch,
        generated_at: cx.generated_at.clone(),
        runs: run_list.len(),
        rows,
        findings,
        run_list,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_name_names_nothing_outside_its_folder() {
        for id in [
            "../../etc/passwd",
            "<script>alert(1)</script>",
            ".hidden",
            "a/b",
            "",
        ] {
            let n = file_name(id);
            assert!(!n.contains('/') && !n.starts_with('.'), "{n}");
            assert!(n.ends_with(".html"));
            assert!(
                n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_+.".contains(c)),
                "{n}"
            );
        }
        assert_ne!(file_name("a<b"), file_name("a>b"));
        assert!(file_name("gpt2-125m.bf16.1gpu.single.base")
            .starts_with("gpt2-125m.bf16.1gpu.single.base-"));
    }

    #[test]
    fn data_cannot_close_the_script_element() {
        let p = page(
            "<b>{{DATA}}",
            &serde_json::json!({"cell": "</script><script>alert(1)</script>"}),
            "",
            "",
        )
        .unwrap();
        assert!(!p.contains("</script><script>alert"));
        assert!(p.contains("&lt;b&gt;&#123;&#123;DATA}}"));
    }

    #[test]
    fn a_shared_table_is_one_string_holding_no_markup() {
        let js = table_js(
            "benchCells",
            &serde_json::json!([{"cell": "</script>\"'\u{2028}`${x}`"}]),
        )
        .unwrap();
        assert!(js.contains("window.benchCells = \"[{"), "{js}");
        assert!(!js.contains('<'), "{js}");
        // The string's text is the table's JSON again.
        let literal = js.lines().nth(1).unwrap();
        let literal = &literal["window.benchCells = ".len()..literal.len() - 1];
        let json: String = serde_json::from_str(literal).unwrap();
        let table: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(table[0]["cell"], "</script>\"'\u{2028}`${x}`");
    }
}
