//! One attempt of a cell as one Slurm job (`--launcher slurm`): the runner's side of
//! [`crate::slurm`].
//!
//! The attempt is submitted with `sbatch`, watched through a [`Queue`] shared by every job
//! in flight (one `squeue` call per poll interval for all of them, not one per job), and
//! its output file is read as it grows: each rank's lines go to that rank's log under
//! `logs/` and through the same [`Collector`] a local attempt uses, so reporters see the
//! same step events and the results hold the same records. The cell's timeout counts from
//! the moment the job leaves the queue (time spent pending is the cluster's, not the
//! cell's); when it passes, or on Ctrl-C, the job is `scancel`led (SIGTERM to its tasks),
//! and killed with SIGKILL if it is still there after the grace period. How the job ended
//! becomes a [`Termination`], judged by the dispatcher as a local attempt's would be.
//!
//! Why one file of this size: one job's life (submit, queue, run, stop, read back) is one
//! state machine, and its output reading must agree with its state polling line by line.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::{LineWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{watch, Mutex};

use super::executor::{AttemptOutput, Cancel, Collector, Termination};
use crate::events::{ErrorKind, Event};
use crate::exit::worker as exit;
use crate::results::Environment;
use crate::slurm::job::{self, Listed};
use crate::slurm::{JobPlan, JobState, SlurmError};

/// How often the queue is asked about the jobs in flight by default.
pub const DEFAULT_POLL: Duration = Duration::from_secs(2);
/// Environment variable that sets the poll interval in seconds (e.g. `10` on a busy
/// controller).
pub const ENV_POLL: &str = "BENCH_SLURM_POLL_S";
/// Jobs in flight at once when `--jobs` does not say.
pub const DEFAULT_JOBS: usize = 32;
/// Consecutive failed queue queries after which a job is given up (and cancelled).
const MAX_QUERY_FAILURES: u32 = 5;
/// How long a stopped job may take to leave the queue after SIGKILL.
const GONE_LIMIT: Duration = Duration::from_secs(30);
/// How long a finished job's output file may lag behind its state (a shared file system
/// shows the compute node's last writes a little later).
const OUTPUT_LAG: Duration = Duration::from_secs(5);

/// The poll interval from [`ENV_POLL`], else [`DEFAULT_POLL`].
pub fn poll_from_env() -> Result<Duration, String> {
    parse_poll(std::env::var(ENV_POLL).ok().as_deref())
}

/// The poll interval a value of [`ENV_POLL`] asks for (unset or empty: the default).
fn parse_poll(v: Option<&str>) -> Result<Duration, String> {
    match v.map(str::trim) {
        Some(t) if !t.is_empty() => t
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0)
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .ok_or_else(|| format!("${ENV_POLL}={t:?}: expected a positive number of seconds")),
        _ => Ok(DEFAULT_POLL),
    }
}

/// The queue as the last `squeue` call showed it, shared by every job in flight.
pub struct Queue {
    poll: Duration,
    ids: std::sync::Mutex<BTreeSet<String>>,
    snapshot: Mutex<Snapshot>,
    /// Held while a job is submitted, so that jobs enter the queue one at a time in the
    /// order their cells asked (the matrix's order, as Slurm then schedules equal jobs).
    submitting: Mutex<()>,
}

struct Snapshot {
    at: Option<Instant>,
    /// The jobs the last call asked about: a job submitted since is not "gone" from it.
    asked: BTreeSet<String>,
    listed: Result<HashMap<String, Listed>, String>,
}

impl Queue {
    pub fn new(poll: Duration) -> Arc<Queue> {
        Arc::new(Queue {
            poll,
            ids: Default::default(),
            snapshot: Mutex::new(Snapshot {
                at: None,
                asked: BTreeSet::new(),
                listed: Ok(HashMap::new()),
            }),
            submitting: Mutex::new(()),
        })
    }

    fn watch(&self, id: &str) {
        if let Ok(mut ids) = self.ids.lock() {
            ids.insert(id.to_string());
        }
    }

