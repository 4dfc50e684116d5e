//! Change points in a cell's trend: E-divisive with means (Matteson & James 2014, "A
//! Nonparametric Approach for Multiple Change Point Analysis of Multivariate Data", JASA
//! 109(505), section 2), the method MongoDB's `signal-processing-algorithms` and Hunter
//! (Fleming et al. 2023, ICPE) run over nightly performance series.
//!
//! For a series split at `tau`, with `X` the values before and `Y` those after, the
//! divergence is the energy distance `E = 2 mean|x - y|^a - mean|x - x'|^a - mean|y - y'|^a`
//! and the statistic `Q = (n m / (n + m)) E`; the best split maximizes `Q`. Its significance
//! is a permutation test: the statistic of the best split of randomly permuted copies, and
//! the split is kept when at most `alpha` of the permutations score as high. Splitting
//! continues inside each part (the paper's hierarchical procedure) until no split is
//! significant. The permutations use a fixed-seed generator, so the same series always
//! gives the same change points.

/// Settings of the search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Settings {
    /// The exponent `a` in (0, 2); 1 is the paper's and Hunter's choice.
    pub alpha_exponent: f64,
    /// Significance level of the permutation test.
    pub significance: f64,
    /// Permutations per test (the paper uses 199 for its level of 0.05).
    pub permutations: usize,
    /// The fewest points on each side of a change point.
    pub min_size: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            alpha_exponent: 1.0,
            significance: 0.05,
            permutations: 199,
            min_size: 3,
        }
    }
}

/// One change point: the index of the first value after the shift, the means on either
/// side (within the enclosing part) and the permutation p-value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ChangePoint {
    pub index: usize,
    pub mean_before: f64,
    pub mean_after: f64,
    pub p_value: f64,
}

impl ChangePoint {
    /// Relative change of the mean across the point.
    pub(crate) fn rel_change(&self) -> f64 {
        (self.mean_after - self.mean_before) / self.mean_before.abs().max(f64::MIN_POSITIVE)
    }
}

/// The change points of `xs`, in index order.
pub(crate) fn e_divisive(xs: &[f64], settings: &Settings) -> Vec<ChangePoint> {
    let mut found = Vec::new();
    let mut rng = SplitMix64(0x5eed_cafe_f00d_d00d);
    let mut parts = vec![(0usize, xs.len())];
    while let Some((start, end)) = parts.pop() {
        let part = &xs[start..end];
        let mut ranked = Ranked::new(part);
        let Some((tau, q)) = split(&ranked, settings) else {
            continue;
        };
        let mut as_high = 0usize;
        // The split is rejected once so many permutations scored as high that p exceeds
        // the level whatever the rest do: the same decision as running all of them, and
        // the common case (a part without a shift) stops after a few dozen.
        let limit = (settings.significance * (settings.permutations + 1) as f64).floor() as usize;
        for _ in 0..settings.permutations {
            ranked.shuffle(&mut rng);
            if split(&ranked, settings).is_some_and(|(_, qp)| qp >= q) {
                as_high += 1;
                if as_high >= limit {
                    break;
                }
            }
        }
        let p_value = (as_high + 1) as f64 / (settings.permutations + 1) as f64;
        if p_value > settings.significance {
            continue;
        }
        let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
        found.push(ChangePoint {
            index: start + tau,
            mean_before: mean(&part[..tau]),
            mean_after: mean(&part[tau..]),
            p_value,
        });
        parts.push((start, start + tau));
        parts.push((start + tau, end));
    }
    found.sort_by_key(|c| c.index);
    found
}

/// A part of the series with what its distance sums need: each value's rank among the
/// part's values, and the prefix sums of the sorted values. Both only depend on the
/// part's multiset of values, so a permutation moves the ranks with the values and sorts
/// nothing again.
struct Ranked {
    values: Vec<f64>,
    ranks: Vec<usize>,
    /// `prefix[r]`: the sum of the `r` smallest values.
    prefix: Vec<f64>,
}

