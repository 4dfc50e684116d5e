//! Rendezvous of the ranks of one cell, on torchrun's environment contract.
//!
//! Every rank reads `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`
//! and `MASTER_PORT` ([`DistEnv`]). Rank 0 makes an opaque blob (the 128-byte NCCL unique
//! id; any bytes, so this is testable without NCCL), listens on `MASTER_PORT`, waits until
//! every other rank has connected and said hello, and sends each the blob. The connections
//! then stay open for the life of the run as a control channel:
//!
//! * [`Rendezvous::barrier`]: all ranks ready (rank 0 counts arrivals and releases);
//! * failure: a rank that reports an error ([`Rendezvous::report_failure`]), whose process
//!   dies (its socket closes), or that stops sending heartbeats is announced by rank 0 to
//!   every other rank; the loss of rank 0 is noticed by all. With [`OnFailure::Exit`] (the
//!   default for workers) a watcher thread prints an `error` event of kind `distributed`
//!   and exits the process with `exit::worker::DISTRIBUTED`, so no rank stays stuck in a
//!   collective waiting for a peer that is gone.
//!
//! Every wait has a deadline; nothing here can hang.
//!
//! This file holds the handle ([`Rendezvous`]); [`error`] its errors, [`config`] its
//! settings; [`env`] reads the launch contract, [`join`] is how ranks find each other (rank 0 serves, the others
//! connect), [`channel`] the state and threads of the control channel once joined, and
//! [`wire`] its message format.

use std::fmt;
use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use self::channel::{lock, Peer, Shared, State};
use self::join::{connect, serve};
use self::wire::{failed_payload, T_BARRIER, T_DONE, T_FAILED};

mod channel;
mod config;
mod env;
mod error;
mod join;
mod wire;

use self::config::{remaining, FailureHook};
pub use self::config::{Config, OnFailure};
pub use self::env::{DistEnv, ENV_VARS};
pub use self::error::{RankFailure, RendezvousError};

/// A joined rank's handle on the control channel. Dropping it without
/// [`Rendezvous::finish`] closes the channel abruptly, which the others treat as this
/// rank's failure.
pub struct Rendezvous {
    shared: Arc<Shared>,
    next_barrier: AtomicU64,
    finished: bool,
}

impl fmt::Debug for Rendezvous {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rendezvous")
            .field("rank", &self.shared.rank)
            .field("world_size", &self.shared.world_size)
            .finish()
    }
}

/// Joins the world: rank 0 calls `make_blob` and serves the result, other ranks receive
/// it. Returns the handle and the blob.
pub fn join<F>(
    env: &DistEnv,
    config: Config,
    make_blob: F,
) -> Result<(Rendezvous, Vec<u8>), RendezvousError>
where
    F: FnOnce() -> Result<Vec<u8>, String>,
{
    let start = Instant::now();
    let deadline = start + config.join_timeout;
    let (peers, blob) = if env.world_size == 1 {
        (Vec::new(), make_blob().map_err(RendezvousError::Blob)?)
    } else if env.rank == 0 {
        serve(env, deadline, start, make_blob)?
    } else {
        connect(env, deadline, start)?
    };
    let shared = Arc::new(Shared {
        rank: env.rank,
        world_size: env.world_size,
        config,
        state: Mutex::new(State::default()),
        cv: Condvar::new(),
        peers: peers
            .iter()
            .map(|(r, s)| {
                s.try_clone().map(|c| Peer {
                    rank: *r,
                    stream: Mutex::new(c),
                })
            })
            .collect::<io::Result<Vec<_>>>()
            .map_err(|e| RendezvousError::Protocol {
                endpoint: env.endpoint(),
                detail: format!("cannot duplicate a socket: {e}"),
            })?,
        stop: AtomicBool::new(false),
        hook: Mutex::new(None),
    });
    let now = Instant::now();
    for (r, s) in peers {
        lock(&shared.state).last_seen.insert(r, now);
        // Writes must not block forever on a peer that stopped reading.
        let _ = s.set_write_timeout(Some(Duration::from_secs(10)));
        let _ = s.set_read_timeout(None);
        let sh = Arc::clone(&shared);
        thread::Builder::new()
            .name(format!("rdzv-read-{r}"))
            .spawn(move || sh.reader(r, s))
            .map_err(|e| RendezvousError::Protocol {
                endpoint: env.endpoint(),
                detail: format!("cannot start a thread: {e}"),
            })?;
    }
    if !shared.peers.is_empty() {
        let sh = Arc::clone(&shared);
        thread::Builder::new()
            .name("rdzv-monitor".into())
            .spawn(move || sh.monitor())
            .map_err(|e| RendezvousError::Protocol {
                endpoint: env.endpoint(),
                detail: format!("cannot start a thread: {e}"),
            })?;
    }
    Ok((
        Rendezvous {
            shared,
            next_barrier: AtomicU64::new(1),
            finished: false,
        },
        blob,
    ))
}

impl Rendezvous {
    /// Sets what runs before the process exits on a peer's failure ([`OnFailure::Exit`]).
    pub(crate) fn set_failure_hook(&self, hook: FailureHook) {
        *lock(&self.shared.hook) = Some(hook);
    }

