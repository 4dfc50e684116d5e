//! The side-by-side confirmation of `bench matrix --history`: a cell the history flags is
//! measured at its last good commit (A, in a git worktree, built there by the matrix's
//! `triage.setup` when it has one) and at this run's commit (B, in this checkout), in the
//! same job, alternating A B B A ..., each repeat a `bench matrix --repeats 1` run of its
//! own, until the pairs answer ([`crate::history::paired`]) or reach their cap or the
//! budget. The gate turns the answer into the verdict; this file only measures.
//!
//! Both ends are then recorded in the history under the probes' branch, so a bisection of
//! the same range starts with its two ends measured and spends its budget inside the range.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::bisect::git::{Commit, Repo};
use crate::bisect::probe::{Budget, Checkout, Halt, Prober};
use crate::bisect::settings::BisectSettings;
use crate::cell::Workload;
use crate::history::gate::{PairRequest, SideBySide, METRIC};
use crate::history::paired::{base_first, paired, settled, PairedPolicy};
use crate::history::record::{RunRecord, PROBE_BRANCH};
use crate::results::RunResults;
use crate::run::MatrixSettings;

/// What the run id of a pair's recorded end holds (`bisect-SHA-pairs-TAG-a`), so a
/// bisection's own rounds can be told from the pairs' ends.
pub(crate) const RUN_MARK: &str = "-pairs-";

/// How to build and run a commit's cell: the matrix's `triage:` block with the
/// `--triage-*` flags laid over it (the same recipe a bisection uses).
#[derive(Debug, Clone, Default)]
pub(crate) struct Recipe {
    pub setup: Option<String>,
    pub worker: Option<PathBuf>,
    /// The triage's budget, when one is set: the setup is the triage's recipe and runs
    /// within it (a setup that hangs must not hold the nightly for the whole confirmation).
    pub setup_budget_gpu_s: Option<f64>,
}

/// What measuring one cell's pairs gave, and whether Ctrl-C or SIGTERM stopped it.
pub(crate) struct Measured {
    pub pairs: SideBySide,
    pub interrupted: bool,
}

/// The record of a cell that was not measured side by side, and why.
pub(crate) fn not_measured(req: &PairRequest, why: String) -> SideBySide {
    SideBySide {
        stopped: Some(why),
        ..unmeasured(req)
    }
}

/// The record of `req`'s cell before any pair.
fn unmeasured(req: &PairRequest) -> SideBySide {
    SideBySide {
        cell_id: req.cell_id.clone(),
        base_commit: req.base_commit.clone(),
        base_run_id: req.base_run_id.clone(),
        head_commit: req.head_commit.clone(),
        screened: req.screened,
        screened_rel: req.screened_rel,
        base: Vec::new(),
        head: Vec::new(),
        result: None,
        stopped: None,
        gpu_s: 0.0,
        logs: None,
    }
}

/// Measures `req`'s cell side by side within `budget_gpu_s` (`None`: no limit).
pub(crate) fn measure(
    args: &MatrixSettings,
    recipe: &Recipe,
    results: &RunResults,
    run_dir: &Path,
    req: &PairRequest,
    budget_gpu_s: Option<f64>,
) -> Measured {
    let mut out = unmeasured(req);
    let mut interrupted = false;
    if let Err(why) = run_pairs(args, recipe, results, run_dir, req, budget_gpu_s, &mut out) {
        match why {
            Halt::Interrupted => {
                interrupted = true;
                out.stopped = Some("interrupted".into());
            }
            Halt::Failed(m) | Halt::OutOfBudget(m) => out.stopped = Some(m),
            Halt::Error(e) => out.stopped = Some(crate::sanitize::clean(&e.report().to_string())),
        }
    }
    Measured {
        pairs: out,
        interrupted,
    }
}