impl Ranked {
    fn new(xs: &[f64]) -> Ranked {
        let n = xs.len();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| xs[a].total_cmp(&xs[b]));
        let mut ranks = vec![0usize; n];
        let mut prefix = vec![0.0; n + 1];
        for (r, &i) in order.iter().enumerate() {
            ranks[i] = r;
            prefix[r + 1] = prefix[r] + xs[i];
        }
        Ranked {
            values: xs.to_vec(),
            ranks,
            prefix,
        }
    }

    /// Fisher-Yates shuffle of the values, each keeping its rank.
    fn shuffle(&mut self, rng: &mut SplitMix64) {
        for i in (1..self.values.len()).rev() {
            let j = rng.below(i + 1);
            self.values.swap(i, j);
            self.ranks.swap(i, j);
        }
    }
}

/// The split of `xs` (index of the first value after it) with the largest statistic `Q`,
/// and that statistic; `None` when `xs` is too short for two parts of `min_size`.
#[cfg(test)]
pub(crate) fn best_split(xs: &[f64], settings: &Settings) -> Option<(usize, f64)> {
    split(&Ranked::new(xs), settings)
}

/// [`best_split`] of a ranked part. O(n log n) for the exponent 1 ([`distance_sums`]),
/// O(n^2) for any other.
fn split(part: &Ranked, settings: &Settings) -> Option<(usize, f64)> {
    let n = part.values.len();
    let min = settings.min_size.max(2);
    if n < 2 * min {
        return None;
    }
    let (to_before, to_after) = distance_sums(part, settings.alpha_exponent);
    let total: f64 = to_before.iter().sum();
    let mut within_left = 0.0;
    let mut within_right = total;
    let mut best: Option<(usize, f64)> = None;
    for tau in 1..n {
        // Moving point tau-1 from the right part to the left one.
        let k = tau - 1;
        within_left += to_before[k];
        within_right -= to_after[k];
        if tau < min || n - tau < min {
            continue;
        }
        let (nl, nr) = (tau as f64, (n - tau) as f64);
        let between = total - within_left - within_right;
        let e = 2.0 * between / (nl * nr)
            - within_left / (nl * (nl - 1.0) / 2.0)
            - within_right / (nr * (nr - 1.0) / 2.0);
        let q = nl * nr / (nl + nr) * e;
        if best.is_none_or(|(_, b)| q > b) {
            best = Some((tau, q));
        }
    }
    best
}

/// For each point, the sum of its distances `|x_i - x_j|^a` to the points before it and to
/// the points after it.
///
/// With `a = 1` (the default, and the paper's choice) both come from the sorted prefix
/// sums and a Fenwick tree over the ranks in O(n log n): a 5,000-run trend is searched with
/// 199 permutations per split in a fraction of a second, where summing the pairs took
/// minutes. Other exponents sum the pairs.
fn distance_sums(part: &Ranked, exponent: f64) -> (Vec<f64>, Vec<f64>) {
    let xs = &part.values;
    let n = xs.len();
    let mut to_before = vec![0.0; n];
    let mut to_after = vec![0.0; n];
    if exponent != 1.0 {
        for (j, &xj) in xs.iter().enumerate() {
            for (i, &xi) in xs[..j].iter().enumerate() {
                let v = (xi - xj).abs().powf(exponent);
                to_before[j] += v;
                to_after[i] += v;
            }
        }
        return (to_before, to_after);
    }
    let prefix = &part.prefix;
    // Fenwick trees (1-based) of the count and the sum of the values seen so far, by rank.
    let mut count = vec![0usize; n + 1];
    let mut sum = vec![0.0; n + 1];
    let mut seen_sum = 0.0;
    for (j, (&x, &r)) in xs.iter().zip(&part.ranks).enumerate() {
        // The earlier points of lower rank: their count and sum.
        let (mut c, mut s, mut k) = (0usize, 0.0, r);
        while k > 0 {
            c += count[k];
            s += sum[k];
            k &= k - 1;
        }
        // Points ranked below are at most x, the others at least x (ties add 0 either way).
        to_before[j] = (x * c as f64 - s) + (seen_sum - s - x * (j - c) as f64);
        let to_all =
            (x * r as f64 - prefix[r]) + (prefix[n] - prefix[r + 1] - x * (n - r - 1) as f64);
        to_after[j] = to_all - to_before[j];
        let mut k = r + 1;
        while k <= n {
            count[k] += 1;
            sum[k] += x;
            k += k & k.wrapping_neg();
        }
        seen_sum += x;
    }
    (to_before, to_after)
}

