//! Measuring one commit: the worktree checked out at it, the setup command run there, one
//! `bench matrix` run of the cell as a child process, and its samples recorded in the
//! history; and the rounds the history already holds for a commit, which is what lets an
//! interrupted bisection resume without measuring them again.
//!
//! A probe runs the *current* bench executable on the commit's own matrix file, in the
//! worktree (so the cell's command line, its relative paths and the commit recorded in
//! `results.json` are the commit's), with `--filter id=<cell>`, no baselines and no
//! progress bar. Its run id is `bisect-<sha>-<tag>-<n>`: `tag` hashes the cell and the
//! hardware key, because the history keys runs by id alone, and `n` counts the rounds of
//! that commit.
//!
//! Children run in process groups of their own (through `crate::proc`, so they also die
//! with this process, even when it is killed with SIGKILL), so Ctrl-C reaches this process
//! only: it passes the signal on to the running child (each one, so a second Ctrl-C stops
//! `bench matrix` at once as it does on a terminal), waits for it, and the command ends
//! with 130 after removing the worktree. From the second signal on, a child that does not
//! end within [`STOP_GRACE`] (a setup that ignores signals) is killed with its group. When
//! a child ends, whatever it left running (in its group, or re-parented to this process)
//! is killed: nothing a setup starts outlives its step.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::builds::BuildCache;
use super::error::BisectError;
use super::git::{Commit, Worktree};
use super::settings::BisectSettings;
use crate::error::CliError;
use crate::history::gate::METRIC;
use crate::history::record::RunRecord;
use crate::history::History;
use crate::proc::Watched;
use crate::results::{Outcome, RunResults};

/// The branch probes are recorded under: never a branch whose history judges nightly runs.
pub(crate) const BRANCH: &str = crate::history::record::PROBE_BRANCH;

/// One `bench matrix` run of the cell at one commit.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Round {
    pub run_id: String,
    /// The cell's `tokens_per_s`, one value per repeat.
    pub samples: Vec<f64>,
    /// Found in the history rather than measured by this invocation.
    pub reused: bool,
}

/// Why a probe did not produce samples.
#[derive(Debug)]
pub(crate) enum Halt {
    /// Ctrl-C or SIGTERM.
    Interrupted,
    /// The commit cannot be measured (setup failed, the cell failed): the bisection stops
    /// with this message (exit 1).
    Failed(String),
    /// Bad input or a failure of bench itself.
    Error(CliError),
    /// The next round would take the bisection past its GPU-seconds budget (an automatic
    /// bisection's; `bench bisect` run by hand has none).
    OutOfBudget(String),
}

impl From<CliError> for Halt {
    fn from(e: CliError) -> Self {
        Halt::Error(e)
    }
}

impl From<BisectError> for Halt {
    fn from(e: BisectError) -> Self {
        Halt::Error(e.into())
    }
}

impl From<crate::history::HistoryError> for Halt {
    fn from(e: crate::history::HistoryError) -> Self {
        Halt::Error(e.into())
    }
}

/// Signals received (SIGINT, SIGTERM) since [`install_signal_handlers`].
static SIGNALS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_signal(_: nix::libc::c_int) {
    SIGNALS.fetch_add(1, Ordering::SeqCst);
}

/// Counts SIGINT and SIGTERM instead of dying of them, so the worktree is removed and the
/// probes measured so far stay recorded.
pub(crate) fn install_signal_handlers() -> Result<(), CliError> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only increments an atomic counter, which is async-signal-safe.
        unsafe { sigaction(sig, &action) }
            .map_err(|e| CliError::internal(miette::miette!("cannot handle {sig}: {e}")))?;
    }
    // A Ctrl-C while the history store is read or written is the same request to stop,
    // not an exit that would leave the worktree behind.
    crate::history::interrupt::defer_first_signal();
    // What a setup starts and detaches from its group is re-parented here, not to init,
    // where `wait_forwarding` finds it.
    let _ = nix::sys::prctl::set_child_subreaper(true);
    Ok(())
}

/// Whether Ctrl-C (or SIGTERM) arrived.
pub(crate) fn interrupted() -> bool {
    SIGNALS.load(Ordering::SeqCst) > 0 || crate::history::interrupt::deferred() > 0
}

/// After the second SIGINT or SIGTERM, how long the running child (setup or probe) has to
/// end before its whole process group is killed with SIGKILL: a setup that ignores signals
/// cannot keep the bisection (and its worktree) alive.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(3);

