//! `bench bisect CELL --good REV --bad REV --matrix FILE [--setup CMD]`: the first commit
//! that changed a cell's speed, found by measuring commits of the range.
//!
//! Stages, one per file:
//! - [`git`]: the repository, the range `good..bad` (bad's first-parent line, oldest
//!   first), and the detached worktree the commits are checked out in.
//! - [`probe`]: one round of measurement at a commit (setup, a `bench matrix` child run of
//!   the cell, recorded in the history under the branch `bisect`), and the rounds the
//!   history already holds, which is how an interrupted bisection resumes.
//! - [`search`]: the decisions, pure (two-sample comparisons, the side of a probe, the
//!   binary search).
//! - [`report`]: the progress lines, the final report and its JSON.
//!
//! What the stages share lives in files of its own, which they import without importing
//! this one back: the settings ([`settings`]), the errors ([`error`]) and the bisection's
//! state ([`bisection`]). This file is the command: it drives the stages.
//!
//! The order of work: good and bad are measured until the two-sample comparison calls them
//! different (more rounds, alternating, while it is unknown; "the same" ends the command),
//! then the binary search probes the middle of the interval still open, each probe
//! measured until it is called good or bad, so at most `ceil(log2(N)) + 2` commits are
//! measured for N commits in the range. A commit with recorded rounds starts from them.

pub(crate) mod auto;
pub(crate) mod bisection;
pub(crate) mod builds;
pub(crate) mod error;
pub(crate) mod git;
pub(crate) mod probe;
pub(crate) mod report;
pub(crate) mod search;
pub(crate) mod settings;

use crate::error::CliError;
use crate::exit::bench as exit;
use crate::history::twosample::{compare, Answer, TwoSamplePolicy};

use self::bisection::{Bisection, Ending, Probe, Role};
use self::error::BisectError;
use self::git::{Commit, Repo};
use self::probe::{Halt, Prober};
use self::search::{classify, endpoint_to_measure, Search, Side};
pub(crate) use self::settings::{BisectSettings, DEFAULT_MAX_REPEATS};

// The methods that drive a bisection live with the command rather than with the state in
// `bisection.rs`: they print through `report`, which reads that state.
impl Bisection<'_> {
    fn probe(&self, position: usize, role: Role, prober: &mut Prober) -> Result<Probe, Halt> {
        let commit = self.commit_at(position).clone();
        let rounds = prober.recorded(&commit)?;
        Ok(Probe {
            commit,
            role,
            position,
            rounds,
            vs_good: None,
            vs_bad: None,
            side: None,
        })
    }

    fn measure(&self, p: &mut Probe, prober: &mut Prober) -> Result<(), Halt> {
        let round = prober.measure(&p.commit, p.rounds.len() + 1)?;
        p.rounds.push(round);
        Ok(())
    }

    /// Measures good and bad until they are told apart: `Ok(None)` when they are,
    /// `Ok(Some(ending))` when they are the same or cannot be told apart.
    fn endpoints(&mut self, prober: &mut Prober) -> Result<Option<Ending>, Halt> {
        let n = self.n();
        let mut good = self.probe(0, Role::Good, prober)?;
        let mut bad = self.probe(n, Role::Bad, prober)?;
        good.side = Some(Side::Good);
        bad.side = Some(Side::Bad);
        // The checks of the cell left bad checked out.
        let mut current = Side::Bad;
        loop {
            let (g, b) = (good.samples(), bad.samples());
            if !g.is_empty() && !b.is_empty() {
                let Some(change) = compare(&g, &b, &self.policy) else {
                    return Ok(Some(Ending::Failed(format!(
                        "good ({}) measured no positive {}",
                        good.commit.short(),
                        crate::history::gate::METRIC
                    ))));
                };
                bad.vs_good = Some(change);
                match change.answer {
                    Answer::Unknown => {}
                    answer => {
                        for p in [good, bad] {
                            eprintln!("{}", report::progress_line(self, &p));
                            self.probes.push(p);
                        }
                        return Ok((answer == Answer::Same).then_some(Ending::Same));
                    }
                }
            }
            let next = if b.is_empty() {
                Some(Side::Bad)
            } else if g.is_empty() {
                Some(Side::Good)
            } else {
                endpoint_to_measure(g.len(), b.len(), self.settings.max_repeats, current)
            };
            match next {
                Some(Side::Good) => self.measure(&mut good, prober)?,
                Some(Side::Bad) => self.measure(&mut bad, prober)?,
                None => {
                    let message = report::undecided_endpoints(self, &good, &bad);
                    self.probes.extend([good, bad]);
                    return Ok(Some(Ending::Undecided(message)));
                }
            }
            current = next.unwrap_or(current);
        }
    }

    /// The whole bisection.
    fn run(&mut self, prober: &mut Prober) -> Result<Ending, Halt> {
        if let Some(end) = self.endpoints(prober)? {
            return Ok(end);
        }
        let (good, bad) = (self.probes[0].samples(), self.probes[1].samples());
        let mut search = Search::new(self.n());
        while let Some(position) = search.next() {
            let mut p = self.probe(position, Role::Probe, prober)?;
            let side = loop {
                let s = p.samples();
                if !s.is_empty() {
                    let Some(call) = classify(&good, &bad, &s, &self.policy) else {
                        return Ok(Ending::Failed(format!(
                            "commit {} measured no positive {}",
                            p.commit.short(),
                            crate::history::gate::METRIC
                        )));
                    };
                    p.vs_good = Some(call.vs_good);
                    p.vs_bad = Some(call.vs_bad);
                    p.side = call.side;
                    if let Some(side) = call.side {
                        break side;
                    }
                    if s.len() >= self.settings.max_repeats {
                        let message = report::undecided_probe(self, &p);
                        eprintln!("{}", report::progress_line(self, &p));
                        self.probes.push(p);
                        return Ok(Ending::Undecided(message));
                    }
                }
                self.measure(&mut p, prober)?;
            };
            eprintln!("{}", report::progress_line(self, &p));
            self.probes.push(p);
            search.record(position, side);
        }
        Ok(Ending::Found {
            first_bad: search.first_bad().unwrap_or(self.n()),
            last_good: search.last_good().unwrap_or(0),
        })
    }
}

