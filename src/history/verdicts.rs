//! The history's verdicts on a run as data: each judged cell ([`CellJudgement`]) and the
//! run's whole judgement ([`GateReport`], kept as `history.json` in the run folder). The
//! gate ([`super::gate`]) produces them, the verdict words ([`super::words`]) and the
//! reports read them; this file imports neither, so both can.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::detect::{HistoryVerdict, Judgement, NumericsVerdict, OutlierRepeat, Policy};
use super::environment::Finding;
use super::suspects::Change;

/// Where a shift began and the last run before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Since {
    pub run_id: String,
    pub commit: Option<String>,
    pub started_at: String,
    pub last_good_run_id: Option<String>,
    pub last_good_commit: Option<String>,
}

/// The history's verdict on one cell of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellJudgement {
    pub cell_id: String,
    pub metric: String,
    pub value: f64,
    /// This run's repeats.
    #[serde(default)]
    pub samples: Vec<f64>,
    /// Repeats far from the others while the others agree: a disturbed run (environment
    /// evidence, named in the verdict line).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outliers: Vec<OutlierRepeat>,
    pub judgement: Judgement,
    /// The re-run's value (median), when the cell was re-run to confirm (the last re-run's
    /// when there were several).
    pub confirm_value: Option<f64>,
    #[serde(default)]
    pub confirm_samples: Vec<f64>,
    /// Each re-run's value (median), in order, when the cell was re-run more than once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub confirm_values: Vec<f64>,
    /// Why the confirming re-run produced no measurement, when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirm_failed: Option<String>,
    pub numerics: NumericsVerdict,
    /// For a regression or improvement: the first run of the shift and the last good one.
    pub since: Option<Since>,
    /// The baseline's own verdict (the old rule), which decides with no history at all.
    pub baseline_regressed: bool,
    /// What the cell's telemetry says against its clean runs (clocks, reasons, processes).
    #[serde(default)]
    pub environment: Option<Finding>,
    /// What differs from the last good run (regressed, improved, suspect, numerics).
    #[serde(default)]
    pub changes: Vec<Change>,
    /// The verdict line every report shows.
    #[serde(default)]
    pub line: String,
    /// The `bench bisect` command that would find the commit, for a regression between
    /// two known commits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bisect: Option<String>,
    /// The verdict on the cell's energy (tokens per joule), when this run and its history
    /// read the cell's GPU power: judged by the same band, repeats' test and confirmation as
    /// its speed, so that a change in energy at an unchanged speed is a verdict too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy: Option<EnergyJudgement>,
    /// The last run that showed the cell good (the side-by-side confirmation measures its
    /// commit against this run's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_good_run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_good_commit: Option<String>,
    /// The side-by-side confirmation, when the cell had one: its verdict is the cell's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pairs: Option<SideBySide>,
    /// Whether only the code (and the host) changed since the last good run: what pairs
    /// can measure. A changed speed switch, library or driver applies to both sides of a
    /// pair alike, so such a cell is confirmed by re-runs. Not kept in `history.json`.
    #[serde(skip)]
    pub only_code_changed: bool,
    /// Whether the cell's last settled run was a regression not yet fixed or accepted: no
    /// run has shown it good since (see `gate::open_regression`). Such a cell is measured
    /// side by side whatever its screen says, and its night is never stored as clean.
    /// Not kept in `history.json`.
    #[serde(skip)]
    pub open_regression: bool,
}

/// A cell measured at its last good commit (A) and at this run's commit (B) in the same
/// job, alternating A B B A ..., each repeat its own process ([`super::paired`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SideBySide {
    pub cell_id: String,
    /// A: the last good run's commit, and that run.
    pub base_commit: String,
    pub base_run_id: Option<String>,
    /// B: this run's commit.
    pub head_commit: String,
    /// What the history's screen said before the pairs, and the change it saw.
    pub screened: HistoryVerdict,
    pub screened_rel: Option<f64>,
    /// Each pair's A and B (the same index is one pair).
    pub base: Vec<f64>,
    pub head: Vec<f64>,
    /// The pairs' answer; `None` when not one pair could be measured.
    pub result: Option<super::paired::Paired>,
    /// Why the pairs stopped short of an answer or could not start (a commit missing, no
    /// recipe for a built-in cell, the setup or a repeat failed, the budget): the verdict
    /// then rests on re-runs, and says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// GPU-seconds the pairs took (setups included).
    pub gpu_s: f64,
    /// The folder of the pairs' logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<String>,
}

