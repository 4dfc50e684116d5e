//! `bench matrix FILE` (without `--dry-run`): the pipeline end to end, matrix -> run ->
//! judge (with the re-runs its verdicts want) -> triage (with the bisections its findings
//! want) -> report.

use crate::error::CliError;
use crate::history::gate::{confirm_run_id, ConfirmOutcome, Confirmation};
use crate::history::History;
use crate::results::{Interruption, RunResults};
use crate::run::{LauncherRequest, MatrixSettings, RunOutcome};

/// `bench matrix FILE`: load and check the matrix (and the history it will be judged
/// against) before the first cell, run the cells, judge them (re-running what the verdicts
/// want confirmed), and write every report.
///
/// Exit code: 130 when interrupted, in the cells, the confirmation or triage (the reports
/// are still written, and say 130: the stage is kept in `results.json` as
/// `interrupted_in`); otherwise 1 when a cell failed, timed out or regressed, else 0.
pub(crate) fn matrix(args: &MatrixSettings) -> Result<i32, CliError> {
    // The host's name is part of every result and of the history: a bad one is refused
    // before anything runs.
    if let Some(why) = crate::env::check_host_override() {
        return Err(CliError::bad_input(miette::miette!("{why}")));
    }
    let mut expansion = crate::matrix::cmd::load(&args.source)?;
    with_repeats(&mut expansion, args.repeats);
    let triage = super::triage::settings(
        &args.triage,
        &args.config.matrix,
        expansion.spec.triage.as_ref(),
    )?;
    let recipe = super::pairs::Recipe {
        setup: args
            .triage
            .setup
            .clone()
            .or_else(|| expansion.spec.triage.as_ref().and_then(|t| t.setup.clone())),
        worker: args.triage.worker.clone().or_else(|| {
            expansion
                .spec
                .triage
                .as_ref()
                .and_then(|t| t.worker.clone())
        }),
        setup_budget_gpu_s: triage.as_ref().map(|t| t.budget_gpu_s),
    };
    // Before the first cell: a workload no cell can start, a malformed baseline file.
    crate::run::check_cells(&expansion)?;
    crate::baseline::Baselines::check_dir(&args.baselines)?;
    let mut store = open_history(args)?;
    let args = &run_settings(args, &mut expansion, store.as_mut())?;
    let mut outcome = match store.as_mut() {
        Some(s) => {
            let branch = crate::history::record::current_branch();
            let mut recorder = crate::history::recorder::Recorder::new(s, branch);
            crate::run::run_matrix(args, expansion, Some(&mut recorder))?
        }
        None => crate::run::run_matrix(args, expansion, None)?,
    };
    eprintln!(
        "results: {}",
        outcome.run_dir.join(RunResults::FILE).display()
    );
    if let (Some(s), true) = (store.as_mut(), args.config.trace_kernels) {
        super::triage::keep_kernels(s, &outcome.results, &outcome.run_dir)?;
    }
    // The cells' interruption is in the results already (the runner's); a later stage's is
    // laid on them here and saved, so that the reports written below and `bench report`
    // later state the 130 this command returns.
    let mut stopped = None;
    if let Some(s) = store.as_mut() {
        if judge_against_history(args, &recipe, s, &outcome)? {
            stopped = Some(Interruption::Confirmation);
        }
    }
    interrupt(&mut outcome, stopped)?;
    let verdicts = crate::judge::of_run(&outcome.results, &args.baselines, Some(&outcome.run_dir))?;
    let mut findings = crate::triage::findings(&outcome.results, &verdicts);
    if let (Some(t), None) = (&triage, outcome.results.interrupted_in) {
        // The bisections can take long: the run's reports are on disk before they start.
        // They are written again below, so an interrupted triage leaves none saying
        // otherwise than the 130 the command then returns.
        let o = &outcome;
        crate::report::write_files(
            &o.run_dir,
            &o.results,
            &verdicts,
            &findings,
            args.gpu_hour_price,
        )?;
        if super::triage::chase(args, t, &outcome.results, &outcome.run_dir, &mut findings)? {
            interrupt(&mut outcome, Some(Interruption::Triage))?;
        }
    }
    if let (Some(h), true) = (&args.history, args.config.trace_kernels) {
        super::triage::diff_from_history(h, &outcome.results, &verdicts, &mut findings);
    }
    if let Some(text) = super::triage::save(&outcome.run_dir, &findings)? {
        // The store outlives the run folder (a CI job's artifacts expire): the site shows the
        // open findings' triage from it.
        if let Some(s) = store.as_mut() {
            let run_id = &outcome.results.run_id;
            // The shards of one run each keep their own chases under the one run id.
            let sharded = args.shard.is_some();
            s.record_triage_with(run_id, &text, |kept, ours| match (sharded, kept) {
                (true, Some(kept)) => super::triage::join(kept, ours),
                _ => ours.to_string(),
            })?;
        }
    }
    if let Some(s) = store.as_mut() {
        // What the verdict cost, kept for the site as its triage is: recorded after the
        // confirmation and the triage, so the figures are the final ones the reports state.
        // Each shard records its share under the one run id and the store sums them; `bench
        // report merge` opens no store, so the merged run is never counted again.
        let input = crate::report::input::ReportInput::new(&outcome.results, &verdicts, &findings);
        s.record_cost(
            &outcome.results.run_id,
            args.shard,
            input.cost(),
            &input.cell_costs(),
        )?;
    }
    let verdict = crate::report::finish_run(
        &outcome.run_dir,
        &outcome.results,
        &verdicts,
        &findings,
        args.format,
        args.verbose,
        args.gpu_hour_price,
    )?;
    // `verdict` is the run's code as every report states it (130 when a signal stopped any
    // stage); the cells' own outcome can only confirm it.
    Ok(verdict.max(outcome.exit_code()))
}