    fn forget(&self, id: &str) {
        if let Ok(mut ids) = self.ids.lock() {
            ids.remove(id);
        }
    }

    /// How `squeue` lists job `id` now (at most one poll interval old); `Ok(None)` when it
    /// no longer lists it. The first caller after the interval refreshes every job's
    /// listing at once; the others wait for that call and share its answer.
    async fn listed(&self, id: &str) -> Result<Option<Listed>, String> {
        let mut snap = self.snapshot.lock().await;
        let stale = snap
            .at
            .is_none_or(|at| at.elapsed() >= self.poll.mul_f64(0.5))
            || !snap.asked.contains(id);
        if stale {
            let ids: BTreeSet<String> = self.ids.lock().map(|ids| ids.clone()).unwrap_or_default();
            snap.asked = ids.clone();
            let ids: Vec<String> = ids.into_iter().collect();
            snap.listed = tokio::task::spawn_blocking(move || job::list(&ids))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()));
            snap.at = Some(Instant::now());
        }
        match &snap.listed {
            Ok(m) => Ok(m.get(id).cloned()),
            Err(e) => Err(e.clone()),
        }
    }
}

/// Runs a blocking Slurm call off the runtime's thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SlurmError> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()))
}

/// Settings of one Slurm attempt.
pub struct JobSpec<'a> {
    pub plan: JobPlan,
    /// Counted from the job's start (not its submission).
    pub timeout: Duration,
    pub grace: Duration,
    /// The log files' common stem, as for a local attempt.
    pub log_stem: &'a Path,
}

/// What a Slurm attempt produced, beyond what a local one does.
pub struct JobAttempt {
    pub out: AttemptOutput,
    pub job_id: Option<String>,
    pub nodes: Option<String>,
    /// The environment the job script captured on the job's first node, when it did.
    pub node_env: Option<Environment>,
}

/// What the launcher hears about a job while it runs.
pub enum JobNews<'a> {
    Submitted(&'a str),
    Running {
        job_id: &'a str,
        nodes: &'a str,
    },
    Event(&'a Event),
    /// The job's first node reported its environment (once per job, as soon as it is read).
    NodeEnv {
        job_id: &'a str,
        env: &'a Environment,
    },
}

/// Reads the environment a job script wrote (`bench env --format json`): `Ok(None)` while
/// the file does not exist, an error naming the file when it cannot be read as one.
pub fn read_node_env(path: &Path) -> Result<Option<Environment>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let env: Environment = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not an environment: {e}", path.display()))?;
    if env.hardware_key.trim().is_empty() {
        return Err(format!("{}: no hardware key", path.display()));
    }
    Ok(Some(env))
}

/// Why a job left no environment of its node, for its log: the probe's own error output
/// when it left some.
fn no_node_env_reason(path: &Path) -> String {
    let mut err = path.as_os_str().to_owned();
    err.push(".err");
    let err = PathBuf::from(err);
    match std::fs::read_to_string(&err) {
        Ok(t) if !t.trim().is_empty() => format!(
            "`bench env` failed on the node: {} (see {})",
            t.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim(),
            err.display()
        ),
        _ => format!(
            "the job script wrote no {} (the job ended before it got that far, or `bench` cannot run on the node)",
            path.display()
        ),
    }
}

/// The log files of one job: one per rank (as a local attempt has), plus the job's own
/// lines (Slurm's and the batch script's, e.g. a cancellation notice) in `<stem>.job.log`.
struct JobLogs {
    ranks: Vec<Option<LineWriter<File>>>,
    job: Option<LineWriter<File>>,
    paths: Vec<PathBuf>,
}