impl SideBySide {
    /// The pairs' answer when at least one pair was measured (else the cell was not
    /// measured side by side, and re-runs may confirm it instead).
    pub fn measured(&self) -> Option<super::paired::Paired> {
        self.result.filter(|r| r.pairs > 0)
    }

    /// `side by side against abc1234: -4.1% (99.6% interval -4.9%..-3.3%, 6 pairs: different)`.
    pub fn describe(&self) -> String {
        let base: String = self.base_commit.chars().take(7).collect();
        match self.measured() {
            Some(r) => {
                let ci = match r.ci_rel {
                    Some((lo, hi)) => format!(
                        "{:.1}% interval {:+.1}%..{:+.1}%, ",
                        r.ci_level * 100.0,
                        lo * 100.0,
                        hi * 100.0
                    ),
                    None => String::new(),
                };
                let mut s = format!(
                    "side by side against {base}: {:+.1}% ({ci}{} pair{}: {})",
                    r.change_rel * 100.0,
                    r.pairs,
                    if r.pairs == 1 { "" } else { "s" },
                    r.answer.as_str()
                );
                if let Some(why) = &self.stopped {
                    s.push_str(&format!("; stopped: {why}"));
                }
                s
            }
            _ => format!(
                "not measured side by side against {base}: {}",
                self.stopped.as_deref().unwrap_or("no pair measured")
            ),
        }
    }
}

/// The history's verdict on one cell's energy (see [`CellJudgement::energy`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnergyJudgement {
    /// `tokens_per_joule`.
    pub metric: String,
    pub value: f64,
    /// This run's repeats.
    #[serde(default)]
    pub samples: Vec<f64>,
    pub judgement: Judgement,
    /// The last re-run's value (median), when the cell was re-run to confirm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirm_value: Option<f64>,
}

impl EnergyJudgement {
    pub fn verdict(&self) -> HistoryVerdict {
        self.judgement.verdict
    }
}

impl CellJudgement {
    pub fn verdict(&self) -> HistoryVerdict {
        self.judgement.verdict
    }

    /// The energy verdict, when the cell's energy was judged.
    pub fn energy_verdict(&self) -> Option<HistoryVerdict> {
        self.energy.as_ref().map(EnergyJudgement::verdict)
    }

    /// The verdicts the cell got: its speed's, and its energy's when judged.
    fn verdicts(&self) -> impl Iterator<Item = HistoryVerdict> {
        std::iter::once(self.verdict()).chain(self.energy_verdict())
    }

    /// Whether this cell fails the job: a confirmed regression (of its speed or its energy),
    /// changed numerics, or a baseline regression where there is no history at all.
    pub(crate) fn fails_run(&self) -> bool {
        self.verdicts().any(HistoryVerdict::fails_run)
            || matches!(self.numerics, NumericsVerdict::Changed { .. })
            || (self.verdict() == HistoryVerdict::InsufficientHistory && self.baseline_regressed)
    }

    /// Whether the cell waits for a confirming re-run: its speed or its energy is a suspect
    /// or unknown.
    pub(crate) fn awaits_rerun(&self) -> bool {
        self.verdicts()
            .any(|v| matches!(v, HistoryVerdict::Suspect | HistoryVerdict::Unknown))
    }

    /// Whether a judgement made after `done` re-runs asks for another
    /// ([`super::detect::wants_rerun`] of its speed or its energy verdict).
    pub(crate) fn wants_rerun(&self, done: usize) -> bool {
        self.verdicts().any(|v| super::detect::wants_rerun(v, done))
    }

    /// Whether either verdict is `v`.
    pub(crate) fn has_verdict(&self, v: HistoryVerdict) -> bool {
        self.verdicts().any(|x| x == v)
    }

