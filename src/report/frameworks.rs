//! The framework comparison: rows model x configuration, columns framework (tokens/s per
//! GPU, MFU, memory, days and GPU-hours per 1T tokens, cost per 1T tokens at a GPU-hour
//! price), as TPrimat and the published recipes report them; and the places where a
//! framework's own figures and bench's disagree by more than [`DISAGREE`].
//!
//! [`rows`] produces the table's data; [`markdown`] renders it (the `frameworks.md`
//! report of a run whose cells include framework workloads). It reads only results, so
//! the reports do not depend on the adapters that produced them (`crate::external`).

use indexmap::IndexMap;

use crate::metrics::flops;
use crate::report::escape::{code, text};
use crate::results::{CellResult, Outcome, RunResults};

/// Relative difference past which bench's and a framework's figure are said to disagree.
pub(crate) const DISAGREE: f64 = 0.02;

/// One framework's figures for one model x configuration.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Column {
    pub tokens_per_s_per_gpu: Option<f64>,
    pub mfu: Option<f64>,
    pub peak_mem_bytes: Option<f64>,
    /// Days to train 1T tokens at the cell's GPU count.
    pub days_per_1t: Option<f64>,
    /// GPU-hours per 1T tokens (independent of the GPU count).
    pub gpu_hours_per_1t: Option<f64>,
    pub cost_per_1t: Option<f64>,
    /// Why there are no figures (failed, skipped, dropped).
    pub note: Option<String>,
    /// The framework's version, e.g. `torchtitan 0.2.2`.
    pub version: Option<String>,
    /// tokens/s per GPU over the repeats: lowest, highest and how many.
    pub spread: Option<Spread>,
    /// What ran, from the run's own records (the first repeat's; see [`Column::ran_differs`]).
    pub ran: Option<crate::events::Ran>,
    /// Whether the repeats' records of what ran disagree (then the first is shown, flagged).
    pub ran_differs: bool,
}

/// A figure's range over a cell's repeats.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Spread {
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Spread {
    /// The range of `samples`, `None` when there are none.
    fn of(samples: &[f64]) -> Option<Spread> {
        let finite: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
        if finite.is_empty() {
            return None;
        }
        Some(Spread {
            min: finite.iter().copied().fold(f64::INFINITY, f64::min),
            max: finite.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            n: finite.len(),
        })
    }

    /// "47,912-49,104 (3)": the range with its count; one repeat says so.
    fn cell(&self) -> String {
        if self.n < 2 {
            return "1 repeat".to_string();
        }
        format!(
            "{}–{} ({})",
            thousands(self.min),
            thousands(self.max),
            self.n
        )
    }
}

/// `v` rounded, with thousands separated by commas, as the README's tables write figures.
fn thousands(v: f64) -> String {
    let digits = format!("{:.0}", v.abs());
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    if v < 0.0 {
        out.insert(0, '-');
    }
    out
}

/// A row: the configuration (every axis value but the framework's) and one column per
/// framework.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    pub config: String,
    pub columns: IndexMap<String, Column>,
}

/// Which framework ran a cell: its `framework` axis value, else its workload kind.
pub(crate) fn framework_of(c: &CellResult) -> String {
    c.values
        .get("framework")
        .map(|v| v.id_fragment())
        .unwrap_or_else(|| c.params.workload.kind().to_string())
}

/// Every axis value but the framework's, as a cell id writes them.
fn config_of(values: &IndexMap<String, crate::cell::Value>) -> String {
    values
        .iter()
        .filter(|(k, _)| k.as_str() != "framework")
        .map(|(k, v)| match (k.as_str(), v) {
            ("gpus", crate::cell::Value::Int(n)) => format!("{n}gpu"),
            _ => v.id_fragment(),
        })
        .collect::<Vec<_>>()
        .join(".")
}

fn metric(c: &CellResult, name: &str) -> Option<f64> {
    c.metrics.get(name).map(|m| m.value)
}

