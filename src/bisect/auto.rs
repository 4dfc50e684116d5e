//! The automatic bisection of a finding: what `bench matrix --history` runs after triage
//! when a finding's cause is a commit range and the matrix (or the command line) says how to
//! build a commit. The same search as `bench bisect` (the probes are recorded in the history
//! under the branch `bisect`, so a later job resumes from them), on the finding's cheapest
//! cell, within a GPU-seconds budget; then one traced step at the last good and at the first
//! bad commit for the kernel diff. Nothing here fails the nightly: a commit the clone does
//! not have, a setup that fails or a budget that runs out is what the finding reports, with
//! the command that finishes the work by hand.

use std::path::{Path, PathBuf};

use crate::error::CliError;
use crate::history::twosample::TwoSamplePolicy;
use crate::triage::culprit::{BisectStatus, Bisected, CommitRef};

use super::bisection::{Bisection, Ending};
use super::git::{Commit, Repo};
use super::probe::{self, Budget, Halt, Prober};
use super::settings::BisectSettings;

/// What an automatic bisection is asked.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub settings: BisectSettings,
    /// GPU-seconds it may take.
    pub budget_gpu_s: f64,
    /// GPUs the cell holds (1 for a CPU cell).
    pub gpus: f64,
    /// What one round of the cell took in the nightly run, seconds: the first estimate of a
    /// round's cost.
    pub round_s: f64,
    /// Where the traced steps of the last good and the first bad commit are written.
    pub trace_dir: PathBuf,
}

/// What it gave back.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub bisected: Bisected,
    /// The traces of the last good and the first bad commit (each rank 0's path; other ranks
    /// sit beside it) with their labels, when both were traced.
    pub traces: Option<[(String, PathBuf); 2]>,
    /// Why no traces are there although the first bad commit is known.
    pub traces_missing: Option<String>,
    /// Stopped by Ctrl-C or SIGTERM.
    pub interrupted: bool,
}

fn commit_ref(c: &Commit) -> CommitRef {
    CommitRef {
        sha: c.sha.clone(),
        subject: c.subject.clone(),
        author: c.author.clone(),
    }
}

/// The `bench bisect` command that finishes (or repeats) this bisection by hand.
pub(crate) fn command(s: &BisectSettings) -> String {
    let q = |x: &str| quote(x);
    let mut c = format!(
        "bench bisect {} --good {} --bad {} --matrix {} --history {}",
        q(&s.cell),
        q(&s.good),
        q(&s.bad),
        q(&s.matrix.display().to_string()),
        q(&s.history)
    );
    if let Some(setup) = &s.setup {
        c.push_str(&format!(" --setup {}", q(setup)));
    }
    if let Some(w) = &s.worker_exe {
        c.push_str(&format!(" --worker-exe {}", q(&w.display().to_string())));
    }
    c
}

/// `x` as one word of a POSIX shell command: as it is when it holds only characters no
/// shell treats specially, else in single quotes.
fn quote(x: &str) -> String {
    let plain = !x.is_empty()
        && x.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./:=@%+-,".contains(c));
    if plain {
        x.to_string()
    } else {
        format!("'{}'", x.replace('\'', "'\\''"))
    }
}

