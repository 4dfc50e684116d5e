//! The state a joined rank shares between its handle and the control channel's threads:
//! one reader thread per peer connection (barriers, failures, heartbeats, orderly ends) and
//! a monitor that sends heartbeats and declares silent peers failed.

use std::collections::{HashMap, HashSet};
use std::io::{self, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use super::config::{Config, FailureHook, OnFailure};
use super::error::RankFailure;
use super::wire::{
    failed_payload, parse_failed, read_msg, u64_payload, write_msg, T_BARRIER, T_DONE, T_FAILED,
    T_HEARTBEAT, T_RELEASE,
};
use crate::events::{ErrorKind, Event};

#[derive(Default)]
pub(super) struct State {
    pub(super) failure: Option<RankFailure>,
    /// Rank 0: which ranks arrived at each barrier.
    pub(super) arrivals: HashMap<u64, HashSet<u32>>,
    /// Highest barrier released.
    pub(super) released: u64,
    /// Rank 0: ranks that finished in order.
    pub(super) done: HashSet<u32>,
    /// This rank is shutting down in order: closed sockets are expected.
    pub(super) finishing: bool,
    pub(super) last_seen: HashMap<u32, Instant>,
}

pub(super) struct Peer {
    pub(super) rank: u32,
    pub(super) stream: Mutex<TcpStream>,
}

pub(super) struct Shared {
    pub(super) rank: u32,
    pub(super) world_size: u32,
    pub(super) config: Config,
    pub(super) state: Mutex<State>,
    pub(super) cv: Condvar,
    pub(super) peers: Vec<Peer>,
    pub(super) stop: AtomicBool,
    pub(super) hook: Mutex<Option<FailureHook>>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking thread cannot leave these plain records inconsistent, so a poisoned
    // lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub(super) fn send(&self, peer: &Peer, tag: u8, payload: &[u8]) -> io::Result<()> {
        write_msg(&mut lock(&peer.stream), tag, payload)
    }

    /// Sends to every peer except `skip`; write errors are left to the readers, which
    /// see the same broken connection.
    pub(super) fn broadcast(&self, tag: u8, payload: &[u8], skip: Option<u32>) {
        for p in &self.peers {
            if Some(p.rank) != skip {
                let _ = self.send(p, tag, payload);
            }
        }
    }

    /// Records a failure (the first one wins), tells the other ranks when this is rank 0,
    /// and applies the policy.
    pub(super) fn fail(&self, f: RankFailure) {
        {
            let mut st = lock(&self.state);
            if st.failure.is_some() || st.finishing {
                return;
            }
            st.failure = Some(f.clone());
            self.cv.notify_all();
        }
        if self.rank == 0 || f.rank == Some(self.rank) {
            self.broadcast(T_FAILED, &failed_payload(&f), f.rank);
        }
        if self.config.on_failure == OnFailure::Exit {
            if let Some(h) = lock(&self.hook).as_ref() {
                h(&f);
            }
            let ev = Event::Error {
                kind: ErrorKind::Distributed,
                message: format!("rank {}: {f}", self.rank),
            };
            let mut out = io::stdout().lock();
            let _ = writeln!(out, "{}", ev.to_line());
            let _ = out.flush();
            eprintln!("bench: rank {}: {f}; exiting", self.rank);
            std::process::exit(crate::exit::worker::DISTRIBUTED);
        }
    }

    pub(super) fn arrive(&self, rank: u32, seq: u64) {
        let release = {
            let mut st = lock(&self.state);
            let set = st.arrivals.entry(seq).or_default();
            set.insert(rank);
            if set.len() as u32 == self.world_size {
                st.arrivals.remove(&seq);
                st.released = st.released.max(seq);
                self.cv.notify_all();
                true
            } else {
                false
            }
        };
        if release {
            self.broadcast(T_RELEASE, &seq.to_be_bytes(), None);
        }
    }

    pub(super) fn reader(self: Arc<Self>, peer_rank: u32, mut stream: TcpStream) {
        loop {
            let msg = read_msg(&mut stream);
            lock(&self.state)
                .last_seen
                .insert(peer_rank, Instant::now());
            match msg {
                Ok((T_BARRIER, p)) if self.rank == 0 => {
                    if let Some(seq) = u64_payload(&p) {
                        self.arrive(peer_rank, seq);
                    }
                }
                Ok((T_RELEASE, p)) => {
                    if let Some(seq) = u64_payload(&p) {
                        let mut st = lock(&self.state);
                        st.released = st.released.max(seq);
                        self.cv.notify_all();
                    }
                }
                Ok((T_FAILED, p)) => self.fail(parse_failed(&p)),
                Ok((T_DONE, _)) => {
                    lock(&self.state).done.insert(peer_rank);
                    self.cv.notify_all();
                }
                Ok(_) => {}
                Err(e) => {
                    let expected = self.stop.load(Ordering::SeqCst) || {
                        let st = lock(&self.state);
                        st.finishing || st.done.contains(&peer_rank)
                    };
                    if !expected {
                        self.fail(RankFailure {
                            rank: Some(peer_rank),
                            message: format!(
                                "connection to rank {peer_rank} lost ({e}); its process died or was killed"
                            ),
                        });
                    }
                    return;
                }
            }
        }
    }

    pub(super) fn monitor(self: Arc<Self>) {
        let mut st = lock(&self.state);
        loop {
            let (g, _) = self
                .cv
                .wait_timeout(st, self.config.heartbeat)
                .unwrap_or_else(|p| p.into_inner());
            st = g;
            if self.stop.load(Ordering::SeqCst) || st.finishing || st.failure.is_some() {
                return;
            }
            let now = Instant::now();
            let silent = self.peers.iter().find(|p| {
                !st.done.contains(&p.rank)
                    && st
                        .last_seen
                        .get(&p.rank)
                        .is_some_and(|t| now.duration_since(*t) > self.config.peer_timeout)
            });
            if let Some(p) = silent {
                let f = RankFailure {
                    rank: Some(p.rank),
                    message: format!(
                        "no heartbeat from rank {} for {:.0}s (host hung or network cut)",
                        p.rank,
                        self.config.peer_timeout.as_secs_f64()
                    ),
                };
                drop(st);
                self.fail(f);
                return;
            }
            drop(st);
            self.broadcast(T_HEARTBEAT, &[], None);
            st = lock(&self.state);
        }
    }
}
