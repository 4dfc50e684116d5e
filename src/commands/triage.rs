//! After triage has grouped a run's verdicts into findings (`crate::triage`), the command
//! layer chases the regressions whose cause is a commit range: it bisects each on its
//! cheapest cell within the run's GPU-seconds budget (`crate::bisect::auto`, which records
//! every probe in the history so a later job resumes), traces one step at the last good
//! and the first bad commit, and lays the first bad commit and the kernel diff
//! (`crate::triage::kernels`) on the finding for the reports.
//!
//! It runs only when a budget is set (the matrix's `triage.budget_gpu_s` or
//! `--triage-budget`), never in a pull request's run (there the change is the pull
//! request's own), and never fails the nightly: what could not be done is what the finding
//! says, with the command that does it by hand.

use std::path::{Path, PathBuf};

use crate::bisect::auto::{self, Request};
use crate::bisect::{BisectSettings, DEFAULT_MAX_REPEATS};
use crate::cell::Workload;
use crate::error::CliError;
use crate::matrix::spec::TriageSpec;
use crate::results::{Outcome, RunResults};
use crate::run::{MatrixSettings, TriageFlags};
use crate::triage::culprit::{BisectStatus, Bisected};
use crate::triage::kernels::{self, KernelDiff, KernelSummary};
use crate::triage::Finding;

/// The triage settings of a run: the matrix's `triage:` block with the `--triage-*` flags
/// laid over it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settings {
    pub budget_gpu_s: f64,
    pub setup: Option<String>,
    pub worker: Option<PathBuf>,
    pub max_repeats: usize,
}

/// The settings, or `None` when no budget is set or it is 0. A budget in the matrix that
/// is not a number of GPU-seconds is bad input, named by its key path.
pub(crate) fn settings(
    flags: &TriageFlags,
    matrix: &Path,
    spec: Option<&TriageSpec>,
) -> Result<Option<Settings>, CliError> {
    if let Some((key, message)) = spec.and_then(TriageSpec::fault) {
        return Err(CliError::bad_input(miette::miette!(
            "{}: {key}: {message}",
            matrix.display()
        )));
    }
    let Some(budget) = flags.budget_gpu_s.or(spec.and_then(|s| s.budget_gpu_s)) else {
        return Ok(None);
    };
    let max_repeats = spec
        .and_then(|s| s.max_repeats)
        .unwrap_or(DEFAULT_MAX_REPEATS);
    if budget == 0.0 {
        return Ok(None);
    }
    Ok(Some(Settings {
        budget_gpu_s: budget,
        setup: flags
            .setup
            .clone()
            .or_else(|| spec.and_then(|s| s.setup.clone())),
        worker: flags
            .worker
            .clone()
            .or_else(|| spec.and_then(|s| s.worker.clone())),
        max_repeats,
    }))
}

/// The file of a run folder that keeps what triage found beyond the grouping (the
/// bisections and kernel diffs, which took GPU time), so that `bench report`, `report html`
/// and `report post` render them again rather than losing them.
pub(crate) const FILE: &str = "triage.json";

/// A finding's chase as [`FILE`] (and the history's `bench_triage`) keeps it, keyed by the
/// finding's cells and commit range.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Chased {
    pub cells: Vec<String>,
    pub commits: Option<[String; 2]>,
    pub bisected: Option<Bisected>,
    #[serde(default)]
    pub kernels: Option<KernelDiff>,
    #[serde(default)]
    pub kernels_missing: Option<String>,
}

/// The whole of [`FILE`]: every chased finding of one run.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Saved {
    pub findings: Vec<Chased>,
}

/// Writes [`FILE`] (atomically) when a finding was chased (bisected, or its kernels diffed),
/// and returns its text, which the history keeps too (`bench site` reads it from there).
pub(crate) fn save(run_dir: &Path, findings: &[Finding]) -> Result<Option<String>, CliError> {
    let chased: Vec<Chased> = findings
        .iter()
        .filter(|f| f.bisected.is_some() || f.kernels.is_some() || f.kernels_missing.is_some())
        .map(|f| Chased {
            cells: f.cells.iter().map(|(c, _)| c.clone()).collect(),
            commits: f.commits.clone(),
            bisected: f.bisected.clone(),
            kernels: f.kernels.clone(),
            kernels_missing: f.kernels_missing.clone(),
        })
        .collect();
    if chased.is_empty() {
        return Ok(None);
    }
    super::write_json(&run_dir.join(FILE), &Saved { findings: chased }).map(Some)
}

