//! The Mermaid `xychart-beta` chart of a regressed cell's recent values (GitHub and GitLab
//! both render it in comments): from the history store's trend when there is one, else
//! from the run's repeats or steps, thinned to a few points so that it stays small.

use crate::baseline::compare::CellComparison;
use crate::report::text::{grouped, metric_label};
use crate::results::{CellResult, RunResults};
use crate::trend::Trends;

/// Points of one chart: enough to see a trend or a slow step, few enough to stay small.
const CHART_POINTS: usize = 24;

/// The unit a chart shows a metric in, and the factor from the metric's own unit.
fn chart_unit(metric: &str) -> (f64, &'static str) {
    match metric {
        "tokens_per_s" | "tokens_per_s_per_gpu" => (1e-3, "K tok/s"),
        "mfu" => (100.0, "%"),
        "tflops_per_gpu" => (1.0, "TFLOP/s"),
        "step_time_s" | "time_to_first_step_s" => (1e3, "ms"),
        "peak_mem_bytes" => (1.0 / f64::from(1u32 << 30), "GiB"),
        "time_to_1t_tokens_days" => (1.0, "days"),
        "tokens_per_joule" => (1.0, "tok/J"),
        "kwh_per_1t_tokens" => (1.0, "kWh"),
        _ => (1.0, ""),
    }
}

/// A number in a chart: four significant digits, never an exponent (Mermaid's parser
/// reads plain decimals).
fn chart_num(v: f64) -> String {
    if !v.is_finite() {
        return "0".into();
    }
    let a = v.abs();
    let decimals = match a {
        a if a >= 1000.0 => 0,
        a if a >= 100.0 => 1,
        a if a >= 10.0 => 2,
        a if a >= 1.0 => 3,
        _ => 4,
    };
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// At most `n` evenly spaced indexes of `0..len`, the first and last included.
fn pick(len: usize, n: usize) -> Vec<usize> {
    if len <= n || n < 2 {
        return (0..len).collect();
    }
    let mut out: Vec<usize> = (0..n).map(|i| i * (len - 1) / (n - 1)).collect();
    out.dedup();
    out
}

/// What a regression chart draws: labels of the x axis, the values, and what they are.
struct ChartData {
    labels: Vec<String>,
    values: Vec<f64>,
    what: String,
}

/// The earlier runs' values from the history, this run's last.
fn from_history(
    trends: &Trends,
    cell: &CellComparison,
    metric: &str,
    now: f64,
) -> Option<ChartData> {
    let series = trends.get(&cell.id, metric)?;
    let mut points: Vec<(String, f64)> = series
        .points
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let label = match (&p.commit, p.change_point) {
                (Some(c), true) => format!("{}*", c.chars().take(7).collect::<String>()),
                (Some(c), false) => c.chars().take(7).collect(),
                (None, cp) => format!("{}{}", i + 1, if cp { "*" } else { "" }),
            };
            (label, p.value)
        })
        .collect();
    points.push(("now".into(), now));
    let keep = pick(points.len(), CHART_POINTS);
    let what = format!(
        "{} over the last {} runs (this run last; * marks a change point)",
        metric_label(metric),
        keep.len()
    );
    let (labels, values) = keep.into_iter().map(|i| points[i].clone()).unzip();
    Some(ChartData {
        labels,
        values,
        what,
    })
}

/// This run's repeats, when there are several.
fn from_repeats(result: &CellResult, metric: &str) -> Option<ChartData> {
    let samples = &result.metrics.get(metric)?.samples;
    if samples.len() < 2 {
        return None;
    }
    Some(ChartData {
        labels: (1..=samples.len()).map(|i| format!("r{i}")).collect(),
        values: samples.clone(),
        what: format!("{} of each repeat of this run", metric_label(metric)),
    })
}

/// This run's measured steps (of its first repeat), for metrics that follow from the step
/// time: each step's value is the cell's value scaled by the median step time over that
/// step's time (or the inverse, for metrics where lower is better).
fn from_steps(result: &CellResult, metric: &str) -> Option<ChartData> {
    if !crate::metrics::catalog::in_step_time_family(metric) {
        return None;
    }
    let value = result.metrics.get(metric)?.value;
    let median = result.metrics.get("step_time_s")?.value;
    let steps: Vec<_> = result
        .repeats
        .first()?
        .steps
        .iter()
        .filter(|s| !crate::metrics::stats::is_warmup(s, result.params.warmup))
        .filter(|s| s.step_time_s > 0.0)
        .collect();
    if steps.len() < 2 || median <= 0.0 {
        return None;
    }
    let lower =
        crate::metrics::catalog::direction(metric) == Some(crate::baseline::Direction::Lower);
    let keep = pick(steps.len(), CHART_POINTS);
    Some(ChartData {
        labels: keep.iter().map(|&i| steps[i].step.to_string()).collect(),
        values: keep
            .iter()
            .map(|&i| {
                let t = steps[i].step_time_s;
                if lower {
                    value * t / median
                } else {
                    value * median / t
                }
            })
            .collect(),
        what: format!("{} per measured step of this run", metric_label(metric)),
    })
}

/// A Mermaid `xychart-beta` of a regressed cell's first regressed metric: its history when
/// `trends` has one, else this run's repeats, else this run's steps; the baseline as a
/// second, flat line.
pub(super) fn regression_chart(
    results: &RunResults,
    cell: &CellComparison,
    trends: Option<&Trends>,
) -> Option<String> {
    let result = results.cells.iter().find(|c| c.id.as_str() == cell.id)?;
    // The first regressed metric the history has (it may keep tokens/s per GPU but not
    // tokens/s), else the first regressed metric, from this run.
    let from_trends = trends.and_then(|t| {
        cell.regressions()
            .find_map(|m| from_history(t, cell, &m.metric, m.current?).map(|d| (m, d)))
    });
    let (m, data) = match from_trends {
        Some(found) => found,
        None => {
            let (m, _) = grouped(cell.regressions()).into_iter().next()?;
            let data = from_repeats(result, &m.metric).or_else(|| from_steps(result, &m.metric))?;
            (m, data)
        }
    };
    let (scale, unit) = chart_unit(&m.metric);
    let line = |vs: &mut dyn Iterator<Item = f64>| {
        vs.map(|v| chart_num(v * scale))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = format!(
        "{}: {}{}.\n\n```mermaid\nxychart-beta\n    title \"{}\"\n    x-axis [{}]\n    y-axis \"{}\"\n    line [{}]\n",
        crate::report::escape::code(cell.id.as_str()),
        data.what,
        if m.baseline.is_some() { "; the flat line is the baseline" } else { "" },
        mermaid_string(cell.id.as_str()),
        data.labels
            .iter()
            .map(|l| format!("\"{}\"", mermaid_string(l)))
            .collect::<Vec<_>>()
            .join(", "),
        format!("{} ({unit})", metric_label(&m.metric)).trim_end_matches(" ()"),
        line(&mut data.values.iter().copied()),
    );
    if let Some(b) = m.baseline {
        out.push_str(&format!(
            "    line [{}]\n",
            line(&mut std::iter::repeat_n(b, data.values.len()))
        ));
    }
    out.push_str("```\n\n");
    Some(out)
}

/// Untrusted text inside a Mermaid string (`"..."`): one line, without the quote that would
/// end it or the backticks, `%%` and braces of Mermaid's directives and Markdown strings.
fn mermaid_string(s: &str) -> String {
    crate::report::text::one_line(s)
        .chars()
        .map(|c| match c {
            '"' | '`' => '\'',
            '{' | '}' | '%' => '_',
            c => c,
        })
        .collect()
}
