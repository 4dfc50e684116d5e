//! What a run's verdict cost, in GPU-seconds ([`Cost`]), and how the history keeps it
//! (`bench_costs`, schema 6): the run's total, and each shard's share when the run was
//! sharded, so that the shards of one run add up and a shard recorded again (a retried CI
//! job, `--resume`) replaces its own share instead of being counted twice.
//!
//! It lives in the history, below the reports that state it (summary.md and report.json
//! through `crate::report::input`), because the store parses and checks the kept figures
//! on the way out, as it checks every stored value, and `bench site` shows them.

use std::collections::BTreeMap;

/// What a run's verdict cost, GPU-seconds (one per second of a CPU cell): measuring the
/// cells, confirming the flagged ones (side by side, and the re-runs of what the pairs could
/// not measure), and triaging the findings (bisections and traced steps).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Cost {
    pub measuring_gpu_s: f64,
    pub pairs_gpu_s: f64,
    pub reruns_gpu_s: f64,
    pub triage_gpu_s: f64,
}

impl Cost {
    /// Every GPU-second the verdict took.
    pub fn total(&self) -> f64 {
        self.measuring_gpu_s + self.pairs_gpu_s + self.reruns_gpu_s + self.triage_gpu_s
    }

    /// The total against the measuring alone (`None` when nothing was measured, where a
    /// ratio would be a division by zero).
    pub fn times_the_run(&self) -> Option<f64> {
        (self.measuring_gpu_s > 0.0).then(|| self.total() / self.measuring_gpu_s)
    }

    /// `measuring 148 GPU-s, confirming 61 (side by side 61, re-runs 0), triage 22: 1.56x the run`.
    pub fn line(&self) -> String {
        let times = self
            .times_the_run()
            .map(|x| format!(": {x:.2}x the run"))
            .unwrap_or_default();
        format!(
            "measuring {:.0} GPU-s, confirming {:.0} (side by side {:.0}, re-runs {:.0}), triage {:.0}{times}",
            self.measuring_gpu_s,
            self.pairs_gpu_s + self.reruns_gpu_s,
            self.pairs_gpu_s,
            self.reruns_gpu_s,
            self.triage_gpu_s
        )
    }

    /// The sentence summary.md and the site's run page state: `Cost of this verdict: ...`.
    pub fn sentence(&self) -> String {
        format!("Cost of this verdict: {}.", self.line())
    }

    /// Why these figures cannot be what a run cost: each part must be a finite number of
    /// GPU-seconds within [`crate::bounds::check_gpu_seconds`]'s range. A row written by
    /// hand or by another tool (`-5`, `1e308`) is skipped on the way out of the store, never
    /// shown.
    pub fn implausible(&self) -> Option<String> {
        [
            ("measuring_gpu_s", self.measuring_gpu_s),
            ("pairs_gpu_s", self.pairs_gpu_s),
            ("reruns_gpu_s", self.reruns_gpu_s),
            ("triage_gpu_s", self.triage_gpu_s),
        ]
        .into_iter()
        .find_map(|(name, v)| crate::bounds::check_gpu_seconds(name, v).err())
    }

    fn plus(self, o: Cost) -> Cost {
        Cost {
            measuring_gpu_s: self.measuring_gpu_s + o.measuring_gpu_s,
            pairs_gpu_s: self.pairs_gpu_s + o.pairs_gpu_s,
            reruns_gpu_s: self.reruns_gpu_s + o.reruns_gpu_s,
            triage_gpu_s: self.triage_gpu_s + o.triage_gpu_s,
        }
    }
}

/// A run's row of `bench_costs`, as JSON: the run's total at the top (what every reader
/// takes), and under `shards` each shard's own figures (`"2/4"`), from which the total of a
/// sharded run is summed.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Kept {
    #[serde(flatten)]
    pub total: Cost,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shards: BTreeMap<String, Cost>,
}