impl JobLogs {
    fn open(stem: &Path, ranks: u32) -> JobLogs {
        let open = |p: &Path| {
            p.parent()
                .map(std::fs::create_dir_all)
                .transpose()
                .and_then(|_| File::create(p))
                .ok()
                .map(LineWriter::new)
        };
        let mut paths: Vec<PathBuf> = (0..ranks)
            .map(|r| {
                let mut s = stem.as_os_str().to_owned();
                if ranks > 1 {
                    s.push(format!(".rank{r}"));
                }
                s.push(".log");
                PathBuf::from(s)
            })
            .collect();
        let ranks_w = paths.iter().map(|p| open(p)).collect();
        let mut s = stem.as_os_str().to_owned();
        s.push(".job.log");
        let job_path = PathBuf::from(s);
        let job = open(&job_path);
        paths.push(job_path);
        JobLogs {
            ranks: ranks_w,
            job,
            paths,
        }
    }

    fn rank(&mut self, rank: u32, text: &str) {
        match self.ranks.get_mut(rank as usize) {
            Some(Some(w)) => {
                let _ = writeln!(w, "{text}");
            }
            // A rank beyond the plan cannot happen with srun's labels; keep the line anyway.
            _ => self.job(&format!("{rank}: {text}")),
        }
    }

    fn job(&mut self, text: &str) {
        if let Some(w) = &mut self.job {
            let _ = writeln!(w, "{text}");
        }
    }

    fn all(&mut self, text: &str) {
        for w in self.ranks.iter_mut().flatten() {
            let _ = writeln!(w, "{text}");
        }
        self.job(text);
    }
}

/// Reads a job's output file as it grows, whole lines at a time (bounded and sanitized by
/// the same splitter as a local worker's pipes).
struct OutputTail {
    path: PathBuf,
    offset: u64,
    partial: crate::events::LineSplitter,
}

impl OutputTail {
    /// The complete lines written since the last call (all of the rest when `last`).
    fn read(&mut self, last: bool) -> Vec<String> {
        let mut lines = Vec::new();
        if let Ok(mut f) = File::open(&self.path) {
            if f.seek(SeekFrom::Start(self.offset)).is_ok() {
                let mut chunk = vec![0u8; 64 * 1024];
                while let Ok(n @ 1..) = f.read(&mut chunk) {
                    self.offset += n as u64;
                    self.partial.push(&chunk[..n], &mut |l| lines.push(l));
                }
            }
        }
        if last {
            lines.extend(self.partial.flush());
        }
        lines
    }
}

/// Where the lines of the job's output go: logs, collector, launcher.
struct Reader<'a, F: FnMut(JobNews<'_>)> {
    logs: JobLogs,
    collector: Collector,
    /// Each rank's last log lines, for the failure message of the rank that failed first.
    tails: HashMap<u32, Collector>,
    /// The batch script's own lines, e.g. Slurm's cancellation notice.
    job_lines: Vec<String>,
    srun_done: bool,
    /// The first rank that exited nonzero, and its status, in output order.
    first_failure: Option<(u32, i32)>,
    news: &'a mut F,
}