/// The variable every child of a bisection carries (the bisection's pid): what a child
/// left behind outside its process group, re-parented to this process (a subreaper), is
/// found by it and killed when the child ends.
const MARK: &str = "BENCH_BISECT_PID";

/// Waits for `child` (the leader of its own process group, watched), passing every signal
/// this process receives on to its group as SIGINT (so a second Ctrl-C stops `bench
/// matrix` at once, as on a terminal); from the second on, SIGTERM too, and SIGKILL to the
/// group once [`STOP_GRACE`] has passed. When it has exited, what it left in its group (a
/// setup's background jobs) is killed, and so is what it left outside it.
fn wait_forwarding(
    child: &mut Watched,
    deadline: Option<Instant>,
) -> std::io::Result<(ExitStatus, bool)> {
    use nix::sys::signal::Signal;
    let mut forwarded = 0;
    let mut kill_at: Option<Instant> = None;
    let mut out_of_time = false;
    let status = loop {
        if child.exited()? {
            break child.kill()?;
        }
        // The budget's end: the child (a setup that hangs, a probe that never ends) and its
        // whole group are killed, so a stuck build cannot hold the nightly past its budget.
        if deadline.is_some_and(|d| Instant::now() >= d) {
            out_of_time = true;
            break child.kill()?;
        }
        let seen = SIGNALS.load(Ordering::SeqCst) + crate::history::interrupt::deferred();
        if seen > forwarded {
            child.signal(Signal::SIGINT);
            if seen >= 2 {
                child.signal(Signal::SIGTERM);
                kill_at.get_or_insert_with(|| Instant::now() + STOP_GRACE);
            }
            forwarded = seen;
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            break child.kill()?;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    crate::proc::reap_orphans(&format!("{MARK}={}", std::process::id()));
    Ok((status, out_of_time))
}

/// Checks that the matrix at `commit` (which `flag` named) exists and has the cell:
/// bad input otherwise, before anything is measured.
pub(crate) fn check_cell(
    worktree: &mut Worktree,
    settings: &BisectSettings,
    commit: &Commit,
    flag: &str,
) -> Result<(), BisectError> {
    worktree.checkout(&commit.sha)?;
    let matrix = settings.matrix.display().to_string();
    let bad = |message: String| BisectError::Matrix {
        matrix: matrix.clone(),
        flag: flag.to_string(),
        commit: commit.short().to_string(),
        message,
    };
    let path = worktree.path.join(&settings.matrix);
    if !path.is_file() {
        return Err(bad("no such file in the commit's tree".into()));
    }
    let exp = crate::matrix::load_within(&path, &[], Default::default()).map_err(|e| {
        // Name the file as the repository does, not by the worktree's temporary path.
        let prefix = format!("{}/", worktree.path.display());
        bad(e.to_string().replace(&prefix, ""))
    })?;
    if exp.cells.iter().any(|c| c.id.as_str() == settings.cell) {
        return Ok(());
    }
    let ids: Vec<&str> = exp.cells.iter().map(|c| c.id.as_str()).collect();
    let shown = if ids.len() > 10 {
        format!("{}, ... ({} in all)", ids[..10].join(", "), ids.len())
    } else if ids.is_empty() {
        "none".to_string()
    } else {
        ids.join(", ")
    };
    Err(BisectError::UnknownCell {
        cell: crate::sanitize::inline(&settings.cell).into_owned(),
        matrix,
        flag: flag.to_string(),
        commit: commit.short().to_string(),
        cells: shown,
    })
}

/// Where a child run of the cell starts: a folder, the matrix file there and the build of
/// the worker for built-in cells (none: the child's own).
#[derive(Debug, Clone)]
pub(crate) struct Checkout {
    pub dir: PathBuf,
    pub matrix: PathBuf,
    pub worker: Option<PathBuf>,
}

/// Measures commits of one bisection.
pub(crate) struct Prober<'a> {
    settings: &'a BisectSettings,
    worktree: Worktree,
    store: History,
    hardware_key: String,
    /// Holds `runs/` (the probes' run folders), `logs/` and an empty baselines folder.
    work_dir: PathBuf,
    /// Hash of the cell and the hardware key in run ids.
    tag: String,
    /// The commit whose setup ran in the worktree last: its build is what is there.
    ready: Option<String>,
    /// Where builds are kept between jobs (`None`: `BENCH_BUILD_CACHE=off`).
    builds: Option<BuildCache>,
    /// The kept build of the `ready` commit, when it came from the cache: the worker runs
    /// from there, and the commit's setup did not run.
    kept: Option<PathBuf>,
    /// The GPU-seconds this prober may spend (`None`: no limit) and what it has spent.
    budget: Option<Budget>,
    /// `--gpus` for every child run (the nightly's own, so a probe sees the GPUs it saw).
    gpus: Option<u32>,
}

/// An automatic bisection's allowance: every child's wall time (setup included: the job
/// holds the GPUs while it builds) times the cell's GPUs counts against it.
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    pub limit_gpu_s: f64,
    /// GPUs the cell holds (1 for a CPU cell).
    pub gpus: f64,
    pub spent_gpu_s: f64,
    /// What one round is expected to take, GPU-seconds: the cell's time in the nightly run
    /// until a round here has been timed, then the last round's.
    pub round_gpu_s: f64,
    /// What one setup is expected to take (the last one's; none until one ran).
    pub setup_gpu_s: f64,
}