    /// Waits up to `timeout` for a failure to be learned.
    pub fn wait_for_failure(&self, timeout: Duration) -> Option<RankFailure> {
        let deadline = Instant::now() + timeout;
        let mut st = lock(&self.shared.state);
        while st.failure.is_none() {
            let left = remaining(deadline);
            if left.is_zero() {
                return None;
            }
            st = self
                .shared
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        st.failure.clone()
    }

    /// Waits until every rank has reached the same barrier (ranks must call barriers in
    /// the same order), a rank fails, or `timeout` passes.
    pub fn barrier(&self, timeout: Duration) -> Result<(), RendezvousError> {
        let start = Instant::now();
        let seq = self.next_barrier.fetch_add(1, Ordering::SeqCst);
        let sh = &self.shared;
        if sh.world_size == 1 {
            return Ok(());
        }
        if sh.rank == 0 {
            sh.arrive(0, seq);
        } else if let Some(p) = sh.peers.first() {
            if let Err(e) = sh.send(p, T_BARRIER, &seq.to_be_bytes()) {
                sh.fail(RankFailure {
                    rank: Some(0),
                    message: format!("cannot reach rank 0 ({e})"),
                });
            }
        }
        let deadline = start + timeout;
        let mut st = lock(&sh.state);
        loop {
            if let Some(f) = &st.failure {
                return Err(RendezvousError::PeerFailed(f.clone()));
            }
            if st.released >= seq {
                return Ok(());
            }
            let left = remaining(deadline);
            if left.is_zero() {
                return Err(RendezvousError::Timeout {
                    rank: sh.rank,
                    what: "barrier",
                    waited_s: start.elapsed().as_secs_f64(),
                });
            }
            st = sh
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Tells the other ranks that this rank failed (before it exits with an error of its
    /// own), so they stop at once instead of waiting in a collective.
    pub fn report_failure(&self, message: &str) {
        let f = RankFailure {
            rank: Some(self.shared.rank),
            message: message.to_string(),
        };
        {
            let mut st = lock(&self.shared.state);
            if st.failure.is_none() {
                st.failure = Some(f.clone());
            }
        }
        self.shared.broadcast(T_FAILED, &failed_payload(&f), None);
    }

    /// Orderly end: the other ranks tell rank 0 they are done; rank 0 waits (up to
    /// `timeout`) until they all have, so its closing the channel is not taken as a failure.
    pub fn finish(mut self, timeout: Duration) -> Result<(), RendezvousError> {
        self.finished = true;
        let sh = Arc::clone(&self.shared);
        let result = if sh.rank == 0 {
            let deadline = Instant::now() + timeout;
            let mut st = lock(&sh.state);
            loop {
                if let Some(f) = &st.failure {
                    break Err(RendezvousError::PeerFailed(f.clone()));
                }
                if st.done.len() + 1 >= sh.world_size as usize {
                    st.finishing = true;
                    break Ok(());
                }
                let left = remaining(deadline);
                if left.is_zero() {
                    break Err(RendezvousError::Timeout {
                        rank: 0,
                        what: "waiting for the other ranks to finish",
                        waited_s: timeout.as_secs_f64(),
                    });
                }
                st = sh
                    .cv
                    .wait_timeout(st, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        } else {
            lock(&sh.state).finishing = true;
            sh.broadcast(T_DONE, &[], None);
            Ok(())
        };
        self.close();
        result
    }

    fn close(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.cv.notify_all();
        for p in &self.shared.peers {
            let _ = lock(&p.stream).shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Rendezvous {
    fn drop(&mut self) {
        if !self.finished {
            // Abrupt: the peers see the connection close and treat this rank as failed,
            // which is what an error path that forgot `report_failure` should cause.
            self.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::config::ENV_JOIN_TIMEOUT;
    use super::wire::parse_failed;
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn env_contract_parses_and_round_trips() {
        let e = DistEnv::from_lookup(env_of(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "3"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("MASTER_ADDR", "node-a"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(e.rank, 3);
        assert_eq!(e.local_world_size, 4);
        let back: HashMap<String, String> = e.to_env().into_iter().collect();
        assert_eq!(
            DistEnv::from_lookup(|k| back.get(k).cloned()).unwrap(),
            Some(e)
        );
    }

    #[test]
    fn env_absent_is_single_process_and_bad_values_name_the_variable() {
        assert_eq!(DistEnv::from_lookup(env_of(&[])).unwrap(), None);
        let err = DistEnv::from_lookup(env_of(&[("RANK", "x"), ("WORLD_SIZE", "2")])).unwrap_err();
        assert!(err.to_string().contains("RANK=\"x\""), "{err}");
        let err = DistEnv::from_lookup(env_of(&[("RANK", "2"), ("WORLD_SIZE", "2")])).unwrap_err();
        assert!(err.to_string().contains("below WORLD_SIZE=2"), "{err}");
        let err = DistEnv::from_lookup(env_of(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", "1"),
        ]))
        .unwrap_err();
        assert!(err.to_string().contains("MASTER_ADDR"), "{err}");
        let one = DistEnv::from_lookup(env_of(&[("RANK", "0"), ("WORLD_SIZE", "1")]))
            .unwrap()
            .unwrap();
        assert_eq!(one.master_addr, "127.0.0.1");
    }

    #[test]
    fn join_timeout_comes_from_the_environment() {
        let c = Config::from_lookup(env_of(&[(ENV_JOIN_TIMEOUT, "12.5")])).unwrap();
        assert_eq!(c.join_timeout, Duration::from_millis(12500));
        assert_eq!(c.on_failure, OnFailure::Exit);
        assert!(Config::from_lookup(env_of(&[(ENV_JOIN_TIMEOUT, "-1")])).is_err());
        assert_eq!(
            Config::from_lookup(env_of(&[])).unwrap().join_timeout,
            Duration::from_secs(300)
        );
    }

    #[test]
    fn failure_messages_round_trip_on_the_wire() {
        let f = RankFailure {
            rank: Some(7),
            message: "CUDA out of memory".into(),
        };
        assert_eq!(parse_failed(&failed_payload(&f)), f);
        let g = RankFailure {
            rank: None,
            message: "lost".into(),
        };
        assert_eq!(parse_failed(&failed_payload(&g)), g);
    }
}
