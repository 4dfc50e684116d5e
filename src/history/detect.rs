//! Detection: judges one new measurement of a (cell, hardware key, metric) against the
//! cell's own recent history, the stored baseline and a tolerance floor, and a seeded loss
//! curve against the band of the earlier curves. Pure functions only; the store and the
//! commands feed them.
//!
//! The rule (its defaults come from the calibration study in `docs/history.md`):
//!
//! - **Robust lookback.** The last `lookback` runs of the cell in its current segment give a
//!   centre, their median, and a noise scale, 1.4826 x their median absolute deviation (MAD),
//!   which estimates the standard deviation of normal noise without being pulled by the
//!   outliers a history of benchmark runs always has (Rousseeuw & Croux 1993, "Alternatives
//!   to the median absolute deviation", JASA 88(424); Leys et al. 2013, "Detecting outliers:
//!   do not use standard deviation around the mean, use absolute deviation around the
//!   median", J. Exp. Soc. Psych. 49(4), who recommend thresholds of 2.5 to 3 robust
//!   standard deviations for outliers; a gate wants fewer false alarms and uses more).
//! - **The noise inside a run** ([`within_run`]). The new run's own noise widens the band
//!   (the two noise sources are added in quadrature), so a run whose repeats disagree
//!   cannot breach on noise it shows itself. It is a robust estimate, 1.4826 x the MAD of
//!   the repeats over their median (three repeats or more), or of the measured steps inside
//!   each repeat (the standard error of a repeat's median step, 1.2533 sigma / sqrt(n),
//!   Kendall & Stuart 1977, "The Advanced Theory of Statistics" vol. 1, 10.10), whichever
//!   is larger; never the half-range, which one disturbed repeat sets alone. It is capped
//!   at the typical (median) within-run noise of the lookback's runs, so no band is wider
//!   than the cell's own history justifies, and a disturbed run's spread never widens
//!   later runs' bands (they take the median over the lookback).
//! - **Outlier repeats** ([`outlier_repeats`]). A repeat far from the others while the
//!   others agree is named in the verdict ("repeat 2 of 3 ran 32% slower than the
//!   others"): the clearest sign that something disturbed the run. The median over the
//!   repeats already ignores it.
//! - **The floor.** The band is never narrower than `floor_rel` of the centre, so a history
//!   of near-identical numbers (a CPU host, a quantized timer) does not flag 0.1% changes.
//! - **Confirmation, never borrowed.** One breach is `Suspect`; it becomes
//!   `Regressed`/`Improved` only by what this job measures: the side-by-side pairs (the
//!   gate's, [`super::paired`]) or, where they cannot be measured, re-runs in the same job
//!   (same commit, same switches) that breach the same way, and `Unchanged` when a re-run
//!   lands inside the band. An earlier night confirms nothing: it ran at another time, and
//!   maybe on another host. Where the cell's own clean runs have shown values as far out (a
//!   bimodal cell), one re-run is not enough: [`reruns_needed`] asks for as many as keep
//!   the false alarm under 1%.
//! - **The baseline.** With too little history the stored baseline and its tolerance decide
//!   (the old rule), reported as `InsufficientHistory`. With enough history the baseline
//!   catches slow creep that no single run shows: when the history's centre itself is past
//!   the baseline's tolerance in the worse direction, the run is `Regressed` (drift).
//! - **The repeats.** Beside the band, the run's repeats are compared with the lookback's
//!   repeats by a two-sample test ([`super::twosample`]); a difference past the floor is a
//!   breach too. With fewer runs than `min_history` (but at least one) the test alone
//!   decides: same, different (confirmed by the re-run's repeats) or unknown.
//! - **The environment** is not judged here: `super::environment` compares a worse cell's
//!   telemetry with its own clean runs' and the gate turns the verdict into `Environment`
//!   only when that difference explains the loss.

use serde::{Deserialize, Serialize};

use super::twosample::{self, Answer, TwoSample, TwoSamplePolicy};
use crate::baseline::Direction;
use crate::metrics::stats::{mad, median};

/// Scale factor that makes the MAD a consistent estimator of a normal standard deviation
/// (1 / Phi^-1(3/4); Rousseeuw & Croux 1993).
pub(crate) const MAD_TO_SIGMA: f64 = 1.4826;

/// The knobs of the rule. [`Policy::default`] is the calibrated choice.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    /// How many of the most recent runs in the segment form the lookback.
    pub lookback: usize,
    /// Fewer runs than this in the segment is `InsufficientHistory`.
    pub min_history: usize,
    /// Half-width of the band in robust standard deviations.
    pub threshold_sigmas: f64,
    /// The narrowest band, relative to the centre.
    pub floor_rel: f64,
    /// The two-sample test of repeats: a second trigger beside the band, and the whole
    /// verdict while the history is shorter than `min_history`.
    #[serde(default)]
    pub two_sample: TwoSamplePolicy,
}

impl Default for Policy {
    /// Chosen from the calibration table in `docs/history.md`: ten runs of lookback, a band
    /// of 4 robust sigmas never narrower than 1%, judged after confirmation.
    fn default() -> Self {
        Policy {
            lookback: 10,
            min_history: 5,
            threshold_sigmas: 4.0,
            floor_rel: 0.01,
            two_sample: TwoSamplePolicy::default(),
        }
    }
}

