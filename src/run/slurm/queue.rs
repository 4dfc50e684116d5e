//! The queue as the last `squeue` call showed it, shared by every Slurm job in flight: one
//! call per poll interval for all of them, so that many jobs cost the controller one query,
//! not one each. It also orders the submissions (one `sbatch` at a time, in the order the
//! cells asked), and shares the question "which nodes does Slurm hold lost?" between the
//! jobs that failed as a lost node makes jobs fail ([`Queue::lost_nodes`]), with how long
//! to keep asking it ([`Queue::lost_node_wait`], from the controller's configuration, read
//! once).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::slurm::job::{self, Listed, LostNode, NodeTimeouts};

/// The longest a failed job's nodes are watched for a loss, whatever the cluster's
/// `SlurmdTimeout`: a cell's own failure that only looks like a lost peer's doing is
/// judged at most this late.
pub(crate) const LOST_NODE_WAIT_CAP: Duration = Duration::from_secs(300);
/// Beyond `SlurmdTimeout` and two message timeouts, for a controller that is slow to act
/// on a silent node (its pings go out every `SlurmdTimeout / 3`, on a busy controller
/// later).
const LOST_NODE_MARGIN: Duration = Duration::from_secs(10);
/// Slurm's defaults (`SlurmdTimeout=300`, `MessageTimeout=10`), for a controller whose
/// configuration cannot be read.
const SLURM_DEFAULT_TIMEOUTS: NodeTimeouts = NodeTimeouts {
    slurmd: Some(Duration::from_secs(300)),
    message: Duration::from_secs(10),
};

/// How long a failed job's nodes are watched for one that Slurm declares lost, and why
/// that long (for the job's log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LostNodeWait {
    pub window: Duration,
    pub why: String,
}

impl LostNodeWait {
    /// The wait for a controller with these timeouts (`Err`: its configuration could not
    /// be read): `SlurmdTimeout`, after which it sets a silent node DOWN, plus two message
    /// timeouts (the ping that gets no answer, which marks the node not responding, and the
    /// one after it) plus [`LOST_NODE_MARGIN`], capped at [`LOST_NODE_WAIT_CAP`]. No wait
    /// when `SlurmdTimeout` is 0: Slurm then never declares a silent node lost.
    pub(crate) fn from_timeouts(t: Result<NodeTimeouts, String>) -> LostNodeWait {
        let (t, source) = match t {
            Ok(t) => (t, "from scontrol show config".to_string()),
            Err(e) => (
                SLURM_DEFAULT_TIMEOUTS,
                format!("Slurm's defaults, as its configuration could not be read: {e}"),
            ),
        };
        let Some(slurmd) = t.slurmd else {
            return LostNodeWait {
                window: Duration::ZERO,
                why: format!(
                    "SlurmdTimeout is 0 ({source}): Slurm never declares a silent node lost"
                ),
            };
        };
        let full = slurmd + 2 * t.message + LOST_NODE_MARGIN;
        let window = full.min(LOST_NODE_WAIT_CAP);
        let capped = if full > LOST_NODE_WAIT_CAP {
            format!(", capped at {}s", LOST_NODE_WAIT_CAP.as_secs())
        } else {
            String::new()
        };
        LostNodeWait {
            window,
            why: format!(
                "SlurmdTimeout {}s + 2 x MessageTimeout {}s + {}s{capped}, {source}",
                slurmd.as_secs(),
                t.message.as_secs(),
                LOST_NODE_MARGIN.as_secs()
            ),
        }
    }
}

/// The queue as the last `squeue` call showed it, shared by every job in flight.
pub(crate) struct Queue {
    pub(super) poll: Duration,
    ids: std::sync::Mutex<BTreeSet<String>>,
    snapshot: Mutex<Snapshot>,
    /// Held while a job is submitted, so that jobs enter the queue one at a time in the
    /// order their cells asked (the matrix's order, as Slurm then schedules equal jobs).
    pub(super) submitting: Mutex<()>,
    /// How long a failed job's nodes are watched: read from the controller once per run.
    lost_wait: tokio::sync::OnceCell<LostNodeWait>,
    /// Slurm's lost nodes as the last `sinfo` call showed them: a node lost mid-run fails
    /// every job on it at once, and they all share one call per interval.
    lost: Mutex<LostSnapshot>,
}

struct LostSnapshot {
    at: Option<Instant>,
    lost: Result<Vec<LostNode>, String>,
}

