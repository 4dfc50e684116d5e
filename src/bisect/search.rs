//! The decisions of a bisection, pure: which side of the regression a probed commit is on,
//! which endpoint needs more repeats, and the binary search over the range.
//!
//! Every comparison is [`crate::history::twosample::compare`] (Mann-Whitney U with the
//! Hodges-Lehmann shift and its interval), which answers same, different or unknown. The
//! endpoints fix the *direction* of the change (bad slower or faster than good); a probe
//! is then called:
//!
//! 1. **bad** when it is *different* from good, shifted in bad's direction: it already
//!    carries (some of) the change;
//! 2. **good** when it is the *same* as good (its whole interval inside the floor);
//! 3. **good** when it is *different* from bad, shifted back towards good, and rule 1 did
//!    not apply: a commit is either like good or like bad when one commit made the change,
//!    and "not like bad" leaves "like good". This decides as soon as the samples separate
//!    from bad, without waiting for the equivalence test against good, which needs more
//!    repeats than a test of difference;
//! 4. **unknown** otherwise: the caller adds repeats, up to its limit.
//!
//! Rule 1 comes first so that a commit half-way between (the change came in two steps) is
//! bad: the search then ends at the first commit measurably off good in bad's direction.

use serde::Serialize;

use crate::history::twosample::{compare, Answer, TwoSample, TwoSamplePolicy};

/// Where a commit belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Side {
    Good,
    Bad,
}

impl Side {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Side::Good => "good",
            Side::Bad => "bad",
        }
    }
}

/// A probe compared with both endpoints, and the side that follows (`None`: unknown).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Call {
    pub vs_good: TwoSample,
    pub vs_bad: TwoSample,
    pub side: Option<Side>,
}

/// Calls the side of `probe` from its samples and the endpoints' (see the module doc).
/// `None` when a sample is empty or has a zero median (nothing to compare).
pub(crate) fn classify(
    good: &[f64],
    bad: &[f64],
    probe: &[f64],
    policy: &TwoSamplePolicy,
) -> Option<Call> {
    let change = compare(good, bad, policy)?;
    let vs_good = compare(good, probe, policy)?;
    let vs_bad = compare(bad, probe, policy)?;
    // The direction of the change: +1 when bad is faster than good, -1 when slower.
    let direction = change.shift_rel.signum();
    let side = if vs_good.answer == Answer::Different && vs_good.shift_rel.signum() == direction {
        Some(Side::Bad)
    } else if vs_good.answer == Answer::Same
        || (vs_bad.answer == Answer::Different && vs_bad.shift_rel.signum() == -direction)
    {
        Some(Side::Good)
    } else {
        None
    };
    Some(Call {
        vs_good,
        vs_bad,
        side,
    })
}

/// Which endpoint gets the next round while good and bad are not yet told apart: the one
/// with fewer samples (the comparison gains most there), `current` on a tie (its build is
/// in the worktree already). `None` when both have `max` samples: cannot decide.
pub(crate) fn endpoint_to_measure(
    n_good: usize,
    n_bad: usize,
    max: usize,
    current: Side,
) -> Option<Side> {
    let room = |n: usize| n < max;
    match (room(n_good), room(n_bad)) {
        (false, false) => None,
        (true, false) => Some(Side::Good),
        (false, true) => Some(Side::Bad),
        (true, true) if n_good < n_bad => Some(Side::Good),
        (true, true) if n_bad < n_good => Some(Side::Bad),
        (true, true) => Some(current),
    }
}

/// The binary search over positions `0..=n`: 0 is good, `n` is bad, and `1..=n` are the
/// commits of `good..bad` oldest first (so `n` is bad itself). The invariant: `lo` is good
/// and `hi` is bad; the search ends when they are neighbours, and `hi` is the first bad
/// commit. Each probe halves the interval (rounding up in the worst case), so it takes at
/// most `ceil(log2(n))` probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Search {
    lo: usize,
    hi: usize,
}

impl Search {
    /// The search over `n >= 1` commits.
    pub(crate) fn new(n: usize) -> Search {
        Search {
            lo: 0,
            hi: n.max(1),
        }
    }

    /// The next position to probe; `None` when the search is over.
    pub(crate) fn next(&self) -> Option<usize> {
        (self.hi - self.lo > 1).then(|| self.lo + (self.hi - self.lo) / 2)
    }

    /// Narrows the interval by the side of the commit at `pos` (a position [`Self::next`]
    /// gave).
    pub(crate) fn record(&mut self, pos: usize, side: Side) {
        match side {
            Side::Good => self.lo = pos,
            Side::Bad => self.hi = pos,
        }
    }

    /// The position of the first bad commit once the search is over.
    pub(crate) fn first_bad(&self) -> Option<usize> {
        self.next().is_none().then_some(self.hi)
    }

    /// The position of the last good one (0: good itself) once the search is over.
    pub(crate) fn last_good(&self) -> Option<usize> {
        self.next().is_none().then_some(self.lo)
    }
}

