//! The side-by-side test: a cell measured at its last good commit (A) and at this run's
//! commit (B) in the same job, on the same host, alternating A B B A A B ..., each repeat its
//! own process. Is B the same as A, or different? Pure statistics; the command layer
//! measures the pairs and the gate ([`super::gate`]) turns the answer into the cell's verdict.
//!
//! Why pairs: a ratio measured against a co-resident control is meaningful even when the
//! absolute numbers are not (Eigen's per-merge-request benchmarks run base and head
//! interleaved in one job for this reason; paired benchmarking, as in Tango, detects a 1%
//! change in seconds). A host of the pool that runs everything 2% slower, a busy CPU, a
//! driver's clock policy: each slows A and B alike, and cancels in the ratio. The order
//! alternates (A B, then B A) so that a drift during the job (a GPU warming up, a neighbour
//! starting) falls on both sides equally.
//!
//! The statistic: each pair's log-ratio `d_i = ln(B_i / A_i)` (a throughput: negative is B
//! slower), judged by Student's one-sample t-test on the `d_i` (Student 1908, "The probable
//! error of a mean", Biometrika 6(1)) with its confidence interval, reported as relative
//! changes `exp(d) - 1`. Pairs are looked at after each pair from [`PairedPolicy::min_pairs`]
//! on, up to [`PairedPolicy::max_pairs`]; repeated looks at a growing sample inflate the
//! chance of a false "different", so each look tests at `alpha / looks`: the Bonferroni
//! bound over all the looks that may happen, which keeps the overall false-alarm rate at or
//! below `alpha` (a conservative stand-in for Pocock's group-sequential boundary: Pocock
//! 1977, "Group sequential methods in the design and analysis of clinical trials",
//! Biometrika 64(2)).
//!
//! The answer, as [`super::twosample`]'s: **different** when the interval excludes no change
//! and the estimated change is past the practical floor; **same** when the whole interval
//! lies within the floor (an equivalence test, as Schuirmann's two one-sided tests) or, for
//! a shift the history saw, when the interval rules out half of that shift (the code does
//! not explain what the history saw); **unknown** otherwise, the cue for another pair.

use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, StudentsT};

pub use super::twosample::Answer;

/// The knobs of the side-by-side test.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PairedPolicy {
    /// The overall false-alarm rate over all looks (two-sided).
    pub alpha: f64,
    /// Relative changes smaller than this are "the same" for a gate (as the band's floor).
    pub floor_rel: f64,
    /// The first look: a t-interval of fewer pairs is too wide to answer anything.
    pub min_pairs: usize,
    /// The most pairs one cell is given before its answer stays unknown.
    pub max_pairs: usize,
}

impl Default for PairedPolicy {
    /// A 5% false-alarm rate and the gate's 1% floor; three to twelve pairs: with the
    /// per-process noise measured on an H200 (about 0.6% between fresh processes), a 4%
    /// slowdown is different after 4 pairs, and a host 2% off the history the same after
    /// about 8 (see docs/history.md, "Side by side").
    fn default() -> Self {
        PairedPolicy {
            alpha: 0.05,
            floor_rel: 0.01,
            min_pairs: 3,
            max_pairs: 12,
        }
    }
}

impl PairedPolicy {
    /// The level of each look: `alpha` over the number of looks that may happen.
    pub(crate) fn per_look_alpha(&self) -> f64 {
        let looks = self.max_pairs.saturating_sub(self.min_pairs) + 1;
        self.alpha / looks as f64
    }
}

/// What the pairs say, with the figures that explain it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Paired {
    pub answer: Answer,
    /// Pairs measured.
    pub pairs: usize,
    /// B against A: the geometric mean of the ratios, minus one (-0.043: B 4.3% slower).
    pub change_rel: f64,
    /// Its confidence interval at the per-look level; `None` below two pairs or with no
    /// spread to estimate (every pair the same ratio, which then is the answer itself).
    pub ci_rel: Option<(f64, f64)>,
    /// The interval's coverage (1 - the per-look alpha).
    pub ci_level: f64,
    /// Two-sided p-value of "no change" at this look.
    pub p_value: f64,
}