/// The relative floor of the energy verdict's band and repeats' test (see
/// [`Policy::for_metric`]).
///
/// Tokens per joule moves from night to night with the board's power even where the speed
/// holds still (see `metrics::catalog::DEFAULT_ENERGY_TOLERANCE`), and the repeats of one
/// night share that night's power, so the repeats' test at the speed's 1% floor takes a
/// night's power for a shift. `bench history study --history STORE --metric
/// tokens_per_joule` replays the real nights of docs/results (tokens/J from each night's
/// tokens/s and mean board power, 1000 months of 30 nights per row; docs/history.md,
/// "Energy"): at the speed's 1% floor, 0.3% to 7.7% of the clean nights of the four cells
/// regressed; at 5% (band and test), at most 0.02% (6 of 25,000), while a real 6.3-6.5%
/// energy loss (`BENCH_FUSED_LN=0` on an H100, the Llama proxy's `BENCH_FUSED_ADAMW=0` on an
/// H200) still regressed on 91-100% of its nights. Energy changes of under 5% mostly pass:
/// they are inside what these sensors tell apart from one night to the next.
pub const ENERGY_FLOOR_REL: f64 = 0.05;

impl Policy {
    /// The policy a metric is judged under: this one, with the band's and the repeats'
    /// test's floor raised to [`ENERGY_FLOOR_REL`] for the energy metrics (tokens/J, kWh
    /// per 1T tokens).
    pub fn for_metric(&self, metric: &str) -> Policy {
        if !matches!(metric, "tokens_per_joule" | "kwh_per_1t_tokens") {
            return *self;
        }
        Policy {
            floor_rel: self.floor_rel.max(ENERGY_FLOOR_REL),
            two_sample: TwoSamplePolicy {
                floor_rel: self.two_sample.floor_rel.max(ENERGY_FLOOR_REL),
                ..self.two_sample
            },
            ..*self
        }
    }
}

/// What a history says about one new measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HistoryVerdict {
    /// Worse than the band, confirmed (or drifted past the baseline).
    Regressed,
    /// Better than the band, confirmed.
    Improved,
    /// Inside the band (or a breach the re-run did not repeat).
    Unchanged,
    /// One breach, not yet confirmed.
    Suspect,
    /// Too few runs for the band, and the repeats cannot yet tell same from different
    /// (the two-sample test's "unknown"): more repeats are needed.
    Unknown,
    /// Worse, and the cell's telemetry differs from its own clean runs in a way that
    /// explains it (a foreign process on its GPU, a lower SM clock, a slowdown reason its
    /// history does not show): the environment, not the code, is blamed. Old stores call
    /// it `throttled`.
    #[serde(alias = "throttled")]
    Environment,
    /// No earlier run of the cell to compare with; the baseline decided.
    InsufficientHistory,
}

impl HistoryVerdict {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            HistoryVerdict::Regressed => "regressed",
            HistoryVerdict::Improved => "improved",
            HistoryVerdict::Unchanged => "unchanged",
            HistoryVerdict::Suspect => "suspect",
            HistoryVerdict::Unknown => "unknown",
            HistoryVerdict::Environment => "environment",
            HistoryVerdict::InsufficientHistory => "insufficient history",
        }
    }

    /// Whether this verdict fails the job.
    pub(crate) fn fails_run(self) -> bool {
        self == HistoryVerdict::Regressed
    }
}

/// The band a lookback gives: centre and half-width, in the metric's unit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Band {
    pub center: f64,
    /// 1.4826 x MAD of the lookback.
    pub sigma_history: f64,
    /// The noise scale used: history and the new run's repeats in quadrature.
    pub sigma: f64,
    pub half_width: f64,
    /// How many runs the band rests on.
    pub runs: usize,
}

impl Band {
    /// Robust standard deviations between `value` and the centre (signed: positive is
    /// above). Infinite when the noise scale is zero and the value differs.
    pub(crate) fn sigmas(&self, value: f64) -> f64 {
        let d = value - self.center;
        if self.sigma > 0.0 {
            d / self.sigma
        } else if d == 0.0 {
            0.0
        } else {
            d.signum() * f64::INFINITY
        }
    }
}

/// Which side of the band a value is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Side {
    Inside,
    Worse,
    Better,
}

/// The band of the last `policy.lookback` values of `history` (oldest first), widened by
/// the new run's relative within-run noise (see [`within_run`]; the caller caps it at the
/// history's typical within-run noise). `None` when `history` has fewer than
/// `policy.min_history` finite values.
pub(crate) fn band(history: &[f64], new_within_rel: f64, policy: &Policy) -> Option<Band> {
    let finite: Vec<f64> = history.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.len() < policy.min_history.max(1) {
        return None;
    }
    let recent = &finite[finite.len().saturating_sub(policy.lookback.max(1))..];
    let center = median(recent)?;
    let sigma_history = MAD_TO_SIGMA * mad(recent)?;
    let within = if new_within_rel.is_finite() {
        new_within_rel.max(0.0)
    } else {
        0.0
    };
    let sigma_repeats = within * center.abs();
    let sigma = sigma_history.hypot(sigma_repeats);
    let half_width = (policy.threshold_sigmas * sigma).max(policy.floor_rel * center.abs());
    Some(Band {
        center,
        sigma_history,
        sigma,
        half_width,
        runs: recent.len(),
    })
}

/// The side of `band` that `value` falls on, for a metric of `direction`.
pub(crate) fn side(band: &Band, value: f64, direction: Direction) -> Side {
    let d = value - band.center;
    if d.abs() <= band.half_width {
        return Side::Inside;
    }
    match (direction, d < 0.0) {
        (Direction::Higher, true) | (Direction::Lower, false) => Side::Worse,
        _ => Side::Better,
    }
}