impl<F: FnMut(JobNews<'_>)> Reader<'_, F> {
    fn take(&mut self, lines: Vec<String>) {
        let chunk = job::JobOutput::parse(&lines.join("\n"));
        if self.first_failure.is_none() {
            self.first_failure = chunk.first_failure();
        }
        for l in chunk.lines {
            match l.rank {
                Some(rank) => {
                    self.logs.rank(rank, &l.text);
                    // The task wrapper's exit line is the runner's business, not log text.
                    if l.text.starts_with("bench: rank ") {
                        continue;
                    }
                    self.tails.entry(rank).or_default().line(rank, &l.text);
                    if let Some(ev) = self.collector.line(rank, &l.text) {
                        (self.news)(JobNews::Event(&ev));
                    }
                }
                None => {
                    self.logs.job(&l.text);
                    if l.text.starts_with("bench: srun exited with status") {
                        self.srun_done = true;
                    } else if !l.text.trim().is_empty() {
                        self.job_lines.push(l.text);
                    }
                }
            }
        }
    }
}

/// How a finished job ended, as a [`Termination`], plus an error to record when the
/// workers said nothing themselves. `first_failure` is the first rank that exited
/// nonzero and its status, from the task wrapper's lines.
pub fn termination(
    state: &JobState,
    first_failure: Option<(u32, i32)>,
) -> (Termination, Option<(ErrorKind, String)>) {
    if let Some((_, code)) = first_failure {
        // The task wrapper is a shell: 128 + N is death by signal N.
        return match code {
            129..=192 => (Termination::Signaled(code - 128), None),
            c => (Termination::Exited(c), None),
        };
    }
    match state {
        JobState::Finished {
            state, exit_code, ..
        } => match state.as_str() {
            "COMPLETED" => (Termination::Exited(exit_code.unwrap_or(0)), None),
            "TIMEOUT" => (Termination::TimedOut, None),
            "OUT_OF_MEMORY" => (
                Termination::Exited(exit::OOM),
                Some((
                    ErrorKind::Oom,
                    "Slurm ended the job OUT_OF_MEMORY (host memory limit of the allocation)"
                        .into(),
                )),
            ),
            // The batch script failed before any rank reported (srun could not start
            // the step, a node could not run the program): a crash before the first step.
            "FAILED" => (Termination::Exited(exit_code.unwrap_or(1).max(1)), None),
            other => (
                Termination::Lost(format!(
                    "the job ended as {other}, which is the cluster's doing, not the cell's"
                )),
                None,
            ),
        },
        JobState::Active(s) => (
            Termination::Lost(format!("the job was still {s} when bench stopped waiting")),
            None,
        ),
        JobState::Unknown => (
            Termination::Lost(
                "Slurm no longer knows the job (it ended without a record; MinJobAge too short and no accounting?)"
                    .into(),
            ),
            None,
        ),
    }
}

/// Runs one attempt as a Slurm job to its end. `pending_only` stops the attempt only while
/// its job has not started (a `--fail-fast` stop withdraws queued jobs, running ones
/// finish); `cancel` stops it in any state (Ctrl-C).
pub async fn execute<F: FnMut(JobNews<'_>)>(
    spec: JobSpec<'_>,
    queue: &Queue,
    mut cancel: watch::Receiver<Cancel>,
    mut pending_only: watch::Receiver<bool>,
    mut news: F,
) -> JobAttempt {
    let started = Instant::now();
    let mut out = AttemptOutput {
        termination: Termination::Exited(0),
        steps: vec![],
        summary: None,
        notices: vec![],
        error: None,
        tail: vec![],
        duration: Duration::ZERO,
        escalated: false,
        logs: vec![],
    };
    let mut logs = JobLogs::open(spec.log_stem, spec.plan.ranks);
    out.logs = logs.paths.clone();
    if *cancel.borrow() != Cancel::None {
        out.termination = Termination::Cancelled;
        return JobAttempt {
            out,
            job_id: None,
            nodes: None,
            node_env: None,
        };
    }
    let plan = spec.plan.clone();
    let submitted = {
        let _turn = queue.submitting.lock().await;
        // Ctrl-C may have come while this attempt waited for its turn.
        if *cancel.borrow() != Cancel::None {
            out.termination = Termination::Cancelled;
            return JobAttempt {
                out,
                job_id: None,
                nodes: None,
                node_env: None,
            };
        }
        blocking(move || crate::slurm::submit(&plan)).await
    };
    let job = match submitted {
        Ok(j) => j,
        Err(e) => {
            logs.all(&format!("bench: sbatch failed: {e}"));
            out.termination = Termination::SpawnFailed(format!("sbatch: {e}"));
            out.duration = started.elapsed();
            return JobAttempt {
                out,
                job_id: None,
                nodes: None,
                node_env: None,
            };
        }
    };
    queue.watch(&job.id);
    news(JobNews::Submitted(&job.id));
    logs.all(&format!(
        "bench: Slurm job {} ({} task(s) on {} node(s)); its output: {}; script: {}",
        job.id,
        spec.plan.ranks,
        spec.plan.nodes,
        job.output.display(),
        spec.plan.script_path.display()
    ));
    let mut tail = OutputTail {
        path: job.output.clone(),
        offset: 0,
        partial: Default::default(),
    };
    let mut reader = Reader {
        logs,
        collector: Collector::default(),
        tails: HashMap::new(),
        job_lines: vec![],
        srun_done: false,
        first_failure: None,
        news: &mut news,
    };

    let env_file = spec.plan.node_env_file(&job.id);
    let mut node_env: Option<Environment> = None;
    // Set once the file was found unreadable, so that it is said once.
    let mut env_error: Option<String> = None;
    let mut nodes: Option<String> = None;
    let mut deadline: Option<tokio::time::Instant> = None;
    let mut stopped_by: Option<Termination> = None;
    let mut stop_sent_at: Option<tokio::time::Instant> = None;
    let mut killed = false;
    let mut seen = Cancel::None;
    let mut failures = 0u32;
    let mut withdrawn = false;
    // Set when Slurm says the job can never start as submitted.
    let mut refused: Option<String> = None;
    // As the queue last listed the job: a job is only withdrawn while it waits.
    let mut pending = true;
    let final_state: JobState = loop {
        reader.take(tail.read(false));
        match queue.listed(&job.id).await {
            Ok(Some(l)) if job::is_active(&l.state) => {
                failures = 0;
                pending = l.state == "PENDING";
                if pending && refused.is_none() && job::never_starts(&l.reason) {
                    let why = format!(
                        "Slurm will never start job {} as submitted: it is pending with reason {} (a limit of the partition, account or QOS, e.g. a time limit above the partition's; see `scontrol show job {}`)",
                        job.id, l.reason, job.id
                    );
                    reader.logs.all(&format!("bench: {why}"));
                    refused = Some(why);
                }
                if !pending && nodes.is_none() && !l.nodes.is_empty() {
                    nodes = Some(l.nodes.clone());
                    deadline = Some(tokio::time::Instant::now() + spec.timeout);
                    reader
                        .logs
                        .all(&format!("bench: job {} runs on {}", job.id, l.nodes));
                    (reader.news)(JobNews::Running {
                        job_id: &job.id,
                        nodes: &l.nodes,
                    });
                }
            }
            Ok(_) => {
                // Gone from the queue, or listed in a final state: ask for the final word.
                let j = job.clone();
                match blocking(move || j.state()).await {
                    Ok(JobState::Active(_)) => {}
                    Ok(s) => break s,
                    Err(e) => {
                        failures += 1;
                        if failures >= MAX_QUERY_FAILURES {
                            break JobState::Finished {
                                state: format!("UNKNOWN ({e})"),
                                exit_code: None,
                                signal: None,
                            };
                        }
                    }
                }
            }
            Err(e) => {
                failures += 1;
                if failures >= MAX_QUERY_FAILURES {
                    reader.logs.all(&format!(
                        "bench: cannot query Slurm, giving up the job: {e}"
                    ));
                    let j = job.clone();
                    let _ = blocking(move || j.cancel()).await;
                    break JobState::Finished {
                        state: format!("UNKNOWN (squeue failed {failures} times: {e})"),
                        exit_code: None,
                        signal: None,
                    };
                }
            }
        }

        // The script writes its node's environment before the tasks start.
        if nodes.is_some() {
            read_env_once(
                env_file.as_deref(),
                &job.id,
                &mut node_env,
                &mut env_error,
                &mut reader,
            );
        }

        // Decide whether to stop the job now.
        let now = tokio::time::Instant::now();
        let level = *cancel.borrow();
        let mut stop: Option<(Termination, bool)> = None;
        if level > seen {
            seen = level;
            stop = Some((Termination::Cancelled, level == Cancel::Force));
        } else if stopped_by.is_none() && refused.is_some() {
            stop = Some((Termination::Exited(exit::BAD_INPUT), false));
        } else if stopped_by.is_none() && deadline.is_some_and(|d| now >= d) {
            stop = Some((Termination::TimedOut, false));
        } else if stopped_by.is_none() && pending && *pending_only.borrow() {
            withdrawn = true;
            stop = Some((Termination::Cancelled, false));
        }
        if let Some((why, force)) = stop {
            if stopped_by.is_none() {
                stopped_by = Some(why);
            }
            let j = job.clone();
            let res = if force {
                killed = true;
                blocking(move || j.kill()).await
            } else if stop_sent_at.is_none() {
                blocking(move || j.cancel()).await
            } else {
                Ok(())
            };
            stop_sent_at.get_or_insert(now);
            if let Err(e) = res {
                reader.logs.all(&format!("bench: scancel {}: {e}", job.id));
            }
        }
        if let Some(at) = stop_sent_at {
            if !killed && now >= at + spec.grace {
                killed = true;
                out.escalated = true;
                let j = job.clone();
                let _ = blocking(move || j.kill()).await;
            }
            if killed && now >= at + spec.grace + GONE_LIMIT {
                let j = job.clone();
                break blocking(move || j.state())
                    .await
                    .unwrap_or(JobState::Unknown);
            }
        }

        // Sleep one poll interval, waking early for a Ctrl-C or a fail-fast stop.
        let sleep = tokio::time::sleep(queue.poll);
        tokio::pin!(sleep);
        tokio::select! {
            _ = &mut sleep => {}
            _ = cancel.changed() => {}
            _ = pending_only.changed(), if pending && !withdrawn => {}
        }
    };
    queue.forget(&job.id);
    if nodes.is_none() {
        // A short job can start and end between two polls; Slurm still knows where it ran.
        let j = job.clone();
        nodes = blocking(move || Ok(j.nodes())).await.ok().flatten();
    }

    // The output file may trail the job's state on a shared file system.
    let lag_until = Instant::now() + OUTPUT_LAG;
    reader.take(tail.read(false));
    while !reader.srun_done && stopped_by.is_none() && Instant::now() < lag_until {
        tokio::time::sleep(Duration::from_millis(200)).await;
        reader.take(tail.read(false));
    }
    reader.take(tail.read(true));
    read_env_once(
        env_file.as_deref(),
        &job.id,
        &mut node_env,
        &mut env_error,
        &mut reader,
    );
    if let (Some(f), None, None) = (env_file.as_deref(), &node_env, &env_error) {
        reader.logs.all(&format!(
            "bench: no environment of the job's node: {}",
            no_node_env_reason(f)
        ));
    }

    let first_failure = reader.first_failure;
    let (term, error) = termination(&final_state, first_failure);
    let state_text = match &final_state {
        JobState::Finished {
            state,
            exit_code,
            signal,
        } => format!(
            "{state} (exit {}:{})",
            exit_code.map_or("?".into(), |c| c.to_string()),
            signal.map_or("?".into(), |c| c.to_string())
        ),
        JobState::Active(s) => s.clone(),
        JobState::Unknown => "unknown".into(),
    };
    reader
        .logs
        .all(&format!("bench: Slurm job {} ended {state_text}", job.id));

    let Reader {
        collector,
        mut tails,
        job_lines,
        ..
    } = reader;
    collector.fill(&mut out);
    // The failure message quotes the rank that failed first, not the ranks srun killed
    // after it; Slurm's own words (a cancellation, a step that could not start) come last.
    if let Some((rank, _)) = first_failure {
        if let Some(t) = tails.remove(&rank) {
            let mut o = out.clone();
            t.fill(&mut o);
            if o.error.is_some() {
                out.error = o.error;
            }
            if !o.tail.is_empty() {
                out.tail = o.tail;
            }
        }
    } else if !job_lines.is_empty() && out.error.is_none() {
        out.tail
            .extend(job_lines.iter().rev().take(2).rev().cloned());
    }
    if error.is_some() && out.error.is_none() {
        out.error = error;
    }
    if let Some(why) = refused {
        out.error = Some((ErrorKind::BadInput, why));
    }
    out.termination = match stopped_by {
        Some(t) if withdrawn && t == Termination::Cancelled => Termination::Withdrawn,
        Some(t) => t,
        None => term,
    };
    out.duration = started.elapsed();
    JobAttempt {
        out,
        job_id: Some(job.id.clone()),
        nodes,
        node_env,
    }
}

/// Reads the job's node environment if it has not been read yet and is there now; says so
/// in the job's logs and to the launcher.
fn read_env_once<F: FnMut(JobNews<'_>)>(
    file: Option<&Path>,
    job_id: &str,
    node_env: &mut Option<Environment>,
    env_error: &mut Option<String>,
    reader: &mut Reader<'_, F>,
) {
    let Some(file) = file else { return };
    if node_env.is_some() || env_error.is_some() {
        return;
    }
    match read_node_env(file) {
        Ok(Some(env)) => {
            reader.logs.all(&format!(
                "bench: job {job_id}'s node {} has hardware key {} ({})",
                env.host,
                env.hardware_key,
                file.display()
            ));
            (reader.news)(JobNews::NodeEnv { job_id, env: &env });
            *node_env = Some(env);
        }
        Ok(None) => {}
        Err(e) => {
            reader
                .logs
                .all(&format!("bench: no environment of the job's node: {e}"));
            *env_error = Some(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(state: &str, exit_code: Option<i32>) -> JobState {
        JobState::Finished {
            state: state.into(),
            exit_code,
            signal: Some(0),
        }
    }

    #[test]
    fn job_ends_map_to_the_terminations_of_local_attempts() {
        // The first failing rank's own status decides, whatever Slurm says of the job.
        let (t, e) = termination(&finished("FAILED", Some(143)), Some((1, 5)));
        assert_eq!((t, e), (Termination::Exited(5), None));
        assert_eq!(
            termination(&finished("FAILED", Some(137)), Some((0, 137))).0,
            Termination::Signaled(9)
        );
        assert_eq!(
            termination(&finished("COMPLETED", Some(0)), None).0,
            Termination::Exited(0)
        );
        // Slurm's own time limit is a timeout; its memory limit an out-of-memory failure.
        assert_eq!(
            termination(&finished("TIMEOUT", None), None).0,
            Termination::TimedOut
        );
        let (t, e) = termination(&finished("OUT_OF_MEMORY", Some(0)), None);
        assert_eq!(t, Termination::Exited(exit::OOM));
        assert_eq!(e.map(|(k, _)| k), Some(ErrorKind::Oom));
        // The batch script failing before any rank reported: a crash (retried if no step).
        assert_eq!(
            termination(&finished("FAILED", Some(1)), None).0,
            Termination::Exited(1)
        );
        assert_eq!(
            termination(&finished("FAILED", Some(0)), None).0,
            Termination::Exited(1)
        );
        // The cluster's doing: infrastructure, retried.
        for state in ["NODE_FAIL", "PREEMPTED", "CANCELLED", "BOOT_FAIL"] {
            assert!(
                matches!(termination(&finished(state, None), None).0, Termination::Lost(m) if m.contains(state)),
                "{state}"
            );
        }
        assert!(matches!(
            termination(&JobState::Unknown, None).0,
            Termination::Lost(_)
        ));
    }

    #[test]
    fn the_output_is_read_in_whole_lines_as_it_grows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("slurm-1.out");
        let mut tail = OutputTail {
            path: path.clone(),
            offset: 0,
            partial: Default::default(),
        };
        // Not written yet (a pending job): nothing, no error.
        assert!(tail.read(false).is_empty());
        let mut f = File::create(&path).unwrap();
        write!(f, "0: one\n1: tw").unwrap();
        assert_eq!(tail.read(false), vec!["0: one"]);
        write!(f, "o\n0: thr").unwrap();
        assert_eq!(tail.read(false), vec!["1: two"]);
        assert!(tail.read(false).is_empty());
        assert_eq!(tail.read(true), vec!["0: thr"]);
    }

    #[test]
    fn each_rank_gets_its_log_and_the_first_failure_its_say() {
        let dir = tempfile::tempdir().unwrap();
        let stem = dir.path().join("logs/c.r0");
        let mut seen = vec![];
        let mut news = |n: JobNews<'_>| {
            if let JobNews::Event(Event::Step(s)) = n {
                seen.push(s.rank);
            }
        };
        let mut reader = Reader {
            logs: JobLogs::open(&stem, 2),
            collector: Collector::default(),
            tails: HashMap::new(),
            job_lines: vec![],
            srun_done: false,
            first_failure: None,
            news: &mut news,
        };
        reader.take(
            [
                r#"1: {"event":"step","step":0,"step_time_s":0.2,"tokens":8,"loss":1.0,"rank":1}"#,
                r#"0: {"event":"step","step":0,"step_time_s":0.1,"tokens":8,"loss":1.0,"rank":0}"#,
                r#"1: {"event":"error","kind":"oom","message":"rank 1 ran out"}"#,
                "1: bench: rank 1 exited with status 4",
                "srun: error: node1: task 1: Exited with exit code 4",
                "0: bench: rank 0 exited with status 143",
                "bench: srun exited with status 143",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        );
        assert_eq!(reader.first_failure, Some((1, 4)));
        assert!(reader.srun_done);
        assert_eq!(
            reader.job_lines,
            vec!["srun: error: node1: task 1: Exited with exit code 4"]
        );
        assert!(reader.tails.contains_key(&1));
        drop(reader);
        assert_eq!(seen, vec![Some(1), Some(0)]);
        let log1 = std::fs::read_to_string(dir.path().join("logs/c.r0.rank1.log")).unwrap();
        assert!(log1.contains("rank 1 ran out") && log1.contains("exited with status 4"));
        assert!(!log1.contains("\"rank\":0"));
        let job = std::fs::read_to_string(dir.path().join("logs/c.r0.job.log")).unwrap();
        assert!(job.contains("srun: error") && job.contains("srun exited"));
    }

    #[test]
    fn a_nodes_environment_is_read_when_there_and_whole() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("node-env-7.json");
        // Not written yet: nothing, no error.
        assert_eq!(read_node_env(&f), Ok(None));
        assert!(no_node_env_reason(&f).contains("wrote no"));
        let env = Environment {
            hardware_key: "h100-sxm-80gb".into(),
            host: "gpu01".into(),
            gpu_model: Some("NVIDIA H100 80GB HBM3".into()),
            gpu_count: 8,
            ..Default::default()
        };
        std::fs::write(&f, serde_json::to_string_pretty(&env).unwrap()).unwrap();
        assert_eq!(read_node_env(&f), Ok(Some(env)));
        std::fs::write(&f, "{\"gpu_count\": 8").unwrap();
        assert!(read_node_env(&f).unwrap_err().contains("node-env-7.json"));
        std::fs::write(&f, "{\"gpu_count\":0,\"cpu\":\"\",\"host\":\"\",\"os\":\"\",\"git_dirty\":false,\"bench_version\":\"\",\"hardware_key\":\" \"}").unwrap();
        assert!(read_node_env(&f).unwrap_err().contains("no hardware key"));
        // The probe's own words, when it left some, say why there is no file.
        std::fs::remove_file(&f).unwrap();
        std::fs::write(
            dir.path().join("node-env-7.json.err"),
            "x\nlibtorch_cpu.so: cannot open\n\n",
        )
        .unwrap();
        let why = no_node_env_reason(&f);
        assert!(why.contains("libtorch_cpu.so: cannot open"), "{why}");
    }

    #[test]
    fn poll_intervals_parse() {
        assert_eq!(parse_poll(None), Ok(DEFAULT_POLL));
        assert_eq!(parse_poll(Some(" ")), Ok(DEFAULT_POLL));
        assert_eq!(parse_poll(Some("0.5")), Ok(Duration::from_millis(500)));
        for bad in ["0", "-1", "soon", "inf", "NaN"] {
            assert!(parse_poll(Some(bad)).is_err(), "{bad}");
        }
    }
}