/// `ours` (a [`FILE`]'s text) with the chases of `kept` (another shard's, kept in the
/// history under the same run id) that are not of the same cells and commit range. Text
/// that does not read as a [`FILE`] is replaced by ours: the chase of this job is known good.
pub(crate) fn join(kept: &str, ours: &str) -> String {
    let (Ok(kept), Ok(mut joined)) = (
        serde_json::from_str::<Saved>(kept),
        serde_json::from_str::<Saved>(ours),
    ) else {
        return ours.to_string();
    };
    for c in kept.findings {
        if !joined
            .findings
            .iter()
            .any(|o| o.cells == c.cells && o.commits == c.commits)
        {
            joined.findings.push(c);
        }
    }
    serde_json::to_string_pretty(&joined).unwrap_or_else(|_| ours.to_string())
}

/// The findings of a finished run: the triage stage's grouping of its verdicts, with what
/// the run's own triage found (its [`FILE`]) laid on the findings of the same cells and
/// commit range.
pub(crate) fn findings(
    results: &RunResults,
    verdicts: &crate::judge::Verdicts,
    run_dir: &Path,
) -> Result<Vec<Finding>, CliError> {
    let mut findings = crate::triage::findings(results, verdicts);
    if let Some(saved) = load(run_dir)? {
        for f in &mut findings {
            let cells: Vec<String> = f.cells.iter().map(|(c, _)| c.clone()).collect();
            if let Some(c) = saved
                .findings
                .iter()
                .find(|c| c.cells == cells && c.commits == f.commits)
            {
                c.lay_on(f);
            }
        }
    }
    Ok(findings)
}

/// A run folder's [`FILE`], or `None` when it has none. A file that is there and does not
/// read is bad input naming it, line and column: it holds GPU time that a silent skip
/// would lose.
pub(crate) fn load(run_dir: &Path) -> Result<Option<Saved>, CliError> {
    super::read_json(&run_dir.join(FILE))
}

impl Chased {
    fn lay_on(&self, f: &mut Finding) {
        f.bisected = self.bisected.clone();
        f.kernels = self.kernels.clone();
        f.kernels_missing = self.kernels_missing.clone();
    }

    /// How far the chase got, to choose among shards that chased one cause: a named first
    /// bad commit first, then the most commits measured, then a kernel diff.
    fn progress(&self) -> (bool, usize, bool) {
        let b = self.bisected.as_ref();
        (
            b.is_some_and(|b| b.first_bad.is_some()),
            b.map_or(0, |b| b.measured),
            self.kernels.is_some(),
        )
    }
}

/// Reads every shard's [`FILE`] without using it: what the merge checks before it writes
/// anything, so a damaged one is refused with the output untouched.
pub(crate) fn check(shard_dirs: &[PathBuf]) -> Result<(), CliError> {
    for dir in shard_dirs {
        load(dir)?;
    }
    Ok(())
}

