//! `bench matrix ... --history URL`: judge every passed cell against its own history
//! ([`super::detect`]), blame the environment only where the cell's telemetry explains the
//! loss ([`super::environment`]), name what changed since the last good run
//! ([`super::suspects`]), re-run the suspect and unknown cells within a budget (on by
//! default; `--no-confirm`), and leave `history.json` in the run folder. The verdicts are
//! then the run's verdicts everywhere: the reports overlay them on the comparison
//! ([`overlay`]), so the terminal table, `summary.md`, `junit.xml`, `report.json`,
//! `report.html` and the exit code all say the same.
//!
//! **Which runs a cell is judged against** ([`Scope`]): those of the same hardware key in the
//! cell's current segment (since its last `bench baseline accept`), on the branch being
//! judged: for a pull request (`GITHUB_BASE_REF`, `CI_MERGE_REQUEST_TARGET_BRANCH_NAME`)
//! its base branch, at the merge-base or before, never its own earlier pushes; otherwise the
//! current branch. Runs judged regressed or environment are not part of the band (a
//! regression stays red every night until it is fixed or accepted), and confirming
//! re-runs (`<run-id>-confirm`) are evidence for their own run only.
//!
//! The confirmation is a value the command drives, [`Confirmation`]: the gate decides which
//! cells to re-run and with how many repeats, and judges again with what the re-runs gave;
//! who runs them is the command's business. The verdicts' types are in
//! [`super::verdicts`].

use std::collections::HashSet;
use std::path::Path;

use crate::baseline::compare::{CellStatus, Comparison, MetricComparison};
use crate::baseline::{compare, Baselines, Direction, Verdict};
use crate::results::{CellResult, Outcome, RunResults};

use super::detect::{
    judge, judge_loss, outlier_repeats, step_rel_sigma, within_run, HistoryVerdict, Judgement,
    NumericsVerdict, Observation, OutlierRepeat, Policy, OUTLIER_MIN_REL, OUTLIER_SIGMAS,
};
use super::environment::{excuse, explain, Finding};
use super::error::HistoryError;
use super::record::{context_of, CellRecord, RunRecord};
use super::store::{current_segment, History, Point};
use super::suspects::{changes, Identity};
pub use super::verdicts::{CellJudgement, EnergyJudgement, GateReport, SideBySide, Since};

/// The metric whose history decides a cell's speed verdict.
pub(crate) const METRIC: &str = "tokens_per_s";

/// The metric whose history decides a cell's energy verdict (see `metrics::energy`).
pub(crate) const ENERGY_METRIC: &str = "tokens_per_joule";

/// Relative floor of the loss band (see `detect::judge_loss`).
pub(crate) const LOSS_FLOOR_REL: f64 = 1e-3;

/// The run-id suffix of a confirming re-run (the first; later ones add `-2`, `-3`).
pub(crate) const CONFIRM_SUFFIX: &str = "-confirm";

/// The run id of the `pass`-th confirming re-run of `run_id` (from 1).
pub(crate) fn confirm_run_id(run_id: &str, pass: usize) -> String {
    if pass <= 1 {
        format!("{run_id}{CONFIRM_SUFFIX}")
    } else {
        format!("{run_id}{CONFIRM_SUFFIX}-{pass}")
    }
}

/// Whether `run_id` names a confirming re-run (evidence for its own run only).
pub(crate) fn is_confirm_run(run_id: &str) -> bool {
    if run_id.ends_with(CONFIRM_SUFFIX) {
        return true;
    }
    match run_id.rsplit_once('-') {
        Some((head, n)) => {
            !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && head.ends_with(CONFIRM_SUFFIX)
        }
        None => false,
    }
}

/// The run a confirming re-run confirms: `run_id` less its `-confirm` or `-confirm-N`
/// suffix; `None` for a run that confirms nothing.
pub(crate) fn confirmed_run(run_id: &str) -> Option<&str> {
    if !is_confirm_run(run_id) {
        return None;
    }
    let head = run_id.strip_suffix(CONFIRM_SUFFIX).unwrap_or_else(|| {
        let (head, _) = run_id.rsplit_once('-').expect("a confirm id has a pass");
        head.strip_suffix(CONFIRM_SUFFIX)
            .expect("checked by is_confirm_run")
    });
    Some(head)
}

/// The trend with each confirming re-run's repeats counted with the run it confirmed: the
/// night measured the cell 3 + 3 (+ 3) times, and every one of those repeats is evidence of
/// that night's speed, so the run's point holds them all and its value is their median; the
/// re-run's own point goes (it is no night of its own). A re-run whose run is not in the
/// trend (recorded before a store was pruned, say) is dropped as before. Runs keep their
/// order and every other field.
pub(crate) fn fold_confirms(trend: Vec<Point>) -> Vec<Point> {
    if !trend.iter().any(|p| is_confirm_run(&p.run_id)) {
        return trend;
    }
    let mut extra: std::collections::HashMap<String, Vec<f64>> = Default::default();
    for p in &trend {
        if let Some(parent) = confirmed_run(&p.run_id) {
            extra
                .entry(parent.to_string())
                .or_default()
                .extend(p.repeats());
        }
    }
    trend
        .into_iter()
        .filter(|p| !is_confirm_run(&p.run_id))
        .map(|mut p| {
            if let Some(more) = extra.remove(&p.run_id) {
                let mut all = p.repeats();
                all.extend(more.into_iter().filter(|v| v.is_finite()));
                if let Some(m) = crate::metrics::stats::median(&all) {
                    p.value = m;
                }
                p.samples = all;
            }
            p
        })
        .collect()
}

/// Which earlier runs count: the branch judged, and for a pull request only commits at its
/// merge-base or before.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Scope {
    pub branch: Option<String>,
    /// Commits reachable from the merge-base, when known (a pull request's run).
    pub ancestors: Option<HashSet<String>>,
    /// The merge-base itself (a pull request's run): every cell is measured side by side
    /// against it.
    pub merge_base: Option<String>,
    pub describe: String,
}

/// The branch a pull (merge) request targets, when this process runs for one: GitHub's
/// `GITHUB_BASE_REF`, GitLab's `CI_MERGE_REQUEST_TARGET_BRANCH_NAME`.
pub(crate) fn pull_request_base() -> Option<String> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    var("GITHUB_BASE_REF").or_else(|| var("CI_MERGE_REQUEST_TARGET_BRANCH_NAME"))
}

impl Scope {
    /// The scope of this process's run, from the CI's variables and git.
    pub(crate) fn detect() -> Scope {
        if let Some(base) = pull_request_base() {
            let base = base.trim().to_string();
            let merge_base = [format!("origin/{base}"), base.clone()]
                .iter()
                .find_map(|r| git(&["merge-base", "HEAD", r]));
            let ancestors = merge_base.as_ref().and_then(|mb| {
                git(&["rev-list", "--max-count=100000", mb])
                    .map(|list| list.lines().map(str::to_string).collect::<HashSet<_>>())
            });
            let describe = match &merge_base {
                Some(mb) => format!(
                    "runs of the base branch {base} at its merge-base {} or before",
                    &mb[..mb.len().min(7)]
                ),
                None => format!("runs of the base branch {base} (merge-base unknown)"),
            };
            return Scope {
                branch: Some(base),
                ancestors,
                merge_base,
                describe,
            };
        }
        let branch = super::record::current_branch();
        let describe = match &branch {
            Some(b) => format!("runs of branch {b}"),
            None => "runs of any branch".into(),
        };
        Scope {
            branch,
            ancestors: None,
            merge_base: None,
            describe,
        }
    }

    /// Whether an earlier run at `p` counts. Runs with no recorded branch count everywhere.
    pub(crate) fn admits(&self, p: &Point) -> bool {
        if let (Some(want), Some(b)) = (&self.branch, &p.branch) {
            if want != b {
                return false;
            }
        }
        match (&self.ancestors, &p.commit) {
            (Some(set), Some(c)) => set.contains(c),
            _ => true,
        }
    }
}

fn git(args: &[&str]) -> Option<String> {
    // Bounded in time and output (`crate::proc`), as every call of a tool is.
    crate::proc::Tool::git()
        .args(args)
        .stdout(None)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// One cell to measure side by side: at `base_commit` (A) and `head_commit` (B).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PairRequest {
    pub cell_id: String,
    pub base_commit: String,
    pub base_run_id: Option<String>,
    pub head_commit: String,
    pub screened: HistoryVerdict,
    pub screened_rel: Option<f64>,
    /// GPUs the cell holds (1 for a CPU cell).
    pub gpus: f64,
    /// Seconds one repeat of the cell took in this run.
    pub repeat_s: f64,
}

