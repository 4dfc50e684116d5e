//! The executor: runs one attempt of a cell (a [`LaunchPlan`]'s processes) to its end.
//!
//! Each process is started directly (no shell) in a process group of its own, so the
//! terminal's Ctrl-C does not reach workers behind the runner's back and so the whole
//! tree a worker starts can be signalled at once. At the timeout, on cancellation, or when
//! one rank of a multi-process cell fails, every group gets SIGTERM, then SIGKILL after
//! the grace period. When the processes have exited, their groups get SIGKILL anyway,
//! which removes children a worker left behind: no orphans outlive an attempt. Should bench
//! itself be killed (SIGKILL included), each worker gets its parent-death signal and the
//! watchdog of `crate::proc` kills the groups still running, so what a worker started in
//! its group (a launcher's ranks) does not outlive bench either.
//!
//! Every output line of both streams goes to the attempt's log file; lines that parse as
//! worker [`Event`]s are collected for the results and passed to the caller as they come.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{LineWriter, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use super::launch::LaunchPlan;
use crate::events::{ErrorKind, Event, StepEvent, SummaryEvent};

/// How many trailing log lines an attempt keeps for its failure message.
const TAIL_LINES: usize = 8;
/// How long output is still read after the processes are gone (a descendant that left
/// the process group may hold a pipe open; it must not hang the runner).
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// A request to stop running attempts, sent by the dispatcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Cancel {
    None,
    /// SIGTERM, then SIGKILL after the grace period (first Ctrl-C).
    Graceful,
    /// SIGKILL now (second Ctrl-C).
    Force,
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Termination {
    /// Every process exited with this code (the first failing rank's code when not 0).
    Exited(i32),
    /// A process died of this signal (not sent by the runner).
    Signaled(i32),
    /// The runner stopped it at the timeout.
    TimedOut,
    /// The runner stopped it on request (Ctrl-C).
    Cancelled,
    /// A process could not be started (or, under Slurm, the job could not be submitted).
    SpawnFailed(String),
    /// The cluster ended the job for reasons of its own (a node failed, the job was
    /// preempted or cancelled by someone else): an infrastructure failure.
    Lost(String),
    /// A queued Slurm job was withdrawn before it started, because the run stopped
    /// starting cells (`--fail-fast`, `--max-fail`).
    Withdrawn,
}

/// Everything an attempt produced.
#[derive(Debug, Clone)]
pub(crate) struct AttemptOutput {
    pub termination: Termination,
    pub steps: Vec<StepEvent>,
    pub summary: Option<SummaryEvent>,
    pub notices: Vec<String>,
    /// The last `error` event a worker printed.
    pub error: Option<(ErrorKind, String)>,
    /// The last lines of log text (not events), for failure messages.
    pub tail: Vec<String>,
    pub duration: Duration,
    /// True when a stop needed SIGKILL: the processes outlived the grace period.
    pub escalated: bool,
    /// The log files written, one per process.
    pub logs: Vec<PathBuf>,
}

impl AttemptOutput {
    /// An attempt's record before anything has happened: a clean exit until the
    /// processes or the job say otherwise. Both launchers' executors start from it.
    pub(crate) fn before_start() -> AttemptOutput {
        AttemptOutput {
            termination: Termination::Exited(0),
            steps: vec![],
            summary: None,
            notices: vec![],
            error: None,
            tail: vec![],
            duration: Duration::ZERO,
            escalated: false,
            logs: vec![],
        }
    }
}

/// Reads the output lines of one attempt's ranks by one set of rules, whichever launcher
/// ran them: events go into the attempt's record, other text into the failure tail.
///
/// Summaries follow the multi-rank contract of the built-in workload: rank 0 reports the
/// cell's figures (with every rank's peak memory gathered); a command workload whose
/// other ranks print summaries of their own adds their memory figures after rank 0's,
/// in rank order, whatever order the lines arrived in.
#[derive(Debug, Default)]
pub(crate) struct Collector {
    steps: Vec<StepEvent>,
    summaries: BTreeMap<u32, SummaryEvent>,
    notices: Vec<String>,
    error: Option<(ErrorKind, String)>,
    tail: VecDeque<String>,
    /// Holds each line to the event contract.
    reader: crate::events::EventReader,
}