/// The comparison's rows, in the order their configurations first appear; `price` is per
/// GPU-hour.
pub(crate) fn rows(results: &RunResults, price: Option<f64>) -> Vec<Row> {
    let mut out: IndexMap<String, Row> = IndexMap::new();
    for c in &results.cells {
        let config = config_of(&c.values);
        let per_gpu = metric(c, "tokens_per_s_per_gpu");
        let gpu_hours = per_gpu.filter(|t| *t > 0.0).map(|t| 1e12 / t / 3600.0);
        let version = c
            .repeats
            .iter()
            .find_map(|r| r.summary.framework.as_ref())
            .map(|f| format!("{} {}", f.name, f.version));
        let note = match &c.outcome {
            Outcome::Passed => None,
            Outcome::Failed { reason } => Some(format!("failed: {reason}")),
            Outcome::TimedOut { reason } => Some(format!("timed out: {reason}")),
            Outcome::Skipped { reason } => Some(format!("skipped: {reason}")),
        };
        let records: Vec<&crate::events::Ran> = c
            .repeats
            .iter()
            .filter_map(|r| r.summary.ran.as_deref())
            .collect();
        let ran = records.first().map(|r| (*r).clone());
        // Evidence names log lines, which move between repeats; the phrases must agree.
        let ran_differs = records
            .iter()
            .any(|r| Some(r.aspects()) != ran.as_ref().map(|f| f.aspects()));
        let col = Column {
            spread: c
                .metrics
                .get("tokens_per_s_per_gpu")
                .and_then(|m| Spread::of(&m.samples)),
            ran,
            ran_differs,
            tokens_per_s_per_gpu: per_gpu,
            mfu: metric(c, "mfu"),
            peak_mem_bytes: metric(c, "peak_mem_bytes"),
            days_per_1t: metric(c, "tokens_per_s").map(flops::days_per_1t_tokens),
            gpu_hours_per_1t: gpu_hours,
            cost_per_1t: gpu_hours.zip(price).map(|(h, p)| h * p),
            note,
            version,
        };
        out.entry(config.clone())
            .or_insert_with(|| Row {
                config,
                columns: IndexMap::new(),
            })
            .columns
            .insert(framework_of(c), col);
    }
    // A cell the command line's --filter left out was never meant to run, so it is no
    // column of the comparison (as in the other reports); the matrix's and the adapters'
    // drops say why a framework is missing from a configuration.
    for d in results.dropped.iter().filter(|d| !d.by_filter()) {
        let fw = d
            .values
            .get("framework")
            .map(|v| v.id_fragment())
            .unwrap_or_default();
        let config = config_of(&d.values);
        if let Some(row) = out.get_mut(&config) {
            row.columns.entry(fw).or_insert_with(|| Column {
                note: Some(format!("dropped: {}", d.reason)),
                ..Column::default()
            });
        }
    }
    out.into_values().collect()
}

/// Where a framework's own figure and bench's differ by more than [`DISAGREE`], one
/// sentence each.
pub(crate) fn disagreements(results: &RunResults) -> Vec<String> {
    let mut out = Vec::new();
    for c in &results.cells {
        let Some(fw) = c.repeats.iter().find_map(|r| r.summary.framework.as_ref()) else {
            continue;
        };
        let pairs = [
            (
                "tokens/s per GPU",
                metric(c, "tokens_per_s_per_gpu"),
                fw.tokens_per_s_per_gpu,
                1.0,
                "",
            ),
            ("MFU", metric(c, "mfu"), fw.mfu, 100.0, "%"),
            (
                "TFLOP/s per GPU",
                metric(c, "tflops_per_gpu"),
                fw.tflops_per_gpu,
                1.0,
                "",
            ),
        ];
        for (what, ours, theirs, scale, unit) in pairs {
            if let (Some(a), Some(b)) = (ours, theirs) {
                let rel = (a - b).abs() / b.abs().max(f64::MIN_POSITIVE);
                if rel > DISAGREE {
                    out.push(format!(
                        "{}: {what} by bench {:.4}{unit}, by {} {} {:.4}{unit} ({:+.1}%; {})",
                        c.id,
                        a * scale,
                        fw.name,
                        fw.version,
                        b * scale,
                        (a / b - 1.0) * 100.0,
                        fw.method
                    ));
                }
            }
        }
    }
    out
}

fn fmt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "–".to_string())
}

/// Whether any cell of the run is a framework cell: it has a `framework` axis value or
/// runs a framework adapter's workload.
pub(crate) fn has_framework_cells(results: &RunResults) -> bool {
    results.cells.iter().any(|c| {
        c.values.contains_key("framework")
            || matches!(c.params.workload, crate::cell::Workload::Framework { .. })
    })
}