/// Lays the chases the shards of a sharded run kept (each shard folder's [`FILE`]) on the
/// merged run's findings, so that the one merged report names the first bad commit a shard
/// found. A shard's finding holds only that shard's cells: it belongs to the merged finding
/// of the same commit range that holds all of its cells. When several shards chased one
/// cause (each bisects with its own budget), the furthest chase is kept and the others are
/// named in its evidence.
pub(crate) fn carry(shard_dirs: &[PathBuf], findings: &mut [Finding]) -> Result<(), CliError> {
    let mut chases: Vec<(usize, &Path, Chased)> = Vec::new();
    for dir in shard_dirs {
        for c in load(dir)?.map(|s| s.findings).unwrap_or_default() {
            let home = findings.iter().position(|f| {
                f.commits == c.commits && c.cells.iter().all(|id| f.has(id)) && !c.cells.is_empty()
            });
            if let Some(i) = home {
                chases.push((i, dir.as_path(), c));
            }
        }
    }
    for (i, f) in findings.iter_mut().enumerate() {
        let mine: Vec<&(usize, &Path, Chased)> = chases.iter().filter(|(j, ..)| *j == i).collect();
        let Some(best) = mine.iter().max_by_key(|(_, _, c)| c.progress()) else {
            continue;
        };
        best.2.lay_on(f);
        // The furthest bisection may have no kernel diff where another shard's chase has
        // one (it traced the same cause): keep it rather than lose it.
        if f.kernels.is_none() {
            if let Some((_, d, c)) = mine.iter().find(|(_, _, c)| c.kernels.is_some()) {
                f.kernels = c.kernels.clone();
                f.kernels_missing = None;
                if let Some(b) = f.bisected.as_mut() {
                    b.evidence = format!("{}; kernels traced by {}", b.evidence, d.display());
                }
            }
        }
        let others: Vec<String> = mine
            .iter()
            .filter(|(_, d, _)| *d != best.1)
            .filter_map(|(_, d, c)| {
                let b = c.bisected.as_ref()?;
                let said = match &b.first_bad {
                    Some(cr) => format!("first bad commit {}", cr.render()),
                    None => format!("{} of {} commits measured", b.measured, b.commits),
                };
                Some(format!("{} also bisected {} ({said})", d.display(), b.cell))
            })
            .collect();
        if let (Some(b), false) = (f.bisected.as_mut(), others.is_empty()) {
            b.evidence = format!("{} ({})", b.evidence, others.join("; "));
        }
    }
    Ok(())
}

/// Keeps in the history the kernel summary of each cell's traced step in the run folder's
/// `kernels/` (`--trace-kernels`, `triage.trace_every_run`). A cell that wrote no trace (a
/// CPU cell, a workload that does not trace) or an unreadable one is a warning, not a failed
/// run: its kernels are simply not known.
pub(crate) fn keep_kernels(
    store: &mut crate::history::History,
    results: &RunResults,
    run_dir: &Path,
) -> Result<(), CliError> {
    for cell in &results.cells {
        if cell.outcome != Outcome::Passed {
            continue;
        }
        let path = crate::run::kernel_trace_path(run_dir, cell.id.as_str());
        let files = kernels::rank_files(&path);
        if files.is_empty() {
            continue;
        }
        let ranks: Result<Vec<_>, _> = files.iter().map(|f| kernels::read_trace(f)).collect();
        match ranks {
            Ok(ranks) => {
                let summary = KernelSummary::of(&ranks);
                let text = serde_json::to_string(&summary)
                    .map_err(|e| CliError::internal(miette::miette!("{e}")))?;
                store.record_kernels(&results.run_id, cell.id.as_str(), &text)?;
            }
            Err(e) => eprintln!("warning: {}: kernels not kept: {e}", cell.id),
        }
    }
    Ok(())
}

/// For each regression whose kernels no bisection diffed, the kernels that moved between
/// its cheapest cell's last good run and this run, from the summaries the history keeps
/// ([`keep_kernels`]): what a finding caused by a switch or version change, a pull request
/// (never bisected) or a bisection that ran out of budget can still say.
pub(crate) fn diff_from_history(
    history: &str,
    results: &RunResults,
    verdicts: &crate::judge::Verdicts,
    findings: &mut [Finding],
) {
    let Some(judged) = &verdicts.history else {
        return;
    };
    let Ok(mut store) = crate::history::open(history) else {
        return;
    };
    for f in findings.iter_mut() {
        if f.direction != "regressed" || f.kernels.is_some() {
            continue;
        }
        let Some((cell, _, _)) = cheapest(f, results, &[]) else {
            continue;
        };
        let Some(good) = judged
            .cells
            .iter()
            .find(|c| c.cell_id == cell)
            .and_then(|c| c.since.as_ref())
            .and_then(|s| s.last_good_run_id.clone())
        else {
            continue;
        };
        let summary = |store: &mut crate::history::History, run: &str| {
            store
                .kernels(run, &cell)
                .ok()
                .flatten()
                .and_then(|t| serde_json::from_str::<KernelSummary>(&t).ok())
        };
        match (
            summary(&mut store, &good),
            summary(&mut store, &results.run_id),
        ) {
            (Some(before), Some(after)) => {
                let path = crate::run::kernel_trace_path(Path::new(""), &cell);
                f.kernels = Some(KernelDiff::of(
                    &cell,
                    [&format!("last good run {good}"), "this run"],
                    &[before.step()],
                    &[after.step()],
                    vec![path.display().to_string()],
                ));
                f.kernels_missing = None;
            }
            (None, _) => {
                f.kernels_missing.get_or_insert(format!(
                    "the history keeps no kernels of {cell} in its last good run {good} (runs keep them with triage.trace_every_run or --trace-kernels)"
                ));
            }
            (_, None) => {
                f.kernels_missing
                    .get_or_insert(format!("this run traced no step of {cell}"));
            }
        }
    }
}

