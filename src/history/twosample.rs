//! The two-sample comparison of repeats: are this run's repeats of a cell the same as, or
//! different from, the earlier runs' repeats? Pure statistics; the gate and `bench bisect`
//! feed them.
//!
//! This is how a cell with little history is judged from its first nights, and how a
//! bisection decides whether a probed commit is good or bad, in the manner of Chromium's
//! Pinpoint (which answers *same*, *different* or *unknown* from a Mann-Whitney U test and
//! asks for more repeats while the answer is unknown):
//!
//! - **Mann-Whitney U** (Mann & Whitney 1947, "On a test of whether one of two random
//!   variables is stochastically larger than the other", Ann. Math. Statist. 18(1)): the
//!   rank test of a shift between two samples, with no assumption about the noise's shape
//!   (step-time noise is skewed: a slow host or a stall adds, nothing subtracts). Its
//!   p-value is exact (the distribution of U by counting, Mann & Whitney's recurrence) for
//!   the small samples a CI job affords, and the normal approximation with the tie
//!   correction above [`EXACT_LIMIT`] pairs.
//! - **Hodges-Lehmann shift** (Hodges & Lehmann 1963, "Estimates of location based on rank
//!   tests", Ann. Math. Statist. 34(2)): the median of all pairwise differences
//!   `after_j - before_i`, with its distribution-free confidence interval from the order
//!   statistics of those differences at the U distribution's critical value (Hollander,
//!   Wolfe & Chicken 2014, "Nonparametric Statistical Methods", 3rd ed., section 4.3).
//!   Both are relative to the median of `before`.
//!
//! The answer: **different** when the test rejects at `alpha` and the estimated shift is
//! past the practical floor (a shift smaller than the floor is not worth a job's failure,
//! and the repeats of one run share that run's offset, which a test of repeats alone does
//! not see); **same** when the whole confidence interval lies inside the floor (an
//! equivalence test, as Schuirmann's two one-sided tests); **unknown** otherwise, which is
//! the cue for more repeats.

use serde::{Deserialize, Serialize};

use crate::metrics::stats::median;

/// Above this many pairs (`m * n`) the p-value uses the normal approximation.
pub(crate) const EXACT_LIMIT: usize = 10_000;

/// What the repeats say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    Same,
    Different,
    Unknown,
}

impl Answer {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Answer::Same => "same",
            Answer::Different => "different",
            Answer::Unknown => "unknown",
        }
    }
}

/// The comparison of two samples, with the figures that explain the answer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TwoSample {
    pub answer: Answer,
    /// Two-sided p-value of the Mann-Whitney U test.
    pub p_value: f64,
    /// Hodges-Lehmann shift of `after` against `before`, relative to `before`'s median.
    pub shift_rel: f64,
    /// Its confidence interval (relative); infinite ends when the samples are too small
    /// for an interval at this level.
    pub ci_rel: (f64, f64),
    /// Coverage the interval actually has (the U distribution is discrete).
    pub ci_level: f64,
    pub n_before: usize,
    pub n_after: usize,
}

/// The knobs of the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TwoSamplePolicy {
    /// Significance level of the test (two-sided), and 1 - the interval's coverage.
    pub alpha: f64,
    /// Relative shifts smaller than this are "the same" for a gate.
    pub floor_rel: f64,
}

impl Default for TwoSamplePolicy {
    /// A 5% test with a 1% floor: the floor is the history band's (see `detect::Policy`),
    /// and the level lets three repeats against six earlier ones decide (the smallest
    /// exact p-value of 3 against 6 is 2/84 = 0.024).
    fn default() -> Self {
        TwoSamplePolicy {
            alpha: 0.05,
            floor_rel: 0.01,
        }
    }
}

