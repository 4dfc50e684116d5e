//! `--shard I/N`: which share of a matrix's cells one job runs, and the split itself.
//!
//! The split is greedy longest-processing-time (LPT) over each cell's expected GPU-seconds:
//! the cells are taken from the most expensive down and each goes to the shard with the
//! least expected time so far. nextest's `--partition count:I/N` and `hash:I/N` split by
//! count or by a hash of the test name, which suits thousands of tests of similar length;
//! a benchmark matrix has a few dozen cells whose costs differ by orders of magnitude (a
//! 1-GPU gpt2-125m cell next to an 8-GPU Llama 70B proxy), so a split by count leaves one
//! shard running hours after the others. pytest-split's `least_duration` algorithm, which
//! is this LPT over recorded durations, is the anchor: LPT's makespan is within 4/3 of the
//! optimum (Graham, 1969) and it needs no search.
//!
//! The split is a pure function of the cells' order and weights, with every tie broken by
//! position (the heaviest first; equal weights in expansion order; the least-loaded shard
//! with the lowest index), so every shard, started on its own runner with the same matrix,
//! filters and weights, computes the same split without talking to the others. Each shard
//! writes the whole plan into its run folder, so the merge can check that the shards
//! agreed and name any cell that no shard ran.
//!
//! Vocabulary only: this module imports no stage.

use std::fmt;
use std::str::FromStr;

/// One share of a matrix: the `index`-th of `count` (both from 1, as `--shard 1/2`
/// writes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = String;

    /// `I/N` with 1 <= I <= N; anything else says what was expected, for an exit-2 error.
    fn from_str(s: &str) -> Result<Shard, String> {
        let bad = |why: &str| format!("--shard {s:?}: {why}");
        let (i, n) = s
            .split_once('/')
            .ok_or_else(|| bad("expected I/N, e.g. 1/4 (the first of four shards)"))?;
        let number = |t: &str, what: &str| {
            // `+1` and ` 1` parse as numbers in Rust; a shard is plain digits only.
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(&format!("{what} {t:?} is not a whole number")));
            }
            t.parse::<u32>()
                .map_err(|_| bad(&format!("{what} {t:?} is too large")))
        };
        let index = number(i, "the shard")?;
        let count = number(n, "the shard count")?;
        if count == 0 {
            return Err(bad("the shard count must be at least 1"));
        }
        if count > MAX_SHARDS {
            return Err(bad(&format!(
                "at most {MAX_SHARDS} shards (a runner per shard; more would only be empty shares)"
            )));
        }
        if index == 0 || index > count {
            return Err(bad(&format!(
                "the shard must be between 1 and {count} (shards count from 1)"
            )));
        }
        Ok(Shard { index, count })
    }
}

/// The most shards a run may be split into: every shard keeps its expected load in the
/// plan, so the count bounds the plan's size and the split's time, and no fleet has more
/// runners than this for one nightly.
pub const MAX_SHARDS: u32 = 4096;

/// Splits items of the given expected costs into `count` shards by greedy
/// longest-processing-time: returns, for each item, the index of its shard (from 0).
///
/// Deterministic: the items are taken by cost, highest first, equal costs in the order
/// given; each goes to the shard with the least cost so far, the lowest index on a tie. A
/// cost that is not a finite positive number counts as 0 (such an item goes where it
/// costs nothing, but still to exactly one shard). `count` 0 is treated as 1.
pub fn split(costs: &[f64], count: usize) -> Vec<usize> {
    let count = count.max(1);
    let cost = |i: usize| {
        let c = costs[i];
        if c.is_finite() && c > 0.0 {
            c
        } else {
            0.0
        }
    };
    let mut order: Vec<usize> = (0..costs.len()).collect();
    // A stable sort keeps equal costs in the order given.
    order.sort_by(|&a, &b| cost(b).total_cmp(&cost(a)));
    let mut load = vec![0.0f64; count];
    let mut shard_of = vec![0usize; costs.len()];
    for i in order {
        let mut best = 0;
        for s in 1..count {
            if load[s] < load[best] {
                best = s;
            }
        }
        load[best] += cost(i);
        shard_of[i] = best;
    }
    shard_of
}

