//! `bench report merge DIR... -o OUT`: the run folders of a sharded run (`bench matrix
//! --shard I/N`, one folder per shard, each with its `shard.json` plan) turned into one run
//! folder, judged and reported as one run: one `results.json`, `summary.md`, JUnit,
//! `report.json`, `report.html` and exit code over all cells, and one triage, so a cause
//! whose cells ran on different shards is one finding.
//!
//! Nothing is dropped in silence. The plan every shard wrote names every cell and its
//! shard, so a cell that no folder holds (its shard is missing, was killed, or computed
//! another plan) is put in the merged run as a failed cell whose reason names its shard;
//! each shard's state is named in the summary (`## Shards`), in `shards.json` and on
//! stderr, and any shard that did not finish fails the exit code.
//!
//! The history's judgement is the one each shard got when it ran (with its confirming
//! re-runs): the shards' `history.json` files are joined into the merged folder, and the
//! judge lays them over the baselines of the run's hardware key as `bench report` does.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::shard::Plan;
use crate::error::CliError;
use crate::format::Format;
use crate::history::verdicts::GateReport;
use crate::results::{CellResult, Outcome, RunResults};

/// Resolved settings of `bench report merge`.
#[derive(Debug, Clone)]
pub(crate) struct MergeSettings {
    /// The shards' run folders.
    pub run_dirs: Vec<PathBuf>,
    /// The merged run folder to write.
    pub output: PathBuf,
    /// Folder of baseline files.
    pub baselines: PathBuf,
    /// Terminal output format.
    pub format: Format,
    /// List every dropped cell's id under its rule in the terminal summary.
    pub verbose: bool,
    /// Price of one GPU-hour, for the framework comparison's cost per 1T tokens.
    pub gpu_hour_price: Option<f64>,
    /// The hardware kinds the fleet must hold (`KIND` or `KIND=SHARDS`), as given.
    pub expect_kinds: Vec<String>,
    /// Whether each merged run prints its summary (or JSON report) on stdout: a fleet in
    /// JSON prints its own report instead, so stdout is one document.
    pub run_stdout: bool,
}

/// One shard's folder as the merge found it.
pub(crate) struct Folder {
    dir: PathBuf,
    plan: Plan,
    /// `None` when the shard wrote its plan but no results (killed before its first cell).
    results: Option<RunResults>,
    /// What failed a run this folder holds merged already (its `shards.json`): a fleet
    /// merged from runs' merged folders keeps a shard that never finished failing its run.
    carried: Vec<String>,
}

/// What became of one shard, as `shards.json` and the summary say it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct ShardState {
    /// `I/N`.
    pub shard: String,
    /// `finished`, `interrupted` (stopped before its last cell: killed, cancelled,
    /// Ctrl-C), `no results` (its folder has a plan and no results) or `missing` (no
    /// folder given holds it).
    pub state: &'static str,
    /// The folder, when one holds the shard.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub folder: Option<PathBuf>,
    /// Cells the plan gave the shard.
    pub planned: usize,
    /// Of those, cells its folder holds.
    pub ran: usize,
}

impl ShardState {
    fn ok(&self) -> bool {
        self.state == "finished" && self.ran == self.planned
    }

    pub(crate) fn line(&self) -> String {
        let mut s = format!(
            "shard {}: {}, {} of {} planned cells",
            self.shard, self.state, self.ran, self.planned
        );
        if let Some(f) = &self.folder {
            s.push_str(&format!(" ({})", f.display()));
        }
        s
    }
}

/// The merged run of some shard folders, before it is judged.
pub(crate) struct Merged {
    pub results: RunResults,
    pub history: Option<GateReport>,
    pub shards: Vec<ShardState>,
    /// Problems beyond one shard's state (a run none of whose shards wrote results, a
    /// merged run's own unfinished shards), named for the summary.
    pub notes: Vec<String>,
}

impl Merged {
    /// Whether every shard finished with every cell of its plan.
    pub(crate) fn complete(&self) -> bool {
        self.notes.is_empty() && self.shards.iter().all(ShardState::ok)
    }

    /// Why the run fails whatever its cells' verdicts: each shard that did not finish
    /// every cell of its plan, and each note. Every report of the run states them with the
    /// exit code they give ([`crate::baseline::compare::Comparison::run_failures`]).
    pub(crate) fn failures(&self) -> Vec<String> {
        self.shards
            .iter()
            .filter(|s| !s.ok())
            .map(ShardState::line)
            .chain(self.notes.iter().cloned())
            .collect()
    }
}

/// The file of a merged run's folder naming its shards and what became of them.
pub(crate) const SHARDS_FILE: &str = "shards.json";

