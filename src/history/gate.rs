//! `bench matrix ... --history URL [--confirm]`: after the run, judge every passed cell
//! against its history ([`super::detect`]), re-run the suspect cells once when `--confirm`
//! asks (a second pass over their ids, driven from the matrix command), record the run
//! (and the confirming run) in the store, and leave `history.json` (the judgements) and
//! `history.md` (the Markdown lines reports show) in the run folder.
//!
//! The confirmation is a seam of its own, [`ConfirmRunner`]: the gate only decides which
//! cells are suspect and what their re-run says; who runs them (today the matrix command
//! through `run::run_matrix` with the suspect ids, later perhaps a runner hook that re-runs
//! inside the same scheduler pass) is the caller's business.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::baseline::{compare, Baselines, Direction, Verdict};
use crate::results::{Outcome, RunResults};

use super::detect::{
    band, judge, judge_loss, side, HistoryVerdict, Judgement, NumericsVerdict, Observation, Policy,
    Side,
};
use super::record::RunRecord;
use super::store::{current_segment, History, Point};
use super::telemetry::{reason_names, Telemetry};
use super::HistoryError;

/// The metric whose history decides a cell's speed verdict.
pub(crate) const METRIC: &str = "tokens_per_s";

/// Relative floor of the loss band (see `detect::judge_loss`).
pub(crate) const LOSS_FLOOR_REL: f64 = 1e-3;

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
    pub judgement: Judgement,
    /// The re-run's value, when the cell was re-run to confirm.
    pub confirm_value: Option<f64>,
    pub numerics: NumericsVerdict,
    /// For a regression or improvement: the first run of the shift and the last good one.
    pub since: Option<Since>,
    /// The baseline's own verdict (the old rule), which decides with too little history.
    pub baseline_regressed: bool,
    /// Slowdown reasons the GPU reported during the run.
    pub throttle_reasons: Vec<String>,
}

impl CellJudgement {
    pub fn verdict(&self) -> HistoryVerdict {
        self.judgement.verdict
    }

    /// Whether this cell fails the job: a confirmed regression, changed numerics, or a
    /// baseline regression where the history is too short to judge.
    pub(crate) fn fails_run(&self) -> bool {
        self.verdict().fails_run()
            || matches!(self.numerics, NumericsVerdict::Changed { .. })
            || (self.verdict() == HistoryVerdict::InsufficientHistory && self.baseline_regressed)
    }
}

/// The history's verdicts on a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateReport {
    pub run_id: String,
    pub hardware_key: String,
    pub store: String,
    pub policy: Policy,
    /// The run that re-ran the suspect cells, when `--confirm` did.
    pub confirm_run_id: Option<String>,
    pub cells: Vec<CellJudgement>,
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

    /// Reads `history.json` from a run folder; `None` when the run was not judged.
    pub(crate) fn load(run_dir: &Path) -> Option<GateReport> {
        let text = std::fs::read_to_string(run_dir.join(Self::FILE)).ok()?;
        serde_json::from_str(&text).ok()
    }

    pub fn suspects(&self) -> Vec<String> {
        self.cells
            .iter()
            .filter(|c| c.verdict() == HistoryVerdict::Suspect)
            .map(|c| c.cell_id.clone())
            .collect()
    }
}

/// Re-runs cells by id and returns the run's results (the seam `--confirm` goes through).
pub(crate) trait ConfirmRunner {
    fn rerun(&mut self, cell_ids: &[String]) -> Result<RunResults, crate::error::CliError>;
}

