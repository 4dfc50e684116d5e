//! The triage of each open finding, as the site shows it: the automatic bisection's first
//! bad commit (or why there is none, with the `bench bisect` command that finishes it),
//! the commits it measured, and the kernels that moved.
//!
//! It is read where it was kept, the history first, since the site is built from the store
//! and a CI job's run folders expire:
//!
//! - the history's `bench_triage` (schema 5): what `bench matrix --history` found when it
//!   chased the finding's regression, kept per run as the run folder's `triage.json`;
//! - else `DIR/RUN_ID/triage.json` under `--runs DIR` (a run recorded before the store
//!   kept triage);
//! - the kernels, when no chase diffed them, from the history's `bench_kernels` at the
//!   finding's last good and first bad runs (`triage.trace_every_run`), as the nightly's
//!   own triage diffs them;
//! - the bisection's rounds (runs on the history's branch `bisect`) of the finding's cells
//!   since the run that opened it: the commits measured, with their rounds and median.
//!
//! The run whose triage is shown is one of the runs the finding stayed open through: the
//! newest that found the first bad commit and diffed its kernels, else the newest that
//! found it, else the newest that tried (a later night that resumed a bisection from the
//! history's rounds knows more than the first one).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde::Serialize;

use crate::commands::triage::{Chased, Saved, FILE};
use crate::error::CliError;
use crate::triage::culprit::{BisectStatus, Bisected};
use crate::triage::kernels::{KernelDiff, KernelSummary};

use super::model::{Finding, Fleet};

/// At most this many of a finding's cells are asked for their kernels in the history (two
/// queries each): the first of them with both summaries is diffed.
const KERNEL_CELLS: usize = 20;

/// At most this many probed commits are listed per finding.
const PROBES: usize = 50;

/// A finding's triage, serialized into the index page's data.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Triage {
    /// Where the chase was read: `history` or the `triage.json` of a run folder.
    pub source: Option<String>,
    /// The run whose chase this is, and its page (the pages fill it in: they name files).
    pub run: Option<String>,
    pub run_page: Option<String>,
    pub bisected: Option<Bisected>,
    /// The status in words (`found`, `out of budget`, `skipped`, ...).
    pub status: Option<&'static str>,
    /// [`Bisected::line`]: the bisection in one line, as the run's own reports put it.
    pub line: Option<String>,
    pub kernels: Option<KernelDiff>,
    /// Where the kernel diff came from: the chase's traced steps, or the history's kernels.
    pub kernels_source: Option<String>,
    /// [`KernelDiff::summary`].
    pub kernels_summary: Option<String>,
    pub kernels_missing: Option<String>,
    /// The commits the history's bisection rounds measured, in the order first measured.
    pub probes: Vec<ProbeView>,
}

/// A probed commit: how many rounds the history holds for it, and their median.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProbeView {
    pub commit: Option<String>,
    pub cell: String,
    pub rounds: usize,
    pub median: Option<f64>,
    /// `first bad`, `last good` or nothing, from the bisection's answer.
    pub role: Option<&'static str>,
}

/// The chases the history keeps per run (`bench_triage`), as text: a row is parsed only
/// when an open finding asks for its run, so one damaged row of a closed regression does
/// not keep the fleet's site from being built.
pub(crate) struct Kept {
    history: HashMap<String, String>,
    location: String,
}

impl Kept {
    pub(crate) fn of(rows: Vec<(String, String)>, location: &str) -> Kept {
        Kept {
            history: rows.into_iter().collect(),
            location: location.to_string(),
        }
    }

    /// The chase kept for `run`; a row that is not the JSON bench wrote is refused with the
    /// store and run named.
    fn get(&self, run: &str) -> Result<Option<Saved>, CliError> {
        let Some(text) = self.history.get(run) else {
            return Ok(None);
        };
        serde_json::from_str(text).map(Some).map_err(|e| {
            CliError::bad_input(miette::miette!(
                "{}: bench_triage, run {run}: line {} column {}: {e}",
                self.location,
                e.line(),
                e.column()
            ))
        })
    }
}

