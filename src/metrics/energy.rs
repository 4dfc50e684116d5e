//! Energy efficiency from the GPU telemetry: tokens per joule and kWh per 1T tokens.
//!
//! Definitions, so that the numbers can be reproduced from `results.json` alone:
//!
//! - **Energy per second** of a repeat = its mean board power per GPU (the mean of every
//!   power sample of the cell's GPUs inside the repeat's measured steps) x the number of GPUs
//!   the cell's telemetry read (`telemetry.gpus`).
//! - **tokens/J** (`tokens_per_joule`) = the repeat's `tokens_per_s` / that energy per
//!   second. Higher is better.
//! - **kWh per 1T tokens** (`kwh_per_1t_tokens`) = 1e12 / tokens/J / 3.6e6 (3.6e6 J in a
//!   kWh). Lower is better.
//!
//! Over repeats, both are the median of the repeats' values with the half-range over the
//! median as their spread, as every metric of the catalog is.
//!
//! # What is measured, against MLPerf Power
//!
//! MLPerf Power measures the whole system at the wall: a power analyzer certified for SPEC
//! PTDaemon between the outlet and every node of the run, with the interconnect measured
//! or estimated, over the whole timed run. bench reads only the **GPUs' own power**, from
//! the vendor tool the telemetry already streams (`nvidia-smi`'s `power.draw`, `amd-smi`'s
//! socket power, `rocm-smi`'s average power), sampled every 100 ms (`nvidia-smi -lms`) or
//! at most every 250 ms (the AMD tools' polls) during the measured steps. The host's CPUs,
//! memory, fans, NICs and switches and the power supplies' losses are not in it, so bench's
//! tokens/J is higher than a wall-power figure of the same run, and comparable only with
//! bench's own figures of the same hardware. The sensor has its own limits too: since
//! Ampere, NVML's board power is a one-second running average, and on A100 and H100 it is
//! sampled over about a quarter of the time (Yang et al. 2024, "Part-time Power
//! Measurements: nvidia-smi's Lack of Attention", arXiv:2312.02741), which is one reason
//! these metrics are given a wider tolerance than tokens/s
//! ([`super::catalog::DEFAULT_ENERGY_TOLERANCE`]).

use super::stats::{median, rel_spread};
use crate::results::{MetricValue, Metrics};

/// Joules in a kilowatt-hour.
pub(crate) const JOULES_PER_KWH: f64 = 3.6e6;

/// The caveat every report that shows these metrics gives with them (see the module docs).
pub(crate) const CAVEAT: &str = "tokens/J and kWh per 1T tokens count GPU board power only (nvidia-smi power.draw or amd-smi socket power, sampled every 100-250 ms over the measured steps), not wall power at the PDU as MLPerf Power measures it: CPUs, memory, fans, network and power-supply losses are not in them";

/// The power a cell's GPUs drew, as its telemetry gives it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Power<'a> {
    /// Mean board power per GPU over all the cell's measured steps, in watts.
    pub cell_w: Option<f64>,
    /// Mean board power per GPU over each repeat's measured steps, in repeat order (`None`
    /// for a repeat whose steps no power sample fell inside); may be empty.
    pub repeat_w: &'a [Option<f64>],
    /// The GPUs the power was read from.
    pub gpus: usize,
}

/// Tokens per joule of a throughput of `tokens_per_s` on `gpus` GPUs drawing `power_w`
/// each; `None` unless every input is positive and finite, so that no figure is ever made
/// up from a missing or zero power reading.
pub(crate) fn tokens_per_joule(tokens_per_s: f64, power_w: f64, gpus: usize) -> Option<f64> {
    let joules_per_s = power_w * gpus as f64;
    let ok = |v: f64| v.is_finite() && v > 0.0;
    (ok(tokens_per_s) && ok(joules_per_s)).then(|| tokens_per_s / joules_per_s)
}

/// Kilowatt-hours for 1e12 tokens at `tokens_per_joule`; `None` unless it is positive
/// and finite.
pub(crate) fn kwh_per_1t_tokens(tokens_per_joule: f64) -> Option<f64> {
    (tokens_per_joule.is_finite() && tokens_per_joule > 0.0)
        .then(|| 1e12 / tokens_per_joule / JOULES_PER_KWH)
}