/// What a confirming re-run gave.
pub(crate) struct ConfirmOutcome {
    pub results: RunResults,
    pub interrupted: bool,
}

/// Judges `results` against `store` (every branch; `bench matrix` narrows to the branch it
/// judges), with the re-runs' results in `confirms`. The library entry tests use.
pub fn judge_run(
    store: &mut History,
    results: &RunResults,
    confirms: &[&RunResults],
    baselines: &Baselines,
    policy: &Policy,
) -> Result<GateReport, HistoryError> {
    let scope = Scope {
        describe: "runs of any branch".into(),
        ..Scope::default()
    };
    Judge {
        store,
        results,
        baselines,
        policy: *policy,
        scope: &scope,
        max_reruns: super::detect::MAX_RERUNS,
        pairs: &[],
    }
    .run(confirms)
}

/// Everything the gate knows while judging one run.
pub(crate) struct Judge<'a> {
    pub store: &'a mut History,
    pub results: &'a RunResults,
    pub baselines: &'a Baselines,
    pub policy: Policy,
    pub scope: &'a Scope,
    /// The most independent re-runs the confirmation can make.
    pub max_reruns: usize,
    /// The side-by-side pairs measured so far (their answer is their cell's verdict).
    pub pairs: &'a [SideBySide],
}

impl Judge<'_> {
    /// Judges every passed cell of the run (and, given `confirms`, the re-runs' cells).
    pub(crate) fn run(&mut self, confirms: &[&RunResults]) -> Result<GateReport, HistoryError> {
        let comparison = compare(self.results, self.baselines);
        let mut cells = Vec::new();
        for cell in self
            .results
            .cells
            .iter()
            .filter(|c| c.outcome == Outcome::Passed && c.metrics.contains_key(METRIC))
        {
            let again: Vec<&CellResult> = confirms
                .iter()
                .filter_map(|c| c.cells.iter().find(|x| x.id == cell.id))
                .collect();
            let baseline_regressed = comparison
                .cell(cell.id.as_str())
                .and_then(|c| c.metric(METRIC))
                .is_some_and(|mc| mc.verdict == Verdict::Regression);
            cells.push(self.cell(cell, &again, baseline_regressed)?);
        }
        Ok(GateReport {
            run_id: self.results.run_id.clone(),
            hardware_key: self.results.environment.hardware_key.clone(),
            store: self.store.location.clone(),
            policy: self.policy,
            scope: self.scope.describe.clone(),
            confirm_run_id: confirms.last().map(|c| c.run_id.clone()),
            over_budget: Vec::new(),
            cells,
            reruns_gpu_s: 0.0,
            reruns_gpu_s_by_cell: Default::default(),
        })
    }

    fn cell(
        &mut self,
        cell: &CellResult,
        again: &[&CellResult],
        baseline_regressed: bool,
    ) -> Result<CellJudgement, HistoryError> {
        let id = cell.id.as_str();
        let key = &self.results.environment.hardware_key;
        let m = &cell.metrics[METRIC];
        let trend = fold_confirms(self.store.trend(id, key, METRIC)?);
        let segments = self.store.segments(id, key)?;
        let scoped = self.scoped(&trend, &segments);
        // The run `bench baseline accept` started the segment with is the new normal,
        // whatever it was judged then.
        let accepted = segments.last().map(|s| s.first_run_id.as_str());
        let base = self.baseline(id, METRIC);
        // Each re-run's repeats, in order; the first that measured nothing says why.
        let mut confirm_runs: Vec<Vec<f64>> = Vec::new();
        let mut confirm_failed = None;
        for c in again {
            match (&c.outcome, c.metrics.get(METRIC)) {
                (Outcome::Passed, Some(mv)) => confirm_runs.push(mv.samples.clone()),
                (Outcome::Passed, None) => {
                    confirm_failed.get_or_insert_with(|| "it measured no tokens/s".to_string());
                }
                (o, _) => {
                    confirm_failed.get_or_insert_with(|| outcome_reason(o));
                }
            }
        }
        let confirms: Vec<&[f64]> = confirm_runs.iter().map(Vec::as_slice).collect();
        // The noise of the steps inside each repeat (see `detect::within_run`).
        let step_sigmas: Vec<f64> = cell
            .repeats
            .iter()
            .filter_map(|r| {
                let times: Vec<f64> =
                    crate::metrics::stats::measured_steps(&r.steps, cell.params.warmup)
                        .into_iter()
                        .map(|(t, _)| t)
                        .collect();
                step_rel_sigma(&times)
            })
            .collect();
        let decided = decide(
            &scoped,
            accepted,
            &Measured {
                value: m.value,
                samples: &m.samples,
                step_sigmas: &step_sigmas,
                telemetry: cell.telemetry.as_deref(),
                confirms: &confirms,
                confirm_failed: confirm_failed.is_some(),
                baseline: base,
                max_reruns: self.max_reruns,
            },
            &self.policy,
        );
        let Decided {
            mut judgement,
            outliers,
            environment,
        } = decided;
        let clean = clean_runs(&scoped, accepted);
        // The last run whose commit is known good: the base of a side-by-side pair.
        let vouched = scoped
            .iter()
            .rev()
            .find(|p| Some(p.run_id.as_str()) == accepted || vouches(p))
            .copied();
        let pairs = self.pairs.iter().find(|p| p.cell_id == id).cloned();
        if let Some(p) = &pairs {
            after_pairs(&mut judgement, p);
        } else if let Some(good) = clean.last() {
            same_code_elsewhere(&mut judgement, good, self.results);
        }
        let energy = self.energy(cell, again, &step_sigmas, &segments, environment.as_ref())?;
        let curves: Vec<Vec<f64>> = clean.iter().map(|p| p.loss_curve.clone()).collect();
        let loss = CellRecord::from_result(cell).loss_curve;
        let numerics = judge_loss(&curves, &loss, self.policy.min_history, LOSS_FLOOR_REL);
        let since = since(&scoped, self.results, judgement.verdict);
        let now = Identity {
            commit: self.results.environment.git_commit.clone(),
            host: self.results.environment.host.clone(),
            switches: self.results.environment.switches.clone(),
            versions: RunRecord::from_results(self.results, None, None).versions,
            context: context_of(cell),
        };
        let shift = |v: HistoryVerdict| {
            matches!(
                v,
                HistoryVerdict::Regressed
                    | HistoryVerdict::Improved
                    | HistoryVerdict::Suspect
                    | HistoryVerdict::Environment
            )
        };
        let named = shift(judgement.verdict)
            || energy.as_ref().is_some_and(|e| shift(e.verdict()))
            || matches!(numerics, NumericsVerdict::Changed { .. });
        // The last good run: the one before the streak, else the latest run that vouches
        // for its commit.
        let good = since
            .as_ref()
            .and_then(|s| s.last_good_run_id.as_ref())
            .and_then(|g| scoped.iter().find(|p| &p.run_id == g).copied())
            .or(vouched);
        let changes = match (named, good) {
            (true, Some(g)) => changes(&Identity::of_point(g), &now),
            _ => Vec::new(),
        };
        let mut j = CellJudgement {
            cell_id: id.to_string(),
            metric: METRIC.to_string(),
            value: m.value,
            samples: m.samples.clone(),
            outliers,
            judgement,
            confirm_value: confirm_runs
                .last()
                .and_then(|c| crate::metrics::stats::median(c)),
            confirm_samples: confirm_runs.concat(),
            confirm_values: if confirm_runs.len() > 1 {
                confirm_runs
                    .iter()
                    .filter_map(|c| crate::metrics::stats::median(c))
                    .collect()
            } else {
                Vec::new()
            },
            confirm_failed,
            numerics,
            since,
            baseline_regressed,
            environment,
            changes,
            line: String::new(),
            bisect: None,
            energy,
            last_good_run_id: good.map(|g| g.run_id.clone()),
            last_good_commit: good.and_then(|g| g.commit.clone()),
            pairs,
            only_code_changed: good.is_some_and(|g| {
                super::suspects::changes(&Identity::of_point(g), &now)
                    .iter()
                    .all(|c| c.what == "commit" || c.what == "host")
            }),
            open_regression: open_regression(&scoped, accepted),
        };
        j.bisect = bisect_command(&j, self.results, &self.store.location);
        j.line = super::words::verdict_line(&j);
        Ok(j)
    }
}