/// The comparison as Markdown; `None` when the run has no framework cells.
pub(crate) fn markdown(results: &RunResults, price: Option<f64>) -> Option<String> {
    if !has_framework_cells(results) {
        return None;
    }
    let rows = rows(results, price);
    let env = &results.environment;
    let mut s = format!(
        "## Framework comparison\n\n{} ({} x {}), run {} started {}.\n\n",
        code(&results.matrix_name),
        env.gpu_count,
        text(env.gpu_model.as_deref().unwrap_or("CPU")),
        code(&results.run_id),
        text(&results.started_at)
    );
    s.push_str("| model x configuration | framework | tokens/s/GPU | range over repeats | MFU | memory (GiB) | days / 1T tokens | GPU-hours / 1T tokens | cost / 1T tokens |\n");
    s.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for row in &rows {
        for (fw, col) in &row.columns {
            // The axis values, the framework's name and version (its driver's line) and the
            // notes are untrusted text.
            let name = text(&match &col.version {
                Some(v) => format!("{fw} ({v})"),
                None => fw.clone(),
            });
            let config = text(&row.config);
            if let Some(note) = &col.note {
                s.push_str(&format!(
                    "| {config} | {name} | {} | | | | | | |\n",
                    text(note)
                ));
                continue;
            }
            s.push_str(&format!(
                "| {config} | {name} | {} | {} | {} | {} | {} | {} | {} |\n",
                fmt(col.tokens_per_s_per_gpu, |v| format!("{v:.0}")),
                col.spread
                    .map(|sp| sp.cell())
                    .unwrap_or_else(|| "–".to_string()),
                fmt(col.mfu, |v| format!("{:.1}%", v * 100.0)),
                fmt(col.peak_mem_bytes, |v| format!(
                    "{:.1}",
                    v / (1u64 << 30) as f64
                )),
                fmt(col.days_per_1t, |v| format!("{v:.1}")),
                fmt(col.gpu_hours_per_1t, |v| format!("{v:.0}")),
                fmt(col.cost_per_1t, |v| format!("${v:.0}")),
            ));
        }
    }
    if price.is_none() {
        s.push_str("\nCost needs a price per GPU-hour: `--gpu-hour-price`.\n");
    }
    s.push_str(&what_ran(&rows));
    let dis = disagreements(results);
    if !dis.is_empty() {
        s.push_str(&format!(
            "\nbench and the framework disagree by more than {:.0}%:\n\n",
            DISAGREE * 100.0
        ));
        for d in dis {
            s.push_str(&format!("- {}\n", text(&d)));
        }
    }
    Some(s)
}

/// The "what ran" table: one row per configuration and framework, one column per aspect,
/// from the runs' own records (the built-in worker's settings, each framework's log lines
/// and driver record); an aspect no record spoke of reads as what the cell asked, marked.
fn what_ran(rows: &[Row]) -> String {
    let mut s = String::from(
        "\n### What ran\n\nFrom each run's own records: the built-in worker's settings, the framework's log lines and its driver's reading of the framework's resolved settings (the cell's `ran` record in results.json lists the line each phrase came from).\n\n| model x configuration | framework | execution | attention | checkpointing | optimizer | precision | parallel |\n|---|---|---|---|---|---|---|---|\n",
    );
    let mut any = false;
    for row in rows {
        for (fw, col) in &row.columns {
            let Some(ran) = &col.ran else { continue };
            any = true;
            let mut name = fw.clone();
            if col.ran_differs {
                name.push_str(" (repeats differ: first shown)");
            }
            let cells: Vec<String> = ran
                .aspects()
                .iter()
                .map(|(_, v)| v.map(text).unwrap_or_else(|| "–".to_string()))
                .collect();
            s.push_str(&format!(
                "| {} | {} | {} |\n",
                text(&row.config),
                text(&name),
                cells.join(" | ")
            ));
        }
    }
    if any {
        s
    } else {
        String::new()
    }
}

/// The `frameworks.md` sink: the comparison table, written only for a run with framework
/// cells (a file in every run folder that only says there is nothing to compare is noise).
pub struct FrameworksExporter {
    /// Price of one GPU-hour (`--gpu-hour-price`), for the cost per 1T tokens.
    pub gpu_hour_price: Option<f64>,
}

impl crate::report::input::Exporter for FrameworksExporter {
    fn file_name(&self) -> &'static str {
        "frameworks.md"
    }

    fn applies(&self, input: &crate::report::input::ReportInput<'_>) -> bool {
        has_framework_cells(input.results)
    }

    fn render(
        &self,
        input: &crate::report::input::ReportInput<'_>,
    ) -> Result<String, crate::report::input::ReportError> {
        Ok(markdown(input.results, self.gpu_hour_price)
            .unwrap_or_else(|| "No framework cells in this run.\n".to_string()))
    }
}