/// Adds `tokens_per_joule` and `kwh_per_1t_tokens` to `metrics` from its `tokens_per_s`
/// and the cell's `power`; leaves `metrics` as it is when the cell has no power reading (a
/// CPU cell, a host without GPU telemetry) or no throughput: the metrics are then absent,
/// never 0.
///
/// Each repeat's value divides that repeat's tokens/s by that repeat's own power when a
/// power sample fell inside its measured steps, so the spread of the repeats carries the
/// power's noise as well as the speed's. A repeat without a sample of its own (steps
/// shorter than the sampling interval) uses the cell's mean power over all its repeats,
/// which then contributes no spread of its own for that repeat.
pub(crate) fn add_energy(metrics: &mut Metrics, power: &Power<'_>) {
    let Some(tps) = metrics.get("tokens_per_s") else {
        return;
    };
    let per_repeat: Option<Vec<f64>> = tps
        .samples
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let w = power.repeat_w.get(i).copied().flatten().or(power.cell_w)?;
            tokens_per_joule(*t, w, power.gpus)
        })
        .collect();
    let Some(tpj) = per_repeat.filter(|s| !s.is_empty()) else {
        return;
    };
    let kwh: Option<Vec<f64>> = tpj.iter().map(|t| kwh_per_1t_tokens(*t)).collect();
    let (Some(kwh), Some(tpj_value)) = (kwh, median(&tpj)) else {
        return;
    };
    let Some(kwh_value) = median(&kwh) else {
        return;
    };
    metrics.insert(
        "tokens_per_joule".into(),
        MetricValue {
            value: tpj_value,
            rel_spread: rel_spread(&tpj),
            samples: tpj,
        },
    );
    metrics.insert(
        "kwh_per_1t_tokens".into(),
        MetricValue {
            value: kwh_value,
            rel_spread: rel_spread(&kwh),
            samples: kwh,
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    fn tps(samples: &[f64]) -> Metrics {
        let mut m = Metrics::new();
        m.insert(
            "tokens_per_s".into(),
            MetricValue {
                value: median(samples).unwrap(),
                rel_spread: rel_spread(samples),
                samples: samples.to_vec(),
            },
        );
        m
    }

    #[test]
    fn formulas_by_hand() {
        // 8 H100s at 600 W each draw 4800 J/s; at 480,000 tokens/s that is 100 tokens/J.
        assert_eq!(tokens_per_joule(480_000.0, 600.0, 8), Some(100.0));
        // 1e12 tokens at 100 tokens/J take 1e10 J = 1e10 / 3.6e6 kWh = 2777.78 kWh.
        let kwh = kwh_per_1t_tokens(100.0).unwrap();
        assert!(close(kwh, 2_777.777_777_777_778), "{kwh}");
        // No power, no GPUs, no throughput: no figure, never 0 or infinity.
        assert_eq!(tokens_per_joule(480_000.0, 0.0, 8), None);
        assert_eq!(tokens_per_joule(480_000.0, 600.0, 0), None);
        assert_eq!(tokens_per_joule(0.0, 600.0, 8), None);
        assert_eq!(tokens_per_joule(f64::NAN, 600.0, 8), None);
        assert_eq!(kwh_per_1t_tokens(0.0), None);
    }

    #[test]
    fn per_repeat_power_and_the_cell_mean_for_a_repeat_without_samples() {
        // Two GPUs; repeats at 1000, 1100 and 990 tokens/s. The first two have their own
        // power (250 W and 275 W per GPU: 500 and 550 J/s), the third none, so it takes
        // the cell's mean of 260 W (520 J/s).
        let mut m = tps(&[1000.0, 1100.0, 990.0]);
        let repeat_w = [Some(250.0), Some(275.0), None];
        add_energy(
            &mut m,
            &Power {
                cell_w: Some(260.0),
                repeat_w: &repeat_w,
                gpus: 2,
            },
        );
        let tpj = &m["tokens_per_joule"];
        // 1000/500 = 2.0, 1100/550 = 2.0, 990/520 = 1.903846...
        assert_eq!(tpj.samples[..2], [2.0, 2.0]);
        assert!(close(tpj.samples[2], 990.0 / 520.0));
        assert_eq!(tpj.value, 2.0);
        // Half the range over the median: (2.0 - 1.903846) / 2 / 2.0.
        assert!(close(tpj.rel_spread, (2.0 - 990.0 / 520.0) / 4.0));
        // 1e12 / 2.0 / 3.6e6 = 138,888.9 kWh for the first two repeats.
        let kwh = &m["kwh_per_1t_tokens"];
        assert!(close(kwh.samples[0], 1e12 / 2.0 / 3.6e6));
        assert!(close(kwh.value, 1e12 / 2.0 / 3.6e6));
        let names: Vec<&str> = m.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            ["tokens_per_s", "tokens_per_joule", "kwh_per_1t_tokens"]
        );
    }

    #[test]
    fn constant_power_scales_the_throughput() {
        // One GPU at a constant 690 W: each repeat's tokens/J is its tokens/s / 690, so the
        // value is exactly the median tokens/s over 690 and the spread is the speed's.
        let mut m = tps(&[51_200.0, 50_000.0, 52_000.0]);
        add_energy(
            &mut m,
            &Power {
                cell_w: Some(690.0),
                repeat_w: &[Some(690.0); 3],
                gpus: 1,
            },
        );
        assert_eq!(m["tokens_per_joule"].value, 51_200.0 / 690.0);
        assert!(close(
            m["tokens_per_joule"].rel_spread,
            m["tokens_per_s"].rel_spread
        ));
    }

    #[test]
    fn no_power_no_energy_metrics() {
        // A CPU cell (no telemetry power) and a cell whose repeats have neither their own
        // power nor a cell mean: the metrics stay absent.
        for power in [
            Power {
                cell_w: None,
                repeat_w: &[],
                gpus: 0,
            },
            Power {
                cell_w: None,
                repeat_w: &[Some(300.0), None],
                gpus: 1,
            },
            Power {
                cell_w: Some(0.0),
                repeat_w: &[],
                gpus: 1,
            },
        ] {
            let mut m = tps(&[1000.0, 1000.0]);
            add_energy(&mut m, &power);
            assert!(!m.contains_key("tokens_per_joule"), "{power:?}");
            assert!(!m.contains_key("kwh_per_1t_tokens"), "{power:?}");
        }
        // No throughput: nothing to divide.
        let mut m = Metrics::new();
        add_energy(
            &mut m,
            &Power {
                cell_w: Some(300.0),
                repeat_w: &[],
                gpus: 1,
            },
        );
        assert!(m.is_empty());
    }
}