impl Judge<'_> {
    /// The earlier runs of `trend` the cell is judged against: those of the branch judged,
    /// in the cell's current segment, started before this run; never this run, never a
    /// confirming re-run.
    fn scoped<'p>(&self, trend: &'p [Point], segments: &[super::store::Segment]) -> Vec<&'p Point> {
        let run_id = &self.results.run_id;
        current_segment(trend, segments)
            .iter()
            .filter(|p| &p.run_id != run_id && !is_confirm_run(&p.run_id))
            // A bisection's probes and the side-by-side pairs measure commits, not nights.
            .filter(|p| p.branch.as_deref() != Some(super::record::PROBE_BRANCH))
            .filter(|p| p.started_at <= self.results.started_at)
            .filter(|p| self.scope.admits(p))
            .collect()
    }

    /// The stored baseline of `metric` for cell `id`, with its tolerance.
    fn baseline(&self, id: &str, metric: &str) -> Option<(f64, f64)> {
        self.baselines
            .cell(id)
            .and_then(|b| b.metrics.get(metric))
            .map(|b| (b.value, b.effective_tolerance(metric)))
    }

    /// The verdict on the cell's energy ([`ENERGY_METRIC`]), judged as its speed is: the
    /// band of its own earlier runs' tokens/J (the runs that read the GPUs' power), the
    /// repeats' test, confirmation by the same re-runs, drift past the baseline. `None` when
    /// this run did not read the cell's power. A loss the environment explains for the
    /// speed (`environment`: a foreign process on the GPU, a lower clock set from outside,
    /// a busy host) is blamed on it for the energy too: a foreign process's power is in the
    /// board's reading, and a throttled or disturbed run is no measure of the code's
    /// efficiency.
    fn energy(
        &mut self,
        cell: &CellResult,
        again: &[&CellResult],
        step_sigmas: &[f64],
        segments: &[super::store::Segment],
        environment: Option<&Finding>,
    ) -> Result<Option<EnergyJudgement>, HistoryError> {
        let Some(m) = cell.metrics.get(ENERGY_METRIC) else {
            return Ok(None);
        };
        let id = cell.id.as_str();
        let trend = self
            .store
            .trend(id, &self.results.environment.hardware_key, ENERGY_METRIC)?;
        let trend = fold_confirms(trend);
        let scoped = self.scoped(&trend, segments);
        let accepted = segments.last().map(|s| s.first_run_id.as_str());
        // The re-runs that read the power; one that did not is no evidence either way, so
        // a suspect without one stays a suspect.
        let confirm_runs: Vec<Vec<f64>> = again
            .iter()
            .filter(|c| c.outcome == Outcome::Passed)
            .filter_map(|c| c.metrics.get(ENERGY_METRIC).map(|mv| mv.samples.clone()))
            .collect();
        let confirms: Vec<&[f64]> = confirm_runs.iter().map(Vec::as_slice).collect();
        let confirm_failed = again.iter().any(|c| c.outcome != Outcome::Passed);
        let (mut judgement, _) = band_verdict(
            &scoped,
            accepted,
            &Measured {
                value: m.value,
                samples: &m.samples,
                // Tokens/J carries the step time's noise (and the power's, which its
                // repeats show); the steps' noise is the least of it.
                step_sigmas,
                telemetry: cell.telemetry.as_deref(),
                confirms: &confirms,
                confirm_failed,
                baseline: self.baseline(id, ENERGY_METRIC),
                max_reruns: self.max_reruns,
            },
            &self.policy.for_metric(ENERGY_METRIC),
        );
        excuse(&mut judgement, environment);
        Ok(Some(EnergyJudgement {
            metric: ENERGY_METRIC.to_string(),
            value: m.value,
            samples: m.samples.clone(),
            judgement,
            confirm_value: confirm_runs
                .last()
                .and_then(|c| crate::metrics::stats::median(c)),
        }))
    }
}

/// One measurement of a cell, as the gate (and the sequence study) judges it.
pub(crate) struct Measured<'a> {
    pub value: f64,
    /// The repeats' values.
    pub samples: &'a [f64],
    /// Each repeat's relative noise of its median step (`detect::step_rel_sigma`).
    pub step_sigmas: &'a [f64],
    pub telemetry: Option<&'a crate::telemetry::CellTelemetry>,
    /// The confirming re-runs' repeats, in order (same job, same commit and switches).
    pub confirms: &'a [&'a [f64]],
    /// A re-run was asked for and produced no measurement.
    pub confirm_failed: bool,
    /// The stored baseline and its tolerance.
    pub baseline: Option<(f64, f64)>,
    /// The most independent re-runs the caller can make (`ConfirmRunner::max_passes`).
    pub max_reruns: usize,
}

/// What [`decide`] found.
pub(crate) struct Decided {
    pub judgement: Judgement,
    pub outliers: Vec<OutlierRepeat>,
    pub environment: Option<Finding>,
}

/// The earlier runs of `scoped` that form a band: those that showed the cell good
/// ([`shown_good`]), and the run `accepted` started its segment with. A run judged
/// regressed or environment stays out (a regression stays red until fixed or accepted), and
/// so does one left suspect or unknown: a night whose breach was never settled may be the
/// first night of a regression, and counting it as clean would pull the band towards it
/// (seen: a 4.3% slowdown left suspect passed again the next night, its slow repeats among
/// the "earlier" ones).
pub(crate) fn clean_runs<'a>(scoped: &[&'a Point], accepted: Option<&str>) -> Vec<&'a Point> {
    scoped
        .iter()
        .copied()
        .filter(|p| Some(p.run_id.as_str()) == accepted || shown_good(p))
        .collect()
}

/// The verdict once the side-by-side pairs answered ([`super::paired`]): the pairs decide.
/// Slower than the last good commit: regressed, whatever the environment (a busy host slows
/// both sides of a pair alike, so it cannot explain a difference between them). The same
/// (or faster) where the history saw a drop: environment, the host or the night ran the cell
/// below its history. An unanswered pair leaves a breach suspect (unconfirmed), an
/// environment verdict standing and an unknown cell unknown.
pub(crate) fn after_pairs(judgement: &mut Judgement, p: &SideBySide) {
    use super::paired::Answer;
    let Some(r) = p.measured() else {
        return;
    };
    let drop = matches!(
        p.screened,
        HistoryVerdict::Regressed | HistoryVerdict::Suspect | HistoryVerdict::Environment
    ) && p.screened_rel.is_some_and(|x| x < 0.0);
    judgement.verdict = match (r.answer, drop) {
        (Answer::Different, _) if r.change_rel < 0.0 => HistoryVerdict::Regressed,
        (Answer::Different | Answer::Same, true) => HistoryVerdict::Environment,
        (Answer::Different | Answer::Same, false) => HistoryVerdict::Unchanged,
        (Answer::Unknown, true) if p.screened == HistoryVerdict::Environment => {
            HistoryVerdict::Environment
        }
        (Answer::Unknown, true) => HistoryVerdict::Suspect,
        (Answer::Unknown, false) => p.screened,
    };
}

/// A drop at the very code, switches and versions of the last good run, on another host:
/// nothing of the cell's own changed, so there is nothing to measure side by side and
/// nothing to bisect; the host runs the cell below its history (`environment`). A drop on
/// the same host with nothing changed stays as judged.
fn same_code_elsewhere(judgement: &mut Judgement, good: &Point, results: &RunResults) {
    let env = &results.environment;
    let same_code = good.commit.is_some() && good.commit == env.git_commit && !env.git_dirty;
    let drop = matches!(
        judgement.verdict,
        HistoryVerdict::Regressed | HistoryVerdict::Suspect
    ) && judgement.rel_change.is_some_and(|r| r < 0.0);
    if !(same_code && drop && good.host != env.host && good.switches == env.switches) {
        return;
    }
    let versions = RunRecord::from_results(results, None, None).versions;
    if versions == good.versions {
        judgement.verdict = HistoryVerdict::Environment;
    }
}