/// What failed the merged run in `dir` beyond its cells, from its [`SHARDS_FILE`] (none
/// when the folder is no merge's): `bench report`, `bench report post` and a fleet's merge
/// of the folder state the exit code the merge gave, not the cells' alone.
pub(crate) fn shard_failures(dir: &Path) -> Result<Vec<String>, CliError> {
    #[derive(serde::Deserialize)]
    struct State {
        shard: String,
        state: String,
        #[serde(default)]
        folder: Option<PathBuf>,
        planned: usize,
        ran: usize,
    }
    #[derive(serde::Deserialize)]
    struct File {
        shards: Vec<State>,
        #[serde(default)]
        notes: Vec<String>,
    }
    let Some(file) = super::read_json::<File>(&dir.join(SHARDS_FILE))? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for s in file.shards {
        if s.state != "finished" || s.ran != s.planned {
            let mut line = format!(
                "shard {}: {}, {} of {} planned cells",
                s.shard, s.state, s.ran, s.planned
            );
            if let Some(f) = s.folder {
                line.push_str(&format!(" ({})", f.display()));
            }
            out.push(line);
        }
    }
    out.extend(file.notes);
    Ok(out)
}

/// The folders grouped by run id, in the order the command line first names each run.
pub(crate) fn by_run(folders: Vec<Folder>) -> Vec<Vec<Folder>> {
    let mut runs: Vec<Vec<Folder>> = Vec::new();
    for f in folders {
        match runs.iter_mut().find(|r| r[0].plan.run_id == f.plan.run_id) {
            Some(r) => r.push(f),
            None => runs.push(vec![f]),
        }
    }
    runs
}

/// One run merged, judged and reported in its folder, as the fleet's summary needs it.
pub(crate) struct MergedRun {
    pub results: RunResults,
    pub verdicts: crate::judge::Verdicts,
    pub findings: Vec<crate::triage::Finding>,
    pub shards: Vec<ShardState>,
    /// Whether every shard finished every cell of its plan.
    pub complete: bool,
    /// The exit code of the run alone.
    pub exit: i32,
}

/// The hardware key the run of `folders` was measured on: its results' (the nodes' key
/// for a Slurm run), else the plan's (a run none of whose shards has results).
pub(crate) fn hardware_key(folders: &[Folder]) -> String {
    folders
        .iter()
        .find_map(|f| f.results.as_ref())
        .map(|r| r.environment.hardware_key.clone())
        .unwrap_or_else(|| folders[0].plan.hardware_key.clone())
}

/// The run id of `folders` (one run's).
pub(crate) fn run_id(folders: &[Folder]) -> &str {
    &folders[0].plan.run_id
}

/// How many shards the run of `folders` was split into: its plan's count, or for a run's
/// merged folder the shards its merge named.
pub(crate) fn shard_count(folders: &[Folder]) -> u32 {
    let f = &folders[0];
    if f.plan.shard.count > 1 || f.dir.join(super::shard::FILE).exists() {
        return f.plan.shard.count;
    }
    #[derive(serde::Deserialize)]
    struct File {
        shards: Vec<serde_json::Value>,
    }
    super::read_json::<File>(&f.dir.join(SHARDS_FILE))
        .ok()
        .flatten()
        .map_or(1, |s| {
            u32::try_from(s.shards.len()).unwrap_or(u32::MAX).max(1)
        })
}

/// A run's folders merged in memory and checked as a whole (one plan, one build, each
/// cell once, its triage files and its key's baseline file readable, the merged results
/// within the size a results.json may have), nothing written yet: `bench report merge`
/// checks every run of a fleet so before it writes the first, so that a refused merge
/// writes nothing (no run's folder, no line in the job's summary page).
pub(crate) struct Checked {
    dirs: Vec<PathBuf>,
    homes: HashMap<String, PathBuf>,
    merged: Merged,
}

impl Checked {
    /// The run's hardware key.
    pub(crate) fn key(&self) -> &str {
        &self.merged.results.environment.hardware_key
    }

    /// The run's id.
    pub(crate) fn run_id(&self) -> &str {
        &self.merged.results.run_id
    }
}

/// Merges and checks the folders of one run ([`Checked`]); bad input is refused here,
/// before anything is written.
pub(crate) fn check_run(folders: Vec<Folder>, args: &MergeSettings) -> Result<Checked, CliError> {
    let dirs: Vec<PathBuf> = folders.iter().map(|f| f.dir.clone()).collect();
    super::triage::check(&dirs)?;
    let homes = log_homes(&folders);
    let merged = merge(folders)?;
    // A damaged baseline file is refused before anything is written.
    crate::baseline::Baselines::load_for(
        &args.baselines,
        &merged.results.environment.hardware_key,
    )?;
    merged.results.document().map_err(|e| CliError::internal(miette::miette!("{e}"))).and_then(|doc| {
        if doc.len() as u64 > crate::files::MAX_RESULTS_BYTES {
            Err(CliError::bad_input(miette::miette!(
                "the merged results of run {} would be {} MiB, more than the {} MiB a results.json may hold: merge fewer cells into one run (split the matrix into several runs and merge them as a fleet)",
                merged.results.run_id,
                doc.len() as u64 / crate::files::MIB,
                crate::files::MAX_RESULTS_BYTES / crate::files::MIB
            )))
        } else {
            Ok(())
        }
    })?;
    Ok(Checked {
        dirs,
        homes,
        merged,
    })
}