/// Marks the run as stopped by a signal in `stage` (unless an earlier stage already was)
/// and saves `results.json` with it, so that its reports, written now or by `bench report`
/// later, state the 130 the command returns.
fn interrupt(outcome: &mut RunOutcome, stage: Option<Interruption>) -> Result<(), CliError> {
    let Some(stage) = stage else {
        return Ok(());
    };
    if outcome.results.interrupted_in.is_some() {
        return Ok(());
    }
    outcome.results.interrupted_in = Some(stage);
    outcome.results.save_atomic(&outcome.run_dir)?;
    Ok(())
}

/// The settings the run takes: `args`, with the cells of this shard only (`--shard`, whose
/// plan needs the history) and every cell's step traced when the matrix asks for it
/// (`triage.trace_every_run`).
fn run_settings(
    args: &MatrixSettings,
    expansion: &mut crate::matrix::Expansion,
    store: Option<&mut History>,
) -> Result<MatrixSettings, CliError> {
    let mut a = args.clone();
    if let Some(shard) = args.shard {
        plan_shard(args, shard, expansion, store)?;
        // The reports say which share of the matrix this folder holds, as they say which
        // cells a filter selected.
        a.config.filters.push(format!("--shard {shard}"));
    }
    let spec = expansion.spec.triage.as_ref();
    a.config.trace_kernels |= spec.and_then(|t| t.trace_every_run).unwrap_or(false);
    Ok(a)
}

/// The history store of `--history`, checked before the first cell: a damaged store, one of
/// a newer schema or a row bench cannot read is refused here (exit 2), as is a run id another
/// hardware's job already recorded, rather than after cells that took hours.
fn open_history(args: &MatrixSettings) -> Result<Option<History>, CliError> {
    let Some(location) = &args.history else {
        return Ok(None);
    };
    crate::history::check(location)?;
    let mut s = crate::history::open(location)?;
    if let (Some(id), LauncherRequest::Local) = (&args.config.run_id, &args.launcher) {
        let mut inv = crate::env::GpuInventory::detect();
        if let Some(n) = args.config.gpus {
            inv = inv.with_count(n);
        }
        s.claim_run_id(id, &crate::env::hardware_key(&inv))?;
    }
    Ok(Some(s))
}

