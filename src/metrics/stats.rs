//! Statistics of step times and repeats: median, mean, percentiles, spread, and the
//! reduction of a cell's repeats into its summary [`Metrics`].
//!
//! Everything here is pure (no I/O, no clocks) so it can be tested against hand-computed
//! values. Definitions, so that numbers can be reproduced elsewhere:
//! - median: the middle order statistic, the mean of the two middle ones for even counts;
//! - p10 / p90: sample quantiles of Hyndman & Fan (1996) definition 8, the one `statrs`
//!   implements and R recommends (approximately median-unbiased);
//! - MAD: the median of absolute deviations from the median, unscaled (multiply by
//!   1.4826 for a normal-consistent estimate of the standard deviation);
//! - relative spread of repeats: half the min..max range over the median, 0 for one repeat.

use statrs::statistics::{Data, OrderStatistics, Statistics};

use super::catalog::{self, OverRepeats};
use super::flops;
use crate::cell::Params;
use crate::events::StepEvent;
use crate::results::{MetricValue, Metrics, Repeat};

/// The median of `xs`; `None` when empty or when a value is NaN.
pub(crate) fn median(xs: &[f64]) -> Option<f64> {
    finite_data(xs).map(|mut d| d.median())
}

/// The arithmetic mean of `xs`; `None` when empty.
pub(crate) fn mean(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() {
        None
    } else {
        Some(xs.mean())
    }
}

/// The `q`-quantile (0..=1) of `xs`, Hyndman & Fan definition 8; `None` when empty.
pub(crate) fn quantile(xs: &[f64], q: f64) -> Option<f64> {
    finite_data(xs).map(|mut d| d.quantile(q))
}

/// The median absolute deviation from the median (unscaled); `None` when empty.
pub(crate) fn mad(xs: &[f64]) -> Option<f64> {
    let m = median(xs)?;
    let dev: Vec<f64> = xs.iter().map(|x| (x - m).abs()).collect();
    median(&dev)
}

/// Half the min..max range over the median; 0 for fewer than two values or a zero median.
pub(crate) fn rel_spread(xs: &[f64]) -> f64 {
    let Some(m) = median(xs) else { return 0.0 };
    if xs.len() < 2 || m == 0.0 {
        return 0.0;
    }
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (hi - lo) / 2.0 / m.abs()
}

fn finite_data(xs: &[f64]) -> Option<Data<Vec<f64>>> {
    if xs.is_empty() || xs.iter().any(|x| x.is_nan()) {
        return None;
    }
    Some(Data::new(xs.to_vec()))
}

/// Statistics of the measured step times of one repeat.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StepStats {
    /// Measured steps (warm-up excluded).
    pub n: usize,
    pub median: f64,
    pub mean: f64,
    pub p10: f64,
    pub p90: f64,
    pub mad: f64,
    /// The last measured step's time.
    pub last: f64,
    /// Median tokens per measured step (across all ranks).
    pub tokens: f64,
}

/// Whether a step is warm-up: the worker's own flag when it gives one, otherwise the
/// first `warmup` steps by index.
pub(crate) fn is_warmup(step: &StepEvent, warmup: u32) -> bool {
    step.warmup.unwrap_or(step.step < u64::from(warmup))
}

/// The measured steps of one repeat, one per step index.
///
/// In a multi-rank cell several ranks may report the same step; the step takes as long
/// as its slowest rank, so the largest time per index is kept (tokens are the global
/// count and agree between ranks).
pub(crate) fn measured_steps(steps: &[StepEvent], warmup: u32) -> Vec<(f64, f64)> {
    let mut by_index: std::collections::BTreeMap<u64, (f64, f64)> = Default::default();
    for s in steps.iter().filter(|s| !is_warmup(s, warmup)) {
        let e = by_index
            .entry(s.step)
            .or_insert((s.step_time_s, s.tokens as f64));
        if s.step_time_s > e.0 {
            *e = (s.step_time_s, s.tokens as f64);
        }
    }
    by_index.into_values().collect()
}

/// Step statistics of one repeat; `None` when it has no measured step.
pub(crate) fn step_stats(steps: &[StepEvent], warmup: u32) -> Option<StepStats> {
    let measured = measured_steps(steps, warmup);
    let times: Vec<f64> = measured.iter().map(|m| m.0).collect();
    let tokens: Vec<f64> = measured.iter().map(|m| m.1).collect();
    Some(StepStats {
        n: times.len(),
        median: median(&times)?,
        mean: mean(&times)?,
        p10: quantile(&times, 0.1)?,
        p90: quantile(&times, 0.9)?,
        mad: mad(&times)?,
        last: *times.last()?,
        tokens: median(&tokens)?,
    })
}

