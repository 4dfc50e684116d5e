//! The rendezvous' failures: a rank that failed, as the others learn it, and the errors of
//! joining and waiting. Every part of the rendezvous raises them and the handle returns
//! them, so they live in a file of their own that the parts import.

use std::fmt;
use std::io;

/// A rank that failed, as the other ranks learn it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankFailure {
    /// The failed rank, when known.
    pub rank: Option<u32>,
    pub message: String,
}

impl fmt::Display for RankFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.rank {
            Some(r) => write!(f, "rank {r} failed: {}", self.message),
            None => write!(f, "a rank failed: {}", self.message),
        }
    }
}

/// Failures of the rendezvous. All of them are distributed failures of the cell
/// ([`RendezvousError::exit_code`]).
#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    #[error("environment variable {var}={value:?}: {reason}")]
    Env {
        var: &'static str,
        value: String,
        reason: String,
    },
    #[error("rank 0 cannot listen on port {port} (MASTER_PORT): {source}")]
    Bind { port: u16, source: io::Error },
    #[error("rendezvous on {endpoint}: rank(s) {missing:?} of {world_size} did not join within {waited_s:.1}s")]
    MissingRanks {
        endpoint: String,
        missing: Vec<u32>,
        world_size: u32,
        waited_s: f64,
    },
    #[error("rank {rank}: cannot reach rank 0 at {endpoint} (MASTER_ADDR:MASTER_PORT) within {waited_s:.1}s; last error: {last_error}")]
    Unreachable {
        rank: u32,
        endpoint: String,
        waited_s: f64,
        last_error: String,
    },
    #[error("rendezvous on {endpoint}: {detail}")]
    Protocol { endpoint: String, detail: String },
    #[error("{0}")]
    PeerFailed(RankFailure),
    #[error("rank {rank}: {what} timed out after {waited_s:.1}s")]
    Timeout {
        rank: u32,
        what: &'static str,
        waited_s: f64,
    },
    #[error("rank 0 could not make the rendezvous id: {0}")]
    Blob(String),
}

impl RendezvousError {
    /// The worker exit code for this failure: always `exit::worker::DISTRIBUTED`.
    pub fn exit_code(&self) -> i32 {
        crate::exit::worker::DISTRIBUTED
    }
}