/// Runs the automatic bisection of `req` in the repository `dir` is in.
pub(crate) fn run(dir: &Path, req: &Request) -> Result<Answer, CliError> {
    let s = &req.settings;
    let mut bisected = Bisected::new(
        BisectStatus::Failed,
        &s.cell,
        [&s.good, &s.bad],
        req.budget_gpu_s,
        String::new(),
    );
    bisected.command = command(s);
    let answer = |bisected: Bisected| Answer {
        bisected,
        traces: None,
        traces_missing: None,
        interrupted: false,
    };
    // The range as this clone knows it: a shallow clone or a force-push can lose a commit
    // the history names, and that is the finding's to say, not a failed nightly.
    let located = Repo::discover(dir).and_then(|repo| {
        let good = repo.commit(&s.good, "the last good run's commit")?;
        let bad = repo.commit(&s.bad, "this run's commit")?;
        if !repo.is_ancestor(&good, &bad)? {
            return Err(super::error::BisectError::NotAncestor {
                good: good.short().to_string(),
                bad: bad.short().to_string(),
            });
        }
        let range = repo.range(&good, &bad)?;
        Ok((repo, good, bad, range))
    });
    let (repo, good, bad, range) = match located {
        Ok(x) => x,
        Err(e) => {
            bisected.evidence = format!(
                "the commit range cannot be walked here: {e} (a shallow clone lacks it: `git fetch --unshallow`; a force-push removed it)"
            );
            bisected.command = String::new();
            return Ok(answer(bisected));
        }
    };
    bisected.commits = range.len();
    if range.len() == 1 {
        // One commit between the last good run and this one: it is the first bad commit, and
        // the nightly's own comparison is the evidence. Only the traces remain to take.
        bisected.status = BisectStatus::Found;
        bisected.first_bad = Some(commit_ref(&bad));
        bisected.last_good = Some(commit_ref(&good));
        bisected.evidence = "the only commit since the last good run".into();
        bisected.command = String::new();
    }
    probe::install_signal_handlers()?;
    let mut worktree = match repo.worktree(&good) {
        Ok(w) => w,
        Err(e) => {
            bisected.status = BisectStatus::Failed;
            bisected.evidence = format!("cannot make a worktree: {e}");
            return Ok(answer(bisected));
        }
    };
    for (c, which) in [(&good, "last good"), (&bad, "this run's")] {
        if let Err(e) = probe::check_cell(&mut worktree, s, c, which) {
            bisected.status = BisectStatus::Skipped;
            bisected.first_bad = None;
            bisected.evidence = format!("the cell cannot be measured at the {which} commit: {e}");
            return Ok(answer(bisected));
        }
    }
    let store = crate::history::open(&s.history)?;
    let key = crate::env::hardware_key(&crate::env::GpuInventory::detect());
    let work_dir = s
        .work_dir
        .clone()
        .unwrap_or_else(|| repo.common_dir.join("bench-bisect"));
    let budget = Budget {
        limit_gpu_s: req.budget_gpu_s,
        gpus: req.gpus.max(1.0),
        spent_gpu_s: 0.0,
        round_gpu_s: req.round_s * req.gpus.max(1.0),
        setup_gpu_s: 0.0,
    };
    let mut prober = Prober::new(s, worktree, store, key, work_dir)?.with_budget(budget);
    let mut b = Bisection {
        settings: s,
        good: good.clone(),
        bad: bad.clone(),
        range: range.clone(),
        probes: vec![],
        policy: TwoSamplePolicy::default(),
        hardware_key: prober.hardware_key().to_string(),
        history: prober.store_location().to_string(),
        runs_dir: prober.runs_dir(),
    };
    let mut interrupted = false;
    let mut ends: Option<(usize, usize)> = (range.len() == 1).then_some((1, 0));
    if ends.is_none() {
        eprintln!("triage: {}", super::report::header(&b));
        match b.run(&mut prober) {
            Ok(Ending::Found {
                first_bad,
                last_good,
            }) => {
                bisected.status = BisectStatus::Found;
                ends = Some((first_bad, last_good));
                let first = b.commit_at(first_bad).clone();
                bisected.first_bad = Some(commit_ref(&first));
                bisected.last_good = Some(commit_ref(b.commit_at(last_good)));
                bisected.evidence = b
                    .probes
                    .iter()
                    .find(|p| p.position == first_bad)
                    .and_then(|p| p.vs_good.map(|t| (p, t)))
                    .map_or("told apart from the last good commit".into(), |(p, t)| {
                        format!(
                            "{} {:+.1}% against the good end, p={:.4}, {} vs {} repeats",
                            crate::history::gate::METRIC,
                            t.shift_rel * 100.0,
                            t.p_value,
                            t.n_after,
                            t.n_before
                        ) + &p
                            .median()
                            .map_or(String::new(), |m| format!(", median {m:.1}"))
                    });
                bisected.command = String::new();
            }
            Ok(Ending::Same) => {
                bisected.status = BisectStatus::Same;
                bisected.evidence = super::report::same_message(&b);
            }
            Ok(Ending::Undecided(m)) => {
                bisected.status = BisectStatus::Undecided;
                bisected.evidence = m;
            }
            Ok(Ending::Failed(m)) | Err(Halt::Failed(m)) => {
                bisected.status = BisectStatus::Failed;
                bisected.evidence = m;
            }
            Ok(Ending::OutOfBudget(m)) | Err(Halt::OutOfBudget(m)) => {
                bisected.status = BisectStatus::OutOfBudget;
                bisected.evidence = m;
            }
            Err(Halt::Interrupted) => {
                bisected.status = BisectStatus::Interrupted;
                bisected.evidence = "stopped by a signal; the rounds measured are recorded".into();
                interrupted = true;
            }
            Err(Halt::Error(e)) => return Err(e),
        }
    }
    bisected.measured = b.probes.len();
    for p in &b.probes {
        for r in &p.rounds {
            if r.reused {
                bisected.rounds_reused += 1;
            } else {
                bisected.rounds_run += 1;
            }
        }
    }
    let mut traces = None;
    let mut traces_missing = None;
    if let Some((first_bad, last_good)) = ends.filter(|_| !interrupted) {
        let mut pair = [
            (
                format!("last good {}", b.commit_at(last_good).short()),
                b.commit_at(last_good).clone(),
            ),
            (
                format!("first bad {}", b.commit_at(first_bad).short()),
                b.commit_at(first_bad).clone(),
            ),
        ];
        // The commit the worktree holds a build of is traced first: one setup fewer.
        let built_second = prober.ready() == Some(pair[1].1.sha.as_str());
        if built_second {
            pair.swap(0, 1);
        }
        match trace_pair(&mut prober, &pair, &req.trace_dir) {
            Ok(mut t) => {
                if built_second {
                    t.swap(0, 1);
                }
                traces = Some(t);
            }
            Err(Halt::Interrupted) => {
                interrupted = true;
                traces_missing = Some("stopped by a signal while tracing".into());
            }
            Err(Halt::Error(e)) => return Err(e),
            Err(Halt::Failed(m)) | Err(Halt::OutOfBudget(m)) => traces_missing = Some(m),
        }
    }
    bisected.gpu_s = prober.spent_gpu_s();
    // The command finishes what more measuring can finish; after "the same" it would only
    // measure the same again.
    bisected.command = match bisected.status {
        BisectStatus::OutOfBudget
        | BisectStatus::Undecided
        | BisectStatus::Interrupted
        | BisectStatus::Failed => command(s),
        _ => String::new(),
    };
    Ok(Answer {
        bisected,
        traces,
        traces_missing,
        interrupted: interrupted || probe::interrupted(),
    })
}

/// One traced step at each commit of `pair`, written as `<label>.trace.json` (with spaces
/// as dashes) in `dir`.
fn trace_pair(
    prober: &mut Prober,
    pair: &[(String, Commit); 2],
    dir: &Path,
) -> Result<[(String, PathBuf); 2], Halt> {
    std::fs::create_dir_all(dir).map_err(|e| {
        Halt::Error(CliError::internal(miette::miette!(
            "{}: {e}",
            dir.display()
        )))
    })?;
    let mut out: Vec<(String, PathBuf)> = Vec::new();
    for (label, commit) in pair {
        let path = dir.join(format!("{}.trace.json", label.replace(' ', "-")));
        // A trace an earlier attempt left would pass for this one's.
        for old in crate::triage::kernels::rank_files(&path) {
            let _ = std::fs::remove_file(old);
        }
        prober.trace(commit, &path)?;
        out.push((label.clone(), path));
    }
    let second = out.pop();
    let first = out.pop();
    match (first, second) {
        (Some(a), Some(b)) => Ok([a, b]),
        _ => Err(Halt::Failed("no trace was taken".into())),
    }
}