/// The shipped speed verdict of one measurement against the earlier runs of its scope
/// (oldest first): the band and the repeats' test ([`judge`]), confirmation by the re-runs
/// (never by an earlier night), the within-run noise capped by the history's,
/// the outlier repeats, and the environment's excuse. Pure: the gate calls it with the
/// store's runs, `bench history study` with simulated nights, so the study measures what
/// users get.
pub(crate) fn decide(
    scoped: &[&Point],
    accepted: Option<&str>,
    now: &Measured<'_>,
    policy: &Policy,
) -> Decided {
    let (mut judgement, outliers) = band_verdict(scoped, accepted, now, policy);
    let clean = clean_runs(scoped, accepted);
    let lookback = &clean[clean.len().saturating_sub(policy.lookback)..];
    let clean_tele: Vec<(f64, &crate::telemetry::CellTelemetry)> = lookback
        .iter()
        .filter_map(|p| p.telemetry.as_ref().map(|t| (p.value, t)))
        .collect();
    let rel = judgement.rel_change.unwrap_or(0.0);
    let environment = explain(now.telemetry, now.value, &clean_tele, rel);
    excuse(&mut judgement, environment.as_ref());
    Decided {
        judgement,
        outliers,
        environment,
    }
}

/// [`decide`] without the environment: the band and the repeats' test of one measurement
/// of a metric where higher is better, confirmed by the re-runs, and
/// its outlier repeats. The energy verdict is this, with the speed's environment finding.
pub(crate) fn band_verdict(
    scoped: &[&Point],
    accepted: Option<&str>,
    now: &Measured<'_>,
    policy: &Policy,
) -> (Judgement, Vec<OutlierRepeat>) {
    let clean = clean_runs(scoped, accepted);
    let history: Vec<f64> = clean.iter().map(|p| p.value).collect();
    let lookback = &clean[clean.len().saturating_sub(policy.lookback)..];
    let history_samples: Vec<f64> = lookback.iter().flat_map(|p| p.repeats()).collect();
    // The noise the lookback's runs showed inside themselves caps this run's.
    let lookback_within: Vec<f64> = lookback
        .iter()
        .filter(|p| p.samples.len() >= 3)
        .map(|p| within_run(&p.samples, &[]))
        .collect();
    let history_within_rel = crate::metrics::stats::median(&lookback_within);
    let outlier_floor = OUTLIER_MIN_REL.max(OUTLIER_SIGMAS * history_within_rel.unwrap_or(0.0));
    let outliers = outlier_repeats(now.samples, outlier_floor);
    let obs = Observation {
        history: &history,
        history_samples: &history_samples,
        history_within_rel,
        value: now.value,
        within_rel: within_run(now.samples, now.step_sigmas),
        samples: now.samples,
        confirms: now.confirms,
        baseline: now.baseline,
        max_reruns: now.max_reruns,
    };
    let mut judgement = judge(&obs, Direction::Higher, policy);
    // A suspect whose re-run could not measure stays failed: a confirmation that cannot
    // run must never pass a cell.
    if judgement.verdict == HistoryVerdict::Suspect && now.confirm_failed {
        judgement.verdict = HistoryVerdict::Regressed;
    }
    (judgement, outliers)
}

fn outcome_reason(o: &Outcome) -> String {
    match o {
        Outcome::Passed => "passed".into(),
        Outcome::Failed { reason } => format!("failed: {reason}"),
        Outcome::TimedOut { reason } => format!("timed out: {reason}"),
        Outcome::Skipped { reason } => format!("did not run: {reason}"),
    }
}

/// Whether a run's stored verdict showed the cell good at its commit: judged inside its
/// band (or improved), or recorded before verdicts existed.
fn shown_good(p: &Point) -> bool {
    matches!(
        p.verdict.as_deref(),
        None | Some("unchanged" | "improved" | "insufficient_history")
    )
}

/// The stored word of an environment verdict whose pairs found the code the same as at its
/// last good commit: the run's values stay out of every band (the host or the night
/// disturbed them), but its commit is vouched for as good, so a later regression's range
/// starts there (a revert night on a disturbed host must not send a later bisection back
/// across the slow commit it reverted).
pub(crate) const CLEARED: &str = "cleared";

/// Whether a run vouches for its commit: it showed the cell good ([`shown_good`]) or its
/// pairs cleared the code ([`CLEARED`]).
fn vouches(p: &Point) -> bool {
    shown_good(p) || p.verdict.as_deref() == Some(CLEARED)
}

/// Whether the latest settled run of `scoped` is a regression: walking back, a run judged
/// `regressed` comes before any run that vouches for its commit ([`vouches`]) or that
/// `accepted` started the segment with. Runs left unknown, suspect or environment settle
/// nothing and are passed over. The next night at the same slow code must be judged
/// regressed again, yet its screen compares it with the few clean nights before the
/// regression, where a 2% slowdown reads `unknown` (seen on an H200: -1.0% against 3
/// repeats, p=0.10, then stored as clean); measured side by side against the last good
/// commit, it reads -1.9% (5 pairs: different).
pub(crate) fn open_regression(scoped: &[&Point], accepted: Option<&str>) -> bool {
    scoped
        .iter()
        .rev()
        .find(|p| {
            Some(p.run_id.as_str()) == accepted
                || vouches(p)
                || p.verdict.as_deref() == Some("regressed")
        })
        .is_some_and(|p| {
            Some(p.run_id.as_str()) != accepted && p.verdict.as_deref() == Some("regressed")
        })
}

/// For a regression or improvement: the last run that showed the cell good (the latest
/// one, so the range never spans a commit a clean run already vouched for), and the first
/// run after it (this run when it is the next). For an improvement, the run just before.
fn since(scoped: &[&Point], results: &RunResults, verdict: HistoryVerdict) -> Option<Since> {
    if !matches!(
        verdict,
        HistoryVerdict::Regressed | HistoryVerdict::Improved
    ) {
        return None;
    }
    let mut start = scoped.len();
    if verdict == HistoryVerdict::Regressed {
        // Back over the runs since the last good one (regressed, suspect, unknown,
        // environment): the shift may have begun at any of them.
        while start > 0 && !vouches(scoped[start - 1]) {
            start -= 1;
        }
    }
    let good = start
        .checked_sub(1)
        .map(|i| scoped[i])
        .filter(|p| verdict != HistoryVerdict::Regressed || vouches(p));
    let (run_id, commit, started_at) = match scoped.get(start) {
        Some(p) => (p.run_id.clone(), p.commit.clone(), p.started_at.clone()),
        None => (
            results.run_id.clone(),
            results.environment.git_commit.clone(),
            results.started_at.clone(),
        ),
    };
    Some(Since {
        run_id,
        commit,
        started_at,
        last_good_run_id: good.map(|p| p.run_id.clone()),
        last_good_commit: good.and_then(|p| p.commit.clone()),
    })
}

/// `bench bisect CELL --good G --bad B --matrix FILE --history STORE` for a regression
/// between two different known commits.
fn bisect_command(j: &CellJudgement, results: &RunResults, store: &str) -> Option<String> {
    if j.verdict() != HistoryVerdict::Regressed {
        return None;
    }
    let s = j.since.as_ref()?;
    let good = s.last_good_commit.as_ref()?;
    let bad = results.environment.git_commit.as_ref()?;
    if good == bad {
        return None;
    }
    let short = |c: &str| c.chars().take(12).collect::<String>();
    // `bench bisect` reads the matrix in each probed commit's tree, so it takes a path
    // inside the checkout: an absolute one under the current folder is made relative.
    let matrix = std::env::current_dir()
        .ok()
        .and_then(|cwd| results.matrix.strip_prefix(cwd).ok().map(Path::to_path_buf))
        .unwrap_or_else(|| results.matrix.clone());
    Some(format!(
        "bench bisect {} --good {} --bad {} --matrix {} --history {}",
        j.cell_id,
        short(good),
        short(bad),
        matrix.display(),
        store
    ))
}

/// Records `results` (with its run telemetry) in `store`, with `branch`.
pub fn record(
    store: &mut History,
    results: &RunResults,
    telemetry: Option<crate::telemetry::Telemetry>,
) -> Result<(), HistoryError> {
    let rec = RunRecord::from_results(results, super::record::current_branch(), telemetry);
    store.record_run(&rec)
}

