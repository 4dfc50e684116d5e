//! How a finished Slurm job becomes the attempt's record: Slurm's final state and the
//! ranks' own exit statuses as a [`Termination`] the dispatcher judges as it would a local
//! attempt's, and the failure message taken from the rank that failed first, or, when a
//! node of the job was lost, a message naming that node. Also what in a failed job's
//! output looks like a lost peer's doing ([`lost_peer_sign`]), on which the job loop
//! waits for Slurm to declare one of the job's nodes lost before the record is built.

use std::collections::HashMap;
use std::time::Duration;

use crate::events::ErrorKind;
use crate::exit::worker as exit;
use crate::run::executor::{AttemptOutput, Collector, Termination};
use crate::slurm::job::LostNode;
use crate::slurm::JobState;

/// What in a failed job's output looks like the doing of a lost peer, a rank whose node
/// went away: the surviving ranks then fail in their next collective (exit 6, a
/// `distributed` error event), or the lost rank itself was killed (SIGKILL, as the kernel's
/// OOM killer or a dying host's shutdown kill it), or srun says a node failed. `None` when
/// nothing does: a rank's own error, a crash, a bad input. A distributed failure only
/// counts when the job spans nodes (`multi_node`): on one node, a lost node takes every
/// rank with it and leaves none to report a lost peer.
///
/// `first_failure` is the first rank whose task wrapper reported a nonzero status;
/// `job_lines` the lines of the batch script and srun; `distributed_error` the first rank
/// that printed an error event of kind `distributed`.
pub(super) fn lost_peer_sign(
    first_failure: Option<(u32, i32)>,
    job_lines: &[String],
    distributed_error: Option<u32>,
    multi_node: bool,
) -> Option<String> {
    use crate::exit::worker::DISTRIBUTED;
    // The shell of the task wrapper reports death by signal N as 128 + N.
    const KILLED: i32 = 128 + 9;
    if let Some(line) = job_lines.iter().find(|l| l.contains("Node failure on")) {
        return Some(line.trim().to_string());
    }
    match first_failure {
        Some((rank, DISTRIBUTED)) if multi_node => {
            return Some(format!(
                "rank {rank} exited with status {DISTRIBUTED}, a distributed failure"
            ))
        }
        Some((rank, KILLED)) => return Some(format!("rank {rank} was killed with SIGKILL")),
        _ => {}
    }
    // srun's word on the first task that ended (`srun: error: node2: task 1: Killed`, or
    // the wrapper's 137 as `Exited with exit code 137`), for a rank whose wrapper died
    // with it and so said nothing itself.
    let first_end = job_lines.iter().find_map(|l| {
        let rest = l.trim().strip_prefix("srun: error: ")?;
        let (_, what) = rest.split_once(": task")?;
        let (_, what) = what.split_once(": ")?;
        Some((l.trim(), what.trim()))
    });
    if let Some((line, what)) = first_end {
        let distributed = what == format!("Exited with exit code {DISTRIBUTED}");
        let killed = what == "Killed" || what == format!("Exited with exit code {KILLED}");
        if killed || (distributed && multi_node) {
            return Some(line.to_string());
        }
    }
    match distributed_error {
        Some(rank) if multi_node => Some(format!("rank {rank} reported a distributed failure")),
        _ => None,
    }
}

/// A node Slurm declared lost only after the job had failed: what in the job's output
/// pointed at a lost peer, and how long after the job's end Slurm declared the loss.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct LostLater {
    pub sign: String,
    pub after: Duration,
}

