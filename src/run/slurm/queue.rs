//! The queue as the last `squeue` call showed it, shared by every Slurm job in flight: one
//! call per poll interval for all of them, so that many jobs cost the controller one query,
//! not one each. It also orders the submissions (one `sbatch` at a time, in the order the
//! cells asked).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::slurm::job::{self, Listed};

/// The queue as the last `squeue` call showed it, shared by every job in flight.
pub(crate) struct Queue {
    pub(super) poll: Duration,
    ids: std::sync::Mutex<BTreeSet<String>>,
    snapshot: Mutex<Snapshot>,
    /// Held while a job is submitted, so that jobs enter the queue one at a time in the
    /// order their cells asked (the matrix's order, as Slurm then schedules equal jobs).
    pub(super) submitting: Mutex<()>,
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
}