/// Whether an unknown cell's estimate shows a shift past twice the floor (a cell with too
/// few earlier repeats to be told the same or different, whose repeats still sit apart).
/// Twice: at the floor itself the nightly noise alone flags a cell on most second nights
/// (measured on an H200: a clean second night at -1.0% cost 2.3x the run in pairs), while
/// a slowdown worth failing a job shows well past it.
fn shows_shift(c: &CellJudgement, floor: f64) -> bool {
    c.judgement
        .rel_change
        // A change that is not a number shows no shift to trust: treated as a shift.
        .is_none_or(|r| r.is_nan() || r.abs() >= 2.0 * floor)
}

/// The verdict words a run's cells got, for the store (so later runs leave regressed,
/// environment, suspect and unknown runs out of their band, and know a regression's
/// streak). An unknown cell whose estimate shows no shift ([`shows_shift`]) is stored as
/// `insufficient_history`: the short history, not the run, left it undecided, and the night
/// counts as clean (otherwise a new matrix's nights, each unknown against too few earlier
/// repeats, would never grow a history to be judged by).
fn verdict_words(report: &GateReport) -> Vec<(String, String)> {
    let floor = report.policy.two_sample.floor_rel;
    report
        .cells
        .iter()
        .map(|c| {
            let word = if c.fails_run() && c.verdict() != HistoryVerdict::Regressed {
                // Changed numerics or a baseline regression: the run is not clean either.
                "regressed"
            } else if c.verdict() == HistoryVerdict::Unknown
                && !shows_shift(c, floor)
                && !c.open_regression
            {
                // The speed decides which runs form a band; an energy reading still unknown
                // at an unchanged speed is no reason to keep the night out of it.
                HistoryVerdict::InsufficientHistory.as_str()
            } else if c.verdict() == HistoryVerdict::Environment
                && c.pairs.as_ref().is_some_and(|p| {
                    p.result
                        .is_some_and(|r| r.answer == super::paired::Answer::Same)
                })
            {
                CLEARED
            } else {
                c.verdict().as_str()
            };
            (c.cell_id.clone(), word.replace(' ', "_"))
        })
        .collect()
}

/// The whole `--history` step of a command after its cells ran, as a value the command
/// layer drives: [`Confirmation::start`] records the run and judges it,
/// [`Confirmation::next_rerun`] says which cells the verdicts want re-run (and in which
/// pass), the command asks the runner for them and hands the results back through
/// [`Confirmation::take`], and [`Confirmation::finish`] records the verdicts and writes
/// `history.json`. The judge never calls the runner: re-running is the command's, judging
/// again is the judge's.
pub(crate) struct Confirmation<'a> {
    store: &'a mut History,
    run_dir: &'a Path,
    results: &'a RunResults,
    baselines: Baselines,
    scope: Scope,
    policy: Policy,
    /// How many independent re-runs the command can give a cell (0: no confirmation).
    max_passes: usize,
    budget_gpu_s: Option<f64>,
    report: GateReport,
    confirms: Vec<RunResults>,
    /// The side-by-side pairs measured so far.
    pairs: Vec<SideBySide>,
    spent: f64,
    over: Vec<String>,
    pass: usize,
    interrupted: bool,
    done: bool,
}

