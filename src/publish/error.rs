//! The publish stage's error. Every text in it is scrubbed of the token before it is built,
//! and each variant names where it happened. The resolver, the HTTP layer and the providers
//! all return it, so it lives apart from `mod.rs`, which imports them.

use super::types::Provider;

/// Failures of this stage. Every text here is scrubbed of the token before it is built.
/// Each variant names where it happened: the flag or variable, or the request (method and
/// URL path) that failed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// Something needed to post is not set; no request was made.
    #[error("cannot post the report to {provider}: {}", missing.join("; "))]
    Missing {
        provider: Provider,
        missing: Vec<String>,
    },
    #[error("cannot tell where to post: pass --provider github|gitlab, or run inside GitHub Actions (GITHUB_ACTIONS=true) or GitLab CI (GITLAB_CI=true)")]
    NoProvider,
    #[error("{source_name}: {message}")]
    BadValue {
        /// The flag or variable that holds the bad value.
        source_name: String,
        message: String,
    },
    #[error("GITHUB_EVENT_PATH {path}: {message}")]
    EventFile { path: String, message: String },
    /// 401 or 403 that is not a rate limit.
    #[error("{provider} refused the request {method} {path} with HTTP {status}: {message}; check {hint}")]
    Auth {
        provider: Provider,
        method: String,
        path: String,
        status: u16,
        message: String,
        hint: String,
    },
    #[error("{provider} answered {method} {path} with HTTP {status}: {message}{hint}")]
    Http {
        provider: Provider,
        method: String,
        path: String,
        status: u16,
        message: String,
        hint: String,
    },
    /// Rate limited for longer than [`RetryPolicy::max_wait`](super::RetryPolicy::max_wait)
    /// allows waiting.
    #[error("{provider} rate-limited {method} {path} and asks to wait {wait_s} s, more than the {cap_s} s this command waits; try again later")]
    RateLimited {
        provider: Provider,
        method: String,
        path: String,
        wait_s: u64,
        cap_s: u64,
    },
    /// No HTTP answer at all (connection refused, DNS, TLS, timeout), after retries.
    #[error("{method} {url} failed: {message}")]
    Transport {
        method: String,
        url: String,
        message: String,
    },
    /// An answer that does not have the shape the API documents.
    #[error("{method} {path}: unexpected response: {message}")]
    Response {
        method: String,
        path: String,
        message: String,
    },
}

impl PublishError {
    /// True for a failure after which a write may still have happened on the server: a 5xx
    /// answer or a lost connection.
    pub(super) fn may_have_written(&self) -> bool {
        match self {
            PublishError::Http { status, .. } => *status >= 500,
            PublishError::Transport { .. } => true,
            _ => false,
        }
    }

    /// True when the fault is in the arguments or environment (exit 2 if the CLI reports it
    /// as an error at all), false for failures of the remote side or the network.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            PublishError::Missing { .. }
                | PublishError::NoProvider
                | PublishError::BadValue { .. }
                | PublishError::EventFile { .. }
        )
    }
}
