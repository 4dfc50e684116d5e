//! One bisection's state: the range, the measured commits and what they were called, and
//! how it ended. The report reads it and the command drives it (the driving methods live
//! with the command in `mod.rs`), so it lives apart from both.

use std::path::PathBuf;

use crate::history::twosample::{TwoSample, TwoSamplePolicy};

use super::git::Commit;
use super::probe::Round;
use super::search::Side;
use super::settings::BisectSettings;

/// What a measured commit is in the bisection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Role {
    Good,
    Bad,
    Probe,
}

/// A measured commit: its rounds and what they were called.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    pub commit: Commit,
    pub role: Role,
    /// Its position in `0..=N` (0 good, N bad).
    pub position: usize,
    pub rounds: Vec<Round>,
    /// Against good (for bad: the comparison of the endpoints).
    pub vs_good: Option<TwoSample>,
    /// Against bad (probes only).
    pub vs_bad: Option<TwoSample>,
    pub side: Option<Side>,
}

impl Probe {
    pub(crate) fn samples(&self) -> Vec<f64> {
        self.rounds
            .iter()
            .flat_map(|r| r.samples.iter().copied())
            .collect()
    }

    pub(crate) fn median(&self) -> Option<f64> {
        crate::metrics::stats::median(&self.samples())
    }
}

/// How a bisection ended (short of an error or an interruption).
#[derive(Debug, Clone)]
pub(crate) enum Ending {
    /// The first bad commit (the position in `0..=N`) and the last good one.
    Found { first_bad: usize, last_good: usize },
    /// Good and bad measured the same: nothing to bisect.
    Same,
    /// A commit stayed unknown after `--max-repeats` repeats.
    Undecided(String),
    /// A commit could not be measured.
    Failed(String),
    /// An automatic bisection's GPU-seconds budget ran out.
    OutOfBudget(String),
}

/// One bisection's state.
pub(crate) struct Bisection<'a> {
    pub settings: &'a BisectSettings,
    pub good: Commit,
    pub bad: Commit,
    /// The commits of `good..bad`, oldest first (bad last): position `i` is `range[i - 1]`.
    pub range: Vec<Commit>,
    /// Every measured commit, in the order they were decided.
    pub probes: Vec<Probe>,
    pub policy: TwoSamplePolicy,
    pub hardware_key: String,
    pub history: String,
    pub runs_dir: PathBuf,
}

impl Bisection<'_> {
    /// The commit at `position` (0 good, N bad).
    pub(crate) fn commit_at(&self, position: usize) -> &Commit {
        match position {
            0 => &self.good,
            p => &self.range[p - 1],
        }
    }

    /// The number of commits in `good..bad`.
    pub(crate) fn n(&self) -> usize {
        self.range.len()
    }
}