impl Budget {
    /// Refuses a step expected to take `cost` GPU-seconds that would not fit.
    fn check(&self, what: &str, cost: f64) -> Result<(), Halt> {
        // Rounding of the wall clock must not refuse the round that fills the budget.
        if self.spent_gpu_s + cost > self.limit_gpu_s * (1.0 + 1e-9) + 1e-9 {
            return Err(Halt::OutOfBudget(format!(
                "{what} would take about {cost:.0} GPU-s, and {:.0} of the {:.0} GPU-s budget are spent",
                self.spent_gpu_s, self.limit_gpu_s
            )));
        }
        Ok(())
    }
}

impl<'a> Prober<'a> {
    /// Measures in `worktree`, recording into `store`; creates the work folder's parts.
    pub(crate) fn new(
        settings: &'a BisectSettings,
        worktree: Worktree,
        store: History,
        hardware_key: String,
        work_dir: PathBuf,
    ) -> Result<Prober<'a>, BisectError> {
        // The children run in the worktree: a relative folder (the default `results/...`,
        // a template's `shards/...`) would name another place there.
        let work_dir = std::path::absolute(&work_dir).map_err(|e| BisectError::Io {
            path: work_dir.display().to_string(),
            message: e.to_string(),
        })?;
        for sub in ["runs", "logs", "baselines"] {
            let dir = work_dir.join(sub);
            std::fs::create_dir_all(&dir).map_err(|e| BisectError::Io {
                path: dir.display().to_string(),
                message: e.to_string(),
            })?;
        }
        let digest = Sha256::digest(format!("{}\0{hardware_key}", settings.cell).as_bytes());
        let tag = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        let builds = BuildCache::for_repo(&worktree.common_dir);
        Ok(Prober {
            settings,
            builds,
            kept: None,
            worktree,
            store,
            hardware_key,
            work_dir,
            tag,
            ready: None,
            budget: None,
            gpus: None,
        })
    }

    /// Gives every child run `--gpus N`.
    pub(crate) fn with_gpus(mut self, gpus: Option<u32>) -> Self {
        self.gpus = gpus;
        self
    }

    /// Limits what the prober may spend from now on.
    pub(crate) fn with_budget(mut self, budget: Budget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Sets the budget's limit to `limit_gpu_s` (what is spent stays counted).
    pub(crate) fn limit_to(&mut self, limit_gpu_s: f64) {
        if let Some(b) = &mut self.budget {
            b.limit_gpu_s = limit_gpu_s;
        }
    }

    /// GPU-seconds spent so far (0 without a budget).
    pub(crate) fn spent_gpu_s(&self) -> f64 {
        self.budget.as_ref().map_or(0.0, |b| b.spent_gpu_s)
    }

    /// Counts `secs` of wall time against the budget; returns the GPU-seconds.
    fn spend(&mut self, secs: f64) -> f64 {
        match &mut self.budget {
            Some(b) => {
                let cost = secs * b.gpus;
                b.spent_gpu_s += cost;
                cost
            }
            None => 0.0,
        }
    }

    /// Records a run in the prober's store (the side-by-side pairs' two ends).
    pub(crate) fn record(&mut self, r: &RunRecord) -> Result<(), crate::history::HistoryError> {
        self.store.record_run(r)
    }

    pub(crate) fn hardware_key(&self) -> &str {
        &self.hardware_key
    }

    pub(crate) fn store_location(&self) -> &str {
        &self.store.location
    }

    /// The commit whose build the worktree holds (its setup ran last), if any.
    pub(crate) fn ready(&self) -> Option<&str> {
        self.ready.as_deref()
    }

    pub(crate) fn runs_dir(&self) -> PathBuf {
        self.work_dir.join("runs")
    }

    fn checkout(&mut self, sha: &str) -> Result<(), BisectError> {
        if self.worktree.checkout(sha)? {
            self.ready = None;
            self.kept = None;
        }
        Ok(())
    }

    /// The key of `commit`'s build in the cache, when its recipe names a build product
    /// (a setup and a worker) and a cache is in use.
    fn build_key(&self, commit: &Commit) -> Option<String> {
        let (setup, worker) = (
            self.settings.setup.as_ref()?,
            self.settings.worker_exe.as_ref()?,
        );
        self.builds.as_ref()?;
        Some(BuildCache::key(&commit.sha, setup, worker))
    }

    /// Keeps the build the setup just made at `commit` for later jobs. A cache that cannot
    /// be written costs the next job a build, not this one its measurement: a warning.
    fn keep_build(&self, commit: &Commit) {
        let (Some(key), Some(cache), Some(worker)) = (
            self.build_key(commit),
            self.builds.as_ref(),
            self.settings.worker_exe.as_ref(),
        ) else {
            return;
        };
        let product = self.worktree.path.join(worker);
        if !product.is_file() {
            // run_cell says so, with the commit, when the probe needs it.
            return;
        }
        match cache.keep(&key, &product) {
            Ok(at) => eprintln!(
                "bisect: the build of {} is kept for later jobs in {}",
                commit.short(),
                at.display()
            ),
            Err(e) => eprintln!(
                "warning: cannot keep the build of {} in {}: {e}",
                commit.short(),
                cache.dir().display()
            ),
        }
    }

    /// The rounds of `commit` the history holds (this cell, this hardware key, recorded
    /// by a bisection), oldest first.
    pub(crate) fn recorded(&mut self, commit: &Commit) -> Result<Vec<Round>, CliError> {
        let trend = self
            .store
            .trend(&self.settings.cell, &self.hardware_key, METRIC)?;
        Ok(trend
            .into_iter()
            .filter(|p| {
                p.branch.as_deref() == Some(BRANCH) && p.commit.as_deref() == Some(&commit.sha)
            })
            .map(|p| Round {
                run_id: p.run_id,
                samples: if p.samples.is_empty() {
                    vec![p.value]
                } else {
                    p.samples
                },
                reused: true,
            })
            .collect())
    }

    /// Runs the setup command in the worktree (its output goes to a log file).
    fn setup(&mut self, commit: &Commit) -> Result<(), Halt> {
        let Some(cmd) = &self.settings.setup else {
            return Ok(());
        };
        let log = self
            .work_dir
            .join("logs")
            .join(format!("setup-{}.log", commit.short()));
        eprintln!("bisect: setup at {} ({cmd})", commit.short());
        let started = Instant::now();
        let (status, out_of_time) = self.spawn_logged(
            crate::proc::command("sh")
                .args(["-c", cmd])
                .env("BENCH_BISECT_COMMIT", &commit.sha),
            "sh",
            &log,
        )?;
        let cost = self.spend(started.elapsed().as_secs_f64());
        if let Some(b) = &mut self.budget {
            b.setup_gpu_s = cost;
        }
        if interrupted() {
            return Err(Halt::Interrupted);
        }
        if out_of_time {
            return Err(self.stopped("the setup", commit, started));
        }
        if !status.success() {
            // One line with the log's path (the finding carries this message).
            return Err(Halt::Failed(format!(
                "the setup command failed at commit {} ({}) with {status}; log: {}",
                commit.short(),
                commit.subject,
                log.display(),
            )));
        }
        Ok(())
    }

    /// Runs `cmd` (made by `crate::proc::command`: a process group of its own, dying with
    /// bench) in the worktree, stdout and stderr into `log`, passing signals on; returns
    /// its status. `program` names it in a message.
    fn spawn_logged(
        &self,
        cmd: &mut Command,
        program: &str,
        log: &Path,
    ) -> Result<(ExitStatus, bool), Halt> {
        let dir = self.worktree.path.clone();
        self.spawn_logged_in(&dir, cmd, program, log)
    }

    /// [`Self::spawn_logged`] in `dir`.
    fn spawn_logged_in(
        &self,
        dir: &Path,
        cmd: &mut Command,
        program: &str,
        log: &Path,
    ) -> Result<(ExitStatus, bool), Halt> {
        let io = |e: std::io::Error| {
            Halt::Error(CliError::internal(miette::miette!(
                "{}: {e}",
                log.display()
            )))
        };
        let out = File::create(log).map_err(io)?;
        let err = out.try_clone().map_err(io)?;
        let mut child = crate::proc::spawn(
            cmd.current_dir(dir)
                .env(MARK, std::process::id().to_string())
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err),
        )
        .map_err(|e| {
            Halt::Error(CliError::internal(miette::miette!(
                "cannot start {program:?}: {e}"
            )))
        })?;
        wait_forwarding(&mut child, self.deadline()).map_err(io)
    }

    /// When the budget's GPU-seconds left run out at the cell's GPUs, from now.
    fn deadline(&self) -> Option<Instant> {
        let b = self.budget.as_ref()?;
        let left = ((b.limit_gpu_s - b.spent_gpu_s) / b.gpus.max(1.0)).clamp(0.0, 1e9);
        Some(Instant::now() + Duration::from_secs_f64(left))
    }

    /// The halt of a child the budget's end stopped.
    fn stopped(&self, what: &str, commit: &Commit, started: Instant) -> Halt {
        let limit = self.budget.as_ref().map_or(0.0, |b| b.limit_gpu_s);
        Halt::OutOfBudget(format!(
            "{what} at {} ({}) was stopped after {:.0} s, when the {limit:.0} GPU-s budget ran out",
            commit.short(),
            commit.subject,
            started.elapsed().as_secs_f64()
        ))
    }

    /// Checks out `commit` and runs its setup, unless the worktree already holds its build;
    /// with a budget, refuses when the setup and one round would not fit.
    pub(crate) fn prepare(&mut self, commit: &Commit, what: &str) -> Result<(), Halt> {
        if interrupted() {
            return Err(Halt::Interrupted);
        }
        let fresh = self.ready.as_deref() != Some(commit.sha.as_str());
        // A build an earlier job kept for this commit saves its setup (and its cost).
        let kept = if fresh {
            self.build_key(commit)
                .and_then(|k| self.builds.as_ref()?.lookup(&k))
        } else {
            None
        };
        if let Some(b) = &self.budget {
            let setup = if fresh && kept.is_none() && self.settings.setup.is_some() {
                b.setup_gpu_s
            } else {
                0.0
            };
            b.check(
                &format!("{what} at {} ({})", commit.short(), commit.subject),
                setup + b.round_gpu_s,
            )?;
        }
        if fresh {
            // A checkout that fails once a setup ran there is the commit's to report (a setup
            // that removed the worktree's `.git`, or left files git cannot replace): the
            // bisection stops with the reason (exit 1), not as bench's own failure.
            self.checkout(&commit.sha).map_err(|e| match e {
                BisectError::Git { .. } if self.ready.is_some() || self.settings.setup.is_some() => {
                    Halt::Failed(format!(
                        "cannot check out commit {} ({}) in the worktree {} after a setup ran there: {e}",
                        commit.short(),
                        commit.subject,
                        self.worktree.path.display()
                    ))
                }
                e => Halt::from(e),
            })?;
            match kept {
                Some(at) => {
                    eprintln!(
                        "bisect: {} is built already: its kept build {} runs, no setup",
                        commit.short(),
                        at.display()
                    );
                    self.kept = Some(at);
                }
                None => {
                    self.setup(commit)?;
                    self.keep_build(commit);
                }
            }
            self.ready = Some(commit.sha.clone());
        }
        Ok(())
    }

    /// Measures the cell once more at `commit` (round `n`, counting from 1): checkout and
    /// setup when the worktree holds another commit, one `bench matrix` run, the run
    /// recorded in the history.
    pub(crate) fn measure(&mut self, commit: &Commit, n: usize) -> Result<Round, Halt> {
        self.prepare(commit, &format!("round {n}"))?;
        let run_id = format!("bisect-{}-{}-{n}", &commit.sha[..12], self.tag);
        eprintln!(
            "bisect: measuring {} ({}), round {n}",
            commit.short(),
            commit.subject
        );
        let (results, samples) = self.run_cell(commit, &run_id, None, None)?;
        if results.environment.hardware_key != self.hardware_key {
            // The child saw other GPUs than this process did (its key is what the history
            // holds, so that is where the next lookup must search).
            eprintln!(
                "warning: the probe ran on hardware key {}, not {}: looking up probes under the former from now on",
                results.environment.hardware_key, self.hardware_key
            );
            self.hardware_key = results.environment.hardware_key.clone();
        }
        let record = RunRecord::from_results(&results, Some(BRANCH.to_string()), None);
        self.store.record_run(&record)?;
        Ok(Round {
            run_id,
            samples,
            reused: false,
        })
    }

    /// Runs the cell once at `commit` with `BENCH_PROFILE` set to `trace` (the built-in
    /// workload and the framework drivers, llm.c's excepted, then trace one step; a command
    /// workload may write its own Chrome trace there). The run is not recorded in the
    /// history: a traced run's speed is not a sample of the commit.
    pub(crate) fn trace(&mut self, commit: &Commit, trace: &Path) -> Result<(), Halt> {
        self.prepare(commit, "the traced step")?;
        let run_id = format!("bisect-trace-{}-{}", &commit.sha[..12], self.tag);
        eprintln!(
            "bisect: tracing one step at {} ({})",
            commit.short(),
            commit.subject
        );
        self.run_cell(commit, &run_id, Some(trace), None)
            .map(|_| ())
    }

    /// One run of the cell at `commit` (checked out and set up when the worktree holds
    /// another) with `repeats` repeats, not recorded: one side of a side-by-side pair.
    pub(crate) fn measure_once(
        &mut self,
        commit: &Commit,
        run_id: &str,
        repeats: u32,
    ) -> Result<(RunResults, Vec<f64>), Halt> {
        self.prepare(commit, "a side-by-side repeat")?;
        self.run_cell(commit, run_id, None, Some(repeats))
    }

    /// One run of the cell in `checkout` (this run's own checkout, at `commit`), with
    /// `repeats` repeats and `worker` (the nightly's own `--worker-exe`, if any), not
    /// recorded: the other side of a side-by-side pair. Its wall time counts against the
    /// budget as the worktree's runs do.
    pub(crate) fn measure_in(
        &mut self,
        checkout: &Checkout,
        commit: &Commit,
        run_id: &str,
        repeats: u32,
    ) -> Result<(RunResults, Vec<f64>), Halt> {
        if interrupted() {
            return Err(Halt::Interrupted);
        }
        self.run_cell_in(checkout, commit, run_id, None, Some(repeats))
    }

    /// One `bench matrix` child run of the cell at the checked-out `commit` under `run_id`:
    /// its results and the cell's samples of the speed metric. Its wall time counts against
    /// the budget.
    fn run_cell(
        &mut self,
        commit: &Commit,
        run_id: &str,
        trace: Option<&Path>,
        repeats: Option<u32>,
    ) -> Result<(RunResults, Vec<f64>), Halt> {
        let worker = match &self.settings.worker_exe {
            Some(_) if self.kept.is_some() => self.kept.clone(),
            Some(worker) => {
                let path = self.worktree.path.join(worker);
                if !path.is_file() {
                    return Err(Halt::Failed(format!(
                        "--worker-exe {}: no such file in the worktree at commit {} ({}) after the setup",
                        worker.display(),
                        commit.short(),
                        commit.subject
                    )));
                }
                Some(path)
            }
            None => None,
        };
        let checkout = Checkout {
            dir: self.worktree.path.clone(),
            matrix: self.worktree.path.join(&self.settings.matrix),
            worker,
        };
        self.run_cell_in(&checkout, commit, run_id, trace, repeats)
    }

    /// [`Self::run_cell`] in `checkout`.
    fn run_cell_in(
        &mut self,
        checkout: &Checkout,
        commit: &Commit,
        run_id: &str,
        trace: Option<&Path>,
        repeats: Option<u32>,
    ) -> Result<(RunResults, Vec<f64>), Halt> {
        let runs = self.runs_dir();
        let run_dir = runs.join(run_id);
        // A folder of this id is a round that was not recorded (interrupted): start again.
        if run_dir.exists() {
            std::fs::remove_dir_all(&run_dir).map_err(|e| {
                Halt::Error(CliError::internal(miette::miette!(
                    "{}: {e}",
                    run_dir.display()
                )))
            })?;
        }
        let log = self.work_dir.join("logs").join(format!("{run_id}.log"));
        let exe = std::env::current_exe().map_err(|e| {
            Halt::Error(CliError::internal(miette::miette!(
                "cannot find this bench executable: {e}"
            )))
        })?;
        let mut cmd = crate::proc::command(&exe);
        cmd.arg("matrix")
            .arg(&checkout.matrix)
            .arg("--filter")
            .arg(format!("id=\"{}\"", self.settings.cell))
            .arg("--results-dir")
            .arg(&runs)
            .arg("--run-id")
            .arg(run_id)
            .arg("--baselines")
            .arg(self.work_dir.join("baselines"))
            .arg("--no-progress")
            // A probe is one measurement: it neither judges nor triages.
            .env_remove("BENCH_HISTORY")
            // The nightly job's step summary is the nightly's, not each probe's.
            .env_remove("GITHUB_STEP_SUMMARY");
        match trace {
            Some(t) => cmd.env("BENCH_PROFILE", t),
            None => cmd.env_remove("BENCH_PROFILE"),
        };
        if let Some(worker) = &checkout.worker {
            cmd.arg("--worker-exe").arg(worker);
        }
        if let Some(r) = repeats {
            cmd.arg("--repeats").arg(r.to_string());
        }
        if let Some(g) = self.gpus {
            cmd.arg("--gpus").arg(g.to_string());
        }
        let started = Instant::now();
        let (status, out_of_time) =
            self.spawn_logged_in(&checkout.dir, &mut cmd, &exe.display().to_string(), &log)?;
        let cost = self.spend(started.elapsed().as_secs_f64());
        if let Some(b) = &mut self.budget {
            b.round_gpu_s = cost;
        }
        if interrupted() || status.code() == Some(crate::exit::bench::INTERRUPTED) {
            return Err(Halt::Interrupted);
        }
        if out_of_time {
            return Err(self.stopped("the run of the cell", commit, started));
        }
        // One line with the log's path: the finding and its reports carry this message,
        // and a probe's whole log there buried the reason (the log is kept for reading).
        let failed = |why: String| {
            Halt::Failed(format!(
                "cannot measure commit {} ({}): {}; log: {}",
                commit.short(),
                commit.subject,
                crate::sanitize::clean(&why).replace('\n', " "),
                log.display(),
            ))
        };
        let results = match RunResults::load(&run_dir) {
            Ok(r) => r,
            Err(e) => return Err(failed(format!("{e} (bench matrix exited with {status})"))),
        };
        let Some(cell) = results
            .cells
            .iter()
            .find(|c| c.id.as_str() == self.settings.cell)
        else {
            return Err(failed(format!(
                "the run has no cell {}",
                crate::sanitize::inline(&self.settings.cell)
            )));
        };
        let reason = match &cell.outcome {
            Outcome::Passed => None,
            Outcome::Failed { reason }
            | Outcome::TimedOut { reason }
            | Outcome::Skipped { reason } => Some(reason.clone()),
        };
        if let Some(reason) = reason {
            return Err(failed(format!("the cell did not pass: {reason}")));
        }
        let samples: Vec<f64> = cell
            .metrics
            .get(METRIC)
            .map(|m| {
                m.samples
                    .iter()
                    .copied()
                    .filter(|v| v.is_finite())
                    .collect()
            })
            .unwrap_or_default();
        if samples.is_empty() {
            return Err(failed(format!("the cell measured no {METRIC}")));
        }
        Ok((results, samples))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_refuses_the_round_that_would_not_fit_and_takes_the_one_that_fills_it() {
        let mut b = Budget {
            limit_gpu_s: 100.0,
            gpus: 2.0,
            spent_gpu_s: 60.0,
            round_gpu_s: 40.0,
            setup_gpu_s: 0.0,
        };
        assert!(
            b.check("round 1", 40.0).is_ok(),
            "60 + 40 fills 100 exactly"
        );
        b.spent_gpu_s = 60.000_000_01;
        assert!(
            b.check("round 1", 40.0).is_ok(),
            "clock rounding is not a refusal"
        );
        b.spent_gpu_s = 61.0;
        match b.check("round 2 at abc", 40.0) {
            Err(Halt::OutOfBudget(m)) => {
                assert!(
                    m.contains("round 2 at abc would take about 40 GPU-s"),
                    "{m}"
                );
                assert!(m.contains("61 of the 100 GPU-s budget"), "{m}");
            }
            other => panic!("{other:?}"),
        }
    }
}