/// Judges `results` against the history in `store` (before recording it), with the
/// baselines of its hardware key. Cells that did not pass are not judged.
pub fn judge_run(
    store: &mut History,
    results: &RunResults,
    telemetry: Option<&Telemetry>,
    baselines: &Baselines,
    policy: &Policy,
) -> Result<GateReport, HistoryError> {
    let key = results.environment.hardware_key.clone();
    let comparison = compare(results, baselines);
    let throttled = telemetry.is_some_and(|t| t.throttled);
    let reasons: Vec<String> = telemetry
        .map(|t| {
            let bits = t.gpus.iter().fold(0, |a, g| a | g.throttle_reasons);
            reason_names(bits).into_iter().map(String::from).collect()
        })
        .unwrap_or_default();
    let mut cells = Vec::new();
    for cell in results
        .cells
        .iter()
        .filter(|c| c.outcome == Outcome::Passed)
    {
        let Some(m) = cell.metrics.get(METRIC) else {
            continue;
        };
        let id = cell.id.as_str();
        let trend = store.trend(id, &key, METRIC)?;
        let segments = store.segments(id, &key)?;
        // A run recorded earlier (a resumed run, an import) is not its own history.
        let earlier: Vec<Point> = current_segment(&trend, &segments)
            .iter()
            .filter(|p| p.run_id != results.run_id)
            .cloned()
            .collect();
        let history: Vec<f64> = earlier.iter().map(|p| p.value).collect();
        let base = baselines
            .cell(id)
            .and_then(|b| b.metrics.get(METRIC))
            .map(|b| (b.value, b.effective_tolerance(METRIC)));
        let obs = Observation {
            history: &history,
            value: m.value,
            rel_spread: m.rel_spread,
            confirm: None,
            baseline: base,
            throttled,
        };
        let judgement = judge(&obs, Direction::Higher, policy);
        let curves: Vec<Vec<f64>> = earlier.iter().map(|p| p.loss_curve.clone()).collect();
        let loss = super::record::CellRecord::from_result(cell).loss_curve;
        let numerics = judge_loss(&curves, &loss, policy.min_history, LOSS_FLOOR_REL);
        let baseline_regressed = comparison
            .cell(id)
            .and_then(|c| c.metric(METRIC))
            .is_some_and(|mc| mc.verdict == Verdict::Regression);
        let mut j = CellJudgement {
            cell_id: id.to_string(),
            metric: METRIC.to_string(),
            value: m.value,
            judgement,
            confirm_value: None,
            numerics,
            since: None,
            baseline_regressed,
            throttle_reasons: if throttled { reasons.clone() } else { vec![] },
        };
        j.since = since(&earlier, results, &j, policy);
        cells.push(j);
    }
    Ok(GateReport {
        run_id: results.run_id.clone(),
        hardware_key: key,
        store: store.location.clone(),
        policy: *policy,
        confirm_run_id: None,
        cells,
    })
}

/// Judges the suspect cells again with their re-run's values from `confirm`.
pub fn apply_confirmation(
    store: &mut History,
    report: &mut GateReport,
    results: &RunResults,
    confirm: &RunResults,
    baselines: &Baselines,
    policy: &Policy,
) -> Result<(), HistoryError> {
    report.confirm_run_id = Some(confirm.run_id.clone());
    for j in report
        .cells
        .iter_mut()
        .filter(|c| c.verdict() == HistoryVerdict::Suspect)
    {
        let Some(again) = confirm
            .cells
            .iter()
            .find(|c| c.id.as_str() == j.cell_id && c.outcome == Outcome::Passed)
            .and_then(|c| c.metrics.get(METRIC))
        else {
            continue;
        };
        let trend = store.trend(&j.cell_id, &report.hardware_key, METRIC)?;
        let segments = store.segments(&j.cell_id, &report.hardware_key)?;
        let earlier: Vec<Point> = current_segment(&trend, &segments)
            .iter()
            .filter(|p| p.run_id != results.run_id && p.run_id != confirm.run_id)
            .cloned()
            .collect();
        let history: Vec<f64> = earlier.iter().map(|p| p.value).collect();
        let base = baselines
            .cell(&j.cell_id)
            .and_then(|b| b.metrics.get(METRIC))
            .map(|b| (b.value, b.effective_tolerance(METRIC)));
        let obs = Observation {
            history: &history,
            value: j.value,
            rel_spread: results
                .cells
                .iter()
                .find(|c| c.id.as_str() == j.cell_id)
                .and_then(|c| c.metrics.get(METRIC))
                .map_or(0.0, |m| m.rel_spread),
            confirm: Some(again.value),
            baseline: base,
            throttled: !j.throttle_reasons.is_empty(),
        };
        j.judgement = judge(&obs, Direction::Higher, policy);
        j.confirm_value = Some(again.value);
        j.since = since(&earlier, results, j, policy);
    }
    Ok(())
}