    /// The verdict that decides the cell's status in the reports: regressed when its speed
    /// or its energy regressed (either fails the job); else its speed's, unless that is
    /// unchanged (or had nothing to compare with) and its energy's is not.
    pub fn status_verdict(&self) -> HistoryVerdict {
        if self.has_verdict(HistoryVerdict::Regressed) {
            return HistoryVerdict::Regressed;
        }
        match (self.verdict(), self.energy_verdict()) {
            (
                HistoryVerdict::Unchanged | HistoryVerdict::InsufficientHistory,
                Some(
                    e @ (HistoryVerdict::Improved
                    | HistoryVerdict::Suspect
                    | HistoryVerdict::Unknown
                    | HistoryVerdict::Environment),
                ),
            ) => e,
            (speed, _) => speed,
        }
    }
}

/// The history's verdicts on a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateReport {
    pub run_id: String,
    pub hardware_key: String,
    pub store: String,
    pub policy: Policy,
    /// Which runs the cells were judged against (branch, merge-base).
    #[serde(default)]
    pub scope: String,
    /// The run that re-ran the suspect and unknown cells, when one did (the last, when
    /// several passes re-ran them).
    pub confirm_run_id: Option<String>,
    /// Cells left unconfirmed because the confirmation budget ran out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub over_budget: Vec<String>,
    pub cells: Vec<CellJudgement>,
    /// GPU-seconds the confirming re-runs took (the pairs' are in each cell's).
    #[serde(default)]
    pub reruns_gpu_s: f64,
    /// The same re-runs' GPU-seconds by cell (they add up to `reruns_gpu_s`), for the cost
    /// of each cell's verdict.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub reruns_gpu_s_by_cell: std::collections::BTreeMap<String, f64>,
}

impl GateReport {
    /// The file in a run folder.
    pub(crate) const FILE: &'static str = "history.json";

    /// 1 when a cell fails the job, else 0.
    pub fn exit_code(&self) -> i32 {
        if self.cells.iter().any(CellJudgement::fails_run) {
            crate::exit::bench::FAILED
        } else {
            crate::exit::bench::OK
        }
    }

    /// Reads `history.json` from a run folder; `None` when the run was not judged (no file
    /// there). One that is there and does not read is an error naming it, line and
    /// column: read as absent, it made `bench report` judge the run against the baselines
    /// instead and change its verdict without a word (a regressed run re-rendered as
    /// "new", exit 0), where `bench report merge` refuses the same file.
    pub(crate) fn load(run_dir: &Path) -> Result<Option<GateReport>, String> {
        crate::files::read_json_if_there(&run_dir.join(Self::FILE))
    }

    pub(crate) fn cell(&self, id: &str) -> Option<&CellJudgement> {
        self.cells.iter().find(|c| c.cell_id == id)
    }

    /// GPU-seconds the side-by-side pairs of this run took.
    pub fn pairs_gpu_s(&self) -> f64 {
        self.cells
            .iter()
            .filter_map(|c| c.pairs.as_ref())
            .map(|p| p.gpu_s)
            .sum()
    }

    /// Why the GPU-seconds of this report cannot be a run's (`None`: they can): each figure
    /// must be GPU-seconds a run spends, each judged cell judged once, and the re-runs by
    /// cell must name cells of the run (`in_run`) and add up to their total. The one check
    /// of a `history.json` read from a run folder: `bench report merge` applies it to each
    /// shard's, and the reports (`crate::report::input`) to the run's they state the cost
    /// from.
    pub(crate) fn implausible_cost(&self, in_run: impl Fn(&str) -> bool) -> Option<String> {
        let mut seen = std::collections::HashSet::new();
        for (i, c) in self.cells.iter().enumerate() {
            if !seen.insert(c.cell_id.as_str()) {
                return Some(format!(
                    "cells[{i}]: cell {} is judged twice",
                    crate::sanitize::inline(&c.cell_id)
                ));
            }
            if let Some(p) = &c.pairs {
                if let Err(why) = crate::bounds::check_gpu_seconds("pairs.gpu_s", p.gpu_s) {
                    return Some(format!("cells[{i}]: {why}"));
                }
            }
        }
        if let Err(why) = crate::bounds::check_gpu_seconds("reruns_gpu_s", self.reruns_gpu_s) {
            return Some(why);
        }
        let mut sum = 0.0;
        for (cell, v) in &self.reruns_gpu_s_by_cell {
            let shown = crate::sanitize::inline(cell);
            if let Err(why) =
                crate::bounds::check_gpu_seconds(&format!("reruns_gpu_s_by_cell.{shown}"), *v)
            {
                return Some(why);
            }
            if !in_run(cell) {
                return Some(format!(
                    "reruns_gpu_s_by_cell names {shown}, which is not a cell of this run"
                ));
            }
            sum += v;
        }
        if !self.reruns_gpu_s_by_cell.is_empty()
            && (sum - self.reruns_gpu_s).abs() > 1e-6 * self.reruns_gpu_s.abs().max(1.0)
        {
            return Some(format!(
                "reruns_gpu_s_by_cell adds up to {sum}, while reruns_gpu_s is {}",
                self.reruns_gpu_s
            ));
        }
        None
    }

