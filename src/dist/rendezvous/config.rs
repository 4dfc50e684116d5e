//! The rendezvous' timeouts and policy: what a rank does on a peer's failure, how long
//! joining may take, how often heartbeats go, and the time left before a deadline. The
//! handle and the control channel both read them, so they live apart from the handle.

use std::time::{Duration, Instant};

use super::error::{RankFailure, RendezvousError};

/// What a rank does when it learns that another rank failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnFailure {
    /// Run the failure hook, print an `error` event (kind `distributed`) on stdout and
    /// exit the process with `exit::worker::DISTRIBUTED`. Right for workers: the main
    /// thread may be blocked in a collective that will never complete.
    #[default]
    Exit,
    /// Only record it: [`Rendezvous::failure`] and [`Rendezvous::wait_for_failure`]
    /// report it, and barriers fail. For tests and callers that poll.
    Record,
}

/// Timeouts and policy of a rendezvous.
#[derive(Debug, Clone)]
pub struct Config {
    /// How long all ranks have to join (connect, hello, receive the blob).
    pub join_timeout: Duration,
    /// How often each side sends a heartbeat on the control channel.
    pub heartbeat: Duration,
    /// A peer silent for this long is taken as failed (a hung host or a cut network,
    /// which close no socket).
    pub peer_timeout: Duration,
    pub on_failure: OnFailure,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            join_timeout: Duration::from_secs(300),
            heartbeat: Duration::from_secs(2),
            peer_timeout: Duration::from_secs(60),
            on_failure: OnFailure::Exit,
        }
    }
}

/// Environment variable overriding [`Config::join_timeout`] in seconds (workers read it
/// through [`Config::from_env`]).
pub(crate) const ENV_JOIN_TIMEOUT: &str = "BENCH_RDZV_TIMEOUT_S";

impl Config {
    /// The defaults, with the join timeout from `$BENCH_RDZV_TIMEOUT_S` when set.
    pub(crate) fn from_env() -> Result<Config, RendezvousError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`Config::from_env`], reading variables through `get`.
    pub(crate) fn from_lookup(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, RendezvousError> {
        let mut c = Config::default();
        if let Some(v) = get(ENV_JOIN_TIMEOUT) {
            let s: f64 = v
                .trim()
                .parse()
                .ok()
                .filter(|s: &f64| s.is_finite() && *s > 0.0)
                .ok_or_else(|| RendezvousError::Env {
                    var: ENV_JOIN_TIMEOUT,
                    value: v.clone(),
                    reason: "must be a positive number of seconds".into(),
                })?;
            c.join_timeout = Duration::from_secs_f64(s);
        }
        Ok(c)
    }
}

/// Called once, before the process exits, when [`OnFailure::Exit`] fires; e.g. to
/// `ncclCommAbort` so the GPU work is torn down cleanly.
pub(crate) type FailureHook = Box<dyn Fn(&RankFailure) + Send + Sync>;

/// The time left until `deadline`, zero once it has passed.
pub(super) fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}