/// The pairs' answer for `base` (A) and `head` (B), each pair's two values at the same
/// index, judged against a history shift of `screened_rel` (the relative change the history
/// saw, when it saw one). Values that are not finite and positive are left out with their
/// pair.
pub fn paired(base: &[f64], head: &[f64], screened_rel: Option<f64>, p: &PairedPolicy) -> Paired {
    let d: Vec<f64> = base
        .iter()
        .zip(head)
        .filter(|(a, b)| a.is_finite() && b.is_finite() && **a > 0.0 && **b > 0.0)
        .map(|(a, b)| (b / a).ln())
        .collect();
    let n = d.len();
    let alpha = p.per_look_alpha();
    let mut out = Paired {
        answer: Answer::Unknown,
        pairs: n,
        change_rel: 0.0,
        ci_rel: None,
        ci_level: 1.0 - alpha,
        p_value: 1.0,
    };
    if n == 0 {
        return out;
    }
    let mean = d.iter().sum::<f64>() / n as f64;
    out.change_rel = mean.exp_m1();
    if n < 2 {
        return out;
    }
    let var = d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let se = (var / n as f64).sqrt();
    let (lo, hi) = if se > 0.0 {
        // `StudentsT::new` fails only for non-positive degrees of freedom, which n >= 2 rules
        // out; an interval is then always there.
        let Ok(t) = StudentsT::new(0.0, 1.0, (n - 1) as f64) else {
            return out;
        };
        let q = t.inverse_cdf(1.0 - alpha / 2.0);
        out.p_value = (2.0 * (1.0 - t.cdf((mean / se).abs()))).clamp(0.0, 1.0);
        (mean - q * se, mean + q * se)
    } else {
        // Identical ratios: the interval is the point (and "no change" is rejected unless
        // the point is no change).
        out.p_value = if mean == 0.0 { 1.0 } else { 0.0 };
        (mean, mean)
    };
    out.ci_rel = Some((lo.exp_m1(), hi.exp_m1()));
    if n < p.min_pairs {
        return out;
    }
    let floor = p.floor_rel.ln_1p();
    let excludes_zero = hi < 0.0 || lo > 0.0;
    out.answer = if excludes_zero && mean.abs() >= floor {
        Answer::Different
    } else if lo > -floor && hi < floor {
        Answer::Same
    } else if let Some(seen) = screened_rel.filter(|r| r.abs() >= p.floor_rel) {
        // The history saw a shift of `seen`; the pairs rule out that the code explains half
        // of it (on the side the history saw), and find no change past the floor.
        let half = (seen / 2.0).ln_1p();
        let rules_out = if seen < 0.0 { lo > half } else { hi < half };
        if rules_out && !excludes_zero {
            Answer::Same
        } else {
            Answer::Unknown
        }
    } else {
        Answer::Unknown
    };
    out
}

/// Whether the pairs need no more: an answer, or the cap.
pub fn settled(r: &Paired, p: &PairedPolicy) -> bool {
    r.answer != Answer::Unknown || r.pairs >= p.max_pairs
}