impl Kept {
    /// The row of a run whose share `shard` (`None`: the whole run) cost `cost`, given the
    /// row `kept` for the run already (`None`: none). A whole run replaces what was kept; a
    /// shard replaces its own share and keeps the other shards' of the same split (a kept
    /// row of another split, or one that does not read, is an earlier run under the same
    /// id, replaced), and the total is their sum.
    pub(crate) fn join(kept: Option<&str>, shard: Option<crate::shard::Shard>, cost: Cost) -> Kept {
        let Some(shard) = shard else {
            return Kept {
                total: cost,
                shards: BTreeMap::new(),
            };
        };
        let split = format!("/{}", shard.count);
        let mut shards: BTreeMap<String, Cost> = kept
            .and_then(|k| serde_json::from_str::<Kept>(k).ok())
            .map(|k| k.shards)
            .unwrap_or_default();
        shards.retain(|label, _| label.ends_with(&split));
        shards.insert(shard.to_string(), cost);
        Kept {
            total: shards.values().fold(Cost::default(), |a, c| a.plus(*c)),
            shards,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::Shard;

    fn cost(m: f64, p: f64, r: f64, t: f64) -> Cost {
        Cost {
            measuring_gpu_s: m,
            pairs_gpu_s: p,
            reruns_gpu_s: r,
            triage_gpu_s: t,
        }
    }

    #[test]
    fn the_line_says_each_part_and_the_ratio() {
        let c = cost(148.0, 61.0, 0.0, 22.0);
        assert_eq!(
            c.sentence(),
            "Cost of this verdict: measuring 148 GPU-s, confirming 61 (side by side 61, re-runs 0), triage 22: 1.56x the run."
        );
        assert_eq!(cost(0.0, 3.0, 0.0, 0.0).times_the_run(), None);
        assert!(!cost(0.0, 3.0, 0.0, 0.0).line().contains("x the run"));
    }

    #[test]
    fn shards_add_up_and_a_shard_recorded_again_replaces_its_share() {
        let s = |i| Some(Shard { index: i, count: 2 });
        let one =
            serde_json::to_string(&Kept::join(None, s(1), cost(100.0, 10.0, 0.0, 5.0))).unwrap();
        let both = Kept::join(Some(&one), s(2), cost(50.0, 0.0, 4.0, 0.0));
        assert_eq!(both.total, cost(150.0, 10.0, 4.0, 5.0));
        // Shard 2 retried: its share is replaced, not added.
        let both = serde_json::to_string(&both).unwrap();
        let again = Kept::join(Some(&both), s(2), cost(60.0, 0.0, 0.0, 0.0));
        assert_eq!(again.total, cost(160.0, 10.0, 0.0, 5.0));
        // A whole run under the same id replaces every share; a shard of another split
        // starts over.
        let whole = Kept::join(Some(&both), None, cost(7.0, 0.0, 0.0, 0.0));
        assert!(whole.shards.is_empty());
        assert_eq!(whole.total.total(), 7.0);
        let other = Kept::join(
            Some(&both),
            Some(Shard { index: 1, count: 3 }),
            cost(1.0, 0.0, 0.0, 0.0),
        );
        assert_eq!(other.shards.len(), 1);
        assert_eq!(other.total.total(), 1.0);
        // The row reads back as the run's total.
        let row: Cost = serde_json::from_str(&both).unwrap();
        assert_eq!(row, cost(150.0, 10.0, 4.0, 5.0));
    }

    #[test]
    fn a_forged_figure_is_implausible() {
        assert_eq!(cost(1.0, 2.0, 3.0, 4.0).implausible(), None);
        assert!(cost(-1.0, 0.0, 0.0, 0.0)
            .implausible()
            .unwrap()
            .contains("measuring_gpu_s"));
        assert!(cost(1.0, 0.0, 0.0, 1e308).implausible().is_some());
        assert!(cost(1.0, f64::NAN, 0.0, 0.0).implausible().is_some());
    }
}