/// Peak memory of a repeat: its largest rank's ([`OverRanks::Largest`]), the one that
/// runs out first.
fn peak_memory(per_rank: &[u64]) -> Option<f64> {
    per_rank.iter().max().map(|m| *m as f64)
}

/// The summary figures of one repeat, before they are reduced over repeats.
fn repeat_figures(params: &Params, gpus: u32, r: &Repeat) -> Vec<(&'static str, f64)> {
    let s = &r.summary;
    let world_size = s.world_size.unwrap_or(gpus).max(1);
    let world = f64::from(world_size);
    let mut out = Vec::new();
    // The runner measures from step events itself; a worker's own summary figures are
    // used only when it reported no measured step.
    let (step_time, tokens_per_s) = match step_stats(&r.steps, params.warmup) {
        Some(st) if st.median > 0.0 => {
            // A worker that reports no token count per step still ran the cell's batch.
            let tokens = if st.tokens > 0.0 {
                st.tokens
            } else {
                f64::from(params.seq_len) * f64::from(params.global_batch)
            };
            (Some(st.median), Some(tokens / st.median))
        }
        _ => (
            s.step_time_s,
            s.tokens_per_s.or(s.tokens_per_s_per_gpu.map(|t| t * world)),
        ),
    };
    // The peak the worker measured its MFU against (its TFLOP/s over its MFU), so that the
    // runner's MFU follows from the runner's own TFLOP/s.
    let peak = match (s.tflops_per_gpu, s.mfu) {
        (Some(t), Some(m)) if t > 0.0 && m > 0.0 => Some(t / m),
        _ => None,
    };
    let derived = tokens_per_s
        .filter(|t| *t > 0.0)
        .map(|t| flops::throughput(t, world_size, s.flops_per_token, peak));
    if let Some(d) = &derived {
        out.push(("tokens_per_s", d.tokens_per_s));
        out.push(("tokens_per_s_per_gpu", d.tokens_per_s_per_gpu));
    }
    if let Some(st) = step_time {
        out.push(("step_time_s", st));
    }
    // Without the FLOPs of a token the runner cannot compute TFLOP/s or MFU: a worker's
    // own figures are kept then.
    let computed = derived.filter(|d| d.tflops_per_gpu.is_some());
    let (tflops, mfu) = match computed {
        Some(d) => (d.tflops_per_gpu, d.mfu.or(s.mfu)),
        None => (s.tflops_per_gpu, s.mfu),
    };
    if let Some(m) = mfu {
        out.push(("mfu", m));
    }
    if let Some(tf) = tflops {
        out.push(("tflops_per_gpu", tf));
    }
    if let Some(m) = peak_memory(&s.peak_mem_bytes) {
        out.push(("peak_mem_bytes", m));
    }
    if let Some(d) = &derived {
        out.push(("time_to_1t_tokens_days", d.days_per_1t_tokens));
    }
    out
}

/// Reduces a cell's successful repeats into its summary metrics.
///
/// Per repeat: `step_time_s` is the median over measured steps (warm-up excluded, see
/// [`is_warmup`]); `tokens_per_s` is the tokens of a step over that median;
/// `tokens_per_s_per_gpu` divides by the world size; `tflops_per_gpu` is
/// `flops_per_token x tokens_per_s_per_gpu` when the worker reports `flops_per_token`
/// (else the worker's own figure); `mfu` is that over the peak the worker measured against
/// (its TFLOP/s over its MFU; the worker's own MFU when the runner cannot compute TFLOP/s),
/// all through [`flops::throughput`]; `peak_mem_bytes` is the largest
/// rank's; `time_to_1t_tokens_days` is `1e12 / tokens_per_s / 86400`. Over repeats: the
/// value is the median and `rel_spread` half the range over the median. A metric is
/// present only when every repeat reported it, so that a value is never a median of a
/// subset of repeats.
pub(crate) fn cell_metrics(params: &Params, gpus: u32, repeats: &[Repeat]) -> Metrics {
    let per_repeat: Vec<Vec<(&str, f64)>> = repeats
        .iter()
        .map(|r| repeat_figures(params, gpus, r))
        .collect();
    let mut metrics = Metrics::new();
    if per_repeat.is_empty() {
        return metrics;
    }
    for metric in &catalog::CATALOG {
        let name = metric.name;
        let samples: Option<Vec<f64>> = per_repeat
            .iter()
            .map(|figs| figs.iter().find(|(n, _)| *n == name).map(|(_, v)| *v))
            .collect();
        let Some(samples) = samples else { continue };
        let Some(value) = (match metric.over_repeats {
            OverRepeats::Median => median(&samples),
        }) else {
            continue;
        };
        metrics.insert(
            name.to_string(),
            MetricValue {
                value,
                rel_spread: rel_spread(&samples),
                samples,
            },
        );
    }
    metrics
}