/// For a regression or improvement: where the shift began, the first run of the unbroken
/// streak of runs just before this one that fell outside the band (of the runs before
/// each) on the same side; this run itself when the run before it was inside.
fn since(
    earlier: &[Point],
    results: &RunResults,
    j: &CellJudgement,
    policy: &Policy,
) -> Option<Since> {
    let wanted = match j.verdict() {
        HistoryVerdict::Regressed => Side::Worse,
        HistoryVerdict::Improved => Side::Better,
        _ => return None,
    };
    let values: Vec<f64> = earlier.iter().map(|p| p.value).collect();
    let mut start = earlier.len();
    while start > 0 {
        let k = start - 1;
        match band(&values[..k], 0.0, policy) {
            Some(b) if side(&b, values[k], Direction::Higher) == wanted => start = k,
            _ => break,
        }
    }
    let good = start.checked_sub(1).map(|i| &earlier[i]);
    let (run_id, commit, started_at) = match earlier.get(start) {
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

/// Records `results` (with its telemetry) in `store`.
pub fn record(
    store: &mut History,
    results: &RunResults,
    telemetry: Option<Telemetry>,
) -> Result<(), HistoryError> {
    let rec = RunRecord::from_results(results, super::record::current_branch(), telemetry);
    store.record_run(&rec)
}

/// The whole `--history` step of `bench matrix`: judge, confirm the suspects through
/// `runner` when given, stop the telemetry `sampler`, record, and write `history.json`
/// and `history.md` into the run folder. Returns the report.
pub(crate) fn after_run(
    location: &str,
    run_dir: &Path,
    results: &RunResults,
    sampler: Option<super::telemetry::Sampler>,
    baselines_dir: &Path,
    runner: Option<&mut dyn ConfirmRunner>,
) -> Result<GateReport, crate::error::CliError> {
    let policy = Policy::default();
    let mut store = super::open(location)?;
    let baselines = Baselines::load_for(baselines_dir, &results.environment.hardware_key)?;
    // Throttling is judged on what the GPU did while the main pass measured.
    let telemetry = sampler.and_then(super::telemetry::Sampler::finish);
    super::telemetry::save(run_dir, &telemetry).map_err(|e| {
        crate::error::CliError::internal(miette::miette!(
            "{}: {e}",
            run_dir.join(super::telemetry::FILE).display()
        ))
    })?;
    let mut report = judge_run(&mut store, results, telemetry.as_ref(), &baselines, &policy)?;
    let suspects = report.suspects();
    let mut confirm_results = None;
    if let Some(runner) = runner.filter(|_| !suspects.is_empty()) {
        eprintln!(
            "history: re-running {} suspect cell(s) to confirm: {}",
            suspects.len(),
            suspects.join(", ")
        );
        let confirm = runner.rerun(&suspects)?;
        apply_confirmation(
            &mut store,
            &mut report,
            results,
            &confirm,
            &baselines,
            &policy,
        )?;
        confirm_results = Some(confirm);
    }
    record(&mut store, results, telemetry)?;
    if let Some(c) = &confirm_results {
        // The confirming run measured too; its GPU telemetry was not sampled separately.
        record(&mut store, c, None)?;
    }
    let write = |name: &str, bytes: &[u8]| {
        crate::atomic::write(&run_dir.join(name), bytes).map_err(|e| {
            crate::error::CliError::internal(miette::miette!(
                "{}: {e}",
                run_dir.join(name).display()
            ))
        })
    };
    let json = serde_json::to_vec_pretty(&report)
        .map_err(|e| crate::error::CliError::internal(miette::miette!("{e}")))?;
    write(GateReport::FILE, &json)?;
    write("history.md", super::report::markdown(&report).as_bytes())?;
    Ok(report)
}

/// Re-runs suspect cells as a second pass of the matrix command: the same matrix and
/// settings, only those cells, into the run folder `<run-id>-confirm`.
pub(crate) struct MatrixConfirm<'a> {
    pub settings: &'a crate::run::MatrixSettings,
    pub run_id: String,
}

impl ConfirmRunner for MatrixConfirm<'_> {
    fn rerun(&mut self, cell_ids: &[String]) -> Result<RunResults, crate::error::CliError> {
        let mut expansion = crate::matrix::cmd::load(&self.settings.source)?;
        expansion
            .cells
            .retain(|c| cell_ids.iter().any(|id| id == c.id.as_str()));
        let mut settings = self.settings.clone();
        let run_id = format!("{}-confirm", self.run_id);
        // The suffix can push a valid id past the limit; it is checked like `--run-id`.
        crate::run::check_run_id(&run_id)?;
        settings.config.run_id = Some(run_id);
        settings.config.resume = None;
        let outcome = crate::run::run_matrix(&settings, expansion)?;
        Ok(outcome.results)
    }
}

/// The `--history` step of `bench matrix` after the reports are written: telemetry saved,
/// cells judged (suspects re-run under `--confirm`), the run recorded, the history's lines
/// appended to the CI job summary.
pub(crate) fn with_history(
    args: &crate::run::MatrixSettings,
    location: &str,
    outcome: &crate::run::RunOutcome,
    sampler: Option<super::telemetry::Sampler>,
) -> Result<GateReport, crate::error::CliError> {
    let mut confirm = MatrixConfirm {
        settings: args,
        run_id: outcome.results.run_id.clone(),
    };
    let runner: Option<&mut dyn ConfirmRunner> = if args.confirm {
        Some(&mut confirm)
    } else {
        None
    };
    let report = after_run(
        location,
        &outcome.run_dir,
        &outcome.results,
        sampler,
        &args.baselines,
        runner,
    )?;
    let md = super::report::markdown(&report);
    if let Err(e) = crate::report::append_step_summary(&md) {
        eprintln!("warning: {e}");
    }
    eprint!("{md}");
    Ok(report)
}