/// Compares `after` with `before` (NaN and infinite values are left out). `None` when
/// either sample is empty or `before`'s median is zero.
pub(crate) fn compare(
    before: &[f64],
    after: &[f64],
    policy: &TwoSamplePolicy,
) -> Option<TwoSample> {
    let b: Vec<f64> = before.iter().copied().filter(|v| v.is_finite()).collect();
    let a: Vec<f64> = after.iter().copied().filter(|v| v.is_finite()).collect();
    if b.is_empty() || a.is_empty() {
        return None;
    }
    let centre = median(&b)?;
    if centre == 0.0 {
        return None;
    }
    let (m, n) = (a.len(), b.len());
    let p_value = mann_whitney_p(&a, &b);
    let mut diffs: Vec<f64> = Vec::with_capacity(m * n);
    for x in &a {
        for y in &b {
            diffs.push(x - y);
        }
    }
    diffs.sort_by(f64::total_cmp);
    let shift = median(&diffs)? / centre.abs();
    let (ci_rel, ci_level) = match ci_rank(m, n, policy.alpha) {
        Some((k, level)) => (
            (diffs[k - 1] / centre.abs(), diffs[m * n - k] / centre.abs()),
            level,
        ),
        None => ((f64::NEG_INFINITY, f64::INFINITY), 1.0),
    };
    let floor = policy.floor_rel.max(0.0);
    let answer = if p_value < policy.alpha && shift.abs() > floor {
        Answer::Different
    } else if ci_rel.0 > -floor && ci_rel.1 < floor {
        Answer::Same
    } else {
        Answer::Unknown
    };
    Some(TwoSample {
        answer,
        p_value,
        shift_rel: shift,
        ci_rel,
        ci_level,
        n_before: n,
        n_after: m,
    })
}

/// The Mann-Whitney U statistic of `a` against `b`: pairs where `a` is larger, ties
/// counting one half.
fn u_statistic(a: &[f64], b: &[f64]) -> f64 {
    let mut u = 0.0;
    for x in a {
        for y in b {
            if x > y {
                u += 1.0;
            } else if x == y {
                u += 0.5;
            }
        }
    }
    u
}

/// The number of arrangements giving each value of U for samples of `m` and `n` with no
/// ties: `counts[u]`, u = 0..=m*n. Mann & Whitney's recurrence
/// `c(u; m, n) = c(u - n; m - 1, n) + c(u; m, n - 1)`, kept as f64 (the counts grow as
/// binomial coefficients, which f64 holds exactly far beyond [`EXACT_LIMIT`]'s sizes in
/// relative terms).
fn u_counts(m: usize, n: usize) -> Vec<f64> {
    // table[j][u]: counts for (i, j) as i grows from 0 to m.
    let mut table: Vec<Vec<f64>> = (0..=n).map(|_| vec![1.0]).collect();
    for i in 1..=m {
        let mut next: Vec<Vec<f64>> = Vec::with_capacity(n + 1);
        next.push(vec![1.0]); // c(0; i, 0) = 1: nothing to compare with.
        for j in 1..=n {
            let mut row = vec![0.0; i * j + 1];
            // c(u; i, j) = c(u - j; i - 1, j) + c(u; i, j - 1)
            for (u, v) in table[j].iter().enumerate() {
                row[u + j] += v;
            }
            for (u, v) in next[j - 1].iter().enumerate() {
                row[u] += v;
            }
            next.push(row);
        }
        table = next;
    }
    table.pop().unwrap_or_else(|| vec![1.0])
}

/// Two-sided p-value of the Mann-Whitney test of `a` against `b`.
fn mann_whitney_p(a: &[f64], b: &[f64]) -> f64 {
    let (m, n) = (a.len(), b.len());
    let u = u_statistic(a, b);
    let mean = (m * n) as f64 / 2.0;
    if m * n <= EXACT_LIMIT {
        let counts = u_counts(m, n);
        let total: f64 = counts.iter().sum();
        // Ties make U a half-integer; the exact tail is taken at the more extreme
        // integer on each side, which keeps the test from rejecting more than it should.
        let lo = u.min(2.0 * mean - u).floor() as usize;
        let tail: f64 = counts.iter().take(lo + 1).sum::<f64>() / total;
        return (2.0 * tail).min(1.0);
    }
    normal_p(a, b, u)
}

