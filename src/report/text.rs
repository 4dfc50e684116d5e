//! Number and duration formatting shared by the human, Markdown and JUnit reports, so that
//! a figure reads the same in every format.

use crate::baseline::compare::{CellComparison, CellStatus, MetricComparison};
use crate::baseline::Direction;
use crate::metrics::catalog;
use crate::results::RunResults;

pub(crate) use crate::format::{pct_change, si, three_digits};

/// A fraction as a percentage: `0.43` -> `43.0%`.
pub(crate) fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

/// Bytes in binary units: `1.50 GiB`.
pub(crate) fn bytes(v: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = v;
    let mut unit = 0;
    while x.abs() >= 1024.0 && unit < UNITS.len() - 1 {
        x /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{x:.0} B")
    } else {
        format!("{x:.2} {}", UNITS[unit])
    }
}

/// Seconds as a short duration: `850 ms`, `12.3 s`, `2m 05s`, `1h 02m`.
pub(crate) fn duration(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "-".into();
    }
    if secs < 1.0 {
        format!("{:.0} ms", secs * 1000.0)
    } else if secs < 60.0 {
        format!("{secs:.1} s")
    } else if secs < 3600.0 {
        let s = secs.round() as u64;
        format!("{}m {:02}s", s / 60, s % 60)
    } else {
        let m = (secs / 60.0).round() as u64;
        format!("{}h {:02}m", m / 60, m % 60)
    }
}

/// A metric's value in its unit (from the catalog), for people.
pub(crate) fn metric_value(metric: &str, v: f64) -> String {
    use crate::metrics::catalog::Unit;
    match catalog::get(metric).map(|m| m.unit) {
        Some(Unit::TokensPerSecond) => format!("{} tok/s", si(v)),
        Some(Unit::Fraction) => pct(v),
        Some(Unit::TflopsPerSecond) => format!("{} TFLOP/s", three_digits(v)),
        Some(Unit::Seconds) => duration(v),
        Some(Unit::Bytes) => bytes(v),
        Some(Unit::Days) => format!("{} days", three_digits(v)),
        Some(Unit::TokensPerJoule) => format!("{} tok/J", si(v)),
        Some(Unit::KilowattHours) => format!("{} kWh", si(v)),
        None => three_digits(v),
    }
}

/// A metric's short label for tables.
pub(crate) fn metric_label(metric: &str) -> &str {
    catalog::label(metric)
}

/// A speed-up factor as hyperfine words it: `1.06x faster`, `1.06x slower`.
pub(crate) fn speedup(factor: f64) -> String {
    // Within half a percent the two-decimal factor would read "1.00x faster": say "same".
    if (factor - 1.0).abs() < 0.005 {
        "same speed".to_string()
    } else if factor >= 1.0 {
        format!("{factor:.2}x faster")
    } else {
        format!("{:.2}x slower", 1.0 / factor)
    }
}

/// One line on a metric that changed: `tokens/s 9.40K tok/s vs 10.0K tok/s (-6.0%;
/// tolerance 3.0%, noise 1.0%)`.
pub(crate) fn metric_change(m: &MetricComparison) -> String {
    let label = metric_label(&m.metric);
    let now = m.current.map(|v| metric_value(&m.metric, v));
    let then = m.baseline.map(|v| metric_value(&m.metric, v));
    let mut s = match (now, then) {
        (Some(n), Some(b)) => format!("{label} {n} vs baseline {b}"),
        (Some(n), None) => format!("{label} {n} (no baseline)"),
        (None, Some(b)) => format!("{label} not measured (baseline {b})"),
        (None, None) => label.to_string(),
    };
    if let Some(c) = m.change {
        let better = match m.direction {
            Some(Direction::Higher) => "higher is better",
            Some(Direction::Lower) => "lower is better",
            None => "",
        };
        s.push_str(&format!(" ({}", pct_change(c)));
        if let Some(t) = m.tolerance {
            s.push_str(&format!("; tolerance {}", pct(t)));
        }
        if let Some(n) = m.noise {
            s.push_str(&format!(", noise {}", pct(n)));
        }
        if let Some(f) = m.floor {
            s.push_str(&format!(", floor {}", metric_value(&m.metric, f)));
        }
        if !better.is_empty() {
            s.push_str(&format!("; {better}"));
        }
        s.push(')');
    }
    s
}

/// The change of the cell's headline throughput against its baseline: `-6.0% (1.06x
/// slower)`, or the status when there is nothing to compare.
pub(crate) fn cell_change(cell: &CellComparison) -> String {
    let headline = ["tokens_per_s_per_gpu", "tokens_per_s", "step_time_s"]
        .iter()
        .find_map(|name| cell.metric(name).filter(|m| m.change.is_some()));
    match (headline, cell.speedup()) {
        (Some(m), Some(f)) => format!(
            "{} ({})",
            pct_change(m.change.unwrap_or_default()),
            speedup(f)
        ),
        (Some(m), None) => pct_change(m.change.unwrap_or_default()),
        _ => match cell.status {
            CellStatus::New => "no baseline".into(),
            _ => "-".into(),
        },
    }
}

