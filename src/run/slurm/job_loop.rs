//! One submitted Slurm job, watched to its end.
//!
//! Shaped as the dispatcher is (cargo-nextest's runner): the job's state lives in one
//! [`JobLoop`] value. Each round reads the output written since the last one, asks the
//! shared queue about the job and turns its answer into a [`Polled`] that one handler acts
//! on, then decides whether the runner stops the job ([`JobLoop::stop_due`], acted on by
//! [`JobLoop::send_stop`] and [`JobLoop::escalate`]), and sleeps one poll interval unless
//! a Ctrl-C or a fail-fast stop wakes it. After the job left the queue, [`JobLoop::finish`]
//! reads the rest of its output and its node's environment and builds the attempt's record
//! with [`super::end`].

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::attempt::{JobAttempt, JobNews, JobSpec};
use super::call::blocking;
use super::end::{self, JobEnd};
use super::output::{NodeEnvProbe, OutputTail, Reader};
use super::queue::Queue;
use crate::exit::worker as exit;
use crate::run::executor::{AttemptOutput, Cancel, Termination};
use crate::slurm::job::{self, Listed};
use crate::slurm::{JobState, SlurmJob};

/// Consecutive failed queue queries after which a job is given up (and cancelled).
const MAX_QUERY_FAILURES: u32 = 5;
/// How long a stopped job may take to leave the queue after SIGKILL.
const GONE_LIMIT: Duration = Duration::from_secs(30);
/// How long a finished job's output file may lag behind its state (a shared file system
/// shows the compute node's last writes a little later).
const OUTPUT_LAG: Duration = Duration::from_secs(5);
/// The least time between two questions about a failed job's nodes (the queue's poll
/// interval when that is longer): one `sinfo` per few seconds keeps the controller's load
/// from a wait of minutes negligible.
const LOST_NODE_POLL_MIN: Duration = Duration::from_secs(2);

/// What one poll of the queue said about the job.
enum Polled {
    /// Listed in an active state (pending, configuring, running, completing...).
    Active(Listed),
    /// No longer listed as active: Slurm's final word on it, asked for at once (it may
    /// still say the job is active, when the listing was older than the job).
    Left(Result<JobState, String>),
    /// The queue could not be asked.
    QueryFailed(String),
}

/// A stop the runner decided on: the termination it stands for, and whether it kills at
/// once (a second Ctrl-C) instead of `scancel`ling with a grace period.
struct Stop {
    why: Termination,
    force: bool,
}

/// The runner's side of stopping the job, once it decided to.
struct Stopping {
    /// Why the runner stopped the job (the first reason counts).
    by: Option<Termination>,
    /// When the first `scancel` went out: the grace period counts from then.
    sent_at: Option<tokio::time::Instant>,
    /// SIGKILL was sent to the job's tasks.
    killed: bool,
    /// The strongest Ctrl-C acted on, so that each level is acted on once.
    seen: Cancel,
    /// The stop withdrew the job while it was still queued (`--fail-fast`).
    withdrawn: bool,
}

/// The state of one submitted job.
pub(super) struct JobLoop<'q, 'n, F: FnMut(JobNews<'_>)> {
    queue: &'q Queue,
    job: SlurmJob,
    /// Counted from the job's start (not its submission).
    timeout: Duration,
    grace: Duration,
    /// Ctrl-C: stops the job in any state.
    cancel: watch::Receiver<Cancel>,
    /// `--fail-fast`: withdraws the job only while it has not started.
    withdraw: watch::Receiver<bool>,
    tail: OutputTail,
    reader: Reader<'n, F>,
    probe: NodeEnvProbe,
    out: AttemptOutput,
    started: Instant,
    /// Where the job runs, once the queue showed it running.
    nodes: Option<String>,
    /// When the cell's timeout passes: set when the job starts.
    deadline: Option<tokio::time::Instant>,
    /// As the queue last listed the job: a job is only withdrawn while it waits.
    pending: bool,
    /// Consecutive failed queries.
    failures: u32,
    /// Set when Slurm says the job can never start as submitted.
    refused: Option<String>,
    stop: Stopping,
}

