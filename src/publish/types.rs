//! The publish stage's vocabulary: where a comment goes ([`Provider`]), what marks it as
//! ours ([`Marker`]), how to post ([`PostOptions`], [`RetryPolicy`], [`CommitStatus`]) and
//! what happened ([`PostOutcome`], [`CommentAction`], [`StatusOutcome`], [`Retry`]). The
//! resolver, the HTTP layer and both providers use these values as much as `post` in
//! `mod.rs` does, so they live in a file that imports none of them back.

use std::fmt;
use std::time::Duration;

/// A GitHub or GitLab instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    GitHub,
    GitLab,
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Provider::GitHub => "GitHub",
            Provider::GitLab => "GitLab",
        })
    }
}

/// The hidden first line of every comment `bench` posts; it names the matrix and the
/// hardware so each pair keeps its own comment and a rerun finds and updates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    matrix: String,
    hardware: String,
}

impl Marker {
    /// Characters other than ASCII letters, digits, `.`, `_` and `-` become `_`, so the
    /// marker stays one well-formed HTML comment whatever the names hold.
    pub fn new(matrix: &str, hardware: &str) -> Self {
        fn clean(s: &str) -> String {
            let cleaned: String = s
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            if cleaned.is_empty() {
                "_".to_string()
            } else {
                cleaned
            }
        }
        Marker {
            matrix: clean(matrix),
            hardware: clean(hardware),
        }
    }

    /// The marker line, e.g. `<!-- bench-report matrix=nightly-h100 hardware=h100-sxm-80gb -->`.
    pub(crate) fn line(&self) -> String {
        format!(
            "<!-- bench-report matrix={} hardware={} -->",
            self.matrix, self.hardware
        )
    }

    /// Whether a comment body is ours for this matrix and hardware. Only a body that starts
    /// with the marker counts, so a human quoting our comment (`> <!-- ...`) is left alone.
    pub(crate) fn matches(&self, body: &str) -> bool {
        body.trim_start().starts_with(&self.line())
    }

    /// Context name of the commit status: one per matrix and hardware, like the comment.
    pub(crate) fn status_context(&self) -> String {
        format!("bench/{}/{}", self.matrix, self.hardware)
    }
}

/// State of a commit status (GitHub's four states).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusState {
    Success,
    Failure,
    Error,
    Pending,
}

impl StatusState {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            StatusState::Success => "success",
            StatusState::Failure => "failure",
            StatusState::Error => "error",
            StatusState::Pending => "pending",
        }
    }
}

/// A commit status carrying the verdict, e.g. `Failure` with "2 regressions in 12 cells".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitStatus {
    pub state: StatusState,
    /// Shown beside the check; GitHub keeps 140 characters, longer text is cut.
    pub description: String,
}

/// How often and how long to retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// First backoff when the server gives no `Retry-After`; doubles on every retry.
    pub base_backoff: Duration,
    /// The longest single wait. A rate limit asking for longer fails at once with
    /// [`PublishError::RateLimited`](super::PublishError::RateLimited) instead of holding the
    /// CI job.
    pub max_wait: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 4,
            base_backoff: Duration::from_secs(1),
            max_wait: Duration::from_secs(60),
        }
    }
}

/// The default of [`PostOptions::deadline`] (and of `bench report post --timeout`): a
/// comment and a status take a few requests of well under a second each, and a rate limit
/// worth waiting for asks for less than [`RetryPolicy::max_wait`].
pub(crate) const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);

/// How to post; [`Default`] is what the CLI uses.
#[derive(Debug, Clone)]
pub struct PostOptions {
    /// Create no comment when nothing changed (see [`post`] for the exact rule).
    pub only_on_change: bool,
    /// Also set a commit status (GitHub only; needs the commit sha in the target).
    pub commit_status: Option<CommitStatus>,
    pub retry: RetryPolicy,
    /// Per-request timeout (connect and whole response).
    pub timeout: Duration,
    /// Everything posting may take, retries and their waits included: a server that accepts
    /// connections and never answers costs this long, not `timeout` for every retry.
    pub deadline: Duration,
}

impl Default for PostOptions {
    fn default() -> Self {
        PostOptions {
            only_on_change: false,
            commit_status: None,
            retry: RetryPolicy::default(),
            timeout: Duration::from_secs(30),
            deadline: DEFAULT_DEADLINE,
        }
    }
}

/// One retried request, reported in [`PostOutcome::retries`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    pub method: String,
    pub path: String,
    /// e.g. `HTTP 429`, `HTTP 502`, `connection failed`.
    pub reason: String,
    pub wait: Duration,
}

impl fmt::Display for Retry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} after {}, waited {:.1} s",
            self.method,
            self.path,
            self.reason,
            self.wait.as_secs_f64()
        )
    }
}

/// What happened to the comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommentAction {
    Created {
        id: u64,
    },
    Updated {
        id: u64,
    },
    /// Our comment already held exactly this body; nothing was written.
    Unchanged {
        id: u64,
    },
    /// `--only-on-change` and nothing changed, and no earlier comment of ours exists.
    Skipped,
}

/// What happened to the optional commit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusOutcome {
    NotRequested,
    Set {
        context: String,
    },
    /// Asked for, but this provider or target cannot carry it; the text says why.
    NotSupported(String),
    /// The comment went through but the status did not; the text is the scrubbed error.
    Failed(String),
}

/// The result of [`post`], for the CLI to print.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostOutcome {
    pub action: CommentAction,
    /// Link to the comment, where the API or the CI environment gives one.
    pub url: Option<String>,
    pub status: StatusOutcome,
    /// Every retried request, with what it waited (for the log and for tests).
    pub retries: Vec<Retry>,
    /// Things worth a line in the log (body cut to the provider's limit, duplicates found).
    pub notes: Vec<String>,
}

impl fmt::Display for PostOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.action {
            CommentAction::Created { id } => write!(f, "created comment {id}")?,
            CommentAction::Updated { id } => write!(f, "updated comment {id} in place")?,
            CommentAction::Unchanged { id } => write!(f, "comment {id} is already up to date")?,
            CommentAction::Skipped => write!(
                f,
                "posted nothing: --only-on-change and no cell regressed, improved or is new"
            )?,
        }
        if let Some(url) = &self.url {
            write!(f, " ({url})")?;
        }
        match &self.status {
            StatusOutcome::NotRequested => {}
            StatusOutcome::Set { context } => write!(f, "; commit status {context} set")?,
            StatusOutcome::NotSupported(why) => write!(f, "; no commit status: {why}")?,
            StatusOutcome::Failed(why) => write!(f, "; commit status failed: {why}")?,
        }
        for r in &self.retries {
            write!(f, "\n  retried {r}")?;
        }
        for n in &self.notes {
            write!(f, "\n  note: {n}")?;
        }
        Ok(())
    }
}
