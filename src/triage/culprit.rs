//! What the automatic bisection of a finding came to, as the reports show it: the first bad
//! commit with its evidence, or why there is none (the budget ran out, a pull request's run,
//! no build recipe), and the command that finishes the work by hand.
//!
//! The command layer fills it (`crate::commands::triage` drives `crate::bisect`), the reports
//! render it; it lives with the triage stage so both can name it without importing the other.

use serde::{Deserialize, Serialize};

/// A commit as a finding names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommitRef {
    pub sha: String,
    pub subject: String,
    pub author: String,
}

impl CommitRef {
    /// `1a2b3c4 "subject" (author)`.
    pub fn render(&self) -> String {
        let short: String = self.sha.chars().take(7).collect();
        format!("{short} \"{}\" ({})", self.subject, self.author)
    }
}

/// How the bisection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BisectStatus {
    /// The first bad commit is known.
    Found,
    /// The GPU-seconds budget ran out before it was known.
    OutOfBudget,
    /// Good and bad measured the same in the bisection's own runs.
    Same,
    /// A commit stayed unknown after the most repeats.
    Undecided,
    /// A commit could not be built or measured.
    Failed,
    /// Not attempted (a pull request's run, no build recipe, the cell not in the matrix).
    Skipped,
    /// Ctrl-C or SIGTERM stopped it; the rounds measured so far are recorded.
    Interrupted,
}

impl BisectStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            BisectStatus::Found => "found",
            BisectStatus::OutOfBudget => "out of budget",
            BisectStatus::Same => "same",
            BisectStatus::Undecided => "undecided",
            BisectStatus::Failed => "failed",
            BisectStatus::Skipped => "skipped",
            BisectStatus::Interrupted => "interrupted",
        }
    }
}

/// The automatic bisection of one finding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bisected {
    pub status: BisectStatus,
    /// The cell it measured: the finding's cheapest (fewest GPU-seconds per round).
    pub cell: String,
    /// The range `good..bad` as the verdict named it.
    pub good: String,
    pub bad: String,
    /// Commits in the range (bad included).
    pub commits: usize,
    pub first_bad: Option<CommitRef>,
    pub last_good: Option<CommitRef>,
    /// Commits measured (those whose rounds an earlier job recorded included).
    pub measured: usize,
    /// Rounds this job ran, and rounds it took from the history (an earlier job's).
    pub rounds_run: usize,
    pub rounds_reused: usize,
    /// GPU-seconds this job's bisection and traced steps took (wall time of every child,
    /// setup included, times the cell's GPUs), and the budget it had.
    pub gpu_s: f64,
    pub budget_gpu_s: f64,
    /// The first bad commit against the last good one, or why it ended as it did.
    pub evidence: String,
    /// `bench bisect ...` to finish or repeat it by hand (empty when it is not needed).
    pub command: String,
}

impl Bisected {
    /// A bisection of `cell` over `good..bad` with `budget_gpu_s` to spend, that has
    /// measured nothing yet: what the driver fills in, or reports as it is when it stops
    /// before the first round.
    pub fn new(
        status: BisectStatus,
        cell: &str,
        [good, bad]: [&str; 2],
        budget_gpu_s: f64,
        evidence: String,
    ) -> Bisected {
        Bisected {
            status,
            cell: cell.to_string(),
            good: good.to_string(),
            bad: bad.to_string(),
            commits: 0,
            first_bad: None,
            last_good: None,
            measured: 0,
            rounds_run: 0,
            rounds_reused: 0,
            gpu_s: 0.0,
            budget_gpu_s,
            evidence,
            command: String::new(),
        }
    }

    /// One line for a finding: the first bad commit and its evidence, or what happened.
    pub fn line(&self) -> String {
        match (&self.status, &self.first_bad) {
            (BisectStatus::Found, Some(c)) => format!(
                "first bad commit {} (bisected on {}: {}; {} commits measured of the {} in the range and its good end, {:.0} GPU-s)",
                c.render(),
                self.cell,
                self.evidence,
                self.measured,
                self.commits,
                self.gpu_s
            ),
            _ => {
                let mut s = format!(
                    "bisection {}: {} ({:.0} of {:.0} GPU-s)",
                    self.status.as_str(),
                    self.evidence,
                    self.gpu_s,
                    self.budget_gpu_s
                );
                if !self.command.is_empty() {
                    s.push_str(&format!("; finish it with `{}`", self.command));
                }
                s
            }
        }
    }
}