/// The old rule: `value` against one stored number with a relative tolerance.
pub(crate) fn baseline_side(
    baseline: f64,
    tolerance: f64,
    value: f64,
    direction: Direction,
) -> Side {
    let rel = (value - baseline) / baseline.abs().max(f64::MIN_POSITIVE);
    if rel.abs() <= tolerance {
        return Side::Inside;
    }
    match (direction, rel < 0.0) {
        (Direction::Higher, true) | (Direction::Lower, false) => Side::Worse,
        _ => Side::Better,
    }
}

/// Everything [`judge`] looks at for one measurement.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Observation<'a> {
    /// The segment's earlier values, oldest first (this run excluded).
    pub history: &'a [f64],
    /// The repeats of the earlier runs the test compares with (the lookback's, pooled).
    pub history_samples: &'a [f64],
    /// The typical (median) robust within-run noise of the lookback's runs, relative; it
    /// caps this run's (`None`: the history's runs kept no repeats, and the run-to-run
    /// noise of the history is the cap).
    pub history_within_rel: Option<f64>,
    /// This run's value (median over its repeats).
    pub value: f64,
    /// This run's robust within-run noise, relative ([`within_run`]).
    pub within_rel: f64,
    /// This run's repeats.
    pub samples: &'a [f64],
    /// The re-runs of the cell in the same job (`--confirm`), in order: each one's repeats.
    pub confirms: &'a [&'a [f64]],
    /// The stored baseline and its relative tolerance, when there is one.
    pub baseline: Option<(f64, f64)>,
    /// The most independent re-runs the caller can make ([`MAX_RERUNS`] for `bench
    /// matrix`; one for `bench ingest`, whose re-run is the log's later half): a breach
    /// never waits for more than it can get.
    pub max_reruns: usize,
}

/// Robust within-run noise of a cell's measurement, relative to its value: the larger of
/// 1.4826 x MAD / median over the repeats' values (with three repeats or more) and the
/// median over repeats of the standard error of each repeat's median step time
/// (`step_rel_sigmas`: each repeat's 1.4826 x MAD / median of its measured steps, divided
/// by sqrt(steps) and multiplied by 1.2533). One disturbed repeat moves neither; the
/// half-range, which it sets alone, is never used.
pub(crate) fn within_run(samples: &[f64], step_rel_sigmas: &[f64]) -> f64 {
    let finite: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
    let repeats = if finite.len() >= 3 {
        match (median(&finite), mad(&finite)) {
            (Some(m), Some(d)) if m != 0.0 => MAD_TO_SIGMA * d / m.abs(),
            _ => 0.0,
        }
    } else {
        0.0
    };
    let steps: Vec<f64> = step_rel_sigmas
        .iter()
        .copied()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .collect();
    repeats.max(median(&steps).unwrap_or(0.0))
}

/// The relative standard error of the median of `times` (one repeat's measured steps):
/// 1.2533 x 1.4826 x MAD / median / sqrt(n). `None` with fewer than three steps.
pub(crate) fn step_rel_sigma(times: &[f64]) -> Option<f64> {
    let t: Vec<f64> = times.iter().copied().filter(|v| v.is_finite()).collect();
    if t.len() < 3 {
        return None;
    }
    let m = median(&t)?;
    if m == 0.0 {
        return None;
    }
    Some(1.2533 * MAD_TO_SIGMA * mad(&t)? / m.abs() / (t.len() as f64).sqrt())
}

/// The smallest gap, relative to the others' median, at which a repeat is an outlier.
pub(crate) const OUTLIER_MIN_REL: f64 = 0.05;
/// Within-run sigmas (the history's typical) a repeat must be away to be an outlier.
pub(crate) const OUTLIER_SIGMAS: f64 = 5.0;

/// A repeat far from the others while the others agree.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OutlierRepeat {
    /// 1-based.
    pub repeat: usize,
    pub of: usize,
    /// Its value against the others' median, relative (negative: lower).
    pub rel: f64,
}

impl OutlierRepeat {
    /// "repeat 2 of 3 ran 32% slower than the others", for a metric of `direction`.
    pub(crate) fn describe(&self, direction: Direction) -> String {
        let worse = match direction {
            Direction::Higher => self.rel < 0.0,
            Direction::Lower => self.rel > 0.0,
        };
        format!(
            "repeat {} of {} ran {:.0}% {} than the others",
            self.repeat,
            self.of,
            self.rel.abs() * 100.0,
            if worse { "slower" } else { "faster" }
        )
    }
}

/// The repeats of `samples` that lie far from the others while the others agree (leave-one-
/// out against the others' median, in the manner of Leys et al. 2013's MAD rule): the gap
/// must exceed `min_rel` of the others' median (the larger of [`OUTLIER_MIN_REL`] and
/// [`OUTLIER_SIGMAS`] x the history's typical within-run noise, chosen by the caller) and
/// four times the others' own largest distance from their median. Needs three repeats.
pub(crate) fn outlier_repeats(samples: &[f64], min_rel: f64) -> Vec<OutlierRepeat> {
    let n = samples.len();
    if n < 3 || samples.iter().any(|v| !v.is_finite()) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (i, &x) in samples.iter().enumerate() {
        let others: Vec<f64> = samples
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, v)| *v)
            .collect();
        let Some(m) = median(&others).filter(|m| *m != 0.0) else {
            continue;
        };
        let spread = others.iter().map(|v| (v - m).abs()).fold(0.0, f64::max);
        let gap = (x - m).abs();
        if gap > min_rel * m.abs() && gap > 4.0 * spread {
            out.push(OutlierRepeat {
                repeat: i + 1,
                of: n,
                rel: (x - m) / m.abs(),
            });
        }
    }
    out
}