/// The expected cost of each shard under a split ([`split`]'s answer).
pub fn loads(costs: &[f64], shard_of: &[usize], count: usize) -> Vec<f64> {
    let mut load = vec![0.0f64; count.max(1)];
    for (c, &s) in costs.iter().zip(shard_of) {
        if c.is_finite() && *c > 0.0 {
            load[s] += c;
        }
    }
    load
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_i_of_n_and_refuses_the_rest_with_a_reason() {
        assert_eq!("1/2".parse(), Ok(Shard { index: 1, count: 2 }));
        assert_eq!("3/3".parse(), Ok(Shard { index: 3, count: 3 }));
        assert_eq!("1/1".parse::<Shard>().unwrap().to_string(), "1/1");
        for (s, says) in [
            ("0/2", "between 1 and 2"),
            ("3/2", "between 1 and 2"),
            ("1/0", "at least 1"),
            ("0/0", "at least 1"),
            ("2", "expected I/N"),
            ("", "expected I/N"),
            ("a/2", "not a whole number"),
            ("1/b", "not a whole number"),
            ("1/", "not a whole number"),
            ("-1/2", "not a whole number"),
            ("+1/2", "not a whole number"),
            (" 1/2", "not a whole number"),
            ("1/2/3", "not a whole number"),
            ("1/99999999999", "too large"),
        ] {
            let e = s.parse::<Shard>().unwrap_err();
            assert!(e.contains(says), "{s:?}: {e}");
            assert!(e.starts_with("--shard"), "{s:?}: {e}");
        }
    }

    #[test]
    fn lpt_balances_by_cost_not_by_count() {
        // One big cell and four small ones: by count two shards would get 3 and 2 cells;
        // by cost the big one is alone and the small ones share the other shard.
        let costs = [10.0, 2.0, 2.0, 2.0, 2.0];
        let s = split(&costs, 2);
        assert_eq!(s, [0, 1, 1, 1, 1]);
        assert_eq!(loads(&costs, &s, 2), [10.0, 8.0]);
    }

    #[test]
    fn lpt_is_the_textbook_greedy_with_ties_by_position() {
        // Sorted 7,6,5,4,3,2 onto three machines: 7->0, 6->1, 5->2, 4->2 (5 least),
        // 3->1 (6 least), 2->0 (7 least): loads 9, 9, 9.
        let costs = [3.0, 7.0, 2.0, 5.0, 6.0, 4.0];
        let s = split(&costs, 3);
        assert_eq!(s, [1, 0, 0, 2, 1, 2]);
        assert_eq!(loads(&costs, &s, 3), [9.0, 9.0, 9.0]);
        // Equal costs go round the shards in the order given.
        assert_eq!(split(&[1.0; 5], 2), [0, 1, 0, 1, 0]);
    }

    #[test]
    fn the_split_is_a_function_of_its_input() {
        let costs: Vec<f64> = (0..200).map(|i| ((i * 7919) % 97) as f64 + 0.5).collect();
        let a = split(&costs, 4);
        let b = split(&costs, 4);
        assert_eq!(a, b);
        // Every item is in exactly one shard and no shard is left empty here.
        assert!(a.iter().all(|&s| s < 4));
        for s in 0..4 {
            assert!(a.contains(&s));
        }
        // LPT's bound: the largest load is within 4/3 of the ideal (here far closer).
        let l = loads(&costs, &a, 4);
        let ideal = costs.iter().sum::<f64>() / 4.0;
        let max = l.iter().cloned().fold(0.0, f64::max);
        assert!(max <= ideal * 4.0 / 3.0, "{l:?}");
    }

    #[test]
    fn odd_costs_still_place_every_item_once() {
        let costs = [f64::NAN, -1.0, f64::INFINITY, 0.0, 1.0];
        let s = split(&costs, 2);
        assert_eq!(s.len(), 5);
        assert_eq!(s[4], 0);
        // More shards than items: the extra shards are empty, never an error.
        assert_eq!(split(&[1.0, 1.0], 4), [0, 1]);
        assert_eq!(split(&[], 3), Vec::<usize>::new());
        assert_eq!(split(&[1.0], 0), [0]);
    }
}