impl<'a> Confirmation<'a> {
    /// Saves the run's telemetry, records the run's row and judges it. `max_passes` is how
    /// many independent re-runs the command can give (`detect::MAX_RERUNS` for a matrix, 1
    /// for an ingested log's later half, 0 for none); `budget_gpu_s` bounds them.
    pub(crate) fn start(
        store: &'a mut History,
        run_dir: &'a Path,
        results: &'a RunResults,
        telemetry: Option<crate::telemetry::Telemetry>,
        baselines_dir: &Path,
        max_passes: usize,
        budget_gpu_s: Option<f64>,
    ) -> Result<Confirmation<'a>, crate::error::CliError> {
        let policy = Policy::default();
        let baselines = Baselines::load_for(baselines_dir, &results.environment.hardware_key)?;
        crate::telemetry::save(run_dir, &telemetry).map_err(|e| {
            crate::error::CliError::internal(miette::miette!(
                "{}: {e}",
                run_dir.join(crate::telemetry::FILE).display()
            ))
        })?;
        // Every cell is in the store already (recorded as it finished); the run's row gets
        // its end time and telemetry now, before judging, which never counts this run.
        record(store, results, telemetry)?;
        let scope = Scope::detect();
        let report = Judge {
            store: &mut *store,
            results,
            baselines: &baselines,
            policy,
            scope: &scope,
            max_reruns: reruns_known(max_passes),
            pairs: &[],
        }
        .run(&[])?;
        Ok(Confirmation {
            store,
            run_dir,
            results,
            baselines,
            scope,
            policy,
            max_passes,
            budget_gpu_s,
            report,
            confirms: Vec::new(),
            pairs: Vec::new(),
            spent: 0.0,
            over: Vec::new(),
            pass: 0,
            interrupted: false,
            done: max_passes == 0,
        })
    }

    fn judge(&mut self, confirms: &[&RunResults]) -> Result<GateReport, HistoryError> {
        Judge {
            store: self.store,
            results: self.results,
            baselines: &self.baselines,
            policy: self.policy,
            scope: &self.scope,
            max_reruns: reruns_known(self.max_passes),
            pairs: &self.pairs,
        }
        .run(confirms)
    }

    /// Adds `gpu_s` to the budget (the command's default makes room for one cell's pairs).
    pub(crate) fn raise_budget(&mut self, gpu_s: f64) {
        if let Some(b) = &mut self.budget_gpu_s {
            *b += gpu_s.max(0.0);
        }
    }

    /// GPU-seconds the confirmation may still spend (`None`: no limit).
    pub(crate) fn budget_left(&self) -> Option<f64> {
        self.budget_gpu_s.map(|b| (b - self.spent).max(0.0))
    }

    /// The cells to measure side by side, in order of need: breaches (regressed, suspect)
    /// first, the largest drop first; then drops the environment explained (the pairs
    /// check the excuse); then unknown cells. Only a cell whose last good run's commit is
    /// known and differs from this run's clean commit: with the same code on both sides a
    /// pair has nothing to compare. Empty without confirmation (`--no-confirm`).
    pub(crate) fn pair_requests(&self) -> Vec<PairRequest> {
        if self.max_passes == 0 || self.interrupted {
            return Vec::new();
        }
        let env = &self.results.environment;
        let Some(head) = env.git_commit.clone().filter(|_| !env.git_dirty) else {
            return Vec::new();
        };
        // A pull request's run measures every cell against its merge-base: the change is
        // the pull request's own, and no other host's night is its reference.
        let merge_base = self.scope.merge_base.as_ref();
        let floor = self.policy.two_sample.floor_rel;
        let need = |c: &CellJudgement| -> Option<u8> {
            let drop = c.judgement.rel_change.is_some_and(|r| r < 0.0);
            match c.verdict() {
                HistoryVerdict::Regressed | HistoryVerdict::Suspect => Some(0),
                // A regression not yet fixed, which the screen could not clear: the pairs
                // say whether this night still has it (the same code again) or not (a
                // revert). A screen that finds the night the same as the clean nights
                // before the regression closes it without pairs (a revert night on a
                // 2-core host spent the whole budget on pairs that could not tell).
                v if c.open_regression && v != HistoryVerdict::Unchanged => Some(0),
                // Too few repeats to tell, but a shift past the floor: as good as a breach.
                HistoryVerdict::Unknown if shows_shift(c, floor) => Some(1),
                HistoryVerdict::Environment if drop => Some(2),
                _ if merge_base.is_some() => Some(3),
                // An unknown cell that shows no shift waits for more nights: the first
                // judged nights of a new matrix are mostly such, and measuring them side by
                // side would cost a multiple of the run.
                _ => None,
            }
        };
        let mut wanted: Vec<(u8, f64, PairRequest)> = self
            .report
            .cells
            .iter()
            .filter(|c| !self.pairs.iter().any(|p| p.cell_id == c.cell_id))
            // A pull request's switches are its own: the merge-base is measured with them.
            .filter(|c| c.only_code_changed || merge_base.is_some())
            .filter_map(|c| {
                let rank = need(c)?;
                let base = merge_base
                    .or(c.last_good_commit.as_ref())
                    .cloned()
                    .filter(|b| b != &head)?;
                let cell = self
                    .results
                    .cells
                    .iter()
                    .find(|x| x.id.as_str() == c.cell_id)?;
                let repeats = f64::from(cell.params.repeats.max(1));
                Some((
                    rank,
                    c.judgement.rel_change.unwrap_or(0.0),
                    PairRequest {
                        cell_id: c.cell_id.clone(),
                        base_commit: base,
                        base_run_id: if merge_base.is_some() {
                            None
                        } else {
                            c.last_good_run_id.clone()
                        },
                        head_commit: head.clone(),
                        screened: c.verdict(),
                        screened_rel: c.judgement.rel_change,
                        gpus: f64::from(cell.gpus()),
                        repeat_s: cell.duration_s / repeats,
                    },
                ))
            })
            .collect();
        wanted.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        wanted.into_iter().map(|(_, _, r)| r).collect()
    }

    /// What the side-by-side measurement of one cell gave: its cost counts against the
    /// budget, and the cell is judged again with it (the pairs' answer is its verdict).
    pub(crate) fn take_pairs(&mut self, p: SideBySide) -> Result<(), crate::error::CliError> {
        self.spent += p.gpu_s;
        let id = p.cell_id.clone();
        self.pairs.retain(|x| x.cell_id != id);
        self.pairs.push(p);
        let confirms = std::mem::take(&mut self.confirms);
        let all: Vec<&RunResults> = confirms.iter().collect();
        let rejudged = self.judge(&all);
        self.confirms = confirms;
        if let Some(c) = rejudged?.cells.into_iter().find(|c| c.cell_id == id) {
            eprintln!("history: {id}: {}", crate::sanitize::clean(&c.line));
            if let Some(slot) = self.report.cells.iter_mut().find(|x| x.cell_id == id) {
                *slot = c;
            }
        }
        Ok(())
    }

    /// Marks the run interrupted (a pair's repeat was stopped by Ctrl-C or SIGTERM).
    pub(crate) fn interrupt(&mut self) {
        self.interrupted = true;
    }

    /// The next pass's cells to re-run, each with the repeats it needs, or `None` when the
    /// confirmation is over: pass after pass, the suspects (and, in the first pass, the
    /// unknown cells) until each has the re-runs its breach needs (`detect::reruns_needed`),
    /// one re-run clears it, the command has no more independent re-runs to give, a re-run
    /// was interrupted, or the budget is spent.
    pub(crate) fn next_rerun(&mut self) -> Option<(usize, Vec<(String, u32)>)> {
        if self.done || self.interrupted || self.pass >= self.max_passes {
            return None;
        }
        let pass = self.pass + 1;
        let wanted: Vec<String> = self
            .report
            .to_confirm()
            .into_iter()
            .filter(|id| {
                self.report
                    .cell(id)
                    .is_some_and(|c| c.wants_rerun(pass - 1))
            })
            // Re-runs are the fallback for a breach the pairs could not measure (no commit to
            // compare with, a commit missing, no recipe for a built-in cell, a failed setup):
            // a cell the pairs measured has their answer (or stays unconfirmed), and an
            // unknown cell waits for more nights rather than doubling its repeats (a first
            // judged night cost 2.9x a plain run that way).
            .filter(|id| {
                self.report
                    .cell(id)
                    .is_some_and(|c| c.has_verdict(HistoryVerdict::Suspect))
            })
            .filter(|id| {
                !self
                    .pairs
                    .iter()
                    .any(|p| &p.cell_id == id && p.measured().is_some())
            })
            .collect();
        if wanted.is_empty() {
            self.done = true;
            return None;
        }
        let left = self.budget_gpu_s.map(|b| b - self.spent);
        let (chosen, out) = within_budget(&wanted, &self.report, self.results, left);
        let cost: f64 = chosen.iter().map(|c| c.gpu_s).sum();
        self.spent += cost;
        self.report.reruns_gpu_s += cost;
        for c in &chosen {
            *self
                .report
                .reruns_gpu_s_by_cell
                .entry(c.cell_id.clone())
                .or_default() += c.gpu_s;
        }
        let chosen: Vec<(String, u32)> =
            chosen.into_iter().map(|c| (c.cell_id, c.repeats)).collect();
        for id in out {
            if !self.over.contains(&id) {
                self.over.push(id);
            }
        }
        if chosen.is_empty() {
            self.done = true;
            return None;
        }
        self.pass = pass;
        eprintln!(
            "history: re-running {} cell(s) to confirm{}: {}",
            chosen.len(),
            if pass > 1 {
                format!(" (re-run {pass}: their breach needs more than one)")
            } else {
                String::new()
            },
            chosen
                .iter()
                .map(|(c, _)| c.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        Some((pass, chosen))
    }

    /// What the re-run of `chosen` (the cells [`Self::next_rerun`] gave) produced: its
    /// results are recorded and every cell it re-ran is judged again with all the re-runs so
    /// far. A re-run that could not start leaves every suspect regressed, with the reason.
    pub(crate) fn take(
        &mut self,
        chosen: &[(String, u32)],
        outcome: Result<ConfirmOutcome, crate::error::CliError>,
    ) -> Result<(), crate::error::CliError> {
        match outcome {
            Ok(confirm) => {
                self.interrupted = confirm.interrupted;
                record(self.store, &confirm.results, None)?;
                self.confirms.push(confirm.results);
                let confirms = std::mem::take(&mut self.confirms);
                let all: Vec<&RunResults> = confirms.iter().collect();
                let rejudged = self.judge(&all);
                self.confirms = confirms;
                // Only the re-run cells take the new verdict.
                for c in rejudged?.cells {
                    if chosen.iter().any(|(id, _)| id == &c.cell_id) {
                        if let Some(slot) = self
                            .report
                            .cells
                            .iter_mut()
                            .find(|x| x.cell_id == c.cell_id)
                        {
                            *slot = c;
                        }
                    }
                }
                self.report.confirm_run_id = self.confirms.last().map(|c| c.run_id.clone());
            }
            Err(e) => {
                let e = e.report();
                // A confirmation that cannot run leaves every suspect failed.
                eprintln!("history: the confirming re-run failed: {e}");
                for c in self
                    .report
                    .cells
                    .iter_mut()
                    .filter(|c| c.has_verdict(HistoryVerdict::Suspect))
                {
                    if c.verdict() == HistoryVerdict::Suspect {
                        c.judgement.verdict = HistoryVerdict::Regressed;
                    }
                    if let Some(e) = c
                        .energy
                        .as_mut()
                        .filter(|e| e.verdict() == HistoryVerdict::Suspect)
                    {
                        e.judgement.verdict = HistoryVerdict::Regressed;
                    }
                    c.confirm_failed = Some(format!("the re-run could not start: {e}"));
                    c.line = super::words::verdict_line(c);
                }
                self.done = true;
            }
        }
        Ok(())
    }

    /// Records the verdicts (on the run and every confirming run), writes `history.json`
    /// into the run folder, and returns the report and whether a re-run was interrupted.
    pub(crate) fn finish(mut self) -> Result<(GateReport, bool), crate::error::CliError> {
        if !self.over.is_empty() {
            eprintln!(
                "history: confirmation budget reached; not re-run: {}",
                self.over.join(", ")
            );
        }
        let words = verdict_words(&self.report);
        for c in &self.confirms {
            self.store.set_verdicts(&c.run_id, &words)?;
        }
        // Only cells still waiting for a re-run are over the budget.
        let report = &self.report;
        self.over
            .retain(|id| report.cell(id).is_some_and(CellJudgement::awaits_rerun));
        self.report.over_budget = std::mem::take(&mut self.over);
        self.store
            .set_verdicts(&self.results.run_id, &verdict_words(&self.report))?;
        let json = serde_json::to_vec_pretty(&self.report)
            .map_err(|e| crate::error::CliError::internal(miette::miette!("{e}")))?;
        let path = self.run_dir.join(GateReport::FILE);
        crate::atomic::write(&path, &json).map_err(|e| {
            crate::error::CliError::internal(miette::miette!("{}: {e}", path.display()))
        })?;
        Ok((self.report, self.interrupted))
    }
}

/// The most re-runs a verdict may count on: what the command can give, or, without any, as
/// many as a breach can ask for (the verdict then says how many it would need).
fn reruns_known(max_passes: usize) -> usize {
    if max_passes == 0 {
        super::detect::MAX_RERUNS
    } else {
        max_passes
    }
}

/// One cell [`within_budget`] chose to re-run: with how many repeats, at what cost.
struct Rerun {
    cell_id: String,
    repeats: u32,
    gpu_s: f64,
}

/// The cells to re-run within `budget` GPU-seconds (each costs what it took in this run,
/// times its GPUs; an unknown cell is re-run with twice its repeats, since its test asked
/// for more), in the order given, each with its cost; and those left out.
fn within_budget(
    wanted: &[String],
    report: &GateReport,
    results: &RunResults,
    budget: Option<f64>,
) -> (Vec<Rerun>, Vec<String>) {
    let mut spent = 0.0;
    let (mut chosen, mut over) = (Vec::new(), Vec::new());
    for id in wanted {
        let Some(cell) = results.cells.iter().find(|c| c.id.as_str() == id) else {
            continue;
        };
        let unknown = report
            .cell(id)
            .is_some_and(|c| c.has_verdict(HistoryVerdict::Unknown));
        let repeats = if unknown {
            cell.params.repeats.max(1) * 2
        } else {
            cell.params.repeats.max(1)
        };
        let per_repeat = cell.duration_s / f64::from(cell.params.repeats.max(1));
        let cost = per_repeat * f64::from(repeats) * f64::from(cell.gpus());
        if budget.is_some_and(|b| !fits(spent + cost, b)) {
            over.push(id.clone());
            continue;
        }
        spent += cost;
        chosen.push(Rerun {
            cell_id: id.clone(),
            repeats,
            gpu_s: cost,
        });
    }
    (chosen, over)
}

/// Whether `seconds` of re-runs fit a `budget` of GPU-seconds. The default budget is a whole
/// multiple of what the cells took, so re-runs that fill it exactly must fit; a re-run's cost
/// is its repeats' share of that time (`duration / repeats x repeats`), which can come out
/// one rounding step above it (seen: a cell of 1.878 s re-run three times against a budget
/// of three times its duration was refused its third re-run, and stayed suspect).
fn fits(seconds: f64, budget: f64) -> bool {
    seconds <= budget * (1.0 + 1e-9)
}

/// The history's verdicts laid over a run's comparison with its baselines, so every report
/// and the exit code say what the history says: a judged cell's status is its verdict, its
/// reason the verdict line, and its tokens/s row the history's numbers (centre, change,
/// band); the other speed metrics' baseline verdicts are set aside (the history decides
/// speed). Its tokens/J and kWh per 1T tokens rows take the energy verdict the same way,
/// once the energy has a history to be judged by. Peak memory keeps the baseline file's
/// verdict, which the history does not judge. Cells with no history at all keep the
/// baseline's verdict.
pub fn overlay(cmp: &mut Comparison, report: &GateReport) {
    cmp.history_scope = Some(report.scope.clone());
    for j in &report.cells {
        let Some(cell) = cmp.cells.iter_mut().find(|c| c.id == j.cell_id) else {
            continue;
        };
        let numerics = matches!(j.numerics, NumericsVerdict::Changed { .. });
        if j.verdict() == HistoryVerdict::InsufficientHistory && !numerics {
            if !j.line.is_empty() && cell.reason.is_none() {
                cell.reason = Some(j.line.clone());
            }
            continue;
        }
        let row_verdict = |v: HistoryVerdict| match v {
            HistoryVerdict::Regressed => Verdict::Regression,
            HistoryVerdict::Improved => Verdict::Improvement,
            _ => Verdict::Unchanged,
        };
        let speed_verdict = row_verdict(j.verdict());
        // The energy rows follow the history once it has runs to judge them by; before, the
        // baseline file's verdict stands for them, as it does for a cell with no history.
        let energy = j
            .energy
            .as_ref()
            .filter(|e| e.verdict() != HistoryVerdict::InsufficientHistory);
        for m in cell.metrics.iter_mut() {
            if m.metric == METRIC || m.metric == "tokens_per_s_per_gpu" {
                apply_history(
                    m,
                    METRIC,
                    &j.judgement,
                    speed_verdict,
                    report.policy.two_sample.floor_rel,
                );
            } else if let (Some(e), true) = (
                energy,
                m.metric == ENERGY_METRIC || m.metric == "kwh_per_1t_tokens",
            ) {
                apply_history(
                    m,
                    ENERGY_METRIC,
                    &e.judgement,
                    row_verdict(e.verdict()),
                    report.policy.for_metric(ENERGY_METRIC).two_sample.floor_rel,
                );
            } else if crate::metrics::catalog::in_step_time_family(&m.metric)
                && matches!(m.verdict, Verdict::Regression | Verdict::Improvement)
            {
                m.verdict = Verdict::Unchanged;
            }
        }
        // A regression of a metric the history leaves to the baseline file (peak memory; the
        // energy before it has a history).
        let other_regressed = cell
            .metrics
            .iter()
            .any(|m| m.verdict == Verdict::Regression && m.metric != METRIC);
        cell.status = match j.status_verdict() {
            _ if numerics => CellStatus::Regression,
            HistoryVerdict::Regressed => CellStatus::Regression,
            _ if other_regressed => CellStatus::Regression,
            HistoryVerdict::Improved => CellStatus::Improvement,
            HistoryVerdict::Unchanged | HistoryVerdict::InsufficientHistory => {
                CellStatus::Unchanged
            }
            HistoryVerdict::Suspect => CellStatus::Suspect,
            HistoryVerdict::Unknown => CellStatus::Unknown,
            HistoryVerdict::Environment => CellStatus::Environment,
        };
        cell.reason = Some(j.line.clone());
    }
}

/// Lays the history's judgement of `judged` (the metric the history judged: tokens/s, or
/// tokens/J) over the comparison row `m` of it or of a metric that follows from it.
fn apply_history(
    m: &mut MetricComparison,
    judged: &str,
    j: &Judgement,
    verdict: Verdict,
    floor: f64,
) {
    // The history's centre in this metric's unit (tokens/s per GPU is tokens/s over the
    // cell's GPUs, so its relative figures are the same).
    let centre = match (m.metric == judged, j.band) {
        (true, Some(b)) => Some(b.center),
        // kWh per 1T tokens is the inverse of tokens/J: its centre is the inverse's, and
        // its change the inverse change.
        _ if m.metric == "kwh_per_1t_tokens" => {
            j.rel_change.zip(m.current).map(|(r, cur)| cur * (1.0 + r))
        }
        _ => j.rel_change.zip(m.current).map(|(r, cur)| cur / (1.0 + r)),
    };
    m.verdict = verdict;
    m.baseline = centre;
    m.change = if m.metric == "kwh_per_1t_tokens" {
        j.rel_change.map(|r| 1.0 / (1.0 + r) - 1.0)
    } else {
        j.rel_change
    };
    if let Some(b) = j.band {
        if b.center != 0.0 {
            m.tolerance = Some(b.half_width / b.center.abs());
            m.noise = Some(b.sigma / b.center.abs());
        }
    } else if let Some(t) = &j.repeats_test {
        // Judged by the repeats: the floor is the tolerance, half the interval's width
        // the noise.
        m.tolerance = Some(floor);
        if let Some((lo, hi)) = t.ci_rel {
            m.noise = Some((hi - lo) / 2.0);
        }
    }
}

/// The comparison every report of a run renders: against the baselines, with the
/// history's verdicts laid over it when the run was judged (`history.json` in `run_dir`).
/// A `history.json` that is there and does not read is an error naming it.
pub fn judged_comparison(
    results: &RunResults,
    baselines: &Baselines,
    run_dir: Option<&Path>,
) -> Result<(Comparison, Option<GateReport>), String> {
    let mut cmp = compare(results, baselines);
    let gate = match run_dir {
        Some(dir) => GateReport::load(dir)?,
        None => None,
    };
    if let Some(g) = &gate {
        if g.run_id == results.run_id {
            overlay(&mut cmp, g);
        }
    }
    Ok((cmp, gate))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::paired::{Answer, Paired};

    fn point(run: &str, verdict: Option<&str>) -> Point {
        Point {
            run_id: run.into(),
            started_at: "2026-11-01T00:00:00Z".into(),
            commit: Some(format!("{run}-sha")),
            branch: Some("main".into()),
            host: "h1".into(),
            throttled: false,
            value: 100.0,
            rel_spread: 0.0,
            samples: vec![100.0],
            loss_curve: Vec::new(),
            switches: indexmap::IndexMap::new(),
            versions: Default::default(),
            telemetry: None,
            context: indexmap::IndexMap::new(),
            verdict: verdict.map(str::to_string),
        }
    }

    #[test]
    fn a_confirming_reruns_repeats_count_with_the_run_it_confirmed() {
        let with = |run: &str, samples: &[f64]| Point {
            samples: samples.to_vec(),
            value: crate::metrics::stats::median(samples).unwrap(),
            ..point(run, Some("unchanged"))
        };
        let trend = vec![
            with("n1", &[100.0, 101.0, 99.0]),
            with("n2", &[90.0, 91.0, 92.0]),
            with("n2-confirm", &[100.0, 100.5, 99.5]),
            with("n2-confirm-2", &[100.2, 99.8, 100.1]),
            with("n3", &[100.0, 100.0, 100.0]),
            // A re-run of a run the trend does not hold is no night either.
            with("gone-confirm", &[50.0]),
        ];
        let folded = fold_confirms(trend);
        let ids: Vec<&str> = folded.iter().map(|p| p.run_id.as_str()).collect();
        assert_eq!(ids, ["n1", "n2", "n3"]);
        assert_eq!(folded[1].samples.len(), 9);
        assert_eq!(
            folded[1].value, 99.8,
            "the median of the night's nine repeats"
        );
        assert_eq!(folded[0].samples, [100.0, 101.0, 99.0]);
        assert_eq!(confirmed_run("n2-confirm-2"), Some("n2"));
        assert_eq!(confirmed_run("n2-confirm"), Some("n2"));
        assert_eq!(confirmed_run("n2"), None);
    }

    #[test]
    fn a_regression_stays_open_until_a_run_shows_the_cell_good_or_it_is_accepted() {
        let open = |verdicts: &[&str], accepted: Option<&str>| {
            let runs: Vec<Point> = verdicts
                .iter()
                .enumerate()
                .map(|(i, v)| point(&format!("n{i}"), Some(v)))
                .collect();
            let scoped: Vec<&Point> = runs.iter().collect();
            open_regression(&scoped, accepted)
        };
        assert!(open(&["unchanged", "regressed"], None));
        // Nights that settled nothing (busy, undecided) keep it open.
        assert!(open(
            &[
                "unchanged",
                "regressed",
                "environment",
                "unknown",
                "suspect"
            ],
            None
        ));
        assert!(!open(&["unchanged", "regressed", "unchanged"], None));
        assert!(!open(&["unchanged", "regressed", CLEARED], None));
        assert!(!open(&["unchanged", "suspect", "unknown"], None));
        assert!(!open(&[], None));
        // `bench baseline accept` made the regressed run the new normal.
        assert!(!open(&["unchanged", "regressed"], Some("n1")));
    }

    #[test]
    fn only_runs_that_showed_the_cell_good_form_the_band() {
        let runs = [
            point("a", None),
            point("b", Some("unchanged")),
            point("c", Some("suspect")),
            point("d", Some("unknown")),
            point("e", Some("regressed")),
            point("f", Some("environment")),
            point("g", Some("insufficient_history")),
            point("h", Some("improved")),
        ];
        let scoped: Vec<&Point> = runs.iter().collect();
        let ids = |v: Vec<&Point>| v.iter().map(|p| p.run_id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(clean_runs(&scoped, None)), ["a", "b", "g", "h"]);
        // The run an acceptance started the segment with is the new normal.
        assert_eq!(
            ids(clean_runs(&scoped, Some("e"))),
            ["a", "b", "e", "g", "h"]
        );
    }

    fn judged(verdict: HistoryVerdict, rel: f64) -> Judgement {
        Judgement {
            verdict,
            band: None,
            sigmas: None,
            rel_change: Some(rel),
            drift: false,
            repeats_test: None,
            reruns_needed: 1,
        }
    }

    fn pairs(screened: HistoryVerdict, rel: f64, answer: Answer, change: f64) -> SideBySide {
        SideBySide {
            cell_id: "c".into(),
            base_commit: "a".into(),
            base_run_id: None,
            head_commit: "b".into(),
            screened,
            screened_rel: Some(rel),
            base: vec![],
            head: vec![],
            result: Some(Paired {
                answer,
                pairs: 5,
                change_rel: change,
                ci_rel: None,
                ci_level: 0.995,
                p_value: 0.5,
            }),
            stopped: None,
            gpu_s: 1.0,
            logs: None,
        }
    }

    #[test]
    fn the_pairs_decide_the_verdict() {
        use HistoryVerdict::*;
        let cases = [
            // A real slowdown, whatever the screen or the host said.
            (Suspect, -0.04, Answer::Different, -0.04, Regressed),
            (Environment, -0.2, Answer::Different, -0.2, Regressed),
            (Unknown, -0.03, Answer::Different, -0.03, Regressed),
            // The code runs the same: the host or the night is below its history.
            (Regressed, -0.02, Answer::Same, 0.0, Environment),
            (Suspect, -0.02, Answer::Same, 0.0, Environment),
            (Unknown, -0.001, Answer::Same, 0.0, Unchanged),
            // Undecided: a breach stays unconfirmed, an excuse stands.
            (Regressed, -0.02, Answer::Unknown, -0.01, Suspect),
            (Environment, -0.02, Answer::Unknown, -0.01, Environment),
            (Unknown, -0.03, Answer::Unknown, -0.01, Unknown),
        ];
        for (screened, rel, answer, change, want) in cases {
            let mut j = judged(screened, rel);
            after_pairs(&mut j, &pairs(screened, rel, answer, change));
            assert_eq!(j.verdict, want, "{screened:?} {rel} {answer:?} {change}");
        }
        // No pair measured: the screen's verdict stands (the re-runs take over).
        let mut j = judged(Suspect, -0.03);
        let mut p = pairs(Suspect, -0.03, Answer::Unknown, 0.0);
        p.result = None;
        after_pairs(&mut j, &p);
        assert_eq!(j.verdict, Suspect);
    }

    #[test]
    fn a_drop_at_the_same_code_on_another_host_is_the_environment() {
        let good = point("n1", Some("unchanged"));
        let mut results: RunResults = serde_json::from_value(serde_json::json!({
            "schema_version": crate::results::SCHEMA_VERSION,
            "run_id": "n2",
            "matrix": "m.yaml",
            "matrix_name": "m",
            "filters": [],
            "started_at": "2026-11-02T00:00:00Z",
            "environment": {
                "gpu_model": null, "gpu_count": 0, "gpu_memory_mib": null, "driver": null,
                "cuda": null, "rocm": null, "libtorch": null, "nccl": null, "cpu": "x",
                "host": "h2", "os": "linux", "git_commit": "n1-sha", "git_dirty": false,
                "bench_version": "0", "hardware_key": "k"
            },
            "cells": []
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let versions = RunRecord::from_results(&results, None, None).versions;
        let good = Point { versions, ..good };
        let mut j = judged(HistoryVerdict::Regressed, -0.02);
        same_code_elsewhere(&mut j, &good, &results);
        assert_eq!(j.verdict, HistoryVerdict::Environment);
        // The same host: stays as judged (nothing bench can name moved).
        results.environment.host = "h1".into();
        let mut j = judged(HistoryVerdict::Regressed, -0.02);
        same_code_elsewhere(&mut j, &good, &results);
        assert_eq!(j.verdict, HistoryVerdict::Regressed);
        // Another commit: the pairs decide, not this rule.
        results.environment.host = "h2".into();
        results.environment.git_commit = Some("n2-sha".into());
        let mut j = judged(HistoryVerdict::Regressed, -0.02);
        same_code_elsewhere(&mut j, &good, &results);
        assert_eq!(j.verdict, HistoryVerdict::Regressed);
    }

    #[test]
    fn re_runs_that_fill_the_budget_exactly_fit() {
        // A re-run costs its share of the cell's time: (1.878 / 3) x 3 is 1.8780000000000001.
        let d: f64 = 1.878;
        let cost = d / 3.0 * 3.0;
        assert!(
            cost + cost + cost > 3.0 * d,
            "the rounding this guards against"
        );
        assert!(fits(cost + cost + cost, 3.0 * d));
        assert!(!fits(3.0 * d + 0.01, 3.0 * d));
    }
}