/// Groups metrics for display: the first metric of the step-time family
/// ([`catalog::Metric::step_time_family`]) stands for the others of the family present (returned as labels); any other metric stands alone.
pub(crate) fn grouped<'a>(
    metrics: impl Iterator<Item = &'a MetricComparison>,
) -> Vec<(&'a MetricComparison, Vec<&'a str>)> {
    let mut out: Vec<(&MetricComparison, Vec<&str>)> = Vec::new();
    let mut family_at: Option<usize> = None;
    for m in metrics {
        if catalog::in_step_time_family(&m.metric) {
            if let Some(i) = family_at {
                out[i].1.push(metric_label(&m.metric));
                continue;
            }
            family_at = Some(out.len());
        }
        out.push((m, Vec::new()));
    }
    out
}

/// `metric_change` of a group's head, followed by the metrics it stands for.
pub(crate) fn group_change(head: &MetricComparison, also: &[&str]) -> String {
    let mut s = metric_change(head);
    if !also.is_empty() {
        s.push_str(&format!("; also {}", also.join(", ")));
    }
    s
}

/// Each group of `metrics` ([`grouped`]) as its [`group_change`] line: how the reports
/// word a cell's regressed (or improved) metrics.
pub(crate) fn group_changes<'a>(
    metrics: impl Iterator<Item = &'a MetricComparison>,
) -> Vec<String> {
    grouped(metrics)
        .into_iter()
        .map(|(m, also)| group_change(m, &also))
        .collect()
}

/// Text on one line (reasons and messages can hold newlines from worker output).
pub(crate) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The cells one matrix rule dropped, for the reports' one-line-per-rule summaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RuleDrops<'a> {
    /// The rule, e.g. `rules[1] (fp8-single-only)`.
    pub by: &'a str,
    pub reason: &'a str,
    pub ids: Vec<&'a str>,
}

/// The run's cells dropped by the matrix's rules, grouped by rule and reason in order of
/// first appearance. Cells `--filter` removed are left out: nobody meant to run them, and
/// on a filtered nightly they outnumber every other line of a report.
pub(crate) fn rule_drops(results: &RunResults) -> Vec<RuleDrops<'_>> {
    let mut out: Vec<RuleDrops<'_>> = Vec::new();
    for d in results.dropped.iter().filter(|d| !d.by_filter()) {
        match out
            .iter_mut()
            .find(|g| g.by == d.by.as_str() && g.reason == d.reason.as_str())
        {
            Some(g) => g.ids.push(d.id.as_str()),
            None => out.push(RuleDrops {
                by: &d.by,
                reason: &d.reason,
                ids: vec![d.id.as_str()],
            }),
        }
    }
    out
}

/// How many cells `--filter` removed.
pub(crate) fn filtered_out(results: &RunResults) -> usize {
    results.dropped.iter().filter(|d| d.by_filter()).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_naturally() {
        assert_eq!(si(344_210.0), "344K");
        assert_eq!(si(43_600.0), "43.6K");
        assert_eq!(si(1_234_000.0), "1.23M");
        assert_eq!(si(950.0), "950");
        assert_eq!(pct_change(-0.06), "-6.0%");
        assert_eq!(pct_change(0.012), "+1.2%");
        assert_eq!(bytes(1.5 * 1024.0 * 1024.0 * 1024.0), "1.50 GiB");
        assert_eq!(duration(0.047), "47 ms");
        assert_eq!(duration(12.34), "12.3 s");
        assert_eq!(duration(125.0), "2m 05s");
        assert_eq!(duration(3720.0), "1h 02m");
        assert_eq!(speedup(1.064), "1.06x faster");
        assert_eq!(speedup(1.0 / 1.064), "1.06x slower");
        assert_eq!(speedup(1.002), "same speed");
        assert_eq!(metric_value("tokens_per_joule", 912.4), "912 tok/J");
        assert_eq!(metric_value("tokens_per_joule", 1_234.0), "1.23K tok/J");
        assert_eq!(metric_value("kwh_per_1t_tokens", 304.4), "304 kWh");
        assert_eq!(metric_value("kwh_per_1t_tokens", 2_777.8), "2.78K kWh");
        assert_eq!(
            one_line("CUDA out of memory.\n  Tried | x"),
            "CUDA out of memory. Tried | x"
        );
    }

    fn m(metric: &str, verdict: crate::baseline::Verdict) -> MetricComparison {
        MetricComparison {
            metric: metric.into(),
            verdict,
            current: Some(2.0),
            baseline: Some(1.0),
            change: Some(1.0),
            direction: Some(Direction::Higher),
            tolerance: Some(0.03),
            floor: None,
            current_spread: Some(0.0),
            baseline_spread: Some(0.0),
            noise: Some(0.0),
        }
    }

    #[test]
    fn step_time_family_is_shown_once() {
        use crate::baseline::Verdict::Regression;
        let ms = [
            m("tokens_per_s", Regression),
            m("peak_mem_bytes", Regression),
            m("step_time_s", Regression),
            m("mfu", Regression),
            m("tokens_per_joule", Regression),
        ];
        let g = grouped(ms.iter());
        // An energy change is its own finding, not one more of the step-time family.
        assert_eq!(g.len(), 3);
        assert_eq!(g[2].0.metric, "tokens_per_joule");
        assert_eq!(g[0].0.metric, "tokens_per_s");
        assert_eq!(g[0].1, vec!["step time", "MFU"]);
        assert_eq!(g[1].0.metric, "peak_mem_bytes");
        assert!(g[1].1.is_empty());
        assert!(group_change(g[0].0, &g[0].1).ends_with("; also step time, MFU"));
    }
}