/// Bisects the findings that want it (regressions with a commit range), in the reports'
/// order, sharing `settings.budget_gpu_s`. Returns whether a signal stopped it.
pub(crate) fn chase(
    args: &MatrixSettings,
    settings: &Settings,
    results: &RunResults,
    run_dir: &Path,
    findings: &mut [Finding],
) -> Result<bool, CliError> {
    let Some(history) = &args.history else {
        return Ok(false);
    };
    let wanted: Vec<usize> = (0..findings.len())
        .filter(|&i| findings[i].direction == "regressed" && findings[i].commits.is_some())
        .collect();
    if wanted.is_empty() {
        return Ok(false);
    }
    let cwd = std::env::current_dir()
        .map_err(|e| CliError::internal(miette::miette!("the current folder: {e}")))?;
    let mut left = settings.budget_gpu_s;
    for i in wanted {
        let f = &mut findings[i];
        let Some([good, bad]) = f.commits.clone() else {
            continue;
        };
        let resumable = resumable_cells(history, f, results, &range_of(&cwd, &good, &bad));
        let Some((cell, gpus, round_s)) = cheapest(f, results, &resumable) else {
            continue;
        };
        let skipped =
            |why: String| Bisected::new(BisectStatus::Skipped, &cell, [&good, &bad], left, why);
        if results.environment.git_dirty {
            f.bisected = Some(skipped(
                "the run's checkout has uncommitted changes, which may be the cause: a commit range is bisected only from a clean checkout".into(),
            ));
            continue;
        }
        if let Some(base) = crate::history::gate::pull_request_base() {
            f.bisected = Some(skipped(format!(
                "a pull request's run (into {base}): the change is the pull request's own; bisection runs on branch runs"
            )));
            continue;
        }
        let builtin = results
            .cells
            .iter()
            .find(|c| c.id.as_str() == cell)
            .is_some_and(|c| matches!(c.params.workload, Workload::Builtin));
        if builtin && settings.worker.is_none() {
            f.bisected = Some(skipped(
                "the cell runs the built-in workload and no build of it is named (triage.worker, --triage-worker): every commit would run this bench's own".into(),
            ));
            continue;
        }
        let matrix = match matrix_in_repo(&cwd, &args.config.matrix) {
            Ok(m) => m,
            Err(why) => {
                f.bisected = Some(skipped(why));
                continue;
            }
        };
        let dir = run_dir.join("triage").join(&f.id);
        let req = Request {
            settings: BisectSettings {
                cell: cell.clone(),
                good,
                bad,
                matrix,
                setup: settings.setup.clone(),
                history: history.clone(),
                max_repeats: settings.max_repeats,
                worker_exe: settings.worker.clone(),
                work_dir: Some(run_dir.join("triage").join("probes")),
                format: args.format,
            },
            budget_gpu_s: left,
            gpus,
            round_s,
            trace_dir: dir,
        };
        eprintln!(
            "triage: {}: bisecting {}..{} on {cell} ({left:.0} GPU-s left)",
            f.id,
            short(&req.settings.good),
            short(&req.settings.bad)
        );
        let answer = auto::run(&cwd, &req)?;
        left = (left - answer.bisected.gpu_s).max(0.0);
        if let Some(pair) = &answer.traces {
            match diff(&cell, pair, run_dir) {
                Ok(d) => f.kernels = Some(d),
                Err(why) => f.kernels_missing = Some(why),
            }
        } else if let Some(why) = answer.traces_missing {
            f.kernels_missing = Some(format!("no traced step: {why}"));
        }
        eprintln!(
            "triage: {}: {}",
            f.id,
            crate::sanitize::clean(&answer.bisected.line())
        );
        f.bisected = Some(answer.bisected);
        if answer.interrupted {
            return Ok(true);
        }
    }
    Ok(false)
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(7)]
}