/// Plans the run's shards (`--shard I/N`), writes the plan into the run folder and keeps
/// only this shard's cells; the other shards' cells become dropped cells of this folder
/// (hidden like a filter's, not reported as missing from the baseline). The store, when there is one, then records this share of the
/// run without deleting the cells the other shards record under the same run id.
fn plan_shard(
    args: &MatrixSettings,
    shard: crate::shard::Shard,
    expansion: &mut crate::matrix::Expansion,
    mut store: Option<&mut History>,
) -> Result<(), CliError> {
    // The run folder: `--resume`'s, else `--run-id`'s under the results folder (the CLI
    // refuses a shard with neither).
    let (run_id, dir) = match (&args.config.resume, &args.config.run_id) {
        (Some(r), _) => {
            let dir = if r.is_dir() {
                r.clone()
            } else {
                r.parent().map(Into::into).unwrap_or_default()
            };
            (RunResults::load(r)?.run_id, dir)
        }
        (None, Some(id)) => (id.clone(), args.config.results_dir.join(id)),
        (None, None) => {
            return Err(CliError::bad_input(miette::miette!(
                "--shard {shard}: give every shard the same --run-id"
            )))
        }
    };
    // The GPUs as the run will see them (`run::run_with`): their key names the history's
    // costs, their name the peak a cost from FLOPs assumes.
    let inv = match args.config.gpus {
        Some(0) => crate::env::GpuInventory::default().with_count(0),
        Some(n) => crate::env::GpuInventory::detect().with_count(n),
        None => crate::env::GpuInventory::detect(),
    };
    let key = crate::env::hardware_key(&inv);
    let hw = super::shard::Hardware {
        key: &key,
        device: inv.gpus.first().map(|g| g.name.as_str()),
    };
    if let Some(s) = store.as_deref_mut() {
        s.record_as_share();
    }
    let total = expansion.cells.len();
    let (plan, others) =
        super::shard::apply(&mut expansion.cells, shard, &run_id, &dir, store, &hw)?;
    for cell in others {
        let other = plan
            .cells
            .iter()
            .find(|p| p.cell.id == cell.id)
            .map_or(0, |p| p.shard);
        expansion.dropped.push(crate::matrix::Dropped {
            cell,
            by: format!("{} {shard}", crate::results::SHARD_DROP_PREFIX),
            reason: format!("shard {other}/{} runs it", shard.count),
        });
    }
    // The loads of every shard, up to a screenful: with hundreds of shards the line would be
    // the plan itself, which shard.json holds.
    let mut loads: Vec<String> = plan
        .expected_gpu_s
        .iter()
        .take(16)
        .map(|g| format!("{g:.0}"))
        .collect();
    if plan.expected_gpu_s.len() > 16 {
        loads.push(format!("... ({} shards)", plan.expected_gpu_s.len()));
    }
    eprintln!(
        "shard {shard}: {} of {total} cells (expected GPU-seconds per shard: {}); plan in {}",
        expansion.cells.len(),
        loads.join(", "),
        dir.join(super::shard::FILE).display()
    );
    Ok(())
}

/// Judges the run against the history, re-running the cells its verdicts want confirmed
/// (with `--confirm`, within the budget) and judging again, until the judge is satisfied;
/// writes `history.json`. Returns whether a re-run was interrupted.
fn judge_against_history(
    args: &MatrixSettings,
    recipe: &super::pairs::Recipe,
    store: &mut History,
    outcome: &RunOutcome,
) -> Result<bool, CliError> {
    let passes = if args.confirm && !outcome.interrupted {
        crate::history::detect::MAX_RERUNS
    } else {
        0
    };
    // By default the confirmation may take what the run took, once for each re-run a breach
    // can ask for (`history::detect::MAX_RERUNS`): every cell could be re-run that often, or
    // one flagged cell of a few measured side by side up to its cap of pairs. A pull
    // request's run measures every cell side by side against its merge-base, so its default
    // pays every cell's cap of pairs.
    let budget = args.confirm_budget_gpu_s.or_else(|| {
        let run = outcome.results.gpu_seconds();
        let reruns = crate::history::detect::MAX_RERUNS as f64 * run;
        Some(if crate::history::gate::pull_request_base().is_some() {
            reruns.max(every_cell_paired_gpu_seconds(&outcome.results))
        } else {
            reruns
        })
    });
    let mut confirm = Confirmation::start(
        store,
        &outcome.run_dir,
        &outcome.results,
        outcome.telemetry.clone(),
        &args.baselines,
        passes,
        budget,
    )?;
    // Side by side first, in order of need: each flagged cell at its last good commit and at
    // this one, alternating; the pairs' answer is its verdict.
    let requests = confirm.pair_requests();
    if args.confirm_budget_gpu_s.is_none() {
        // The default also holds one flagged cell's whole cap of pairs (the costliest), so
        // a breach in a small matrix is never left unconfirmed for want of budget; a large
        // matrix shares its multiple of the run in order of need.
        let pairs = crate::history::paired::PairedPolicy::default().max_pairs as f64;
        let cap = requests
            .iter()
            .filter(|r| r.screened != crate::history::detect::HistoryVerdict::Unchanged)
            .map(|r| 2.0 * pairs * (r.repeat_s + CHILD_START_S) * r.gpus)
            .fold(0.0, f64::max);
        confirm.raise_budget(cap);
    }
    // The pairs run setups and repeats in a worktree as the bisection does, and stop the
    // way it stops: the first Ctrl-C or SIGTERM is passed on to the running child and ends
    // the confirmation with 130. The runner's handler, still installed after the cells,
    // counted such a signal where nothing read it: the night went on through the whole
    // triage and exited 1.
    if !requests.is_empty() {
        crate::bisect::probe::install_signal_handlers()?;
    }
    // A last good commit whose setup failed (or hung) is not set up again for another cell.
    let mut unusable: Vec<(String, String)> = Vec::new();
    for req in requests {
        if let Some((_, why)) = unusable.iter().find(|(c, _)| c == &req.base_commit) {
            let why = format!("not measured side by side: {why}");
            eprintln!("history: {}: {why}", req.cell_id);
            confirm.take_pairs(super::pairs::not_measured(&req, why))?;
            continue;
        }
        let pair = 2.0 * (req.repeat_s + CHILD_START_S) * req.gpus;
        let left = confirm.budget_left();
        if left.is_some_and(|l| l < pair) {
            eprintln!(
                "history: {}: the confirmation budget cannot pay for one pair; not measured side by side",
                req.cell_id
            );
            continue;
        }
        let m = super::pairs::measure(args, recipe, &outcome.results, &outcome.run_dir, &req, left);
        if m.pairs.measured().is_none() {
            if let Some(why) = &m.pairs.stopped {
                unusable.push((req.base_commit.clone(), why.clone()));
            }
        }
        confirm.take_pairs(m.pairs)?;
        if m.interrupted {
            confirm.interrupt();
            break;
        }
    }
    // Re-runs for what the pairs could not measure.
    while let Some((pass, cells)) = confirm.next_rerun() {
        confirm.take(&cells, rerun(args, &outcome.results.run_id, pass, &cells))?;
    }
    let (_, interrupted) = confirm.finish()?;
    Ok(interrupted)
}