impl Collector {
    /// Takes one line printed by `rank`; returns the event on it, if it is one.
    pub(crate) fn line(&mut self, rank: u32, line: &str) -> Option<Event> {
        let Some(ev) = self.reader.line(rank, line) else {
            if !line.trim().is_empty() {
                if self.tail.len() == TAIL_LINES {
                    self.tail.pop_front();
                }
                self.tail.push_back(line.to_string());
            }
            return None;
        };
        match &ev {
            Event::Step(s) => self.steps.push(s.clone()),
            Event::Summary(s) => {
                self.summaries.insert(rank, s.clone());
            }
            Event::Notice { message } => self.notices.push(message.clone()),
            Event::Error { kind, message } => self.error = Some((*kind, message.clone())),
            Event::Start { .. } => {}
        }
        Some(ev)
    }

    /// The attempt's summary: the lowest reporting rank's, with the others' memory added.
    pub(crate) fn summary(&self) -> Option<SummaryEvent> {
        let mut it = self.summaries.values();
        let mut first = it.next()?.clone();
        for other in it {
            first
                .peak_mem_bytes
                .extend(other.peak_mem_bytes.iter().copied());
        }
        Some(first)
    }

    /// Moves what was gathered into `out` (its termination and timing are the caller's).
    pub(crate) fn fill(self, out: &mut AttemptOutput) {
        out.summary = self.summary();
        out.steps = self.steps;
        out.notices = self.notices;
        // A broken contract is the attempt's error when the worker reported none.
        out.error = self.error.or_else(|| {
            let why = self.reader.violation()?;
            Some((ErrorKind::BadInput, why))
        });
        out.tail = self.tail.into_iter().collect();
    }
}

/// Settings of one attempt.
#[derive(Debug, Clone)]
pub(crate) struct AttemptSpec<'a> {
    pub plan: &'a LaunchPlan,
    pub timeout: Duration,
    pub grace: Duration,
    /// The log file without its `.log` extension; a multi-process plan adds `.rank<N>`.
    pub log_stem: &'a Path,
}

fn log_path(stem: &Path, rank: u32, ranks: usize) -> PathBuf {
    let mut s = stem.as_os_str().to_owned();
    if ranks > 1 {
        s.push(format!(".rank{rank}"));
    }
    s.push(".log");
    PathBuf::from(s)
}

/// Sends `sig` to every process group; groups already empty are skipped silently.
fn signal_groups(pgids: &[Pid], sig: Signal) {
    for pg in pgids {
        // ESRCH means the group is already empty, which is the goal.
        let _ = killpg(*pg, sig);
    }
}

/// Makes this process the child subreaper of everything it starts (Linux's
/// `PR_SET_CHILD_SUBREAPER`): a worker's descendant that leaves the worker's process group
/// (`setsid`, a double fork) and outlives its parent is re-parented to bench instead of to
/// PID 1, where [`reap_orphans`] finds it when the cell ends. Called once when a run
/// starts; failure (another OS) leaves such processes to the group kill alone.
pub(crate) fn become_subreaper() {
    let _ = nix::sys::prctl::set_child_subreaper(true);
}

/// The `BENCH_CELL_ID` an attempt's processes carry (and pass to their descendants).
fn cell_id(spec: &AttemptSpec) -> Option<String> {
    spec.plan
        .procs
        .first()?
        .env
        .iter()
        .find(|(k, _)| k == "BENCH_CELL_ID")
        .map(|(_, v)| v.clone())
}