fn run_pairs(
    args: &MatrixSettings,
    recipe: &Recipe,
    results: &RunResults,
    run_dir: &Path,
    req: &PairRequest,
    budget_gpu_s: Option<f64>,
    out: &mut SideBySide,
) -> Result<(), Halt> {
    let failed = |m: String| Halt::Failed(m);
    let cell = results
        .cells
        .iter()
        .find(|c| c.id.as_str() == req.cell_id)
        .ok_or_else(|| failed(format!("the run has no cell {}", req.cell_id)))?;
    if matches!(cell.params.workload, Workload::Builtin) && recipe.worker.is_none() {
        return Err(failed(
            "the cell runs the built-in workload and no build of it is named (triage.worker, --triage-worker): both sides would run this bench's own".into(),
        ));
    }
    let Some(history) = &args.history else {
        return Err(failed("no history store".into()));
    };
    let cwd = std::env::current_dir()
        .map_err(|e| failed(format!("cannot read the current folder: {e}")))?;
    let repo = Repo::discover(&cwd).map_err(|e| failed(e.to_string()))?;
    let base = repo
        .commit(&req.base_commit, "the last good run's commit")
        .map_err(|e| failed(e.to_string()))?;
    let head = repo
        .commit(&req.head_commit, "this run's commit")
        .map_err(|e| failed(e.to_string()))?;
    let matrix = matrix_for_worktree(&repo, &cwd, &args.config.matrix)?;
    let tag = {
        let d = Sha256::digest(format!("{}\0{}", req.cell_id, results.run_id).as_bytes());
        d[..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let work_dir = std::path::absolute(run_dir.join("confirm").join(format!("pairs-{tag}")))
        .map_err(|e| failed(e.to_string()))?;
    out.logs = Some(work_dir.join("logs").display().to_string());
    let settings = BisectSettings {
        cell: req.cell_id.clone(),
        good: base.sha.clone(),
        bad: head.sha.clone(),
        matrix: matrix.clone(),
        setup: recipe.setup.clone(),
        history: history.clone(),
        max_repeats: 1,
        worker_exe: recipe.worker.clone(),
        work_dir: Some(work_dir.clone()),
        format: args.format,
    };
    let store = crate::history::open(history).map_err(|e| Halt::Error(e.into()))?;
    let worktree = repo.worktree(&base)?;
    let prober = Prober::new(
        &settings,
        worktree,
        store,
        results.environment.hardware_key.clone(),
        work_dir,
    )?
    .with_gpus(args.config.gpus)
    // Without a limit the budget still counts what the pairs take: that is their cost.
    .with_budget(Budget {
        limit_gpu_s: budget_gpu_s.unwrap_or(f64::INFINITY),
        gpus: req.gpus,
        spent_gpu_s: 0.0,
        round_gpu_s: req.repeat_s * req.gpus,
        setup_gpu_s: 0.0,
    });
    // This run's side: its own checkout (the code the nightly just ran, with the files a
    // worktree lacks), its own worker build when it named one.
    let here_matrix =
        std::path::absolute(&args.config.matrix).map_err(|e| failed(e.to_string()))?;
    let checkout = Checkout {
        dir: cwd.clone(),
        matrix: here_matrix,
        worker: args.config.bench_exe.clone(),
    };
    let policy = PairedPolicy::default();
    eprintln!(
        "history: {}: measuring side by side against {} ({}), A B B A ..., up to {} pairs",
        req.cell_id,
        base.short(),
        crate::sanitize::clean(&base.subject),
        policy.max_pairs
    );
    let mut prober = prober;
    if let (Some(_), Some(setup_limit)) = (&recipe.setup, recipe.setup_budget_gpu_s) {
        let limit = budget_gpu_s.unwrap_or(f64::INFINITY);
        prober.limit_to(setup_limit.min(limit));
        let ready = prober.prepare(&base, "the setup of the last good commit");
        prober.limit_to(limit);
        if let Err(e) = ready {
            out.gpu_s = prober.spent_gpu_s();
            return Err(e);
        }
    }
    let result = pairs_loop(&mut prober, &checkout, &base, &head, &tag, &policy, out);
    out.gpu_s = prober.spent_gpu_s();
    result?;
    // Both ends, recorded where a bisection of this range looks for them first. This
    // run's own repeats were measured at this commit in this job on this host, so they join
    // the head's end: a bisection's two-sample test of 3 against 3 repeats can never decide
    // (its smallest p is 0.1), 3 against 6 can.
    let mut head_end = out.head.clone();
    head_end.extend(
        cell.metrics
            .get(METRIC)
            .map(|m| m.samples.clone())
            .unwrap_or_default(),
    );
    for (commit, samples, side) in [(&base, &out.base, "a"), (&head, &head_end, "b")] {
        record_end(
            &mut prober,
            results,
            &req.cell_id,
            commit,
            samples,
            &tag,
            side,
        )?;
    }
    Ok(())
}

/// The pairs themselves: A B, then B A, until they answer, reach the cap or the budget.
fn pairs_loop(
    prober: &mut Prober<'_>,
    checkout: &Checkout,
    base: &Commit,
    head: &Commit,
    tag: &str,
    policy: &PairedPolicy,
    out: &mut SideBySide,
) -> Result<(), Halt> {
    for i in 0..policy.max_pairs {
        let mut a = None;
        let mut b = None;
        let order = if base_first(i) {
            [true, false]
        } else {
            [false, true]
        };
        for is_base in order {
            let run_id = format!("pair-{tag}-{}-{}", i + 1, if is_base { "a" } else { "b" });
            let measured = if is_base {
                prober.measure_once(base, &run_id, 1)
            } else {
                prober.measure_in(checkout, head, &run_id, 1)
            };
            let (_, samples) = match measured {
                Ok(m) => m,
                Err(Halt::OutOfBudget(m)) => {
                    out.stopped = Some(format!("the budget ran out after {i} pair(s): {m}"));
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            let v = crate::metrics::stats::median(&samples).unwrap_or(f64::NAN);
            if is_base {
                a = Some(v);
            } else {
                b = Some(v);
            }
        }
        if let (Some(a), Some(b)) = (a, b) {
            out.base.push(a);
            out.head.push(b);
        }
        let r = paired(&out.base, &out.head, out.screened_rel, policy);
        out.result = Some(r);
        if settled(&r, policy) {
            if r.answer == crate::history::paired::Answer::Unknown {
                out.stopped = Some(format!("still undecided after {} pairs (the cap)", r.pairs));
            }
            return Ok(());
        }
    }
    Ok(())
}

/// Records one end's repeats as a probe of `commit` (branch `bisect`), so a bisection of the
/// range reuses them as its end.
fn record_end(
    prober: &mut Prober<'_>,
    results: &RunResults,
    cell_id: &str,
    commit: &Commit,
    samples: &[f64],
    tag: &str,
    side: &str,
) -> Result<(), Halt> {
    let samples: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
    let Some(value) = crate::metrics::stats::median(&samples) else {
        return Ok(());
    };
    let mut one = results.clone();
    one.run_id = format!("bisect-{}{RUN_MARK}{tag}-{side}", &commit.sha[..12]);
    one.environment.git_commit = Some(commit.sha.clone());
    one.environment.git_dirty = false;
    one.cells.retain(|c| c.id.as_str() == cell_id);
    for c in &mut one.cells {
        c.metrics.retain(|k, _| k == METRIC);
        if let Some(m) = c.metrics.get_mut(METRIC) {
            m.value = value;
            m.samples = samples.clone();
        }
    }
    let record = RunRecord::from_results(&one, Some(PROBE_BRANCH.to_string()), None);
    prober.record(&record)?;
    Ok(())
}

/// The matrix as the worktree reads it: its path inside the repository when it lies there
/// (each commit's own matrix), else this file itself, absolute (a matrix kept outside the
/// repository is the same for both commits).
fn matrix_for_worktree(repo: &Repo, cwd: &Path, matrix: &Path) -> Result<PathBuf, Halt> {
    let root = std::fs::canonicalize(&repo.root)
        .map_err(|e| Halt::Failed(format!("{}: {e}", repo.root.display())))?;
    let file = std::fs::canonicalize(cwd.join(matrix))
        .map_err(|e| Halt::Failed(format!("{}: {e}", matrix.display())))?;
    Ok(match file.strip_prefix(&root) {
        Ok(inside) => inside.to_path_buf(),
        Err(_) => file,
    })
}