/// Re-runs `cells` (each with at least the repeats given) as a second pass of the same
/// matrix and settings, into the run folder `<run-id>-confirm` (`-confirm-2`, ... for later
/// passes).
fn rerun(
    args: &MatrixSettings,
    run_id: &str,
    pass: usize,
    cells: &[(String, u32)],
) -> Result<ConfirmOutcome, CliError> {
    let mut expansion = crate::matrix::cmd::load(&args.source)?;
    with_repeats(&mut expansion, args.repeats);
    expansion
        .cells
        .retain(|c| cells.iter().any(|(id, _)| id == c.id.as_str()));
    for c in &mut expansion.cells {
        if let Some((_, r)) = cells.iter().find(|(id, _)| id == c.id.as_str()) {
            c.params.repeats = c.params.repeats.max(*r);
        }
    }
    let mut settings = args.clone();
    let run_id = confirm_run_id(run_id, pass);
    // The suffix can push a valid id past the limit; it is checked like `--run-id`.
    crate::run::check_run_id(&run_id)?;
    settings.config.run_id = Some(run_id);
    settings.config.resume = None;
    let outcome = crate::run::run_matrix(&settings, expansion, None)?;
    Ok(ConfirmOutcome {
        interrupted: outcome.interrupted,
        results: outcome.results,
    })
}

/// Seconds a side-by-side repeat takes beyond the repeat itself: each is a `bench matrix`
/// run of its own (environment detection, the matrix, the worker's start, the reports).
/// Measured: about 0.5 s in a debug build on a 2-core CPU host, 1-3 s on an H200 host
/// (docs/results/side-by-side-2026-11-28: 13.7 s a child against 11-12 s a repeat). The
/// default budget counts it, so a cell whose repeats take milliseconds still gets its pairs.
const CHILD_START_S: f64 = 5.0;

/// `--repeats N`: every cell's repeats, over what the matrix says.
fn with_repeats(expansion: &mut crate::matrix::Expansion, repeats: Option<u32>) {
    if let Some(r) = repeats {
        for c in &mut expansion.cells {
            c.params.repeats = r;
        }
    }
}

/// GPU-seconds that measuring every cell of the run side by side up to the cap of pairs
/// takes (each pair two repeats).
fn every_cell_paired_gpu_seconds(results: &RunResults) -> f64 {
    let pairs = crate::history::paired::PairedPolicy::default().max_pairs as f64;
    results
        .cells
        .iter()
        .map(|c| {
            let repeat_s = c.duration_s / f64::from(c.params.repeats.max(1));
            2.0 * pairs * (repeat_s + CHILD_START_S) * f64::from(c.gpus())
        })
        .sum()
}