/// `bench bisect`: exit 0 with the first bad commit; 1 when good and bad are the same, a
/// commit cannot be decided or measured; 2 on bad input; 130 when interrupted.
pub(crate) fn cmd(settings: &BisectSettings) -> Result<i32, CliError> {
    let cwd = std::env::current_dir()
        .map_err(|e| CliError::internal(miette::miette!("the current folder: {e}")))?;
    let repo = Repo::discover(&cwd)?;
    let good = repo.commit(&settings.good, "--good")?;
    let bad = repo.commit(&settings.bad, "--bad")?;
    if good.sha == bad.sha {
        return Err(BisectError::SameCommit { sha: good.sha }.into());
    }
    if !repo.is_ancestor(&good, &bad)? {
        return Err(BisectError::NotAncestor {
            good: format!("{} ({})", settings.good, good.short()),
            bad: format!("{} ({})", settings.bad, bad.short()),
        }
        .into());
    }
    let range = repo.range(&good, &bad)?;
    if range.last().map(|c| c.sha.as_str()) != Some(bad.sha.as_str()) {
        return Err(CliError::internal(miette::miette!(
            "git log --first-parent --ancestry-path {}..{} does not end at the bad commit",
            good.short(),
            bad.short()
        )));
    }
    // Before the worktree exists, so that Ctrl-C from here on removes it.
    probe::install_signal_handlers()?;
    match measure(settings, &repo, good, bad, range) {
        // A child started just as Ctrl-C came can die of it before it is in a process group
        // of its own (git, say), and its failure is the error seen: the interruption is
        // what happened.
        Err(e) if probe::interrupted() => {
            eprintln!("bisect: interrupted ({:#})", e.report());
            Ok(exit::INTERRUPTED)
        }
        other => other,
    }
}

/// The part of [`cmd`] that runs with the worktree: check the cell at both ends, measure,
/// report.
fn measure(
    settings: &BisectSettings,
    repo: &Repo,
    good: Commit,
    bad: Commit,
    range: Vec<Commit>,
) -> Result<i32, CliError> {
    let mut worktree = repo.worktree(&good)?;
    probe::check_cell(&mut worktree, settings, &good, "--good")?;
    probe::check_cell(&mut worktree, settings, &bad, "--bad")?;
    let store = crate::history::open(&settings.history)?;
    let key = crate::env::hardware_key(&crate::env::GpuInventory::detect());
    let work_dir = settings
        .work_dir
        .clone()
        .unwrap_or_else(|| repo.common_dir.join("bench-bisect"));
    let mut prober = Prober::new(settings, worktree, store, key, work_dir)?;
    let mut b = Bisection {
        settings,
        good,
        bad,
        range,
        probes: vec![],
        policy: TwoSamplePolicy::default(),
        hardware_key: prober.hardware_key().to_string(),
        history: prober.store_location().to_string(),
        runs_dir: prober.runs_dir(),
    };
    eprintln!("{}", report::header(&b));
    let ending = b.run(&mut prober);
    // The key the probes were recorded under, should the child have seen another.
    b.hardware_key = prober.hardware_key().to_string();
    // The worktree goes before the report, whatever the ending.
    drop(prober);
    let ending = match ending {
        Ok(e) => Some(e),
        Err(Halt::Failed(message)) if !probe::interrupted() => Some(Ending::Failed(message)),
        Err(Halt::Error(e)) if !probe::interrupted() => return Err(e),
        // `bench bisect` run by hand has no budget; should one ever be set, it ends here.
        Err(Halt::OutOfBudget(message)) if !probe::interrupted() => {
            Some(Ending::OutOfBudget(message))
        }
        // Interrupted, or a failure the signal caused (see `cmd`).
        Err(_) => None,
    };
    let Some(ending) = ending else {
        eprintln!("{}", report::interrupted(&b));
        return Ok(exit::INTERRUPTED);
    };
    report::print(&b, &ending, settings.format)?;
    Ok(match ending {
        Ending::Found { .. } => exit::OK,
        _ => exit::FAILED,
    })
}