/// SplitMix64 (Steele, Lea & Flood 2014, "Fast splittable pseudorandom number
/// generators", OOPSLA): a small, well-mixed generator, enough for permutation tests and
/// seeded so results repeat.
pub(crate) struct SplitMix64(pub u64);

impl SplitMix64 {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform index below `n` (n > 0); the modulo bias is below 2^-40 for the sizes here.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic noise in [-1, 1).
    fn noise(n: usize, seed: u64) -> Vec<f64> {
        let mut r = SplitMix64(seed);
        (0..n)
            .map(|_| (r.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0)
            .collect()
    }

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        // The reference implementation (Vigna, splitmix64.c) seeded with 0 begins so.
        let mut r = SplitMix64(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
    }

    #[test]
    fn the_statistic_of_a_clean_step_peaks_at_the_step() {
        let mut xs = vec![10.0; 8];
        xs.extend([20.0; 8]);
        let (tau, q) = best_split(&xs, &Settings::default()).unwrap();
        assert_eq!(tau, 8);
        // E = 2 * 10 - 0 - 0 = 20; Q = (8 * 8 / 16) * 20 = 80.
        assert!((q - 80.0).abs() < 1e-9, "{q}");
    }

    #[test]
    fn finds_two_shifts_in_a_noisy_series_and_none_in_pure_noise() {
        let e = noise(60, 7);
        let xs: Vec<f64> = (0..60)
            .map(|i| {
                let level = if i < 25 {
                    100.0
                } else if i < 45 {
                    97.0
                } else {
                    99.0
                };
                level + 0.3 * e[i]
            })
            .collect();
        let cps = e_divisive(&xs, &Settings::default());
        let idx: Vec<usize> = cps.iter().map(|c| c.index).collect();
        assert_eq!(idx, [25, 45], "{cps:?}");
        // The means are those of the enclosing part at the time of the split, so only the
        // direction of the first shift is certain here.
        assert!(cps[0].rel_change() < -0.01, "{cps:?}");
        let quiet: Vec<f64> = noise(60, 11).iter().map(|v| 100.0 + 0.3 * v).collect();
        assert!(e_divisive(&quiet, &Settings::default()).is_empty());
    }

    #[test]
    fn sorted_distance_sums_equal_the_pairwise_ones() {
        let mut xs = noise(300, 3);
        // Ties, as rounded figures have.
        xs[10] = xs[20];
        xs[30] = xs[20];
        let ranked = Ranked::new(&xs);
        let (before, after) = distance_sums(&ranked, 1.0);
        let (b2, a2) = distance_sums(&ranked, 1.0 + f64::EPSILON);
        for i in 0..xs.len() {
            assert!((before[i] - b2[i]).abs() < 1e-9 * (1.0 + b2[i]), "{i}");
            assert!((after[i] - a2[i]).abs() < 1e-9 * (1.0 + a2[i]), "{i}");
        }
    }

    #[test]
    fn five_thousand_runs_are_searched_interactively() {
        // `bench history CELL` over 5,000 runs took minutes with pairwise sums.
        let e = noise(5000, 5);
        let xs: Vec<f64> = (0..5000)
            .map(|i| (if i < 2500 { 100.0 } else { 97.0 }) + 0.5 * e[i])
            .collect();
        let t = std::time::Instant::now();
        let cps = e_divisive(&xs, &Settings::default());
        let took = t.elapsed();
        assert_eq!(cps.iter().map(|c| c.index).collect::<Vec<_>>(), [2500]);
        // A debug build on a shared CI machine; a release build takes a tenth of this.
        assert!(took < std::time::Duration::from_secs(20), "{took:?}");
    }

    #[test]
    fn short_series_have_no_change_points() {
        assert!(e_divisive(&[1.0, 2.0, 3.0, 4.0, 5.0], &Settings::default()).is_empty());
        assert!(e_divisive(&[], &Settings::default()).is_empty());
    }
}