/// A run folder's `triage.json`, when `runs` holds one for `run_id`, with its path; a file
/// that is not the JSON bench wrote is refused with its path and position, as `bench
/// report` refuses it.
fn from_folder(runs: &Path, run_id: &str) -> Result<Option<(String, Saved)>, CliError> {
    if !crate::ids::is_valid(run_id) {
        return Ok(None);
    }
    let dir = runs.join(run_id);
    Ok(crate::commands::triage::load(&dir)?.map(|s| (dir.join(FILE).display().to_string(), s)))
}

/// The chase of `saved` that is about this finding: one of its cells, over a range that
/// starts at the finding's last good commit (when both are known).
fn matching<'a>(saved: &'a Saved, cells: &HashSet<&str>, good: Option<&str>) -> Option<&'a Chased> {
    saved.findings.iter().find(|c| {
        c.cells.iter().any(|x| cells.contains(x.as_str()))
            && match (&c.commits, good) {
                (Some([g, _]), Some(want)) => g == want,
                _ => true,
            }
    })
}

/// The triage of `f`, or `None` when nothing of it was kept anywhere.
pub(crate) fn of(
    store: &mut crate::history::History,
    fleet: &Fleet,
    f: &Finding,
    kept: &Kept,
    runs_dir: Option<&Path>,
) -> Result<Option<Triage>, CliError> {
    let o = &f.cells[0];
    let s = &fleet.series[o.series];
    let cells: Vec<&str> = f
        .cells
        .iter()
        .map(|c| fleet.series[c.series].cell.as_str())
        .collect();
    let good_run = o.last_good.map(|g| &fleet.runs[s.values[g].run]);
    let bad_run = &fleet.runs[s.values[o.first_bad].run];
    let good_commit = good_run.and_then(|r| r.commit.as_deref());
    // A set: a finding of every cell of a large fleet, open for months, is matched against
    // each night's chase of as many cells.
    let wanted: HashSet<&str> = cells.iter().copied().collect();

    // The runs the finding stayed open through, newest first, and the chase each kept.
    let mut best: Option<(usize, String, Chased)> = None;
    for v in s.values[o.first_bad..].iter().rev() {
        let run = &fleet.runs[v.run];
        let found = match kept.get(&run.run_id)? {
            Some(saved) => Some(("history".to_string(), saved)),
            None => match runs_dir {
                Some(dir) => from_folder(dir, &run.run_id)?,
                None => None,
            },
        };
        let Some((source, saved)) = found else {
            continue;
        };
        let Some(chase) = matching(&saved, &wanted, good_commit) else {
            continue;
        };
        // A found first bad commit first, then one with its kernels diffed (a later night
        // that resumed from the history's rounds may have had no budget left to trace).
        let score = |c: &Chased| {
            let found = c
                .bisected
                .as_ref()
                .is_some_and(|b| b.status == BisectStatus::Found);
            (found, c.kernels.is_some())
        };
        if best
            .as_ref()
            .is_none_or(|(_, _, b)| score(chase) > score(b))
        {
            best = Some((v.run, source, chase.clone()));
        }
        if best
            .as_ref()
            .is_some_and(|(_, _, b)| score(b) == (true, true))
        {
            break;
        }
    }

    let mut t = Triage {
        source: None,
        run: None,
        run_page: None,
        bisected: None,
        status: None,
        line: None,
        kernels: None,
        kernels_source: None,
        kernels_summary: None,
        kernels_missing: None,
        probes: Vec::new(),
    };
    if let Some((run, source, chase)) = best {
        let id = &fleet.runs[run].run_id;
        t.source = Some(source);
        t.run = Some(id.clone());
        t.status = chase.bisected.as_ref().map(|b| b.status.as_str());
        t.line = chase.bisected.as_ref().map(Bisected::line);
        if let Some(k) = chase.kernels {
            t.kernels_source = Some(format!("the triage of run {id}"));
            t.kernels = Some(k);
        }
        t.kernels_missing = chase.kernels_missing;
        t.bisected = chase.bisected;
    }
    if t.kernels.is_none() {
        if let Some(good) = good_run {
            if let Some(k) = kernels_from_history(store, &cells, &good.run_id, &bad_run.run_id)? {
                t.kernels_source = Some(format!(
                    "the history's kernels of runs {} and {}",
                    good.run_id, bad_run.run_id
                ));
                t.kernels_missing = None;
                t.kernels = Some(k);
            }
        }
    }
    t.kernels_summary = t.kernels.as_ref().map(KernelDiff::summary);
    // A bisection measures one cell: its rounds, when it is known which.
    let probed: Vec<&str> = match &t.bisected {
        Some(b) => vec![b.cell.as_str()],
        None => cells.clone(),
    };
    t.probes = probes(fleet, f, &probed, t.bisected.as_ref());
    let empty = t.bisected.is_none()
        && t.kernels.is_none()
        && t.kernels_missing.is_none()
        && t.probes.is_empty();
    Ok((!empty).then_some(t))
}