/// The verdict on one measurement, with the numbers that explain it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Judgement {
    pub verdict: HistoryVerdict,
    pub band: Option<Band>,
    /// Robust sigmas from the band's centre (signed), when there is a band.
    pub sigmas: Option<f64>,
    /// Relative change against the band's centre (or the baseline without a band).
    pub rel_change: Option<f64>,
    /// True when the verdict rests on the history's centre having drifted past the
    /// baseline rather than on this run alone.
    pub drift: bool,
    /// The two-sample test of this run's repeats (with the re-run's, when confirmed)
    /// against the earlier runs' repeats.
    #[serde(default)]
    pub repeats_test: Option<TwoSample>,
    /// Re-runs that must all breach the same way before a breach is confirmed
    /// ([`reruns_needed`]); more than one where the cell's clean runs have shown values
    /// this far out.
    #[serde(default = "one")]
    pub reruns_needed: usize,
}

fn one() -> usize {
    1
}

/// The false-alarm probability a confirmed breach may carry, at most (see
/// [`reruns_needed`]).
pub(crate) const CONFIRM_ALPHA: f64 = 0.01;

/// The most re-runs a breach asks for.
pub(crate) const MAX_RERUNS: usize = 3;

/// Whether a judgement made after `done` re-runs asks for another: a suspect until
/// [`MAX_RERUNS`] (it waits for as many as [`reruns_needed`] says, or one that clears it),
/// an unknown cell once (with more repeats). The gate's passes and both calibration
/// studies follow this one rule.
pub(crate) fn wants_rerun(verdict: HistoryVerdict, done: usize) -> bool {
    done < MAX_RERUNS
        && match verdict {
            HistoryVerdict::Suspect => true,
            HistoryVerdict::Unknown => done == 0,
            _ => false,
        }
}

/// Clean runs after which a value none of them reached counts as rare (one re-run
/// confirms it); with fewer, two re-runs must.
pub(crate) const RARE_AFTER: usize = 20;

/// How many re-runs must breach the same way for a breach at `value` to be confirmed. A
/// clean run of this cell lands this far out with probability p, estimated as the share of
/// the recent clean runs (`history`: three lookbacks) at least as far out (within half the floor), this run counted
/// among them; none at all needs one re-run when there are [`RARE_AFTER`] of them (the
/// band already says it is rare), two when there are fewer. The run and k
/// independent re-runs all do with probability p^(k+1), so k is the least with
/// p^(k+1) <= [`CONFIRM_ALPHA`], at least 1 and at most [`MAX_RERUNS`]. A cell whose clean
/// runs are bimodal (issue 31's eager SAC cell on an H100, one night in six some 3.5%
/// slower) would otherwise confirm its own slow mode once in 36 nights with one re-run.
pub(crate) fn reruns_needed(
    history: &[f64],
    value: f64,
    band: &Band,
    direction: Direction,
    floor_rel: f64,
) -> usize {
    let slack = 0.5 * floor_rel * band.center.abs();
    let as_far = |v: f64| match (direction, value < band.center) {
        (Direction::Higher, true) | (Direction::Lower, true) => v <= value + slack,
        _ => v >= value - slack,
    };
    let n = history.iter().filter(|v| v.is_finite()).count();
    let seen = history
        .iter()
        .filter(|v| v.is_finite() && as_far(**v))
        .count();
    if seen == 0 {
        // None of them: rare, when there are enough of them to say so. Fewer runs than
        // RARE_AFTER hide a one-in-six mode too often (5/6 to the tenth is 16%).
        return if n >= RARE_AFTER { 1 } else { 2 };
    }
    // This run counts as one more such value among n + 1 (the rule of succession's
    // caution: ten runs estimate a rate of one in six poorly).
    let p = (seen + 1) as f64 / (n + 1) as f64;
    if p >= 1.0 {
        return MAX_RERUNS;
    }
    let k = (CONFIRM_ALPHA.ln() / p.ln()).ceil() as usize;
    k.saturating_sub(1).clamp(1, MAX_RERUNS)
}

/// The side a two-sample answer points to for a metric of `direction`.
fn test_side(t: &TwoSample, direction: Direction) -> Side {
    if t.answer != Answer::Different {
        return Side::Inside;
    }
    match (direction, t.shift_rel < 0.0) {
        (Direction::Higher, true) | (Direction::Lower, false) => Side::Worse,
        _ => Side::Better,
    }
}