struct Snapshot {
    at: Option<Instant>,
    /// The jobs the last call asked about: a job submitted since is not "gone" from it.
    asked: BTreeSet<String>,
    listed: Result<HashMap<String, Listed>, String>,
}

impl Queue {
    pub(crate) fn new(poll: Duration) -> Arc<Queue> {
        Arc::new(Queue {
            poll,
            ids: Default::default(),
            snapshot: Mutex::new(Snapshot {
                at: None,
                asked: BTreeSet::new(),
                listed: Ok(HashMap::new()),
            }),
            submitting: Mutex::new(()),
            lost_wait: tokio::sync::OnceCell::new(),
            lost: Mutex::new(LostSnapshot {
                at: None,
                lost: Ok(vec![]),
            }),
        })
    }

    pub(super) fn watch(&self, id: &str) {
        if let Ok(mut ids) = self.ids.lock() {
            ids.insert(id.to_string());
        }
    }

    pub(super) fn forget(&self, id: &str) {
        if let Ok(mut ids) = self.ids.lock() {
            ids.remove(id);
        }
    }

    /// How `squeue` lists job `id` now (at most one poll interval old); `Ok(None)` when it
    /// no longer lists it. The first caller after the interval refreshes every job's
    /// listing at once; the others wait for that call and share its answer.
    pub(super) async fn listed(&self, id: &str) -> Result<Option<Listed>, String> {
        let mut snap = self.snapshot.lock().await;
        let stale = snap
            .at
            .is_none_or(|at| at.elapsed() >= self.poll.mul_f64(0.5))
            || !snap.asked.contains(id);
        if stale {
            let ids: BTreeSet<String> = self.ids.lock().map(|ids| ids.clone()).unwrap_or_default();
            snap.asked = ids.clone();
            let ids: Vec<String> = ids.into_iter().collect();
            snap.listed = super::call::blocking(move || job::list(&ids)).await;
            snap.at = Some(Instant::now());
        }
        match &snap.listed {
            Ok(m) => Ok(m.get(id).cloned()),
            Err(e) => Err(e.clone()),
        }
    }

    /// How long a failed job's nodes are watched for a loss: asked of the controller
    /// (`scontrol show config`) by the first job that needs it, then shared.
    pub(super) async fn lost_node_wait(&self) -> LostNodeWait {
        self.lost_wait
            .get_or_init(|| async {
                LostNodeWait::from_timeouts(super::call::blocking(job::node_timeouts).await)
            })
            .await
            .clone()
    }

    /// The nodes Slurm holds lost, cluster-wide, as an `sinfo` call at most `max_age` old
    /// showed them (`Duration::ZERO`: asked now). Jobs asking together share one call.
    pub(super) async fn lost_nodes(&self, max_age: Duration) -> Result<Vec<LostNode>, String> {
        let mut snap = self.lost.lock().await;
        if snap.at.is_none_or(|at| at.elapsed() >= max_age) {
            snap.lost = super::call::blocking(|| job::lost_nodes(None)).await;
            snap.at = Some(Instant::now());
        }
        snap.lost.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lost_node_wait_is_slurmd_timeout_and_a_margin_capped() {
        let t = |slurmd: u64, message: u64| {
            Ok(NodeTimeouts {
                slurmd: (slurmd > 0).then(|| Duration::from_secs(slurmd)),
                message: Duration::from_secs(message),
            })
        };
        // The CI cluster: 4 + 2 x 5 + 10.
        let w = LostNodeWait::from_timeouts(t(4, 5));
        assert_eq!(w.window, Duration::from_secs(24));
        assert_eq!(
            w.why,
            "SlurmdTimeout 4s + 2 x MessageTimeout 5s + 10s, from scontrol show config"
        );
        // Slurm's defaults (300 s) reach the cap; so does a controller that cannot be asked.
        let w = LostNodeWait::from_timeouts(t(300, 10));
        assert_eq!(w.window, LOST_NODE_WAIT_CAP);
        assert!(w.why.contains("capped at 300s"), "{}", w.why);
        let w = LostNodeWait::from_timeouts(Err("scontrol: timed out".into()));
        assert_eq!(w.window, LOST_NODE_WAIT_CAP);
        assert!(w.why.contains("scontrol: timed out"), "{}", w.why);
        // SlurmdTimeout=0: no node is ever declared lost for silence, so no wait.
        assert_eq!(LostNodeWait::from_timeouts(t(0, 10)).window, Duration::ZERO);
    }
}