/// [`cell_metrics`] for a cell that is about to pass: a cell passes only when every repeat
/// measured its speed (a step time or a throughput), so that a worker whose steps are all
/// warm-up, or that reported nothing usable, fails with why instead of passing with no
/// metrics (which no baseline comparison can catch). A world size a repeat's summary
/// reports must be the cell's GPUs (`world_gpus`, 0 for a CPU cell, which is only held to
/// a plausible count of ranks: [`crate::bounds::check_world_size`]): the figures per GPU
/// are divided by it, so a worker reporting 8 or 1,048,576 ranks on a 1-GPU cell would
/// make them up.
pub(crate) fn measured_metrics(
    params: &Params,
    gpus: u32,
    world_gpus: u32,
    repeats: &[Repeat],
) -> Result<Metrics, String> {
    if repeats.is_empty() {
        return Err("no repeat was measured".into());
    }
    for (i, r) in repeats.iter().enumerate() {
        if let Some(w) = r.summary.world_size {
            crate::bounds::check_world_size(u64::from(w), world_gpus)
                .map_err(|why| format!("repeat {}: the worker's summary reports {why}", i + 1))?;
        }
        let figs = repeat_figures(params, gpus, r);
        let measured = figs.iter().any(|(n, v)| {
            matches!(*n, "step_time_s" | "tokens_per_s") && v.is_finite() && *v > 0.0
        });
        if measured {
            continue;
        }
        let warm = r
            .steps
            .iter()
            .filter(|s| is_warmup(s, params.warmup))
            .count();
        let why = if r.steps.is_empty() {
            "it printed no `step` event and no `summary` with `step_time_s` or `tokens_per_s`"
                .to_string()
        } else if warm == r.steps.len() {
            format!(
                "all {} of its `step` events are warm-up (flagged `warmup: true`, or numbered below the cell's warmup of {}), and its summary gives no `step_time_s` or `tokens_per_s`",
                warm, params.warmup
            )
        } else {
            format!(
                "none of its {} measured `step` events gives a usable step time",
                r.steps.len() - warm
            )
        };
        return Err(format!("measured nothing in repeat {}: {why}", i + 1));
    }
    Ok(cell_metrics(params, gpus, repeats))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::SummaryEvent;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    #[test]
    fn median_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, f64::NAN]), None);
    }

    #[test]
    fn mean_and_mad_by_hand() {
        // 1, 2, 3, 4, 100: mean 110/5 = 22; median 3; deviations 2,1,0,1,97 -> MAD 1.
        let xs = [1.0, 2.0, 3.0, 4.0, 100.0];
        assert_eq!(mean(&xs), Some(22.0));
        assert_eq!(mad(&xs), Some(1.0));
    }

    #[test]
    fn quantiles_follow_hyndman_fan_8() {
        // Definition 8: h = (n + 1/3) q + 1/3 and the quantile interpolates between the
        // order statistics x_(floor h) and x_(floor h + 1). With x_i = i for 1..=10 the
        // quantile equals h itself: p10 = 10.333../10 + 0.333.. = 1.3667, p90 = 9.6333.
        let xs: Vec<f64> = (1..=10).map(f64::from).collect();
        let h = |q: f64| (10.0 + 1.0 / 3.0) * q + 1.0 / 3.0;
        assert!(close(quantile(&xs, 0.1).unwrap(), h(0.1)));
        assert!(close(quantile(&xs, 0.9).unwrap(), h(0.9)));
        assert!(close(h(0.1), 1.366_666_666_666_666_7));
        assert_eq!(quantile(&xs, 0.5), Some(5.5));
    }

    #[test]
    fn spread_is_half_range_over_median() {
        // 98, 100, 104: median 100, range 6 -> 0.03.
        assert!(close(rel_spread(&[104.0, 98.0, 100.0]), 0.03));
        assert_eq!(rel_spread(&[5.0]), 0.0);
        assert_eq!(rel_spread(&[]), 0.0);
    }

    fn step(i: u64, t: f64, warmup: Option<bool>) -> StepEvent {
        StepEvent {
            step: i,
            step_time_s: t,
            tokens: 4096,
            loss: 1.0,
            warmup,
            rank: None,
        }
    }

    #[test]
    fn warmup_by_flag_or_by_count() {
        // Unflagged: the first 2 steps (times 9, 8) are warm-up; measured 1, 2, 3 -> median 2.
        let steps: Vec<_> = [9.0, 8.0, 1.0, 2.0, 3.0]
            .iter()
            .enumerate()
            .map(|(i, t)| step(i as u64, *t, None))
            .collect();
        let st = step_stats(&steps, 2).unwrap();
        assert_eq!((st.n, st.median, st.last), (3, 2.0, 3.0));
        // Flagged: the worker's flag wins over the count (only step 0 is warm-up here).
        let flagged: Vec<_> = [9.0, 8.0, 1.0]
            .iter()
            .enumerate()
            .map(|(i, t)| step(i as u64, *t, Some(i == 0)))
            .collect();
        let st = step_stats(&flagged, 2).unwrap();
        assert_eq!((st.n, st.median), (2, 4.5));
        // Nothing measured.
        assert_eq!(step_stats(&steps[..2], 2), None);
    }

    #[test]
    fn slowest_rank_sets_the_step_time() {
        let mut a = step(0, 1.0, Some(false));
        a.rank = Some(0);
        let mut b = step(0, 1.5, Some(false));
        b.rank = Some(1);
        assert_eq!(step_stats(&[a, b], 0).unwrap().median, 1.5);
    }

    fn repeat(times: &[f64], mem: Vec<u64>) -> Repeat {
        Repeat {
            steps: times
                .iter()
                .enumerate()
                .map(|(i, t)| step(i as u64, *t, Some(i == 0)))
                .collect(),
            summary: SummaryEvent {
                mfu: Some(0.4),
                flops_per_token: Some(1e9),
                peak_mem_bytes: mem,
                world_size: Some(2),
                ..Default::default()
            },
            notices: vec![],
        }
    }

    #[test]
    fn cell_metrics_by_hand() {
        let params = Params {
            warmup: 1,
            ..Params::default()
        };
        // Repeat medians (warm-up step 0 excluded): 0.5 and 0.4 and 0.5 s.
        let reps = vec![
            repeat(&[5.0, 0.5, 0.5, 0.6], vec![10, 30]),
            repeat(&[5.0, 0.4, 0.4], vec![20, 25]),
            repeat(&[5.0, 0.5], vec![40, 5]),
        ];
        let m = cell_metrics(&params, 2, &reps);
        let st = &m["step_time_s"];
        assert_eq!(st.samples, vec![0.5, 0.4, 0.5]);
        assert_eq!(st.value, 0.5);
        // (0.5 - 0.4) / 2 / 0.5 = 0.1
        assert!(close(st.rel_spread, 0.1));
        // 4096 tokens / 0.5 s = 8192 tok/s; / 2 GPUs = 4096 per GPU.
        assert_eq!(m["tokens_per_s"].value, 8192.0);
        assert_eq!(m["tokens_per_s_per_gpu"].value, 4096.0);
        // 1e9 FLOPs/token x 4096 tok/s/GPU = 4.096 TFLOP/s per GPU.
        assert!(close(m["tflops_per_gpu"].value, 4.096));
        assert_eq!(m["mfu"].value, 0.4);
        // Largest rank per repeat: 30, 25, 40 -> median 30.
        assert_eq!(m["peak_mem_bytes"].samples, vec![30.0, 25.0, 40.0]);
        assert_eq!(m["peak_mem_bytes"].value, 30.0);
        // 1e12 / 8192 / 86400 days.
        assert!(close(
            m["time_to_1t_tokens_days"].value,
            1e12 / 8192.0 / 86400.0
        ));
        let names: Vec<&str> = m.keys().map(String::as_str).collect();
        assert_eq!(names[0], "tokens_per_s");
    }

    #[test]
    fn summary_only_worker_and_missing_metric() {
        let params = Params::default();
        let r = Repeat {
            steps: vec![],
            summary: SummaryEvent {
                tokens_per_s: Some(1000.0),
                step_time_s: Some(2.0),
                ..Default::default()
            },
            notices: vec![],
        };
        let m = cell_metrics(&params, 1, &[r]);
        assert_eq!(m["tokens_per_s"].value, 1000.0);
        assert_eq!(m["step_time_s"].value, 2.0);
        assert!(!m.contains_key("mfu"));
        assert!(cell_metrics(&params, 1, &[]).is_empty());
    }
}
