//! The metric catalog: every metric the runner produces, with its unit, label, better
//! direction, default tolerance and how it is aggregated over ranks and repeats, in one
//! table that every stage reads (statistics, baselines, comparisons, reports).
//!
//! Adding a metric means adding a row here and computing it in
//! [`stats::cell_metrics`](super::stats::cell_metrics); nothing else keeps a list of metric
//! names. A metric outside the catalog (one a user wrote into a baseline file by hand) is
//! still compared, with the fallbacks in [`direction`], [`tolerance`] and [`label`].

use serde::{Deserialize, Serialize};

/// Which way a metric is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Higher,
    Lower,
}

impl Direction {}

/// The unit a metric's value is in; reports format values by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    TokensPerSecond,
    /// A fraction 0..1, shown as a percentage.
    Fraction,
    TflopsPerSecond,
    Seconds,
    Bytes,
    Days,
}

/// How the ranks of a multi-rank repeat give one figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OverRanks {
    /// A step takes as long as its slowest rank: the largest time per step index.
    SlowestStep,
    /// The largest rank's value (peak memory: the rank that runs out first).
    Largest,
    /// Computed from the repeat's step time and token count, which are already global.
    FromStepTime,
}

/// How a cell's repeats give its value (the spread of the repeats is its noise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OverRepeats {
    /// The median of the repeats, with half the range over the median as the spread.
    Median,
}

/// One metric's facts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Metric {
    /// The key in results and baseline files.
    pub name: &'static str,
    /// The short label of tables.
    pub label: &'static str,
    pub unit: Unit,
    pub direction: Direction,
    /// The relative tolerance of a change when the baseline sets none.
    pub tolerance: f64,
    pub over_ranks: OverRanks,
    pub over_repeats: OverRepeats,
    /// Follows from the step time when the cell's configuration is fixed: when one of the
    /// family changes, all change by the same factor, so reports name the first and list
    /// the others instead of repeating one finding six times.
    pub step_time_family: bool,
    /// Says how fast the cell is, in the order of preference for a cell's speed-up.
    pub speed: bool,
}

/// Default relative tolerance of throughput and time metrics.
///
/// DESIGN.md's noise data (gpt2-125m on H100s): five runs on one host lie within +-0.5% of
/// each other, two hosts of the same kind are 1.6-1.7% apart. Since CI jobs land on any
/// runner of a pool, host-to-host variation is the noise floor a gate must tolerate: 3% does
/// not flag a 2% difference between two runners, and a 5% drop on one runner is flagged.
pub(crate) const DEFAULT_THROUGHPUT_TOLERANCE: f64 = 0.03;

/// Default relative tolerance of peak memory: allocator caching and fragmentation move peak
/// memory by a few percent between otherwise identical runs, and a memory change matters
/// when it approaches the device's capacity, not at the last percent.
pub(crate) const DEFAULT_MEMORY_TOLERANCE: f64 = 0.10;

/// Default relative tolerance of a metric outside the catalog.
pub(crate) const DEFAULT_OTHER_TOLERANCE: f64 = 0.05;

/// A throughput or time metric that follows from the step time.
const fn timing(
    name: &'static str,
    label: &'static str,
    unit: Unit,
    direction: Direction,
    over_ranks: OverRanks,
    speed: bool,
) -> Metric {
    Metric {
        name,
        label,
        unit,
        direction,
        tolerance: DEFAULT_THROUGHPUT_TOLERANCE,
        over_ranks,
        over_repeats: OverRepeats::Median,
        step_time_family: true,
        speed,
    }
}

/// Every metric, in the order results, baselines and reports list them.
pub(crate) const CATALOG: [Metric; 7] = [
    timing(
        "tokens_per_s",
        "tokens/s",
        Unit::TokensPerSecond,
        Direction::Higher,
        OverRanks::FromStepTime,
        true,
    ),
    timing(
        "tokens_per_s_per_gpu",
        "tokens/s/GPU",
        Unit::TokensPerSecond,
        Direction::Higher,
        OverRanks::FromStepTime,
        true,
    ),
    timing(
        "step_time_s",
        "step time",
        Unit::Seconds,
        Direction::Lower,
        OverRanks::SlowestStep,
        true,
    ),
    timing(
        "mfu",
        "MFU",
        Unit::Fraction,
        Direction::Higher,
        OverRanks::FromStepTime,
        false,
    ),
    timing(
        "tflops_per_gpu",
        "TFLOP/s/GPU",
        Unit::TflopsPerSecond,
        Direction::Higher,
        OverRanks::FromStepTime,
        false,
    ),
    Metric {
        name: "peak_mem_bytes",
        label: "peak memory",
        unit: Unit::Bytes,
        direction: Direction::Lower,
        tolerance: DEFAULT_MEMORY_TOLERANCE,
        over_ranks: OverRanks::Largest,
        over_repeats: OverRepeats::Median,
        step_time_family: false,
        speed: false,
    },
    timing(
        "time_to_1t_tokens_days",
        "time to 1T tokens",
        Unit::Days,
        Direction::Lower,
        OverRanks::FromStepTime,
        false,
    ),
];

/// The catalog's row for `name`.
pub(crate) fn get(name: &str) -> Option<&'static Metric> {
    CATALOG.iter().find(|m| m.name == name)
}

/// The better direction of `name`; `None` for a metric outside the catalog, whose baseline
/// must then say its direction.
pub(crate) fn direction(name: &str) -> Option<Direction> {
    get(name).map(|m| m.direction)
}

/// The tolerance `name` gets when its baseline sets none.
pub(crate) fn tolerance(name: &str) -> f64 {
    get(name).map_or(DEFAULT_OTHER_TOLERANCE, |m| m.tolerance)
}

/// The short label of `name` in tables (the name itself outside the catalog).
pub(crate) fn label(name: &str) -> &str {
    get(name).map_or(name, |m| m.label)
}

/// Whether `name` belongs to the step-time family (see [`Metric::step_time_family`]).
pub(crate) fn in_step_time_family(name: &str) -> bool {
    get(name).is_some_and(|m| m.step_time_family)
}

/// The metrics that say how fast a cell is, in order of preference.
pub(crate) fn speed_metrics() -> impl Iterator<Item = &'static str> {
    CATALOG.iter().filter(|m| m.speed).map(|m| m.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_known_facts_hold() {
        for (i, m) in CATALOG.iter().enumerate() {
            assert!(CATALOG[..i].iter().all(|n| n.name != m.name), "{}", m.name);
        }
        assert_eq!(direction("mfu"), Some(Direction::Higher));
        assert_eq!(direction("peak_mem_bytes"), Some(Direction::Lower));
        assert_eq!(direction("my_metric"), None);
        assert_eq!(tolerance("peak_mem_bytes"), DEFAULT_MEMORY_TOLERANCE);
        assert_eq!(tolerance("step_time_s"), DEFAULT_THROUGHPUT_TOLERANCE);
        assert_eq!(tolerance("my_metric"), DEFAULT_OTHER_TOLERANCE);
        assert_eq!(label("my_metric"), "my_metric");
        assert_eq!(
            speed_metrics().collect::<Vec<_>>(),
            ["tokens_per_s", "tokens_per_s_per_gpu", "step_time_s"]
        );
        assert!(!in_step_time_family("peak_mem_bytes"));
    }
}