/// Judges `obs` for a metric of `direction` under `policy` (see the module docs).
pub(crate) fn judge(obs: &Observation<'_>, direction: Direction, policy: &Policy) -> Judgement {
    let test = |after: &[f64]| twosample::compare(obs.history_samples, after, &policy.two_sample);
    // The new run's noise widens the band only as far as the history's runs show such
    // noise themselves: a disturbed run cannot blind its own judgement.
    let within = match obs.history_within_rel {
        Some(cap) => obs.within_rel.min(cap),
        None => obs.within_rel,
    };
    let Some(b) = band(obs.history, within, policy) else {
        // Too few runs for a band: the repeats decide, as a two-sample test against every
        // earlier repeat; with no earlier run at all the stored baseline decides.
        let mut after: Vec<f64> = obs.samples.to_vec();
        for c in obs.confirms {
            after.extend_from_slice(c);
        }
        let Some(t) = test(&after) else {
            let rel_change = obs
                .baseline
                .map(|(base, _)| (obs.value - base) / base.abs().max(f64::MIN_POSITIVE));
            return Judgement {
                verdict: HistoryVerdict::InsufficientHistory,
                band: None,
                sigmas: None,
                rel_change,
                drift: false,
                repeats_test: None,
                reruns_needed: 1,
            };
        };
        // With too few runs to know how often this cell's clean runs land this far out, a
        // difference stands only when two re-runs pooled in keep it (see `reruns_needed`).
        let needed = 2.min(obs.max_reruns.max(1));
        let verdict = match (t.answer, test_side(&t, direction)) {
            (Answer::Same, _) => HistoryVerdict::Unchanged,
            (Answer::Unknown, _) => HistoryVerdict::Unknown,
            (Answer::Different, side) if obs.confirms.len() >= needed => confirmed(side),
            (Answer::Different, _) => HistoryVerdict::Suspect,
        };
        return Judgement {
            verdict,
            band: None,
            sigmas: None,
            rel_change: Some(t.shift_rel),
            drift: false,
            repeats_test: Some(t),
            reruns_needed: needed,
        };
    };
    let rel_change = Some((obs.value - b.center) / b.center.abs().max(f64::MIN_POSITIVE));
    // With no spread in the history (identical nights) a distance in sigmas is no figure: the
    // band is its floor, and the verdict line says so rather than printing an infinity.
    let sigmas = Some(b.sigmas(obs.value)).filter(|s| s.is_finite());
    let repeats = test(obs.samples);
    // A breach is the median outside the band, or the repeats different from the
    // lookback's repeats by more than the floor: the band is calibrated on run medians
    // and misses a 3% shift whose history happens to be noisy; the test sees it in the
    // repeats themselves.
    let breach_of = |value: f64, t: Option<&TwoSample>| match side(&b, value, direction) {
        Side::Inside => t.map_or(Side::Inside, |t| test_side(t, direction)),
        s => s,
    };
    let this = breach_of(obs.value, repeats.as_ref());
    // How often clean runs land this far out is a tail rate: it is estimated over three
    // lookbacks of clean runs, since ten runs rarely hold a one-in-six mode.
    let finite: Vec<f64> = obs
        .history
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .collect();
    let tail = &finite[finite.len().saturating_sub(3 * policy.lookback.max(1))..];
    let needed = match this {
        Side::Inside => 1,
        _ => reruns_needed(tail, obs.value, &b, direction, policy.floor_rel),
    }
    .min(obs.max_reruns.max(1));
    let mut repeats_test = repeats;
    let mut verdict = match this {
        Side::Inside => HistoryVerdict::Unchanged,
        _ if obs.confirms.is_empty() => HistoryVerdict::Suspect,
        breach => {
            // Every re-run must breach the same way; one that does not clears the cell.
            let mut all = true;
            for c in obs.confirms {
                let again_t = test(c);
                let again = match median(c) {
                    Some(m) => breach_of(m, again_t.as_ref()),
                    None => Side::Inside,
                };
                if again_t.is_some() {
                    repeats_test = again_t;
                }
                all &= again == breach;
            }
            match (all, obs.confirms.len() >= needed) {
                (false, _) => HistoryVerdict::Unchanged,
                (true, true) => confirmed(breach),
                (true, false) => HistoryVerdict::Suspect,
            }
        }
    };
    let mut drift = false;
    if verdict == HistoryVerdict::Unchanged {
        if let Some((base, tol)) = obs.baseline {
            // Creep: each run inside the band of the last few, but the band's centre itself
            // past the baseline's tolerance, and this run with it.
            if baseline_side(base, tol, b.center, direction) == Side::Worse
                && baseline_side(base, tol, obs.value, direction) == Side::Worse
            {
                verdict = HistoryVerdict::Regressed;
                drift = true;
            }
        }
    }
    Judgement {
        verdict,
        band: Some(b),
        sigmas,
        rel_change,
        drift,
        repeats_test,
        reruns_needed: needed,
    }
}

fn confirmed(side: Side) -> HistoryVerdict {
    match side {
        Side::Worse => HistoryVerdict::Regressed,
        Side::Better => HistoryVerdict::Improved,
        Side::Inside => HistoryVerdict::Unchanged,
    }
}

/// What the seeded loss curves say about numerics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum NumericsVerdict {
    /// Every step's loss is inside the band the history shows at that step.
    Unchanged,
    /// The first step whose loss left the band.
    Changed {
        step: usize,
        loss: f64,
        center: f64,
        half_width: f64,
    },
    /// Fewer than `min_history` earlier curves (or no curve in this run).
    InsufficientHistory,
}