/// Merges the folders of one run into `out`, judges it against the baselines of its own
/// hardware key and the shards' history verdicts, writes every report there and prints its
/// summary. Every input was read and checked by [`check_run`] (the shards, their history
/// and triage files, the baselines) before this writes the first file.
pub(crate) fn merge_run(
    checked: Checked,
    out: &Path,
    args: &MergeSettings,
) -> Result<MergedRun, CliError> {
    let Checked {
        dirs,
        homes,
        merged,
    } = checked;
    std::fs::create_dir_all(out)
        .map_err(|e| CliError::internal(miette::miette!("{}: {e}", out.display())))?;
    copy_logs(&homes, &merged.results, out);
    merged.results.save_atomic(out)?;
    if let Some(h) = &merged.history {
        super::write_json(&out.join(GateReport::FILE), h)?;
    }
    super::write_json(
        &out.join(SHARDS_FILE),
        &serde_json::json!({
            "shards": merged.shards,
            "notes": merged.notes,
        }),
    )?;
    for s in &merged.shards {
        eprintln!("{}", s.line());
    }
    for n in &merged.notes {
        eprintln!("warning: {n}");
    }

    let mut verdicts = crate::judge::of_run(&merged.results, &args.baselines, Some(out))?;
    // A shard that did not finish fails the run: every report says so, with the one exit
    // code this command returns.
    verdicts.comparison.run_failures = merged.failures();
    // One triage over every shard's cells: a cause spanning shards is one finding, and
    // what a shard's own triage found (its bisection, its kernels) is laid on it and kept.
    let mut findings = crate::triage::findings(&merged.results, &verdicts);
    super::triage::carry(&dirs, &mut findings)?;
    super::triage::save(out, &findings)?;
    // The merged cost is the shards' figures summed (history.json's, and triage.json's
    // carried over): refused as at every other door when no run can have spent them. The
    // merge is written in a stage folder, so a refusal leaves the output as it was.
    if let Some(why) = crate::report::input::ReportInput::new(&merged.results, &verdicts, &findings)
        .implausible_cost()
    {
        return Err(CliError::bad_input(miette::miette!(
            "the shards' files ({}): {why}",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let exit = if args.run_stdout {
        crate::report::finish_run(
            out,
            &merged.results,
            &verdicts,
            &findings,
            args.format,
            args.verbose,
            args.gpu_hour_price,
        )?
    } else {
        crate::report::write_files(
            out,
            &merged.results,
            &verdicts,
            &findings,
            args.gpu_hour_price,
        )?;
        crate::report::input::ReportInput::new(&merged.results, &verdicts, &findings).exit_code()
    };
    append_shards_section(out, &merged)?;
    let complete = merged.complete();
    Ok(MergedRun {
        results: merged.results,
        verdicts,
        findings,
        shards: merged.shards,
        complete,
        exit,
    })
}

/// A run folder: a shard's, with its plan, or a whole run's (`bench matrix` without
/// `--shard`), which is its own one shard of a plan of the cells it holds. A folder with
/// neither a plan nor results is bad input.
pub(crate) fn read_folder(dir: &Path) -> Result<Folder, CliError> {
    // A link that leads nowhere is a damaged folder, not one without results.
    for name in [RunResults::FILE, RunResults::JOURNAL, super::shard::FILE] {
        let path = dir.join(name);
        if std::fs::symlink_metadata(&path).is_ok() && !path.exists() {
            return Err(CliError::bad_input(miette::miette!(
                "{}: a link that leads nowhere",
                path.display()
            )));
        }
    }
    let has_results = dir.join(RunResults::FILE).exists() || dir.join(RunResults::JOURNAL).exists();
    let results = if has_results {
        Some(RunResults::load(dir)?)
    } else {
        None
    };
    // A merged run's folder (a fleet merged from each kind's merged run) keeps what
    // failed it.
    let carried = if dir.join(super::shard::FILE).exists() {
        Vec::new()
    } else {
        shard_failures(dir)?
    };
    let plan = match (Plan::load(dir)?, &results) {
        (Some(plan), _) => plan,
        (None, Some(r)) => Plan::whole(r),
        (None, None) => {
            return Err(CliError::bad_input(miette::miette!(
                "{}: neither {} nor {}: not the folder of a `bench matrix` run",
                dir.display(),
                super::shard::FILE,
                RunResults::FILE
            )))
        }
    };
    if let Some(r) = &results {
        if r.run_id != plan.run_id {
            return Err(CliError::bad_input(miette::miette!(
                "{}: results of run {:?} beside the plan of run {:?}: not one run's folder",
                dir.display(),
                r.run_id,
                plan.run_id
            )));
        }
        if r.environment.hardware_key.trim().is_empty() {
            return Err(CliError::bad_input(miette::miette!(
                "{}: environment.hardware_key is empty: the run cannot be judged against any baselines",
                dir.join(RunResults::FILE).display()
            )));
        }
    }
    Ok(Folder {
        dir: dir.to_path_buf(),
        plan,
        results,
        carried,
    })
}

/// Joins shard folders into one run: the cells of every plan in the plan's order, each
/// from its shard's results, else a failed cell naming why it has no result.
fn merge(mut folders: Vec<Folder>) -> Result<Merged, CliError> {
    let Some(first) = folders.first() else {
        return Err(CliError::bad_input(miette::miette!(
            "bench report merge needs at least one shard folder"
        )));
    };
    let (run_id, count) = (first.plan.run_id.clone(), first.plan.shard.count);
    for f in &folders {
        if f.plan.run_id != run_id || f.plan.shard.count != count {
            return Err(CliError::bad_input(miette::miette!(
                "{}: shard {} of run {}, while {} holds shard {} of run {}: merge the shards of one run (one --run-id, one N)",
                f.dir.display(),
                f.plan.shard,
                f.plan.run_id,
                first.dir.display(),
                first.plan.shard,
                run_id
            )));
        }
    }
    // The shards of one run are measured on one hardware key, and are judged against its
    // baselines: a shard measured elsewhere would be compared with another GPU's numbers.
    let keyed: Vec<&Folder> = folders.iter().filter(|f| f.results.is_some()).collect();
    if let Some(k) = keyed.first() {
        let key = &k.results.as_ref().unwrap().environment.hardware_key;
        if let Some(other) = keyed
            .iter()
            .find(|f| &f.results.as_ref().unwrap().environment.hardware_key != key)
        {
            return Err(CliError::bad_input(miette::miette!(
                "{} was measured on {}, {} on {}: the shards of run {run_id} must run on one hardware kind (give each kind its own --run-id and merge the runs as a fleet)",
                k.dir.display(),
                key,
                other.dir.display(),
                other.results.as_ref().unwrap().environment.hardware_key
            )));
        }
    }
    folders.sort_by_key(|f| f.plan.shard.index);
    for pair in folders.windows(2) {
        if pair[0].plan.shard == pair[1].plan.shard {
            return Err(CliError::bad_input(miette::miette!(
                "{} and {} both hold shard {}: give each shard's folder once",
                pair[0].dir.display(),
                pair[1].dir.display(),
                pair[0].plan.shard
            )));
        }
    }
    check_plans(&folders)?;
    check_same_hardware(&folders, &run_id)?;
    check_same_build(&folders, &run_id)?;
    for f in &folders {
        check_cells(f)?;
    }
    let mut notes: Vec<String> = folders.iter().flat_map(|f| f.carried.clone()).collect();
    let reference = &folders[0].plan;
    // Indexed by cell id: a fleet's nightly holds thousands of cells, and nested scans
    // made the merge quadratic (40,000 cells took minutes).
    let planned: Vec<&super::shard::Planned> = reference.cells.iter().collect();
    // Every shard's results, by cell id: each cell is in the results of the one shard
    // that planned it (check_cells).
    let mut ran: HashMap<&str, &crate::results::CellResult> = HashMap::new();
    for f in &folders {
        if let Some(r) = &f.results {
            for c in &r.cells {
                ran.insert(c.id.as_str(), c);
            }
        }
    }
    let mut planned_per_shard: HashMap<u32, usize> = HashMap::new();
    for p in &reference.cells {
        *planned_per_shard.entry(p.shard).or_default() += 1;
    }

    let states: Vec<ShardState> = (1..=count)
        .map(
            |index| match folders.iter().find(|f| f.plan.shard.index == index) {
                None => ShardState {
                    shard: format!("{index}/{count}"),
                    state: "missing",
                    folder: None,
                    planned: planned_per_shard.get(&index).copied().unwrap_or(0),
                    ran: 0,
                },
                Some(f) => {
                    let mine = f.plan.cells_of(index);
                    let (state, planned_n, ran_n) = match &f.results {
                        None => ("no results", mine.count(), 0),
                        Some(r) => {
                            let held: HashSet<&str> =
                                r.cells.iter().map(|c| c.id.as_str()).collect();
                            let (mut n, mut done_n) = (0, 0);
                            for p in mine {
                                n += 1;
                                done_n += usize::from(held.contains(p.cell.id.as_str()));
                            }
                            let done = r.finished_at.is_some() && !r.interrupted;
                            (if done { "finished" } else { "interrupted" }, n, done_n)
                        }
                    };
                    ShardState {
                        shard: format!("{index}/{count}"),
                        state,
                        folder: Some(f.dir.clone()),
                        planned: planned_n,
                        ran: ran_n,
                    }
                }
            },
        )
        .collect();

    let with_results: Vec<&RunResults> =
        folders.iter().filter_map(|f| f.results.as_ref()).collect();
    // A run none of whose shards wrote results (all killed before their first cell) is
    // still a run of the fleet: every planned cell failed, naming its shard, on the
    // hardware its plan was computed for.
    let nothing_ran;
    let head = match with_results.first() {
        Some(h) => *h,
        None => {
            nothing_ran = RunResults {
                schema_version: crate::results::SCHEMA_VERSION,
                run_id: run_id.clone(),
                matrix: PathBuf::new(),
                matrix_name: format!("run {run_id}"),
                matrix_sha256: None,
                filters: Vec::new(),
                started_at: String::new(),
                finished_at: None,
                interrupted: true,
                interrupted_in: None,
                environment: crate::results::Environment {
                    hardware_key: reference.hardware_key.clone(),
                    ..Default::default()
                },
                environment_source: None,
                launcher: None,
                cells: Vec::new(),
                dropped: Vec::new(),
            };
            notes.push(format!(
                "no shard of run {run_id} wrote results: every planned cell is failed"
            ));
            &nothing_ran
        }
    };
    let mut results = RunResults {
        cells: Vec::new(),
        dropped: Vec::new(),
        ..head.clone()
    };
    results.started_at = with_results
        .iter()
        .map(|r| r.started_at.clone())
        .min()
        .unwrap_or_default();
    let all_done = states.iter().all(|s| s.state == "finished");
    results.finished_at = if all_done {
        with_results
            .iter()
            .filter_map(|r| r.finished_at.clone())
            .max()
    } else {
        None
    };
    // The merge itself ran to its end: a shard that did not is a failure of the run that
    // names the shard (Merged::failures), whose exit code (1) every report states, not an
    // interrupted run's 130 that this command never returns.
    results.interrupted = false;
    results.interrupted_in = None;
    results
        .filters
        .retain(|f| !f.starts_with(crate::results::SHARD_DROP_PREFIX));
    for p in &planned {
        results.cells.push(match ran.get(p.cell.id.as_str()) {
            Some(c) => (*c).clone(),
            None => not_run(p, &states),
        });
    }
    let mut dropped_ids: HashSet<String> = HashSet::new();
    for r in &with_results {
        // Another shard's cells, dropped from this folder, are cells of the merged run.
        for d in r.dropped.iter().filter(|d| !d.by_shard()) {
            if dropped_ids.insert(d.id.to_string()) {
                results.dropped.push(d.clone());
            }
        }
    }

    Ok(Merged {
        history: merge_history(&folders)?,
        results,
        shards: states,
        notes,
    })
}

/// `shard.json` of `f`, for messages.
fn plan_file(f: &Folder) -> PathBuf {
    f.dir.join(super::shard::FILE)
}

/// `results.json` of `f`, for messages.
fn results_file(f: &Folder) -> PathBuf {
    f.dir.join(RunResults::FILE)
}

/// Every shard computed one plan: the same cells, with the same parameters, each in the
/// same shard. Shards that split the run differently (the history changed between their
/// starts, or a plan was edited) cannot be merged into one run: a cell could be run twice
/// or by nobody, or at steps its twin in the other plan does not have.
fn check_plans(folders: &[Folder]) -> Result<(), CliError> {
    let first = &folders[0];
    for f in &folders[1..] {
        let (a, b) = (&first.plan.cells, &f.plan.cells);
        let differs = a
            .iter()
            .zip(b)
            .position(|(x, y)| x.cell.id != y.cell.id || x.shard != y.shard)
            .or((a.len() != b.len()).then_some(a.len().min(b.len())));
        // Same cells in the same shards, but one cell planned with other parameters (its
        // steps, repeats, workload): the shards still did not compute one plan.
        let params = a.iter().zip(b).position(|(x, y)| x.cell != y.cell);
        if let (None, Some(i)) = (differs, params) {
            return Err(CliError::bad_input(miette::miette!(
                "{}: cells[{i}] ({}) is planned with other parameters than in {}: the shards computed different plans (a plan was edited); run the night again with one plan",
                plan_file(f).display(),
                crate::sanitize::inline(b[i].cell.id.as_str()),
                plan_file(first).display(),
            )));
        }
        if let Some(i) = differs {
            let at = |cells: &[super::shard::Planned]| match cells.get(i) {
                Some(p) => format!(
                    "{} in shard {}",
                    crate::sanitize::terminal(p.cell.id.as_str()),
                    p.shard
                ),
                None => "nothing".to_string(),
            };
            return Err(CliError::bad_input(miette::miette!(
                "{}: cells[{i}] is {}, while {} plans {} there: the shards computed different plans (the history changed between their starts, or a plan was edited); run the night again with one plan",
                plan_file(f).display(),
                at(b),
                plan_file(first).display(),
                at(a)
            )));
        }
    }
    Ok(())
}

/// The shards of one run are one build of one matrix on one software stack: results of
/// another matrix, commit or driver merged in would be reported as this run's.
fn check_same_build(folders: &[Folder], run_id: &str) -> Result<(), CliError> {
    check_agree(
        folders,
        run_id,
        "one matrix built from one commit on one software stack",
        |r| {
            let e = &r.environment;
            let show = |v: &Option<String>| format!("{v:?}");
            vec![
                ("matrix_sha256", show(&r.matrix_sha256)),
                ("matrix_name", format!("{:?}", r.matrix_name)),
                ("launcher", show(&r.launcher)),
                ("environment.git_commit", show(&e.git_commit)),
                ("environment.git_dirty", e.git_dirty.to_string()),
                (
                    "environment.bench_version",
                    format!("{:?}", e.bench_version),
                ),
                ("environment.driver", show(&e.driver)),
                ("environment.cuda", show(&e.cuda)),
                ("environment.rocm", show(&e.rocm)),
                ("environment.libtorch", show(&e.libtorch)),
                ("environment.nccl", show(&e.nccl)),
                ("environment.switches", format!("{:?}", e.switches)),
            ]
        },
    )
}

/// The shards of one run ran on one GPU model and count: the hardware key names the
/// baselines they are judged against, and two kinds of GPU (or an 8-GPU host beside a
/// 4-GPU one, which skips the 8-GPU cells) under one key would be judged as one machine.
fn check_same_hardware(folders: &[Folder], run_id: &str) -> Result<(), CliError> {
    check_agree(
        folders,
        run_id,
        "measured on one GPU model and count, as their one hardware key says",
        |r| {
            let e = &r.environment;
            vec![
                (
                    "environment.gpu_model",
                    e.gpu_model
                        .as_deref()
                        .map_or_else(|| "none".to_string(), |m| format!("{m:?}")),
                ),
                ("environment.gpu_count", e.gpu_count.to_string()),
            ]
        },
    )
}

/// Every shard with results has the same value of each of `fields` as the first: the
/// first that differs is bad input naming both shards' files, the field and both values,
/// and what the shards of a run must be (`must_be`).
fn check_agree(
    folders: &[Folder],
    run_id: &str,
    must_be: &str,
    fields: impl Fn(&RunResults) -> Vec<(&'static str, String)>,
) -> Result<(), CliError> {
    let keyed: Vec<&Folder> = folders.iter().filter(|f| f.results.is_some()).collect();
    let Some(first) = keyed.first() else {
        return Ok(());
    };
    let want = fields(first.results.as_ref().expect("keyed"));
    for f in &keyed[1..] {
        let got = fields(f.results.as_ref().expect("keyed"));
        if let Some(((name, a), (_, b))) = want.iter().zip(&got).find(|(a, b)| a.1 != b.1) {
            return Err(CliError::bad_input(miette::miette!(
                "{}: {name} is {}, while {} has {}: the shards of run {run_id} must be {must_be}",
                results_file(f).display(),
                crate::sanitize::terminal(b),
                results_file(first).display(),
                crate::sanitize::terminal(a)
            )));
        }
    }
    Ok(())
}

/// A shard's results hold each cell once, only cells its plan gave it, each with the
/// values and parameters its plan gave it ([`check_as_planned`]), and measurements within
/// their bounds: what `bench history import` refuses is not reported here either.
fn check_cells(f: &Folder) -> Result<(), CliError> {
    let Some(r) = &f.results else {
        return Ok(());
    };
    let file = results_file(f);
    let planned: HashMap<&str, &super::shard::Planned> = f
        .plan
        .cells
        .iter()
        .map(|p| (p.cell.id.as_str(), p))
        .collect();
    let mine = f.plan.shard.index;
    let mut seen: HashSet<&str> = HashSet::new();
    for (i, c) in r.cells.iter().enumerate() {
        let id = crate::sanitize::terminal(c.id.as_str());
        if !seen.insert(c.id.as_str()) {
            return Err(CliError::bad_input(miette::miette!(
                "{}: cells[{i}] ({id}) is listed twice: a run holds each cell once",
                file.display()
            )));
        }
        match planned.get(c.id.as_str()).map(|p| (p.shard, p)) {
            Some((s, p)) if s == mine => check_as_planned(&file, &plan_file(f), i, c, p)?,
            Some((s, _)) => {
                return Err(CliError::bad_input(miette::miette!(
                    "{}: cells[{i}] ({id}) is a cell of shard {s}/{}, not of shard {} whose folder this is: each cell is merged from the shard that planned it",
                    file.display(),
                    f.plan.shard.count,
                    f.plan.shard
                )))
            }
            None => {
                return Err(CliError::bad_input(miette::miette!(
                    "{}: cells[{i}] ({id}) is in no shard's plan ({}): not a cell of this run",
                    file.display(),
                    plan_file(f).display()
                )))
            }
        }
    }
    if let Some(why) = r.implausible_measurement() {
        return Err(CliError::bad_input(miette::miette!(
            "{}: {why}; not merged",
            file.display()
        )));
    }
    Ok(())
}

/// A shard's cell ran as its plan says: the same axis values and parameters (steps,
/// repeats, sequence length, ...). A cell measured with other parameters than the rest of
/// the run (an edited results file, or a shard resumed with another `--repeats`) would be
/// judged against baselines of another measurement; it is bad input naming the key path,
/// both values and the plan.
fn check_as_planned(
    file: &Path,
    plan: &Path,
    i: usize,
    c: &CellResult,
    p: &super::shard::Planned,
) -> Result<(), CliError> {
    let json = |v: serde_json::Result<serde_json::Value>| {
        v.map_err(|e| CliError::internal(miette::miette!("{}: {e}", file.display())))
    };
    for (key, got, want) in [
        (
            "values",
            json(serde_json::to_value(&c.values))?,
            json(serde_json::to_value(&p.cell.values))?,
        ),
        (
            "params",
            json(serde_json::to_value(&c.params))?,
            json(serde_json::to_value(&p.cell.params))?,
        ),
    ] {
        if let Some((at, got, want)) = first_difference(&got, &want, key) {
            return Err(CliError::bad_input(miette::miette!(
                "{}: cells[{i}] ({}).{at} is {}, while {} plans {}: the cell did not run as the run's plan says; run the shard again",
                file.display(),
                crate::sanitize::terminal(c.id.as_str()),
                crate::sanitize::terminal(&got),
                plan.display(),
                crate::sanitize::terminal(&want)
            )));
        }
    }
    Ok(())
}

/// The first key path, from `at` down, where `got` and `want` differ, with both values as
/// JSON text (`absent` for a key one side lacks). Keys are visited in `want`'s order, then
/// the keys only `got` has.
fn first_difference(
    got: &serde_json::Value,
    want: &serde_json::Value,
    at: &str,
) -> Option<(String, String, String)> {
    use serde_json::Value;
    let shown = |v: Option<&Value>| v.map_or_else(|| "absent".to_string(), Value::to_string);
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => w
            .keys()
            .chain(g.keys().filter(|k| !w.contains_key(*k)))
            .find_map(|k| {
                let at = format!("{at}.{k}");
                match (g.get(k), w.get(k)) {
                    (Some(a), Some(b)) => first_difference(a, b, &at),
                    (a, b) => Some((at, shown(a), shown(b))),
                }
            }),
        (Value::Array(g), Value::Array(w)) if g.len() == w.len() => g
            .iter()
            .zip(w)
            .enumerate()
            .find_map(|(j, (a, b))| first_difference(a, b, &format!("{at}[{j}]"))),
        _ => (got != want).then(|| (at.to_string(), got.to_string(), want.to_string())),
    }
}

/// A planned cell no shard folder holds: failed, with its shard and what became of it.
fn not_run(p: &super::shard::Planned, states: &[ShardState]) -> CellResult {
    let state = states
        .get(p.shard as usize - 1)
        .map(|s| s.state)
        .unwrap_or("missing");
    let why = match state {
        "missing" => "no folder given holds that shard",
        "no results" => "the shard wrote its plan and no results (killed before its first cell?)",
        "interrupted" => "the shard stopped before this cell (killed, cancelled or interrupted)",
        _ => "the shard finished without it",
    };
    let count = states.len();
    CellResult {
        id: p.cell.id.clone(),
        values: p.cell.values.clone(),
        params: p.cell.params.clone(),
        outcome: Outcome::Failed {
            reason: format!("not run: shard {}/{count} {state}: {why}", p.shard),
        },
        flaky: false,
        attempts: Vec::new(),
        repeats: Vec::new(),
        metrics: Default::default(),
        logs: Vec::new(),
        duration_s: 0.0,
        telemetry: None,
    }
}

/// The shards' `history.json` joined: the verdicts each shard's cells got against the
/// history when it ran. `None` when no shard was judged against a history.
fn merge_history(folders: &[Folder]) -> Result<Option<GateReport>, CliError> {
    let mut merged: Option<GateReport> = None;
    for f in folders {
        let Some(h) = load_history(&f.dir)? else {
            continue;
        };
        check_history_costs(f, &h)?;
        match &mut merged {
            None => merged = Some(h),
            Some(m) => {
                m.cells.extend(h.cells);
                m.over_budget.extend(h.over_budget);
                if h.confirm_run_id.is_some() {
                    m.confirm_run_id = h.confirm_run_id;
                }
                // Each shard re-ran its own cells: the run's re-runs cost their sum (the
                // merged cost kept only the first shard's before).
                m.reruns_gpu_s += h.reruns_gpu_s;
                for (cell, gpu_s) in h.reruns_gpu_s_by_cell {
                    *m.reruns_gpu_s_by_cell.entry(cell).or_default() += gpu_s;
                }
            }
        }
    }
    Ok(merged)
}

/// Refuses a shard's `history.json` whose GPU-seconds no run can have spent (a forged
/// `1e308` or `-5`, re-runs by cell that do not add up), naming the file and the field: the
/// merged reports state the cost. The check is the reports' own
/// ([`GateReport::implausible_cost`]), against the cells the shard ran.
fn check_history_costs(f: &Folder, h: &GateReport) -> Result<(), CliError> {
    let ran = |id: &str| {
        f.results
            .iter()
            .flat_map(|r| &r.cells)
            .any(|c| c.id.as_str() == id)
    };
    match h.implausible_cost(ran) {
        Some(why) => Err(CliError::bad_input(miette::miette!(
            "{}: {why}",
            f.dir.join(GateReport::FILE).display()
        ))),
        None => Ok(()),
    }
}

/// A shard's `history.json`, or `None` when it was not judged against a history. One that
/// is there and does not read is bad input naming it: skipping it would judge that shard's
/// cells against the baselines instead, and change the verdict without a word.
fn load_history(dir: &Path) -> Result<Option<GateReport>, CliError> {
    super::read_json(&dir.join(GateReport::FILE))
}

/// Each cell's shard folder, by cell id: where its logs are.
fn log_homes(folders: &[Folder]) -> HashMap<String, PathBuf> {
    let mut homes = HashMap::new();
    for f in folders {
        for c in f.results.iter().flat_map(|r| &r.cells) {
            homes
                .entry(c.id.as_str().to_string())
                .or_insert_with(|| f.dir.clone());
        }
    }
    homes
}

/// `rel` inside `dir` when every part of it below `dir` is a plain folder or, at its end,
/// a regular file: a link in a shard's `logs/` (to a file, or a `logs/` that is itself a
/// link) would have the merge copy whatever it points at into its output.
fn plain_file_under(dir: &Path, rel: &Path) -> Option<PathBuf> {
    let mut at = dir.to_path_buf();
    let parts: Vec<_> = rel.components().collect();
    for (i, part) in parts.iter().enumerate() {
        at.push(part);
        let meta = std::fs::symlink_metadata(&at).ok()?;
        let last = i + 1 == parts.len();
        if (last && !meta.file_type().is_file()) || (!last && !meta.file_type().is_dir()) {
            return None;
        }
    }
    Some(at)
}

/// Copies each cell's log files from the shard folder that ran it, so the merged folder's
/// reports link logs that are there. A log that is not a plain file there (missing, a
/// link, a FIFO) is left out with a warning: the verdict does not depend on it.
fn copy_logs(homes: &HashMap<String, PathBuf>, results: &RunResults, out: &Path) {
    for c in &results.cells {
        let Some(home) = homes.get(c.id.as_str()) else {
            continue;
        };
        for log in &c.logs {
            // Only plain relative paths inside the run folder (as the runner writes them).
            if log.as_os_str().is_empty()
                || log.is_absolute()
                || log
                    .components()
                    .any(|p| !matches!(p, std::path::Component::Normal(_)))
            {
                continue;
            }
            let Some(src) = plain_file_under(home, log) else {
                if std::fs::symlink_metadata(home.join(log)).is_ok() {
                    eprintln!(
                        "warning: {}: not a plain file in the shard's folder (a link?); not copied",
                        home.join(log).display()
                    );
                }
                continue;
            };
            let dst = out.join(log);
            if let Some(parent) = dst.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            if let Err(e) = std::fs::copy(&src, &dst) {
                eprintln!("warning: {}: {e}", src.display());
            }
        }
    }
}

/// Appends the shards' states to `summary.md`, so the one summary names a shard that did
/// not finish (its cells are already failed cells with the shard in their reason).
fn append_shards_section(out: &Path, merged: &Merged) -> Result<(), CliError> {
    let path = out.join("summary.md");
    let mut text = std::fs::read_to_string(&path).unwrap_or_default();
    text.push_str(&format!(
        "\n## Shards\n\n{} of {} shards finished every cell.\n\n",
        merged.shards.iter().filter(|s| s.ok()).count(),
        merged.shards.len()
    ));
    for s in &merged.shards {
        let mark = if s.ok() { "" } else { "**" };
        text.push_str(&format!("- {mark}{}{mark}\n", s.line()));
    }
    for n in &merged.notes {
        text.push_str(&format!("- **{n}**\n"));
    }
    crate::atomic::write(&path, text.as_bytes())
        .map_err(|e| CliError::internal(miette::miette!("{}: {e}", path.display())))
}