/// The finding's cell that costs fewest GPU-seconds per round (its duration in this run
/// times its GPUs), among those that passed: its id, GPUs and duration in seconds. A cell an
/// earlier job already bisected over this range (`resumable`) is preferred, so that job's
/// rounds are not lost to a cell that ran a little faster tonight.
fn cheapest(f: &Finding, results: &RunResults, resumable: &[String]) -> Option<(String, f64, f64)> {
    results
        .cells
        .iter()
        .filter(|c| f.has(c.id.as_str()) && c.outcome == Outcome::Passed)
        .map(|c| (c.id.to_string(), f64::from(c.gpus()), c.duration_s))
        .min_by(|a, b| {
            let resumed = |x: &(String, f64, f64)| !resumable.contains(&x.0);
            resumed(a)
                .cmp(&resumed(b))
                .then((a.1 * a.2).total_cmp(&(b.1 * b.2)))
                .then(a.0.cmp(&b.0))
        })
}

/// The finding's cells for which the history holds bisection rounds in `range` (good
/// first, bad last) under this run's hardware key: an earlier job's unfinished (or finished)
/// bisection of the same range; else those whose two ends the side-by-side pairs measured (the bisection
/// then starts with its ends). A store that cannot be read here resumes nothing; the
/// bisection opens it again and reports what is wrong.
fn resumable_cells(
    history: &str,
    f: &Finding,
    results: &RunResults,
    range: &[String],
) -> Vec<String> {
    let (good, bad) = match range {
        [g, .., b] => (g.as_str(), b.as_str()),
        _ => return Vec::new(),
    };
    let Ok(mut store) = crate::history::open(history) else {
        return Vec::new();
    };
    let key = &results.environment.hardware_key;
    // Per cell: whether a bisection's own rounds lie in the range (its ends included), and
    // whether the pairs measured its ends.
    let found: Vec<(String, bool, bool)> = f
        .cells
        .iter()
        .map(|(c, _)| {
            let probes: Vec<(bool, bool)> = store
                .trend(c, key, crate::history::gate::METRIC)
                .map(|points| {
                    points
                        .iter()
                        .filter(|p| p.branch.as_deref() == Some(crate::bisect::probe::BRANCH))
                        .filter_map(|p| {
                            let at = p.commit.as_deref()?;
                            let pairs = p.run_id.contains(crate::commands::pairs::RUN_MARK);
                            let in_range = range.iter().any(|x| x == at);
                            let at_end = at == good || at == bad;
                            Some((!pairs && in_range, pairs && at_end))
                        })
                        .collect()
                })
                .unwrap_or_default();
            (
                c.clone(),
                probes.iter().any(|x| x.0),
                probes.iter().any(|x| x.1),
            )
        })
        .collect();
    let rounds: Vec<String> = found.iter().filter(|x| x.1).map(|x| x.0.clone()).collect();
    if !rounds.is_empty() {
        return rounds;
    }
    found.into_iter().filter(|x| x.2).map(|x| x.0).collect()
}

/// The commits of `good..bad` (first-parent, both ends included, good first) as the
/// repository at `cwd` knows them; just the two ends when it cannot tell.
fn range_of(cwd: &Path, good: &str, bad: &str) -> Vec<String> {
    let ends = vec![good.to_string(), bad.to_string()];
    let Ok(repo) = crate::bisect::git::Repo::discover(cwd) else {
        return ends;
    };
    let (Ok(g), Ok(b)) = (repo.commit(good, "good"), repo.commit(bad, "bad")) else {
        return ends;
    };
    match repo.range(&g, &b) {
        Ok(commits) => std::iter::once(good.to_string())
            .chain(commits.into_iter().map(|c| c.sha))
            .chain(std::iter::once(bad.to_string()))
            .collect(),
        Err(_) => ends,
    }
}

