//! The metric catalog: every metric the runner produces, with its unit, label, better
//! direction, default tolerance and how it is aggregated over ranks and repeats, in one
//! table that every stage reads (statistics, baselines, comparisons, reports).
//!
//! Adding a metric means adding a row here and computing it in
//! [`stats::cell_metrics`](super::stats::cell_metrics) (or, for the energy metrics, which
//! need the cell's telemetry, in [`energy::add_energy`](super::energy::add_energy)); nothing
//! else keeps a list of metric names. A metric outside the catalog (one a user wrote into a baseline file by hand) is
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
    TokensPerJoule,
    /// Kilowatt-hours (per 1e12 tokens).
    KilowattHours,
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
    /// Computed from the repeat's global tokens/s and the power of every GPU of the cell
    /// (its telemetry's mean power per GPU x its GPUs; see `metrics::energy`).
    FromThroughputAndPower,
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

/// Default relative tolerance of the energy metrics (tokens/J, kWh per 1T tokens).
///
/// They carry the step time's noise and the power reading's, and the second is the larger:
/// night after night on one host (docs/results/gate-study-2026-11-25, one H100, and
/// gate-nights-2026-11-27, H200s; tokens/J computed from each night's tokens/s and mean
/// board power), the undisturbed nights' tokens/J had a robust relative sigma of 0.5-1.2%
/// against 0.2-0.4% for tokens/s, and the 27 nights of gpt2-125m on the H100 lay within
/// -3.6%..+4.0% of their median tokens/J while their tokens/s spanned 0.9%. The board sensor itself is a one-second
/// running average sampled over part of the time (see `metrics::energy`), and the chips of
/// one SKU draw different power for the same work, which a pool of runners adds on top.
/// A baseline is one night, compared with another: 8% is twice the farthest clean night
/// from the median, so no pair of those clean nights differs by more (the largest pair,
/// +4.0% and -3.6%, is 7.3% apart), while a 10% loss of efficiency is flagged. The history
/// gate judges these metrics against the cell's own band as well, which is narrower
/// wherever the cell's power is steadier.
pub(crate) const DEFAULT_ENERGY_TOLERANCE: f64 = 0.08;

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

/// An energy metric (see `metrics::energy`): it follows from the step time *and* the power,
/// so a change of it at an unchanged speed is a finding of its own, not one of the
/// step-time family's.
const fn energy(
    name: &'static str,
    label: &'static str,
    unit: Unit,
    direction: Direction,
) -> Metric {
    Metric {
        name,
        label,
        unit,
        direction,
        tolerance: DEFAULT_ENERGY_TOLERANCE,
        over_ranks: OverRanks::FromThroughputAndPower,
        over_repeats: OverRepeats::Median,
        step_time_family: false,
        speed: false,
    }
}

/// Every metric, in the order results, baselines and reports list them.
pub(crate) const CATALOG: [Metric; 9] = [
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
    energy(
        "tokens_per_joule",
        "tokens/J",
        Unit::TokensPerJoule,
        Direction::Higher,
    ),
    energy(
        "kwh_per_1t_tokens",
        "kWh per 1T tokens",
        Unit::KilowattHours,
        Direction::Lower,
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
        assert_eq!(direction("tokens_per_joule"), Some(Direction::Higher));
        assert_eq!(direction("kwh_per_1t_tokens"), Some(Direction::Lower));
        assert_eq!(tolerance("tokens_per_joule"), DEFAULT_ENERGY_TOLERANCE);
        assert_eq!(tolerance("kwh_per_1t_tokens"), DEFAULT_ENERGY_TOLERANCE);
        // An energy change at the same speed stands alone in the reports.
        assert!(!in_step_time_family("tokens_per_joule"));
        assert!(!in_step_time_family("kwh_per_1t_tokens"));
    }
}