/// The kernels that moved in the first of `cells` whose kernels the history keeps at both
/// runs (`bench_kernels`, written when runs trace a step of each cell).
fn kernels_from_history(
    store: &mut crate::history::History,
    cells: &[&str],
    good: &str,
    bad: &str,
) -> Result<Option<KernelDiff>, CliError> {
    for cell in cells.iter().take(KERNEL_CELLS) {
        let summary = |store: &mut crate::history::History, run: &str| {
            store
                .kernels(run, cell)
                .map(|t| t.and_then(|t| serde_json::from_str::<KernelSummary>(&t).ok()))
        };
        let Some(before) = summary(store, good)? else {
            continue;
        };
        let Some(after) = summary(store, bad)? else {
            continue;
        };
        let path = crate::run::kernel_trace_path(Path::new(""), cell);
        return Ok(Some(KernelDiff::of(
            cell,
            [
                &format!("last good run {good}"),
                &format!("first bad run {bad}"),
            ],
            &[before.step()],
            &[after.step()],
            vec![path.display().to_string()],
        )));
    }
    Ok(None)
}

/// The commits the bisection rounds of the finding's cells measured on its hardware key
/// since the run that opened it, each with its rounds and their median.
fn probes(fleet: &Fleet, f: &Finding, cells: &[&str], b: Option<&Bisected>) -> Vec<ProbeView> {
    let o = &f.cells[0];
    let s = &fleet.series[o.series];
    let since = &fleet.runs[s.values[o.first_bad].run].started_at;
    let cells: HashSet<&str> = cells.iter().copied().collect();
    let mut out: Vec<(ProbeView, Vec<f64>)> = Vec::new();
    for p in &fleet.probes {
        let run = &fleet.runs[p.run];
        if p.key != s.key || !cells.contains(&p.cell.as_str()) || run.started_at < *since {
            continue;
        }
        let at = out
            .iter()
            .position(|(v, _)| v.cell == p.cell && v.commit == run.commit);
        let i = match at {
            Some(i) => i,
            None if out.len() < PROBES => {
                let role = b.and_then(|b| {
                    let is = |c: &Option<crate::triage::culprit::CommitRef>| {
                        c.as_ref().map(|c| c.sha.as_str()) == run.commit.as_deref()
                    };
                    if is(&b.first_bad) {
                        Some("first bad")
                    } else if is(&b.last_good) {
                        Some("last good")
                    } else {
                        None
                    }
                });
                out.push((
                    ProbeView {
                        commit: run.commit.clone(),
                        cell: p.cell.clone(),
                        rounds: 0,
                        median: None,
                        role,
                    },
                    Vec::new(),
                ));
                out.len() - 1
            }
            None => continue,
        };
        out[i].0.rounds += 1;
        out[i].1.push(p.value);
    }
    out.into_iter()
        .map(|(mut v, xs)| {
            v.median = crate::metrics::stats::median(&xs);
            v
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::site::synthetic::{generate, Spec, HOSTILE_SUBJECT};

    fn chased(cells: &[&str], good: &str) -> Chased {
        Chased {
            cells: cells.iter().map(|c| c.to_string()).collect(),
            commits: Some([good.into(), "bad".into()]),
            bisected: None,
            kernels: None,
            kernels_missing: Some("no trace".into()),
        }
    }

    #[test]
    fn a_chase_is_the_findings_when_it_shares_a_cell_and_the_last_good_commit() {
        let saved = Saved {
            findings: vec![chased(&["x.bf16"], "g1"), chased(&["a.fp8", "b.fp8"], "g2")],
        };
        let hit = |cells: &[&str], good| {
            let cells: HashSet<&str> = cells.iter().copied().collect();
            matching(&saved, &cells, good).map(|c| c.cells[0].clone())
        };
        assert_eq!(hit(&["b.fp8"], Some("g2")).as_deref(), Some("a.fp8"));
        assert_eq!(hit(&["b.fp8"], Some("g1")), None, "another range");
        assert_eq!(hit(&["c.fp8"], Some("g2")), None, "another cause");
        assert_eq!(hit(&["x.bf16"], None).as_deref(), Some("x.bf16"));
    }

    /// The generated store's fp8 regression: on main, the newest run's found bisection
    /// (over the older run's out-of-budget one) with its kernels and rounds; on release, a
    /// skipped bisection whose kernels come from the history's `bench_kernels`.
    #[test]
    fn each_finding_gets_the_best_kept_triage_and_the_history_fills_in_the_kernels() {
        let d = tempfile::tempdir().unwrap();
        let location = d.path().join("h.sqlite").display().to_string();
        let spec = Spec {
            cells: 12,
            runs: 21,
            keys: 1,
            hostile: false,
        };
        generate(&location, &spec).unwrap();
        let mut store = crate::history::open_existing(&location).unwrap();
        let fleet = crate::site::model::build(
            store.fleet_runs().unwrap(),
            store.fleet("tokens_per_s").unwrap(),
            store.all_segments().unwrap(),
            None,
            1,
        );
        assert!(
            fleet.series.iter().all(|s| s.branch != "bisect"),
            "the bisection's rounds are no series"
        );
        assert_eq!(fleet.probes.len(), 6);
        let kept = Kept::of(store.all_triage().unwrap(), &location);
        let mut seen = Vec::new();
        for f in &fleet.findings {
            let s = &fleet.series[f.cells[0].series];
            let t = of(&mut store, &fleet, f, &kept, None).unwrap().unwrap();
            seen.push(s.branch.clone());
            let b = t.bisected.as_ref().unwrap();
            if s.branch == "main" {
                assert_eq!(t.status, Some("found"));
                assert_eq!(t.run.as_deref(), Some("night-0019-h100-sxm-80gb-x8"));
                assert_eq!(b.first_bad.as_ref().unwrap().subject, HOSTILE_SUBJECT);
                assert!(t
                    .kernels_source
                    .as_deref()
                    .unwrap()
                    .contains("triage of run"));
                let roles: Vec<_> = t.probes.iter().map(|p| p.role).collect();
                assert_eq!(roles, [Some("last good"), None, Some("first bad")], "{t:?}");
                assert_eq!(t.probes[0].rounds, 2);
            } else {
                assert_eq!(t.status, Some("skipped"));
                assert!(b.evidence.contains("pull request"));
                let k = t.kernels.as_ref().unwrap();
                assert!(t
                    .kernels_source
                    .as_deref()
                    .unwrap()
                    .contains("history's kernels"));
                assert!(k
                    .kernels
                    .iter()
                    .any(|d| d.name == "master_adamw" && d.after_ms == 0.0));
                assert!(t.probes.is_empty());
            }
        }
        seen.sort();
        assert_eq!(seen, ["main", "release"]);
    }

    #[test]
    fn a_damaged_row_of_the_history_is_refused_naming_the_run() {
        let kept = Kept::of(vec![("night-1".into(), "{".into())], "h.sqlite");
        assert!(kept.get("night-2").unwrap().is_none());
        let e = kept.get("night-1").err().unwrap();
        let text = format!("{:?}", e.report());
        assert!(text.contains("bench_triage, run night-1"), "{text}");
    }
}