/// The matrix file as a path inside the repository `cwd` is in: a probe reads it in each
/// commit's tree.
fn matrix_in_repo(cwd: &Path, matrix: &Path) -> Result<PathBuf, String> {
    let repo = crate::bisect::git::Repo::discover(cwd).map_err(|e| e.to_string())?;
    let root =
        std::fs::canonicalize(&repo.root).map_err(|e| format!("{}: {e}", repo.root.display()))?;
    let file = std::fs::canonicalize(cwd.join(matrix))
        .map_err(|e| format!("{}: {e}", matrix.display()))?;
    file.strip_prefix(&root)
        .map(Path::to_path_buf)
        .map_err(|_| {
            format!(
                "the matrix {} is not inside the repository {}: a probed commit could not read it",
                matrix.display(),
                root.display()
            )
        })
}

/// The kernel diff of the two traced steps (each rank's trace beside rank 0's).
fn diff(cell: &str, pair: &[(String, PathBuf); 2], run_dir: &Path) -> Result<KernelDiff, String> {
    let mut steps = Vec::new();
    let mut names = Vec::new();
    for (label, path) in pair {
        let files = kernels::rank_files(path);
        if files.is_empty() {
            return Err(format!(
                "the {label} run wrote no trace at {} (the built-in workload and the framework drivers but llm.c's trace a step under BENCH_PROFILE, and a driver says why it could not in a `bench-profile: warning` line of the cell's log; a command workload may write a Chrome trace there)",
                path.display()
            ));
        }
        let mut ranks = Vec::new();
        for f in &files {
            ranks.push(kernels::read_trace(f).map_err(|e| e.to_string())?);
            names.push(f.strip_prefix(run_dir).unwrap_or(f).display().to_string());
        }
        steps.push(ranks);
    }
    Ok(KernelDiff::of(
        cell,
        [pair[0].0.as_str(), pair[1].0.as_str()],
        &steps[0],
        &steps[1],
        names,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(budget: Option<f64>) -> TriageFlags {
        TriageFlags {
            budget_gpu_s: budget,
            ..Default::default()
        }
    }

    fn settings_of(
        budget: Option<f64>,
        spec: Option<&TriageSpec>,
    ) -> Result<Option<Settings>, CliError> {
        settings(&flags(budget), Path::new("m.yaml"), spec)
    }

    #[test]
    fn flags_override_the_matrix_and_zero_turns_it_off() {
        let spec = TriageSpec {
            budget_gpu_s: Some(600.0),
            setup: Some("make".into()),
            worker: None,
            max_repeats: None,
            trace_every_run: None,
        };
        let s = settings_of(None, Some(&spec)).unwrap().unwrap();
        assert_eq!(s.budget_gpu_s, 600.0);
        assert_eq!(s.setup.as_deref(), Some("make"));
        assert_eq!(s.max_repeats, DEFAULT_MAX_REPEATS);
        let s = settings_of(Some(60.0), Some(&spec)).unwrap().unwrap();
        assert_eq!(s.budget_gpu_s, 60.0);
        assert_eq!(settings_of(Some(0.0), Some(&spec)).unwrap(), None);
        assert_eq!(settings_of(None, None).unwrap(), None);
        let bad = TriageSpec {
            budget_gpu_s: Some(-1.0),
            ..spec.clone()
        };
        let e = settings_of(None, Some(&bad)).unwrap_err();
        assert!(
            format!("{:?}", e.report()).contains("triage.budget_gpu_s"),
            "{e:?}"
        );
        let one = TriageSpec {
            max_repeats: Some(1),
            ..spec
        };
        assert!(settings_of(None, Some(&one)).is_err());
    }

    #[test]
    fn a_shards_chases_join_the_ones_kept_for_the_run() {
        let saved = |cells: &[&str], good: &str| {
            serde_json::json!({"findings": [{
                "cells": cells, "commits": [good, "bad"], "bisected": null,
                "kernels": null, "kernels_missing": "no trace"}]})
            .to_string()
        };
        let joined: Saved =
            serde_json::from_str(&join(&saved(&["a"], "g1"), &saved(&["b"], "g1"))).unwrap();
        let cells: Vec<&str> = joined
            .findings
            .iter()
            .map(|c| c.cells[0].as_str())
            .collect();
        assert_eq!(cells, ["b", "a"]);
        // The same chase again is not doubled; a damaged kept row gives way to ours.
        let same: Saved =
            serde_json::from_str(&join(&saved(&["b"], "g1"), &saved(&["b"], "g1"))).unwrap();
        assert_eq!(same.findings.len(), 1);
        assert_eq!(join("{", &saved(&["b"], "g1")), saved(&["b"], "g1"));
    }

    fn a_finding(cells: &[&str], commits: [&str; 2]) -> Finding {
        Finding {
            id: "F1".into(),
            direction: "regressed",
            metric: None,
            cause: "commits".into(),
            cells: cells.iter().map(|c| (c.to_string(), -0.1)).collect(),
            shift: [-0.1; 3],
            separates: Vec::new(),
            against: Vec::new(),
            commits: Some(commits.map(String::from)),
            bisected: None,
            kernels: None,
            kernels_missing: None,
        }
    }

    /// A shard folder whose triage chased `cells` over `good..bad`: found `first_bad`, or
    /// measured `measured` commits without finding it.
    fn shard_dir(cells: &[&str], first_bad: Option<&str>, measured: usize) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let mut f = a_finding(cells, ["good", "bad"]);
        let status = if first_bad.is_some() {
            BisectStatus::Found
        } else {
            BisectStatus::OutOfBudget
        };
        let mut b = Bisected::new(status, cells[0], ["good", "bad"], 60.0, "ran".into());
        b.commits = 8;
        b.measured = measured;
        b.first_bad = first_bad.map(|sha| crate::triage::culprit::CommitRef {
            sha: sha.into(),
            subject: "slow down".into(),
            author: "A".into(),
        });
        f.bisected = Some(b);
        save(dir.path(), &[f]).unwrap();
        dir
    }

    #[test]
    fn a_shards_chase_is_laid_on_the_merged_finding_that_holds_its_cells() {
        // Two shards chased one cause on their own cells; the one that found the commit
        // wins and the other is named in its evidence.
        let one = shard_dir(&["a", "c"], None, 3);
        let two = shard_dir(&["b"], Some("1234567890abcdef"), 4);
        let dirs = vec![one.path().to_path_buf(), two.path().to_path_buf()];
        let mut findings = vec![
            a_finding(&["x"], ["good", "bad"]),
            a_finding(&["a", "b", "c"], ["good", "bad"]),
        ];
        carry(&dirs, &mut findings).unwrap();
        assert!(findings[0].bisected.is_none(), "{:?}", findings[0]);
        let b = findings[1].bisected.as_ref().expect("carried");
        assert_eq!(b.first_bad.as_ref().unwrap().sha, "1234567890abcdef");
        assert!(
            b.evidence
                .contains("also bisected a (3 of 8 commits measured)"),
            "{}",
            b.evidence
        );

        // Kept in the merged folder, it is found again by the merged run's findings.
        let out = tempfile::tempdir().unwrap();
        save(out.path(), &findings).unwrap();
        let saved = load(out.path()).unwrap().unwrap();
        assert_eq!(saved.findings.len(), 1);
        assert_eq!(saved.findings[0].cells, vec!["a", "b", "c"]);

        // Another commit range, or cells the merged finding does not hold: not laid on it.
        let mut other = vec![a_finding(&["a", "b", "c"], ["good", "other"])];
        carry(&dirs, &mut other).unwrap();
        assert!(other[0].bisected.is_none());
        let mut smaller = vec![a_finding(&["a"], ["good", "bad"])];
        carry(&dirs[..1], &mut smaller).unwrap();
        assert!(smaller[0].bisected.is_none());
    }

    #[test]
    fn a_broken_triage_file_in_a_shard_is_bad_input_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), "{\"findings\": [1]}").unwrap();
        let e = carry(&[dir.path().to_path_buf()], &mut []).unwrap_err();
        let text = format!("{e:?}");
        assert!(text.contains("triage.json: line 1"), "{text}");
    }
}