/// Why a job failed because of its nodes, when it did: Slurm ended it `NODE_FAIL`, or it
/// failed while (or, `later`, shortly before) Slurm holds one of its nodes lost. `None`
/// for every other end. The message names the lost nodes (`node node2 was lost (Not
/// responding)`), or, when Slurm no longer holds any lost (the node came back before it
/// was asked), the job's node list.
fn node_loss(
    state: &JobState,
    lost: &[LostNode],
    job_id: &str,
    nodes: Option<&str>,
    later: Option<&LostLater>,
) -> Option<String> {
    let JobState::Finished { state, .. } = state else {
        return None;
    };
    if state == "COMPLETED" || (state != "NODE_FAIL" && lost.is_empty()) {
        return None;
    }
    let which = match lost {
        [] => format!(
            "a node of the job ({}) failed",
            nodes.unwrap_or("its nodes unknown")
        ),
        [one] => format!("node {} was lost ({})", one.name, one.why()),
        many => format!(
            "nodes {} were lost",
            many.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let how = match later {
        Some(l) => format!(
            "Slurm job {job_id} {state} as a lost peer makes jobs fail ({}), and Slurm declared the loss {:.0}s after the job ended",
            l.sign,
            l.after.as_secs_f64()
        ),
        None => format!("Slurm ended job {job_id} {state}"),
    };
    Some(format!(
        "{which}: {how}, which is the cluster's doing, not the cell's"
    ))
}

/// How a finished job ended, as a [`Termination`], plus an error to record when the
/// workers said nothing themselves. `first_failure` is the first rank that exited
/// nonzero and its status, from the task wrapper's lines.
fn termination(
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

/// Slurm's final word on a job, for its logs: e.g. `FAILED (exit 6:0)`.
pub(super) fn describe(state: &JobState) -> String {
    match state {
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
    }
}

/// Everything known at a job's end that decides its attempt's record.
pub(super) struct JobEnd {
    pub final_state: JobState,
    /// The first rank that exited nonzero and its status, in output order.
    pub first_failure: Option<(u32, i32)>,
    /// What every rank's lines said.
    pub collector: Collector,
    /// Each rank's own lines, for the failure message of the rank that failed first.
    pub tails: HashMap<u32, Collector>,
    /// The batch script's own lines (Slurm's, e.g. a cancellation notice).
    pub job_lines: Vec<String>,
    /// Why Slurm would never have started the job, when it said so.
    pub refused: Option<String>,
    /// Why the runner stopped the job, when it did.
    pub stopped_by: Option<Termination>,
    /// The runner's stop withdrew the job while it was still queued.
    pub withdrawn: bool,
    /// The job's nodes that Slurm held lost when it failed, or declared lost soon after.
    pub lost: Vec<LostNode>,
    /// Set when Slurm declared them lost only after the job had failed.
    pub lost_later: Option<LostLater>,
    pub job_id: String,
    /// The job's node list, when it ran.
    pub nodes: Option<String>,
}

impl JobEnd {
    /// Fills the attempt's record: events, failure message and termination.
    pub(super) fn record(self, out: &mut AttemptOutput) {
        let JobEnd {
            final_state,
            first_failure,
            collector,
            mut tails,
            job_lines,
            refused,
            stopped_by,
            withdrawn,
            lost,
            lost_later,
            job_id,
            nodes,
        } = self;
        // A lost node explains whatever its job's ranks said afterwards (a peer gone from
        // a collective, a task killed by Slurm): it is the attempt's termination, judged as
        // the cluster's failure, so the cell's retries apply.
        let loss = node_loss(
            &final_state,
            &lost,
            &job_id,
            nodes.as_deref(),
            lost_later.as_ref(),
        );
        let (term, error) = match loss {
            Some(why) => (Termination::Lost(why), None),
            None => termination(&final_state, first_failure),
        };
        collector.fill(out);
        // The failure message quotes the rank that failed first, not the ranks srun killed
        // after it; Slurm's own words (a cancellation, a step that could not start) come
        // last.
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

    fn lost(name: &str, reason: &str) -> LostNode {
        LostNode {
            name: name.into(),
            state: "down*".into(),
            reason: reason.into(),
        }
    }

    #[test]
    fn a_lost_node_is_named_and_outranks_the_ranks_own_statuses() {
        let node2 = [lost("node2", "Not responding")];
        let m = node_loss(
            &finished("NODE_FAIL", Some(0)),
            &node2,
            "42",
            Some("node[1-2]"),
            None,
        );
        assert_eq!(
            m.as_deref(),
            Some("node node2 was lost (Not responding): Slurm ended job 42 NODE_FAIL, which is the cluster's doing, not the cell's")
        );
        // A job that failed (rank 0 saw its peer vanish) while its node is down.
        let m = node_loss(
            &finished("FAILED", Some(6)),
            &node2,
            "42",
            Some("node[1-2]"),
            None,
        )
        .unwrap();
        assert!(
            m.starts_with("node node2 was lost (Not responding): Slurm ended job 42 FAILED"),
            "{m}"
        );
        // NODE_FAIL with the node back already: the job's node list.
        let m = node_loss(
            &finished("NODE_FAIL", None),
            &[],
            "42",
            Some("node[1-2]"),
            None,
        )
        .unwrap();
        assert!(m.starts_with("a node of the job (node[1-2]) failed"), "{m}");
        let two = [lost("n1", ""), lost("n2", "power")];
        let m = node_loss(&finished("NODE_FAIL", None), &two, "7", None, None).unwrap();
        assert!(
            m.starts_with("nodes n1 (not responding), n2 (power) were lost"),
            "{m}"
        );
        // A completed job, or a failure with every node well, is judged as before.
        assert_eq!(
            node_loss(&finished("COMPLETED", Some(0)), &node2, "42", None, None),
            None
        );
        assert_eq!(
            node_loss(&finished("FAILED", Some(6)), &[], "42", None, None),
            None
        );
        assert_eq!(
            node_loss(&JobState::Unknown, &node2, "42", None, None),
            None
        );

        // Through the record: the loss, not rank 0's exit 6, ends the attempt.
        let end = JobEnd {
            final_state: finished("NODE_FAIL", Some(0)),
            first_failure: Some((0, 6)),
            collector: Collector::default(),
            tails: HashMap::new(),
            job_lines: vec![],
            refused: None,
            stopped_by: None,
            withdrawn: false,
            lost: node2.to_vec(),
            lost_later: None,
            job_id: "42".into(),
            nodes: Some("node[1-2]".into()),
        };
        let mut out = AttemptOutput::before_start();
        end.record(&mut out);
        assert!(
            matches!(&out.termination, Termination::Lost(m) if m.starts_with("node node2 was lost (Not responding)")),
            "{:?}",
            out.termination
        );
    }

    #[test]
    fn a_failure_that_looks_like_a_lost_peer_is_told_from_the_cells_own() {
        let lines = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // The ranks left behind fail in their next collective: exit 6 on a job over nodes.
        assert_eq!(
            lost_peer_sign(Some((0, 6)), &[], None, true).as_deref(),
            Some("rank 0 exited with status 6, a distributed failure")
        );
        // On one node a lost node leaves no rank to say so: exit 6 is the cell's.
        assert_eq!(lost_peer_sign(Some((0, 6)), &[], Some(0), false), None);
        // A rank killed with SIGKILL (its wrapper's 137), or srun saying so when the
        // wrapper died with it (seen when node2's rank was killed, Slurm 22.05).
        assert_eq!(
            lost_peer_sign(Some((1, 137)), &[], None, false).as_deref(),
            Some("rank 1 was killed with SIGKILL")
        );
        let killed = lines(&[
            "srun: error: node2: task 1: Killed",
            "srun: launch/slurm: _step_signal: Terminating StepId=655.0",
            "srun: error: node1: task 0: Terminated",
        ]);
        assert_eq!(
            lost_peer_sign(None, &killed, Some(0), true).as_deref(),
            Some("srun: error: node2: task 1: Killed")
        );
        assert_eq!(
            lost_peer_sign(
                None,
                &lines(&["srun: error: node2: task 1: Exited with exit code 137"]),
                None,
                false
            )
            .as_deref(),
            Some("srun: error: node2: task 1: Exited with exit code 137")
        );
        assert_eq!(
            lost_peer_sign(
                None,
                &lines(&["srun: error: node1: tasks 0-1: Exited with exit code 6"]),
                None,
                true
            )
            .as_deref(),
            Some("srun: error: node1: tasks 0-1: Exited with exit code 6")
        );
        assert_eq!(
            lost_peer_sign(
                Some((0, 1)),
                &lines(&["srun: error: Node failure on node2"]),
                None,
                true
            )
            .as_deref(),
            Some("srun: error: Node failure on node2")
        );
        // Only the rank's distributed error event said it.
        assert_eq!(
            lost_peer_sign(None, &[], Some(1), true).as_deref(),
            Some("rank 1 reported a distributed failure")
        );
        // The cell's own failures: an exit 1 and the ranks srun then stopped, a crash, a
        // NaN loss.
        let own = lines(&[
            "srun: error: node1: task 0: Exited with exit code 1",
            "srun: error: node2: task 1: Terminated",
        ]);
        assert_eq!(lost_peer_sign(Some((0, 1)), &own, None, true), None);
        assert_eq!(lost_peer_sign(Some((0, 139)), &[], None, true), None);
        assert_eq!(lost_peer_sign(Some((1, 5)), &[], None, true), None);
        assert_eq!(lost_peer_sign(None, &[], None, true), None);
    }

    #[test]
    fn a_node_declared_lost_after_the_job_failed_is_named_with_what_pointed_at_it() {
        let later = LostLater {
            sign: "srun: error: node2: task 1: Killed".into(),
            after: Duration::from_millis(7400),
        };
        let node2 = [LostNode {
            name: "node2".into(),
            state: "idle*".into(),
            reason: String::new(),
        }];
        let m = node_loss(
            &finished("FAILED", Some(143)),
            &node2,
            "655",
            Some("node[1-2]"),
            Some(&later),
        );
        assert_eq!(
            m.as_deref(),
            Some("node node2 was lost (not responding): Slurm job 655 FAILED as a lost peer makes jobs fail (srun: error: node2: task 1: Killed), and Slurm declared the loss 7s after the job ended, which is the cluster's doing, not the cell's")
        );
        // Through the record: an infrastructure failure, so the cell's retries apply.
        let end = JobEnd {
            final_state: finished("FAILED", Some(143)),
            first_failure: None,
            collector: Collector::default(),
            tails: HashMap::new(),
            job_lines: vec![],
            refused: None,
            stopped_by: None,
            withdrawn: false,
            lost: node2.to_vec(),
            lost_later: Some(later),
            job_id: "655".into(),
            nodes: Some("node[1-2]".into()),
        };
        let mut out = AttemptOutput::before_start();
        end.record(&mut out);
        assert!(
            matches!(&out.termination, Termination::Lost(m) if m.starts_with("node node2 was lost (not responding): Slurm job 655 FAILED")),
            "{:?}",
            out.termination
        );
    }
}