/// Kills and reaps bench's children that descend from a worker of cell `cell` (their
/// environment still says `BENCH_CELL_ID=<cell>`) once that cell's attempt is over: the
/// processes that left the worker's process group and were re-parented to bench
/// ([`become_subreaper`]). bench's other children (other cells' workers, Slurm commands)
/// carry another cell id or none and are left alone.
fn reap_orphans(cell: &str) {
    crate::proc::reap_orphans(&format!("BENCH_CELL_ID={cell}"));
}

/// Reads `stream` line by line into `tx`, tagged with the process index.
fn spawn_reader<R: AsyncRead + Unpin + Send + 'static>(
    set: &mut JoinSet<()>,
    index: usize,
    stream: R,
    tx: mpsc::UnboundedSender<(usize, String)>,
) {
    set.spawn(async move {
        let mut stream = stream;
        // Workers may print any bytes, in lines of any length: the splitter bounds and
        // sanitizes each line where it is read (see `events`).
        let mut lines = crate::events::LineSplitter::default();
        let mut chunk = vec![0u8; 64 * 1024];
        let mut open = true;
        while open {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => lines.push(&chunk[..n], &mut |l| open &= tx.send((index, l)).is_ok()),
            }
        }
        if let Some(l) = lines.flush() {
            let _ = tx.send((index, l));
        }
    });
}