/// `ceil(log2(n))`: the most probes the search takes over `n` commits.
pub(crate) fn ceil_log2(n: usize) -> usize {
    if n <= 1 {
        0
    } else {
        (usize::BITS - (n - 1).leading_zeros()) as usize
    }
}

/// The most commits a bisection over `n` commits measures: both endpoints, then the search.
pub(crate) fn max_probes(n: usize) -> usize {
    ceil_log2(n) + 2
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` values spread deterministically by up to `amp` (relative) around `centre`.
    fn spread(centre: f64, n: usize, amp: f64) -> Vec<f64> {
        (0..n)
            .map(|i| centre * (1.0 + amp * ((i as f64 * 2.1).sin())))
            .collect()
    }

    fn around(centre: f64, n: usize) -> Vec<f64> {
        spread(centre, n, 0.002)
    }

    #[test]
    fn ceil_log2_and_the_probe_bound() {
        let want = [
            (1, 0),
            (2, 1),
            (3, 2),
            (4, 2),
            (5, 3),
            (8, 3),
            (9, 4),
            (12, 4),
            (16, 4),
        ];
        for (n, k) in want {
            assert_eq!(ceil_log2(n), k, "n = {n}");
        }
        assert_eq!(max_probes(16), 6);
        assert_eq!(max_probes(17), 7);
    }

    /// Every first bad position in every range size is found within ceil(log2(n)) probes.
    #[test]
    fn search_finds_every_boundary_within_the_bound() {
        for n in 1..=70 {
            for first_bad in 1..=n {
                let mut s = Search::new(n);
                let mut probes = 0;
                while let Some(pos) = s.next() {
                    assert!(pos > 0 && pos < n, "n {n}: probed {pos}");
                    probes += 1;
                    s.record(
                        pos,
                        if pos >= first_bad {
                            Side::Bad
                        } else {
                            Side::Good
                        },
                    );
                }
                assert_eq!(s.first_bad(), Some(first_bad), "n {n}");
                assert_eq!(s.last_good(), Some(first_bad - 1), "n {n}");
                assert!(probes <= ceil_log2(n), "n {n}: {probes} probes");
            }
        }
    }

    #[test]
    fn probes_are_called_by_their_side() {
        let p = TwoSamplePolicy::default();
        let good = around(1000.0, 5);
        let bad = around(970.0, 5);
        // Like good: same as good.
        let c = classify(&good, &bad, &around(1000.5, 5), &p).unwrap();
        assert_eq!(c.side, Some(Side::Good), "{c:?}");
        // Like bad: different from good in bad's direction.
        let c = classify(&good, &bad, &around(969.0, 5), &p).unwrap();
        assert_eq!(c.side, Some(Side::Bad), "{c:?}");
        // Half-way: off good in bad's direction, so bad (rule 1 before rule 3).
        let c = classify(&good, &bad, &around(985.0, 5), &p).unwrap();
        assert_eq!(c.side, Some(Side::Bad), "{c:?}");
        // Faster than good: not bad.
        let c = classify(&good, &bad, &around(1030.0, 5), &p).unwrap();
        assert_eq!(c.side, Some(Side::Good), "{c:?}");
        // Too few repeats to say anything.
        let c = classify(&good, &bad, &[990.0], &p).unwrap();
        assert_eq!(c.side, None, "{c:?}");
        // A speed-up bisected the same way: bad is the faster side.
        let c = classify(&bad, &good, &around(999.0, 5), &p).unwrap();
        assert_eq!(c.side, Some(Side::Bad), "{c:?}");
    }

    /// Different from bad towards good decides "good" before the equivalence test with good
    /// can: 3 repeats are too few for an interval inside the floor.
    #[test]
    fn separating_from_bad_decides_good_early() {
        let p = TwoSamplePolicy::default();
        let good = spread(1000.0, 8, 0.008);
        let bad = spread(970.0, 8, 0.008);
        let probe = spread(1000.0, 3, 0.008);
        let c = classify(&good, &bad, &probe, &p).unwrap();
        assert_ne!(c.vs_good.answer, Answer::Same, "{c:?}");
        assert_eq!(c.vs_bad.answer, Answer::Different, "{c:?}");
        assert_eq!(c.side, Some(Side::Good));
    }

    #[test]
    fn the_endpoint_with_fewer_samples_is_measured_next() {
        assert_eq!(endpoint_to_measure(3, 6, 20, Side::Bad), Some(Side::Good));
        assert_eq!(endpoint_to_measure(6, 3, 20, Side::Good), Some(Side::Bad));
        assert_eq!(endpoint_to_measure(6, 6, 20, Side::Bad), Some(Side::Bad));
        assert_eq!(endpoint_to_measure(20, 6, 20, Side::Good), Some(Side::Bad));
        assert_eq!(endpoint_to_measure(20, 21, 20, Side::Good), None);
    }
}
