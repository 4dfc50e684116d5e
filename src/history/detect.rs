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
//! - **The repeats' spread.** The new run's own half-range over its repeats widens the band
//!   (the two noise sources are added in quadrature), so a run whose repeats disagree
//!   cannot breach on noise it shows itself.
//! - **The floor.** The band is never narrower than `floor_rel` of the centre, so a history
//!   of near-identical numbers (a CPU host, a quantized timer) does not flag 0.1% changes.
//! - **Confirmation.** One breach is `Suspect`; it becomes `Regressed`/`Improved` when a
//!   re-run in the same job (`--confirm`) or the previous run breaches the same way, and
//!   `Unchanged` when the re-run lands inside the band.
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
/// the new run's relative repeat spread. `None` when `history` has fewer than
/// `policy.min_history` finite values.
pub(crate) fn band(history: &[f64], new_rel_spread: f64, policy: &Policy) -> Option<Band> {
    let finite: Vec<f64> = history.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.len() < policy.min_history.max(1) {
        return None;
    }
    let recent = &finite[finite.len().saturating_sub(policy.lookback.max(1))..];
    let center = median(recent)?;
    let sigma_history = MAD_TO_SIGMA * mad(recent)?;
    let sigma_repeats = new_rel_spread.max(0.0) * center.abs();
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
    /// This run's value (median over its repeats) and relative repeat spread.
    pub value: f64,
    pub rel_spread: f64,
    /// This run's repeats.
    pub samples: &'a [f64],
    /// A re-run of the cell in the same job (`--confirm`): its repeats.
    pub confirm: Option<&'a [f64]>,
    /// The stored baseline and its relative tolerance, when there is one.
    pub baseline: Option<(f64, f64)>,
    /// The run just before this one was judged regressed (a breach now repeats it).
    pub previous_regressed: bool,
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
    let Some(b) = band(obs.history, obs.rel_spread, policy) else {
        // Too few runs for a band: the repeats decide, as a two-sample test against every
        // earlier repeat; with no earlier run at all the stored baseline decides.
        let mut after: Vec<f64> = obs.samples.to_vec();
        if let Some(c) = obs.confirm {
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
            };
        };
        let verdict = match (t.answer, test_side(&t, direction)) {
            (Answer::Same, _) => HistoryVerdict::Unchanged,
            (Answer::Unknown, _) => HistoryVerdict::Unknown,
            // A difference in this run's repeats alone waits for the re-run's; with them
            // pooled in, it stands.
            (Answer::Different, side) if obs.confirm.is_some() => confirmed(side),
            (Answer::Different, _) => HistoryVerdict::Suspect,
        };
        return Judgement {
            verdict,
            band: None,
            sigmas: None,
            rel_change: Some(t.shift_rel),
            drift: false,
            repeats_test: Some(t),
        };
    };
    let rel_change = Some((obs.value - b.center) / b.center.abs().max(f64::MIN_POSITIVE));
    let sigmas = Some(b.sigmas(obs.value));
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
    let previous = previous_side(obs.history, direction, policy);
    let mut repeats_test = repeats;
    let mut verdict = match this {
        Side::Inside => HistoryVerdict::Unchanged,
        breach => match obs.confirm {
            Some(c) => {
                let again_t = test(c);
                let again = match median(c) {
                    Some(m) => breach_of(m, again_t.as_ref()),
                    None => Side::Inside,
                };
                if again_t.is_some() {
                    repeats_test = again_t;
                }
                if again == breach {
                    confirmed(breach)
                } else {
                    HistoryVerdict::Unchanged
                }
            }
            None if previous == breach || (breach == Side::Worse && obs.previous_regressed) => {
                confirmed(breach)
            }
            None => HistoryVerdict::Suspect,
        },
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
    }
}

fn confirmed(side: Side) -> HistoryVerdict {
    match side {
        Side::Worse => HistoryVerdict::Regressed,
        Side::Better => HistoryVerdict::Improved,
        Side::Inside => HistoryVerdict::Unchanged,
    }
}

/// The side the last value of `history` fell on against the lookback before it: a breach
/// there, repeated now, confirms without a re-run.
fn previous_side(history: &[f64], direction: Direction, policy: &Policy) -> Side {
    let Some((&last, before)) = history.split_last() else {
        return Side::Inside;
    };
    match band(before, 0.0, policy) {
        Some(b) => side(&b, last, direction),
        None => Side::Inside,
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
            rel_spread: 0.0,
            history_samples: &[],
            samples: &[],
            confirm: None,
            baseline: None,
            previous_regressed: false,
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
        // 0.3% run-to-run noise around 1000, as measured on one H100.
        vec![
            1000.0, 1003.0, 997.0, 1001.0, 999.0, 1002.0, 998.0, 1000.0, 1001.0, 999.0,
        ]
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
            confirm: Some(&[979.0]),
            ..obs(&h, 980.0)
        };
        assert_eq!(
            judge(&again, Direction::Higher, &p).verdict,
            HistoryVerdict::Regressed
        );
        let transient = Observation {
            confirm: Some(&[1000.5]),
            ..obs(&h, 980.0)
        };
        assert_eq!(
            judge(&transient, Direction::Higher, &p).verdict,
            HistoryVerdict::Unchanged
        );
        // Faster, confirmed: improved. Lower-is-better metrics mirror it.
        let faster = Observation {
            confirm: Some(&[1030.0]),
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

    #[test]
    fn a_breach_that_the_previous_run_also_showed_is_confirmed() {
        let mut h = quiet_history();
        h.push(975.0);
        let j = judge(&obs(&h, 978.0), Direction::Higher, &Policy::default());
        assert_eq!(j.verdict, HistoryVerdict::Regressed);
        assert!(j.sigmas.unwrap() < -4.0, "{j:?}");
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
            rel_spread: 0.01,
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
        let confirmed = Observation {
            confirm: Some(&[970.5, 969.5, 971.5]),
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