    /// Cells still unconfirmed: suspects, whose breach neither pairs nor re-runs could
    /// settle. The headline of every report names them.
    pub fn unconfirmed(&self) -> Vec<&CellJudgement> {
        self.cells
            .iter()
            .filter(|c| c.has_verdict(HistoryVerdict::Suspect))
            .collect()
    }

    /// Cells the confirmation re-runs: suspects (of their speed or their energy), then
    /// unknown ones.
    pub fn to_confirm(&self) -> Vec<String> {
        let suspect = |c: &&CellJudgement| c.has_verdict(HistoryVerdict::Suspect);
        let suspects = self.cells.iter().filter(suspect);
        let unknown = self
            .cells
            .iter()
            .filter(|c| !suspect(c) && c.has_verdict(HistoryVerdict::Unknown));
        suspects.chain(unknown).map(|c| c.cell_id.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::words::tests::regressed;

    fn with(speed: HistoryVerdict, energy: Option<HistoryVerdict>) -> CellJudgement {
        let mut c = regressed();
        c.judgement.verdict = speed;
        c.energy = energy.map(|v| EnergyJudgement {
            metric: "tokens_per_joule".into(),
            value: 800.0,
            samples: vec![800.0],
            judgement: Judgement {
                verdict: v,
                ..c.judgement
            },
            confirm_value: None,
        });
        c
    }

    #[test]
    fn the_energy_verdict_counts_for_the_job_the_status_and_the_re_runs() {
        use HistoryVerdict::*;
        // Either regression fails the job and makes the status regressed.
        for (speed, energy) in [
            (Unchanged, Regressed),
            (Suspect, Regressed),
            (Improved, Regressed),
        ] {
            let c = with(speed, Some(energy));
            assert!(c.fails_run(), "{speed:?} {energy:?}");
            assert_eq!(c.status_verdict(), Regressed, "{speed:?} {energy:?}");
        }
        // An energy suspect waits for a re-run like a speed suspect, and shows as one.
        let c = with(Unchanged, Some(Suspect));
        assert!(!c.fails_run());
        assert!(c.awaits_rerun() && c.wants_rerun(0) && !c.wants_rerun(3));
        assert_eq!(c.status_verdict(), Suspect);
        // The speed's own verdict stands over the energy's lesser ones.
        assert_eq!(
            with(Environment, Some(Improved)).status_verdict(),
            Environment
        );
        assert_eq!(with(Unchanged, Some(Improved)).status_verdict(), Improved);
        assert_eq!(with(Unchanged, None).status_verdict(), Unchanged);
        assert!(!with(Unchanged, Some(Unchanged)).awaits_rerun());
        // A report's cells to confirm: suspects of either kind first, then unknown ones.
        let mut a = with(Unknown, None);
        a.cell_id = "a".into();
        let mut b = with(Unchanged, Some(Suspect));
        b.cell_id = "b".into();
        let r = GateReport {
            run_id: "r".into(),
            hardware_key: "k".into(),
            store: "s".into(),
            policy: Policy::default(),
            scope: String::new(),
            confirm_run_id: None,
            over_budget: vec![],
            cells: vec![a, b],
            reruns_gpu_s: 0.0,
            reruns_gpu_s_by_cell: Default::default(),
        };
        assert_eq!(r.to_confirm(), ["b", "a"]);
    }
}