/// The order of the two sides in pair `i` (from 0): A first in even pairs, B first in odd
/// ones, so a run of pairs reads A B B A A B B A.
pub fn base_first(i: usize) -> bool {
    i.is_multiple_of(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pairs around 100 and 100 x (1 + change), with a per-process offset of up to `noise`
    /// on each side (deterministic: a fixed pseudo-random sequence).
    fn pairs(n: usize, change: f64, noise: f64) -> (Vec<f64>, Vec<f64>) {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 10_000) as f64 / 10_000.0 * 2.0 - 1.0
        };
        let a = (0..n).map(|_| 100.0 * (1.0 + noise * next())).collect();
        let b = (0..n)
            .map(|_| 100.0 * (1.0 + change) * (1.0 + noise * next()))
            .collect();
        (a, b)
    }

    #[test]
    fn a_four_percent_slowdown_is_different_within_a_few_pairs() {
        let p = PairedPolicy::default();
        let (a, b) = pairs(12, -0.04, 0.01);
        let first = (p.min_pairs..=p.max_pairs)
            .find(|&n| paired(&a[..n], &b[..n], Some(-0.04), &p).answer == Answer::Different)
            .expect("decided within the cap");
        assert!(first <= 6, "took {first} pairs");
        let r = paired(&a[..first], &b[..first], Some(-0.04), &p);
        assert!((r.change_rel + 0.04).abs() < 0.01, "{r:?}");
        let (lo, hi) = r.ci_rel.unwrap();
        assert!(lo < r.change_rel && r.change_rel < hi && hi < 0.0, "{r:?}");
    }

    #[test]
    fn the_same_code_on_a_slower_host_is_the_same_and_not_a_regression() {
        // The history saw -2%; A and B are the same code, so their ratio is about 1.
        let p = PairedPolicy::default();
        let (a, b) = pairs(12, 0.0, 0.006);
        let answers: Vec<Answer> = (p.min_pairs..=p.max_pairs)
            .map(|n| paired(&a[..n], &b[..n], Some(-0.02), &p).answer)
            .collect();
        assert!(!answers.contains(&Answer::Different), "{answers:?}");
        assert!(answers.contains(&Answer::Same), "{answers:?}");
    }

    #[test]
    fn too_few_pairs_or_broken_values_answer_nothing() {
        let p = PairedPolicy::default();
        assert_eq!(paired(&[], &[], None, &p).answer, Answer::Unknown);
        let r = paired(&[100.0, 100.0], &[50.0, 50.0], None, &p);
        assert_eq!(r.answer, Answer::Unknown, "below min_pairs");
        assert_eq!(r.pairs, 2);
        // A pair with a zero, a negative or a NaN is left out.
        let r = paired(
            &[100.0, 0.0, f64::NAN, -1.0],
            &[90.0, 90.0, 90.0, 90.0],
            None,
            &p,
        );
        assert_eq!(r.pairs, 1);
        assert!((r.change_rel + 0.1).abs() < 1e-12);
    }

    #[test]
    fn identical_ratios_are_a_point_not_an_infinity() {
        let p = PairedPolicy::default();
        let r = paired(&[100.0; 4], &[95.0; 4], None, &p);
        assert_eq!(r.answer, Answer::Different);
        let (lo, hi) = r.ci_rel.unwrap();
        assert!(lo.is_finite() && hi.is_finite() && (lo - hi).abs() < 1e-12);
        let r = paired(&[100.0; 4], &[100.0; 4], None, &p);
        assert_eq!(r.answer, Answer::Same);
    }

    #[test]
    fn the_looks_share_the_false_alarm_rate() {
        // Under no change, across many seeds of noise, "different" at any look of a run of
        // looks happens at most about alpha of the time.
        let p = PairedPolicy::default();
        let mut alarms = 0;
        let runs = 400;
        let mut x: u64 = 12345;
        for _ in 0..runs {
            let mut next = || {
                // A sum of six uniforms: roughly normal noise.
                let mut sum = 0.0;
                for _ in 0..6 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    sum += (x % 1000) as f64 / 1000.0;
                }
                sum - 3.0
            };
            let a: Vec<f64> = (0..p.max_pairs).map(|_| 100.0 + next()).collect();
            let b: Vec<f64> = (0..p.max_pairs).map(|_| 100.0 + next()).collect();
            let alarmed = (p.min_pairs..=p.max_pairs).any(|n| {
                let r = paired(
                    &a[..n],
                    &b[..n],
                    None,
                    &PairedPolicy {
                        floor_rel: 0.0,
                        ..p
                    },
                );
                r.answer == Answer::Different
            });
            alarms += usize::from(alarmed);
        }
        assert!(
            (alarms as f64) / (runs as f64) <= 0.08,
            "{alarms} of {runs}"
        );
    }

    #[test]
    fn the_order_alternates_a_b_b_a() {
        let order: String = (0..4)
            .flat_map(|i| {
                if base_first(i) {
                    ['A', 'B']
                } else {
                    ['B', 'A']
                }
            })
            .collect();
        assert_eq!(order, "ABBAABBA");
    }
}