impl<'q, 'n, F: FnMut(JobNews<'_>)> JobLoop<'q, 'n, F> {
    /// The job just submitted; `out` holds its log files, `started` when the attempt began.
    pub(super) fn new(
        spec: &JobSpec<'_>,
        queue: &'q Queue,
        job: SlurmJob,
        reader: Reader<'n, F>,
        (cancel, withdraw): (watch::Receiver<Cancel>, watch::Receiver<bool>),
        out: AttemptOutput,
        started: Instant,
    ) -> Self {
        JobLoop {
            queue,
            tail: OutputTail::new(job.output.clone()),
            probe: NodeEnvProbe::new(spec.plan.node_env_file(&job.id)),
            job,
            timeout: spec.timeout,
            grace: spec.grace,
            cancel,
            withdraw,
            reader,
            out,
            started,
            nodes: None,
            deadline: None,
            pending: true,
            failures: 0,
            refused: None,
            stop: Stopping {
                by: None,
                sent_at: None,
                killed: false,
                seen: Cancel::None,
                withdrawn: false,
            },
        }
    }

    /// Watches the job until it ends (or is given up), and returns the attempt's record.
    pub(super) async fn run(mut self) -> JobAttempt {
        let final_state = loop {
            self.reader.take(self.tail.read(false));
            let polled = self.poll().await;
            let handled = match polled {
                Polled::Active(l) => {
                    self.on_active(l);
                    ControlFlow::Continue(())
                }
                Polled::Left(state) => self.on_left(state),
                Polled::QueryFailed(e) => self.on_query_failed(e).await,
            };
            if let ControlFlow::Break(state) = handled {
                break state;
            }
            // The script writes its node's environment before the tasks start.
            if self.nodes.is_some() {
                self.probe.read_once(&self.job.id, &mut self.reader);
            }
            let now = tokio::time::Instant::now();
            if let Some(stop) = self.stop_due(now) {
                self.send_stop(stop, now).await;
            }
            if let ControlFlow::Break(state) = self.escalate(now).await {
                break state;
            }
            self.sleep().await;
        };
        self.finish(final_state).await
    }

    /// Asks the queue about the job, and Slurm for its final word when the queue no longer
    /// shows it active. (`&mut self` although it changes nothing: a shared borrow held
    /// across an await would need the launcher's news callback to be `Sync`.)
    async fn poll(&mut self) -> Polled {
        match self.queue.listed(&self.job.id).await {
            Ok(Some(l)) if job::is_active(&l.state) => Polled::Active(l),
            // Gone from the queue, or listed in a final state: ask for the final word.
            Ok(_) => {
                let j = self.job.clone();
                Polled::Left(blocking(move || j.state()).await)
            }
            Err(e) => Polled::QueryFailed(e),
        }
    }

    /// The job is queued or running: notes whether it waits, whether Slurm will ever
    /// start it, and where it runs once it does (its timeout counts from then).
    fn on_active(&mut self, l: Listed) {
        self.failures = 0;
        self.pending = l.state == "PENDING";
        if self.pending && self.refused.is_none() && job::never_starts(&l.reason) {
            let id = &self.job.id;
            let why = format!(
                "Slurm will never start job {id} as submitted: it is pending with reason {} (a limit of the partition, account or QOS, e.g. a time limit above the partition's; see `scontrol show job {id}`)",
                l.reason
            );
            self.reader.logs.all(&format!("bench: {why}"));
            self.refused = Some(why);
        }
        if !self.pending && self.nodes.is_none() && !l.nodes.is_empty() {
            self.deadline = Some(tokio::time::Instant::now() + self.timeout);
            self.reader.logs.all(&format!(
                "bench: job {} runs on {}",
                self.job.id,
                crate::slurm::hostlist::shown(&l.nodes)
            ));
            (self.reader.news)(JobNews::Running {
                job_id: &self.job.id,
                nodes: &l.nodes,
            });
            self.nodes = Some(l.nodes);
        }
    }

    /// The queue no longer shows the job active: its final state ends the loop; a failed
    /// question counts as a failed query (but does not cancel the job, which has left).
    fn on_left(&mut self, state: Result<JobState, String>) -> ControlFlow<JobState> {
        match state {
            Ok(JobState::Active(_)) => ControlFlow::Continue(()),
            Ok(s) => ControlFlow::Break(s),
            Err(e) => {
                self.failures += 1;
                if self.failures >= MAX_QUERY_FAILURES {
                    return ControlFlow::Break(JobState::Finished {
                        state: format!("UNKNOWN ({e})"),
                        exit_code: None,
                        signal: None,
                    });
                }
                ControlFlow::Continue(())
            }
        }
    }

    /// The queue could not be asked: a busy controller misses a query now and then, so
    /// the job is given up (and cancelled) only when it keeps failing.
    async fn on_query_failed(&mut self, e: String) -> ControlFlow<JobState> {
        self.failures += 1;
        if self.failures < MAX_QUERY_FAILURES {
            return ControlFlow::Continue(());
        }
        self.reader.logs.all(&format!(
            "bench: cannot query Slurm, giving up the job: {e}"
        ));
        let j = self.job.clone();
        let _ = blocking(move || j.cancel()).await;
        ControlFlow::Break(JobState::Finished {
            state: format!("UNKNOWN (squeue failed {} times: {e})", self.failures),
            exit_code: None,
            signal: None,
        })
    }

    /// Whether the runner stops the job now, and why: a Ctrl-C (each level once), a job
    /// Slurm will never start, the timeout, or a fail-fast stop while the job still waits.
    fn stop_due(&mut self, now: tokio::time::Instant) -> Option<Stop> {
        let level = *self.cancel.borrow();
        if level > self.stop.seen {
            self.stop.seen = level;
            return Some(Stop {
                why: Termination::Cancelled,
                force: level == Cancel::Force,
            });
        }
        if self.stop.by.is_some() {
            return None;
        }
        let why = if self.refused.is_some() {
            Termination::Exited(exit::BAD_INPUT)
        } else if self.deadline.is_some_and(|d| now >= d) {
            Termination::TimedOut
        } else if self.pending && *self.withdraw.borrow() {
            self.stop.withdrawn = true;
            Termination::Cancelled
        } else {
            return None;
        };
        Some(Stop { why, force: false })
    }

    /// Sends a stop: SIGKILL when forced, else one `scancel` (SIGTERM), whose grace period
    /// counts from the first stop sent.
    async fn send_stop(&mut self, stop: Stop, now: tokio::time::Instant) {
        self.stop.by.get_or_insert(stop.why);
        let j = self.job.clone();
        let res = if stop.force {
            self.stop.killed = true;
            blocking(move || j.kill()).await
        } else if self.stop.sent_at.is_none() {
            blocking(move || j.cancel()).await
        } else {
            Ok(())
        };
        self.stop.sent_at.get_or_insert(now);
        if let Err(e) = res {
            self.reader
                .logs
                .all(&format!("bench: scancel {}: {e}", self.job.id));
        }
    }

    /// A stopped job still there after the grace period gets SIGKILL; one still there
    /// [`GONE_LIMIT`] after that is given up with Slurm's last word on it.
    async fn escalate(&mut self, now: tokio::time::Instant) -> ControlFlow<JobState> {
        let Some(at) = self.stop.sent_at else {
            return ControlFlow::Continue(());
        };
        if !self.stop.killed && now >= at + self.grace {
            self.stop.killed = true;
            self.out.escalated = true;
            let j = self.job.clone();
            let _ = blocking(move || j.kill()).await;
        }
        if self.stop.killed && now >= at + self.grace + GONE_LIMIT {
            let j = self.job.clone();
            return ControlFlow::Break(
                blocking(move || j.state())
                    .await
                    .unwrap_or(JobState::Unknown),
            );
        }
        ControlFlow::Continue(())
    }

    /// Sleeps one poll interval, waking early for a Ctrl-C or a fail-fast stop (the next
    /// round decides what they mean).
    async fn sleep(&mut self) {
        let listen_withdraw = self.pending && !self.stop.withdrawn;
        tokio::select! {
            _ = tokio::time::sleep(self.queue.poll) => {}
            _ = self.cancel.changed() => {}
            _ = self.withdraw.changed(), if listen_withdraw => {}
        }
    }

    /// After the job left the queue: where it ran, the rest of its output (which may trail
    /// its state on a shared file system), its node's environment, and the record.
    async fn finish(mut self, final_state: JobState) -> JobAttempt {
        self.queue.forget(&self.job.id);
        if self.nodes.is_none() {
            // A short job can start and end between two polls; Slurm still knows where it
            // ran.
            let j = self.job.clone();
            self.nodes = blocking(move || Ok(j.nodes())).await.ok().flatten();
        }
        let lag_until = Instant::now() + OUTPUT_LAG;
        self.reader.take(self.tail.read(false));
        while !self.reader.srun_done && self.stop.by.is_none() && Instant::now() < lag_until {
            tokio::time::sleep(Duration::from_millis(200)).await;
            self.reader.take(self.tail.read(false));
        }
        self.reader.take(self.tail.read(true));
        self.reader.finish();
        self.probe.read_once(&self.job.id, &mut self.reader);
        self.probe.say_if_missing(&mut self.reader.logs);
        self.reader.logs.all(&format!(
            "bench: Slurm job {} ended {}",
            self.job.id,
            end::describe(&final_state)
        ));
        let (lost, lost_later) = self.lost_nodes(&final_state).await;
        let Reader {
            collector,
            tails,
            job_lines,
            first_failure,
            ..
        } = self.reader;
        JobEnd {
            final_state,
            first_failure,
            collector,
            tails,
            job_lines,
            refused: self.refused,
            stopped_by: self.stop.by,
            withdrawn: self.stop.withdrawn,
            lost,
            lost_later,
            job_id: self.job.id.clone(),
            nodes: self.nodes.clone(),
        }
        .record(&mut self.out);
        self.out.duration = self.started.elapsed();
        let node_names = self
            .nodes
            .as_deref()
            .and_then(crate::slurm::hostlist::expand)
            .unwrap_or_default();
        JobAttempt {
            out: self.out,
            job_id: Some(self.job.id),
            nodes: self.nodes,
            node_names,
            node_env: self.probe.env,
        }
    }

    /// The job's nodes that Slurm holds lost (DOWN, FAIL or not responding), asked only
    /// when the job failed on its own (not when the runner stopped it, nor when it
    /// completed): a node lost mid-job fails every multi-node job on it, and its ranks' own
    /// exit statuses then tell of the loss (a peer gone, a task killed) rather than of the
    /// cell.
    ///
    /// Slurm declares a silent node lost only after `SlurmdTimeout` (seconds in CI,
    /// minutes on real clusters), and the ranks a lost node leaves behind may fail sooner
    /// and end the job `FAILED` first. So when none is lost yet but the failure looks like a
    /// lost peer's doing ([`end::lost_peer_sign`]), the runner asks again, one shared
    /// `sinfo` per interval, for up to the cluster's lost-node wait
    /// ([`Queue::lost_node_wait`]); a node declared lost then is the attempt's cause
    /// (`Some` second value). A Ctrl-C ends the wait, and the attempt counts as
    /// interrupted. A failed question is said in the logs and counts as no node lost.
    async fn lost_nodes(
        &mut self,
        final_state: &JobState,
    ) -> (Vec<job::LostNode>, Option<end::LostLater>) {
        let failed_state = match final_state {
            JobState::Finished { state, .. } if state != "COMPLETED" => state.clone(),
            _ => return (vec![], None),
        };
        let Some(nodes) = self.nodes.clone().filter(|_| self.stop.by.is_none()) else {
            return (vec![], None);
        };
        let names = crate::slurm::hostlist::expand(&nodes);
        let lost = self
            .ask_lost(&nodes, names.as_deref(), Duration::ZERO)
            .await;
        // Only a job whose ranks decided its end (FAILED) may have hidden a loss: Slurm's
        // other ends (NODE_FAIL, TIMEOUT, CANCELLED...) are judged by Slurm's word.
        if !lost.is_empty() || failed_state != "FAILED" {
            return (lost, None);
        }
        let multi_node = names.as_ref().is_none_or(|n| n.len() > 1);
        let Some(sign) = end::lost_peer_sign(
            self.reader.first_failure,
            &self.reader.job_lines,
            self.reader.distributed_error,
            multi_node,
        ) else {
            return (lost, None);
        };
        let wait = self.queue.lost_node_wait().await;
        if wait.window.is_zero() {
            self.reader.logs.all(&format!(
                "bench: job {} failed as a lost peer makes jobs fail ({sign}), but bench does not wait for Slurm to declare a node lost: {}",
                self.job.id, wait.why
            ));
            return (lost, None);
        }
        let every = self.queue.poll.max(LOST_NODE_POLL_MIN);
        self.reader.logs.all(&format!(
            "bench: job {} failed as a lost peer makes jobs fail ({sign}); asking Slurm every {}s for up to {}s ({}) whether one of its nodes is lost",
            self.job.id,
            every.as_secs_f64(),
            wait.window.as_secs(),
            wait.why
        ));
        (self.reader.news)(JobNews::AwaitingNodes {
            job_id: &self.job.id,
            nodes: &nodes,
            sign: &sign,
            limit: wait.window,
        });
        let began = Instant::now();
        let deadline = began + wait.window;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.reader.logs.all(&format!(
                    "bench: Slurm declared none of job {}'s nodes lost within {}s: the failure is the cell's",
                    self.job.id,
                    wait.window.as_secs()
                ));
                return (lost, None);
            }
            tokio::select! {
                _ = tokio::time::sleep(every.min(left)) => {}
                changed = self.cancel.changed() => {
                    // The sender gone (the run ending) is no Ctrl-C: sleep out the interval.
                    if changed.is_err() {
                        tokio::time::sleep(every.min(left)).await;
                    }
                }
            }
            if *self.cancel.borrow() != Cancel::None {
                self.reader.logs.all(&format!(
                    "bench: interrupted while asking Slurm whether one of job {}'s nodes was lost",
                    self.job.id
                ));
                self.stop.by = Some(Termination::Cancelled);
                return (lost, None);
            }
            let lost = self.ask_lost(&nodes, names.as_deref(), every / 2).await;
            if !lost.is_empty() {
                return (
                    lost,
                    Some(end::LostLater {
                        sign,
                        after: began.elapsed(),
                    }),
                );
            }
        }
    }

    /// Which of the job's nodes Slurm holds lost now, from the queue's shared `sinfo` call
    /// (at most `max_age` old), or, for a node list that does not expand into names, from
    /// a call about that list; each said in the job's logs. A failed call is said too and
    /// counts as none lost.
    async fn ask_lost(
        &mut self,
        nodes: &str,
        names: Option<&[String]>,
        max_age: Duration,
    ) -> Vec<job::LostNode> {
        let answer = match names {
            Some(names) => self.queue.lost_nodes(max_age).await.map(|all| {
                all.into_iter()
                    .filter(|l| names.contains(&l.name))
                    .collect::<Vec<_>>()
            }),
            None => {
                let list = nodes.to_string();
                blocking(move || job::lost_nodes(Some(&list))).await
            }
        };
        match answer {
            Ok(lost) => {
                for l in &lost {
                    self.reader.logs.all(&format!(
                        "bench: Slurm holds node {} lost: state {}{}",
                        l.name,
                        l.state,
                        if l.reason.is_empty() {
                            String::new()
                        } else {
                            format!(", reason: {}", l.reason)
                        }
                    ));
                }
                lost
            }
            Err(e) => {
                self.reader.logs.all(&format!(
                    "bench: cannot ask Slurm which nodes are lost: {e}"
                ));
                vec![]
            }
        }
    }
}