/// Runs one attempt to its end. `on_event` sees each worker event as it is printed.
pub(crate) async fn execute(
    spec: AttemptSpec<'_>,
    mut cancel: watch::Receiver<Cancel>,
    mut on_event: impl FnMut(&Event),
) -> AttemptOutput {
    let started = Instant::now();
    let n = spec.plan.procs.len();
    let mut out = AttemptOutput::before_start();
    let mut logs: Vec<Option<LineWriter<File>>> = Vec::with_capacity(n);
    for p in &spec.plan.procs {
        let path = log_path(spec.log_stem, p.rank, n);
        logs.push(
            path.parent()
                .map(std::fs::create_dir_all)
                .transpose()
                .and_then(|_| File::create(&path))
                .ok()
                .map(LineWriter::new),
        );
        out.logs.push(path);
    }

    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, String)>();
    let mut readers = JoinSet::new();
    let mut waits: JoinSet<(usize, std::io::Result<ExitStatus>)> = JoinSet::new();
    let mut pgids: Vec<Pid> = Vec::with_capacity(n);
    for (i, p) in spec.plan.procs.iter().enumerate() {
        // Through the runner's command (`crate::proc`): where setpriv can set the
        // parent-death signal the worker is spawned without a fork of bench (which maps
        // libtorch: about 30 ms per cell), through `setpriv --pdeathsig KILL -- /bin/sh -c
        // '<check bench is the parent>; exec "$@"'`, the same process becoming the worker;
        // otherwise the signal is set between fork and exec. Either way the worker dies
        // with bench, even when bench is killed with SIGKILL, and its group is watched, so
        // what the worker started in it dies too.
        let path = p
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| std::ffi::OsStr::new(v.as_str()));
        let mut cmd = tokio::process::Command::from(crate::proc::command_in(&p.program, path));
        cmd.args(&p.args);
        cmd.envs(p.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // A new group led by the worker: signals reach its whole tree.
            .process_group(0)
            .kill_on_drop(true);
        match cmd.spawn() {
            Ok(mut child) => {
                if let Some(id) = child.id() {
                    let pgid = Pid::from_raw(id as i32);
                    crate::proc::watch(pgid);
                    pgids.push(pgid);
                }
                if let Some(s) = child.stdout.take() {
                    spawn_reader(&mut readers, i, s, tx.clone());
                }
                if let Some(s) = child.stderr.take() {
                    spawn_reader(&mut readers, i, s, tx.clone());
                }
                waits.spawn(async move { (i, child.wait().await) });
            }
            Err(e) => {
                let msg = format!("cannot start {}: {e}", p.program.display());
                if let Some(Some(log)) = logs.get_mut(i) {
                    let _ = writeln!(log, "bench: {msg}");
                }
                signal_groups(&pgids, Signal::SIGKILL);
                for pg in &pgids {
                    crate::proc::unwatch(*pg);
                }
                out.termination = Termination::SpawnFailed(msg);
                // The processes already started die with their groups; reap them.
                while waits.join_next().await.is_some() {}
                out.duration = started.elapsed();
                return out;
            }
        }
    }
    drop(tx);

    let ranks: Vec<u32> = spec.plan.procs.iter().map(|p| p.rank).collect();
    let mut collector = Collector::default();
    let mut handle_line = |i: usize, line: String| {
        if let Some(Some(log)) = logs.get_mut(i) {
            let _ = writeln!(log, "{line}");
        }
        if let Some(ev) = collector.line(ranks.get(i).copied().unwrap_or(0), &line) {
            on_event(&ev);
        }
    };

    let deadline = tokio::time::sleep(spec.timeout);
    tokio::pin!(deadline);
    let grace = tokio::time::sleep(Duration::from_secs(u64::MAX / 4));
    tokio::pin!(grace);
    let mut terminating = false;
    let mut killed = false;
    let mut seen = Cancel::None;
    let mut stopped_by: Option<Termination> = None;
    let mut first_failure: Option<Termination> = None;
    let mut remaining = n;
    let mut lines_open = true;

    while remaining > 0 {
        tokio::select! {
            msg = rx.recv(), if lines_open => match msg {
                Some((i, line)) => handle_line(i, line),
                None => lines_open = false,
            },
            done = waits.join_next() => {
                let Some(done) = done else { break };
                remaining -= 1;
                let status = match done {
                    Ok((_, Ok(st))) => st,
                    // Waiting failed (the runtime cannot observe the child): count it as
                    // a crash so the attempt is retried rather than trusted.
                    _ => ExitStatus::from_raw(1 << 8),
                };
                let t = match (status.code(), status.signal()) {
                    (Some(c), _) => Termination::Exited(c),
                    (None, Some(s)) => Termination::Signaled(s),
                    (None, None) => Termination::Exited(-1),
                };
                if t != Termination::Exited(0) && first_failure.is_none() {
                    first_failure = Some(t);
                    // One failed rank brings the whole cell down (the others would hang
                    // in their next collective).
                    if remaining > 0 && !terminating {
                        terminating = true;
                        signal_groups(&pgids, Signal::SIGTERM);
                        grace.as_mut().reset(tokio::time::Instant::now() + spec.grace);
                    }
                }
            }
            _ = &mut deadline, if stopped_by.is_none() => {
                stopped_by = Some(Termination::TimedOut);
                if !terminating {
                    terminating = true;
                    signal_groups(&pgids, Signal::SIGTERM);
                    grace.as_mut().reset(tokio::time::Instant::now() + spec.grace);
                }
            }
            c = cancel.wait_for(|c| *c > seen), if seen != Cancel::Force => {
                // A closed channel means the dispatcher is gone: stop at once.
                let level = c.map(|r| *r).unwrap_or(Cancel::Force);
                seen = level;
                if stopped_by.is_none() {
                    stopped_by = Some(Termination::Cancelled);
                }
                if level == Cancel::Force {
                    killed = true;
                    signal_groups(&pgids, Signal::SIGKILL);
                } else if !terminating {
                    terminating = true;
                    signal_groups(&pgids, Signal::SIGTERM);
                    grace.as_mut().reset(tokio::time::Instant::now() + spec.grace);
                }
            }
            _ = &mut grace, if terminating && !killed => {
                killed = true;
                out.escalated = true;
                signal_groups(&pgids, Signal::SIGKILL);
            }
        }
    }
    // Whatever the workers left in their groups dies with them, and so does whatever
    // left the groups (a `setsid` daemon): bench is the run's child subreaper, so those
    // are its children now.
    signal_groups(&pgids, Signal::SIGKILL);
    for pg in &pgids {
        crate::proc::unwatch(*pg);
    }
    if let Some(id) = cell_id(&spec) {
        reap_orphans(&id);
    }
    let drain = tokio::time::sleep(DRAIN_LIMIT);
    tokio::pin!(drain);
    while lines_open {
        tokio::select! {
            msg = rx.recv() => match msg {
                Some((i, line)) => handle_line(i, line),
                None => lines_open = false,
            },
            _ = &mut drain => break,
        }
    }
    readers.abort_all();
    collector.fill(&mut out);
    out.termination = stopped_by
        .or(first_failure)
        .unwrap_or(Termination::Exited(0));
    out.duration = started.elapsed();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::launch::ProcSpec;

    fn fake(args: &[&str], rank: u32) -> ProcSpec {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_worker.sh");
        let mut a = vec![script.display().to_string()];
        a.extend(args.iter().map(|s| s.to_string()));
        ProcSpec {
            program: "sh".into(),
            args: a,
            env: vec![("BENCH_CELL_ID".into(), format!("rank{rank}"))],
            rank,
        }
    }

    fn alive(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    }

    #[test]
    fn summaries_merge_by_rank_whatever_the_order() {
        let summary = |mem: u64| {
            format!(r#"{{"event":"summary","peak_mem_bytes":[{mem}],"tokens_per_s":{mem}.0}}"#)
        };
        let mut c = Collector::default();
        assert!(c.line(1, &summary(2000)).is_some());
        assert!(c.line(0, "plain text").is_none());
        assert!(c.line(0, &summary(1000)).is_some());
        assert!(c.line(2, &summary(3000)).is_some());
        let s = c.summary().unwrap();
        // Rank 0's figures, with every rank's memory in rank order.
        assert_eq!(s.tokens_per_s, Some(1000.0));
        assert_eq!(s.peak_mem_bytes, vec![1000, 2000, 3000]);
        let mut out = AttemptOutput::before_start();
        c.fill(&mut out);
        assert_eq!(out.tail, vec!["plain text"]);
        assert_eq!(out.summary.map(|s| s.peak_mem_bytes.len()), Some(3));
    }

    /// A multi-process cell (the shape issue 5's ranks take): when one rank crashes, the
    /// others, even one that ignores SIGTERM, are brought down and each rank has its log.
    #[test]
    fn a_failing_rank_brings_down_the_others() {
        let tmp = tempfile::tempdir().unwrap();
        let pidfile = tmp.path().join("pids");
        let plan = LaunchPlan {
            procs: vec![
                fake(&["hang", pidfile.to_str().unwrap()], 0),
                fake(&["crash-after", pidfile.to_str().unwrap()], 1),
            ],
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (_tx, rx) = watch::channel(Cancel::None);
        let stem = tmp.path().join("logs/cell.r0");
        let out = rt.block_on(execute(
            AttemptSpec {
                plan: &plan,
                timeout: Duration::from_secs(600),
                grace: Duration::from_millis(500),
                log_stem: &stem,
            },
            rx,
            |_| {},
        ));
        assert_eq!(out.termination, Termination::Exited(1));
        assert!(out.escalated, "rank 0 ignores SIGTERM and needed SIGKILL");
        assert_eq!(
            out.logs,
            vec![
                tmp.path().join("logs/cell.r0.rank0.log"),
                tmp.path().join("logs/cell.r0.rank1.log")
            ]
        );
        let crash_log = std::fs::read_to_string(&out.logs[1]).unwrap();
        assert!(crash_log.contains("segfault-like crash"));
        // Rank 1 crashed only once rank 0 was ready; neither rank 0 nor its child survives.
        let pids = std::fs::read_to_string(&pidfile).unwrap();
        for pid in pids
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            let mut tries = 0;
            while alive(pid) && tries < 100 {
                std::thread::sleep(Duration::from_millis(50));
                tries += 1;
            }
            assert!(!alive(pid), "rank-0 process {pid} survived");
        }
    }
}