/// Judges a seeded run's loss curve against the earlier curves of its segment (oldest
/// first). At each step the band is the median of the earlier losses plus or minus the
/// larger of twice their full range (the run-to-run nondeterminism the history shows,
/// e.g. from atomics in reductions) and `floor_rel` of the median. Steps beyond the
/// shortest curve are not judged.
pub(crate) fn judge_loss(
    history: &[Vec<f64>],
    new: &[f64],
    min_history: usize,
    floor_rel: f64,
) -> NumericsVerdict {
    let curves: Vec<&Vec<f64>> = history.iter().filter(|c| !c.is_empty()).collect();
    if new.is_empty() || curves.len() < min_history.max(1) {
        return NumericsVerdict::InsufficientHistory;
    }
    let len = curves
        .iter()
        .map(|c| c.len())
        .min()
        .unwrap_or(0)
        .min(new.len());
    for (step, &loss) in new.iter().enumerate().take(len) {
        let at: Vec<f64> = curves.iter().map(|c| c[step]).collect();
        let Some(center) = median(&at) else { continue };
        let lo = at.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = at.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let half_width = (2.0 * (hi - lo)).max(floor_rel * center.abs());
        if !loss.is_finite() || (loss - center).abs() > half_width {
            return NumericsVerdict::Changed {
                step,
                loss,
                center,
                half_width,
            };
        }
    }
    NumericsVerdict::Unchanged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(history: &[f64], value: f64) -> Observation<'_> {
        Observation {
            history,
            value,
            within_rel: 0.0,
            history_within_rel: None,
            history_samples: &[],
            samples: &[],
            confirms: &[],
            baseline: None,
            max_reruns: MAX_RERUNS,
        }
    }

    #[test]
    fn mad_sigma_matches_the_textbook_example() {
        // Leys et al. (2013), section "The MAD": for 1, 3, 3, 6, 8, 10, 10, 1000 the median
        // is 7, the absolute deviations' median is 3.5 and 1.4826 x 3.5 = 5.1891.
        let xs = [1.0, 3.0, 3.0, 6.0, 8.0, 10.0, 10.0, 1000.0];
        let policy = Policy {
            lookback: 100,
            min_history: 1,
            threshold_sigmas: 3.0,
            floor_rel: 0.0,
            two_sample: TwoSamplePolicy::default(),
        };
        let b = band(&xs, 0.0, &policy).unwrap();
        assert_eq!(b.center, 7.0);
        assert!((b.sigma_history - 5.1891).abs() < 1e-9, "{b:?}");
        // Their outlier test: 1000 is (1000 - 7) / 5.1891 = 191 robust sigmas out.
        assert!((b.sigmas(1000.0) - 191.36).abs() < 0.01);
        assert_eq!(side(&b, 1000.0, Direction::Lower), Side::Worse);
        assert_eq!(side(&b, 10.0, Direction::Lower), Side::Inside);
    }

    #[test]
    fn the_lookback_uses_only_the_most_recent_runs() {
        let mut h = vec![50.0; 20];
        h.extend([100.0, 101.0, 99.0, 100.0, 100.5]);
        let p = Policy {
            lookback: 5,
            ..Policy::default()
        };
        let b = band(&h, 0.0, &p).unwrap();
        assert_eq!(b.center, 100.0);
        assert_eq!(b.runs, 5);
    }

    #[test]
    fn too_little_history_is_insufficient_and_reports_the_baseline_change() {
        let j = judge(
            &Observation {
                baseline: Some((100.0, 0.03)),
                ..obs(&[100.0, 100.0], 90.0)
            },
            Direction::Higher,
            &Policy::default(),
        );
        assert_eq!(j.verdict, HistoryVerdict::InsufficientHistory);
        assert!((j.rel_change.unwrap() + 0.1).abs() < 1e-12);
    }

    fn quiet_history() -> Vec<f64> {
        // 0.3% run-to-run noise around 1000, as measured on one H100; twenty runs, enough
        // for a value none of them reached to count as rare (one re-run confirms it).
        let ten = [
            1000.0, 1003.0, 997.0, 1001.0, 999.0, 1002.0, 998.0, 1000.0, 1001.0, 999.0,
        ];
        ten.iter().chain(ten.iter()).copied().collect()
    }

    /// Issue 31's bimodal cell: where the clean runs have shown values this far out, one
    /// re-run is not enough; with fewer than RARE_AFTER clean runs, neither.
    #[test]
    fn reruns_needed_grow_with_how_often_clean_runs_land_this_far_out() {
        let p = Policy::default();
        let h = quiet_history();
        let b = band(&h, 0.0, &p).unwrap();
        assert_eq!(reruns_needed(&h, 960.0, &b, Direction::Higher, 0.01), 1);
        assert_eq!(
            reruns_needed(&h[..10], 960.0, &b, Direction::Higher, 0.01),
            2
        );
        let mut bimodal = h.clone();
        for i in [3, 9, 15] {
            bimodal[i] = 962.0;
        }
        // 4 of 21 (this run counted): p = 0.19, p^3 = 0.7%.
        assert_eq!(
            reruns_needed(&bimodal, 963.0, &b, Direction::Higher, 0.01),
            2
        );
        for i in [1, 5, 11, 13, 17] {
            bimodal[i] = 962.0;
        }
        assert_eq!(
            reruns_needed(&bimodal, 963.0, &b, Direction::Higher, 0.01),
            3
        );
        // Two re-runs that both breach confirm a breach that needs two; one does not.
        let o = Observation {
            confirms: &[&[963.0]],
            ..obs(&h[..10], 963.0)
        };
        assert_eq!(
            judge(&o, Direction::Higher, &p).verdict,
            HistoryVerdict::Suspect
        );
        let o2 = Observation {
            confirms: &[&[963.0], &[962.5]],
            ..o
        };
        assert_eq!(
            judge(&o2, Direction::Higher, &p).verdict,
            HistoryVerdict::Regressed
        );
        let cleared = Observation {
            confirms: &[&[963.0], &[1000.5]],
            ..o
        };
        assert_eq!(
            judge(&cleared, Direction::Higher, &p).verdict,
            HistoryVerdict::Unchanged
        );
    }

    #[test]
    fn one_breach_is_suspect_and_a_rerun_decides() {
        let h = quiet_history();
        let p = Policy::default();
        // 2% slower: past the 1% floor and 4 robust sigmas (MAD 1 -> sigma 1.48).
        assert_eq!(
            judge(&obs(&h, 980.0), Direction::Higher, &p).verdict,
            HistoryVerdict::Suspect
        );
        let again = Observation {
            confirms: &[&[979.0]],
            ..obs(&h, 980.0)
        };
        assert_eq!(
            judge(&again, Direction::Higher, &p).verdict,
            HistoryVerdict::Regressed
        );
        let transient = Observation {
            confirms: &[&[1000.5]],
            ..obs(&h, 980.0)
        };
        assert_eq!(
            judge(&transient, Direction::Higher, &p).verdict,
            HistoryVerdict::Unchanged
        );
        // Faster, confirmed: improved. Lower-is-better metrics mirror it.
        let faster = Observation {
            confirms: &[&[1030.0]],
            ..obs(&h, 1030.0)
        };
        assert_eq!(
            judge(&faster, Direction::Higher, &p).verdict,
            HistoryVerdict::Improved
        );
        assert_eq!(
            judge(&faster, Direction::Lower, &p).verdict,
            HistoryVerdict::Regressed
        );
        // Inside the band: unchanged, whatever the re-run says.
        assert_eq!(
            judge(&obs(&h, 995.0), Direction::Higher, &p).verdict,
            HistoryVerdict::Unchanged
        );
    }

    /// A breach is a suspect until this job measures it again, however clearly the night
    /// before showed the same level: before issue 40 that night confirmed it (issue 31's
    /// revert of a slow commit came out regressed that way), and a night measures another
    /// time, maybe another host.
    #[test]
    fn a_breach_alone_is_a_suspect_until_this_job_measures_it_again() {
        let h = quiet_history();
        let before: Vec<f64> = (0..30).map(|i| 1000.0 + (i % 5) as f64 - 2.0).collect();
        let now = [975.4, 974.6, 975.0, 975.2, 974.7, 975.1, 974.9, 975.3];
        let o = Observation {
            history_samples: &before,
            samples: &now,
            ..obs(&h, 975.0)
        };
        let j = judge(&o, Direction::Higher, &Policy::default());
        assert_eq!(j.verdict, HistoryVerdict::Suspect, "{j:?}");
        assert!(j.sigmas.unwrap() < -4.0, "{j:?}");
        let again = [975.1, 974.9, 975.2];
        let confirmed = Observation {
            confirms: &[&again, &again],
            ..o
        };
        assert_eq!(
            judge(&confirmed, Direction::Higher, &Policy::default()).verdict,
            HistoryVerdict::Regressed
        );
    }

    /// Issue 31's blind spot: one repeat of three ran 32% slower. The half-range would
    /// widen the band to +-80%; the robust within-run noise does not, so a 5% drop of the
    /// median is still a breach, and the outlier repeat is named.
    #[test]
    fn one_disturbed_repeat_neither_blinds_the_band_nor_goes_unnamed() {
        let h = quiet_history();
        let disturbed = [950.0, 951.0, 646.0];
        let within = within_run(&disturbed, &[]);
        assert!(within < 0.002, "{within}");
        let o = Observation {
            within_rel: within,
            samples: &disturbed,
            ..obs(&h, 950.0)
        };
        let j = judge(&o, Direction::Higher, &Policy::default());
        assert_eq!(j.verdict, HistoryVerdict::Suspect, "{j:?}");
        let b = j.band.unwrap();
        assert!(b.half_width / b.center < 0.02, "{b:?}");
        let out = outlier_repeats(&disturbed, OUTLIER_MIN_REL);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(
            out[0].describe(Direction::Higher),
            "repeat 3 of 3 ran 32% slower than the others"
        );
        // Repeats that merely disagree name no outlier; two repeats never do.
        assert!(outlier_repeats(&[1000.0, 950.0, 900.0], OUTLIER_MIN_REL).is_empty());
        assert!(outlier_repeats(&[1000.0, 600.0], OUTLIER_MIN_REL).is_empty());
        assert!(outlier_repeats(&[1000.0, 1001.0, 990.0], OUTLIER_MIN_REL).is_empty());
        // A run noisier than its history is capped at the history's typical noise.
        let capped = Observation {
            within_rel: 0.2,
            history_within_rel: Some(0.002),
            ..obs(&h, 950.0)
        };
        let bc = judge(&capped, Direction::Higher, &Policy::default())
            .band
            .unwrap();
        assert!(bc.half_width / bc.center < 0.02, "{bc:?}");
    }

    #[test]
    fn within_run_noise_is_robust_and_uses_the_steps() {
        assert_eq!(within_run(&[100.0, 100.0, 100.0], &[]), 0.0);
        // 1.4826 x MAD 1 / 100.
        assert!((within_run(&[99.0, 100.0, 101.0], &[]) - 0.014826).abs() < 1e-9);
        // Two repeats: the steps decide.
        assert_eq!(within_run(&[100.0, 60.0], &[0.004, 0.002, 0.003]), 0.003);
        let steps: Vec<f64> = (0..100)
            .map(|i| 1.0 + 0.01 * ((i % 3) as f64 - 1.0))
            .collect();
        let s = step_rel_sigma(&steps).unwrap();
        assert!((s - 1.2533 * 1.4826 * 0.01 / 10.0).abs() < 1e-9, "{s}");
        assert_eq!(step_rel_sigma(&[1.0, 2.0]), None);
    }

    #[test]
    fn the_floor_and_the_repeats_spread_widen_the_band() {
        let flat = vec![1000.0; 10];
        let p = Policy::default();
        // MAD 0: the 1% floor keeps a 0.5% change inside.
        assert_eq!(
            judge(&obs(&flat, 995.0), Direction::Higher, &p).verdict,
            HistoryVerdict::Unchanged
        );
        assert_eq!(
            judge(&obs(&flat, 985.0), Direction::Higher, &p).verdict,
            HistoryVerdict::Suspect
        );
        // Repeats 1% apart (half-range 1%): the band becomes 4% wide on each side.
        let noisy = Observation {
            within_rel: 0.01,
            ..obs(&flat, 985.0)
        };
        assert_eq!(
            judge(&noisy, Direction::Higher, &p).verdict,
            HistoryVerdict::Unchanged
        );
    }

    #[test]
    fn creep_past_the_baseline_is_a_regression_even_inside_the_band() {
        let h = vec![960.0, 961.0, 959.0, 960.0, 960.5, 959.5];
        let j = judge(
            &Observation {
                baseline: Some((1000.0, 0.03)),
                ..obs(&h, 960.0)
            },
            Direction::Higher,
            &Policy::default(),
        );
        assert_eq!(j.verdict, HistoryVerdict::Regressed);
        assert!(j.drift);
        // Within the baseline's tolerance: no drift.
        let h2 = vec![980.0, 981.0, 979.0, 980.0, 980.5, 979.5];
        let j2 = judge(
            &Observation {
                baseline: Some((1000.0, 0.03)),
                ..obs(&h2, 980.0)
            },
            Direction::Higher,
            &Policy::default(),
        );
        assert_eq!(j2.verdict, HistoryVerdict::Unchanged);
    }

    #[test]
    fn repeats_decide_with_little_history_and_catch_a_shift_the_band_misses() {
        let p = Policy::default();
        // Two earlier runs of three repeats, no band yet.
        let before = [1000.0, 1002.0, 998.0, 1001.0, 999.0, 1000.5];
        let history = [1000.0, 1000.5];
        let slow = [970.0, 971.0, 969.0];
        let o = Observation {
            history: &history,
            history_samples: &before,
            samples: &slow,
            value: 970.0,
            ..obs(&history, 970.0)
        };
        let j = judge(&o, Direction::Higher, &p);
        assert_eq!(j.verdict, HistoryVerdict::Suspect, "{j:?}");
        // Too few runs for a band: two re-runs must keep the difference.
        let once = Observation {
            confirms: &[&[970.5, 969.5, 971.5]],
            ..o
        };
        assert_eq!(
            judge(&once, Direction::Higher, &p).verdict,
            HistoryVerdict::Suspect
        );
        let confirmed = Observation {
            confirms: &[&[970.5, 969.5, 971.5], &[970.0, 971.0, 969.0]],
            ..o
        };
        assert_eq!(
            judge(&confirmed, Direction::Higher, &p).verdict,
            HistoryVerdict::Regressed
        );
        // Same speed, repeats agree: unchanged from the second night.
        let same = [1000.2, 1000.8, 999.6];
        let o2 = Observation {
            samples: &same,
            ..o
        };
        assert_eq!(
            judge(&o2, Direction::Higher, &p).verdict,
            HistoryVerdict::Unchanged
        );
        // One repeat against one: unknown.
        let o3 = Observation {
            history: &history[..1],
            history_samples: &before[..1],
            samples: &slow[..1],
            ..o
        };
        assert_eq!(
            judge(&o3, Direction::Higher, &p).verdict,
            HistoryVerdict::Unknown
        );
        // A noisy history widens the band past a 2.5% drop; the repeats still see it.
        let noisy = [1000.0, 1030.0, 975.0, 1010.0, 990.0, 1025.0, 980.0, 1000.0];
        let pooled: Vec<f64> = (0..24).map(|i| 1000.0 + (i % 5) as f64).collect();
        let drop = [975.0, 974.0, 976.0];
        let o4 = Observation {
            history: &noisy,
            history_samples: &pooled,
            samples: &drop,
            value: 975.0,
            ..obs(&noisy, 975.0)
        };
        let j4 = judge(&o4, Direction::Higher, &p);
        assert_eq!(
            side(&j4.band.unwrap(), 975.0, Direction::Higher),
            Side::Inside
        );
        assert_eq!(j4.verdict, HistoryVerdict::Suspect, "{j4:?}");
    }

    #[test]
    fn loss_curves_inside_the_history_band_are_unchanged_and_a_shift_is_caught() {
        let base: Vec<f64> = (0..20).map(|i| 10.0 - 0.3 * i as f64).collect();
        let history: Vec<Vec<f64>> = (0..5)
            .map(|k| base.iter().map(|l| l + 1e-4 * k as f64).collect())
            .collect();
        assert_eq!(
            judge_loss(&history, &base, 5, 1e-3),
            NumericsVerdict::Unchanged
        );
        let mut changed = base.clone();
        changed[7] += 0.05;
        match judge_loss(&history, &changed, 5, 1e-3) {
            NumericsVerdict::Changed { step, .. } => assert_eq!(step, 7),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            judge_loss(&history[..2], &base, 5, 1e-3),
            NumericsVerdict::InsufficientHistory
        );
        let mut nan = base.clone();
        nan[3] = f64::NAN;
        assert!(matches!(
            judge_loss(&history, &nan, 5, 1e-3),
            NumericsVerdict::Changed { step: 3, .. }
        ));
    }
}