/// The normal approximation of the two-sided p-value, with the tie correction of the
/// variance and a continuity correction of one half.
fn normal_p(a: &[f64], b: &[f64], u: f64) -> f64 {
    let (m, n) = (a.len(), b.len());
    let mean = (m * n) as f64 / 2.0;
    let mut all: Vec<f64> = a.iter().chain(b).copied().collect();
    all.sort_by(f64::total_cmp);
    let mut tie_term = 0.0;
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j + 1 < all.len() && all[j + 1] == all[i] {
            j += 1;
        }
        let t = (j - i + 1) as f64;
        tie_term += t * t * t - t;
        i = j + 1;
    }
    let nn = (m + n) as f64;
    let var = (m * n) as f64 / 12.0 * ((nn + 1.0) - tie_term / (nn * (nn - 1.0)));
    if var <= 0.0 {
        return 1.0;
    }
    // Continuity correction of one half.
    let z = ((u - mean).abs() - 0.5).max(0.0) / var.sqrt();
    (2.0 * normal_upper_tail(z)).min(1.0)
}

/// P(Z > z) for a standard normal variable.
fn normal_upper_tail(z: f64) -> f64 {
    use statrs::distribution::{ContinuousCDF, Normal};
    Normal::standard().sf(z)
}

/// The rank `k` (1-based) of the pairwise differences that bounds the interval: the
/// largest `k` with P(U <= k - 1) <= alpha / 2, and the interval's actual coverage.
/// `None` when even k = 1 is too likely (samples too small for this level).
fn ci_rank(m: usize, n: usize, alpha: f64) -> Option<(usize, f64)> {
    let total_pairs = m * n;
    if total_pairs > EXACT_LIMIT {
        // Normal approximation of the critical value (Hollander et al., eq. 4.41).
        let z = {
            use statrs::distribution::{ContinuousCDF, Normal};
            Normal::standard().inverse_cdf(1.0 - alpha / 2.0)
        };
        let mn = total_pairs as f64;
        let c = mn / 2.0 - z * (mn * (m + n + 1) as f64 / 12.0).sqrt();
        let k = c.floor().max(1.0) as usize;
        return Some((k, 1.0 - alpha));
    }
    let counts = u_counts(m, n);
    let total: f64 = counts.iter().sum();
    let mut cum = 0.0;
    let mut k = 0;
    for (u, c) in counts.iter().enumerate() {
        if cum + c / total > alpha / 2.0 {
            break;
        }
        cum += c / total;
        k = u + 1;
    }
    // The interval [D_(k), D_(mn+1-k)] needs k <= mn / 2 to be an interval at all.
    (k >= 1 && 2 * k <= total_pairs).then_some((k, 1.0 - 2.0 * cum))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u_distribution_matches_the_tables() {
        // m = n = 3: 20 arrangements, counts 1 1 2 3 3 3 3 2 1 1 (Mann & Whitney 1947,
        // table I gives P(U <= 0) = 0.050, P(U <= 1) = 0.100, P(U <= 2) = 0.200).
        assert_eq!(
            u_counts(3, 3),
            vec![1.0, 1.0, 2.0, 3.0, 3.0, 3.0, 3.0, 2.0, 1.0, 1.0]
        );
        let c = u_counts(3, 6);
        assert_eq!(c.iter().sum::<f64>(), 84.0); // C(9, 3)
        let c = u_counts(4, 9);
        assert_eq!(c.iter().sum::<f64>(), 715.0); // C(13, 4)
        assert_eq!(u_counts(0, 5), vec![1.0]);
    }

    #[test]
    fn exact_p_values() {
        // Complete separation of 3 against 3: U = 0, p = 2 * 1/20.
        let p = mann_whitney_p(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]);
        assert!((p - 0.1).abs() < 1e-12, "{p}");
        // 3 against 6, separated: 2 / 84.
        let p = mann_whitney_p(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
        assert!((p - 2.0 / 84.0).abs() < 1e-12, "{p}");
        // Interleaved samples: no evidence.
        let p = mann_whitney_p(&[1.0, 3.0, 5.0], &[2.0, 4.0, 6.0]);
        assert!(p > 0.5, "{p}");
    }

    #[test]
    fn normal_approximation_agrees_with_the_exact_test_near_its_limit() {
        let a: Vec<f64> = (0..90).map(|i| i as f64 * 1.01).collect();
        let b: Vec<f64> = (0..100).map(|i| i as f64 + 7.3).collect();
        let exact = {
            let counts = u_counts(a.len(), b.len());
            let total: f64 = counts.iter().sum();
            let u = u_statistic(&a, &b);
            let lo = u.min(90.0 * 100.0 - u).floor() as usize;
            2.0 * counts.iter().take(lo + 1).sum::<f64>() / total
        };
        let approx = normal_p(&a, &b, u_statistic(&a, &b));
        assert!((exact - approx).abs() < 0.01, "{exact} {approx}");
    }

    #[test]
    fn hodges_lehmann_shift_and_interval() {
        let before = [100.0, 101.0, 99.0, 100.5, 99.5, 100.2];
        let after = [97.0, 97.4, 96.8];
        let t = compare(&before, &after, &TwoSamplePolicy::default()).unwrap();
        // Pairwise differences centre on -3.
        assert!((t.shift_rel + 0.03).abs() < 0.005, "{t:?}");
        assert!(t.ci_rel.0 < t.shift_rel && t.shift_rel < t.ci_rel.1);
        assert!(t.ci_level >= 0.95, "{t:?}");
        assert_eq!(t.answer, Answer::Different);
        assert!((t.p_value - 2.0 / 84.0).abs() < 1e-12);
    }

    #[test]
    fn same_needs_the_interval_inside_the_floor() {
        let before: Vec<f64> = (0..9).map(|i| 1000.0 + (i % 3) as f64).collect();
        let after = [1000.5, 1001.0, 1001.5, 1000.0, 1002.0];
        let t = compare(&before, &after, &TwoSamplePolicy::default()).unwrap();
        assert_eq!(t.answer, Answer::Same, "{t:?}");
        // One repeat against three: no interval at 95%, and no test can reject.
        let t = compare(
            &[1000.0, 1001.0, 999.0],
            &[970.0],
            &TwoSamplePolicy::default(),
        )
        .unwrap();
        assert_eq!(t.answer, Answer::Unknown, "{t:?}");
        assert!(t.ci_rel.0.is_infinite());
    }

    #[test]
    fn a_significant_shift_under_the_floor_is_not_different() {
        let before = [1000.0, 1000.1, 1000.2, 999.9, 1000.05, 1000.15];
        let after = [995.0, 995.1, 995.2];
        let t = compare(&before, &after, &TwoSamplePolicy::default()).unwrap();
        assert!(t.p_value < 0.05);
        assert!(t.shift_rel.abs() < 0.01);
        assert_ne!(t.answer, Answer::Different);
    }

    #[test]
    fn empty_and_degenerate_inputs() {
        let p = TwoSamplePolicy::default();
        assert!(compare(&[], &[1.0], &p).is_none());
        assert!(compare(&[1.0], &[], &p).is_none());
        assert!(compare(&[0.0, 0.0], &[1.0], &p).is_none());
        assert!(compare(&[f64::NAN], &[1.0], &p).is_none());
        // Identical values: no shift, p = 1.
        let t = compare(&[5.0; 6], &[5.0; 3], &p).unwrap();
        assert_eq!(t.shift_rel, 0.0);
        assert!(t.p_value >= 0.99);
        assert_eq!(t.answer, Answer::Same);
    }
}
