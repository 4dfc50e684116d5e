//! Posting the Markdown report to a pull request (GitHub) or merge request (GitLab).
//!
//! This stage owns everything between a rendered Markdown body and the code-review page:
//! resolving where to post from flags or the CI environment ([`target`]), talking to the
//! two REST APIs ([`github`], [`gitlab`]) through one retrying HTTP layer ([`http`]), and
//! keeping exactly one comment per matrix and hardware, found again by a hidden
//! [`Marker`] and updated in place ([`thread`], written once for both providers). It does not render anything: `report` does.
//!
//! Tokens are held in [`Secret`], whose `Debug` and `Display` print `***`, and every text
//! that leaves this module in an error is scrubbed of the token, so a token cannot reach
//! output, logs or results through this stage.

mod github;
mod gitlab;
pub mod http;
pub mod target;
mod thread;

use std::fmt;
use std::time::Duration;

pub use http::{Retry, RetryPolicy};
pub use target::{resolve_target, Provider, Secret, Target, TargetFlags, Token};
pub(crate) use thread::Thread;

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
    fn as_str(self) -> &'static str {
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
    /// Rate limited for longer than [`RetryPolicy::max_wait`] allows waiting.
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
    fn may_have_written(&self) -> bool {
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

/// Posts `body` (the rendered Markdown report) as the comment of `marker`'s matrix and
/// hardware on the target's pull request or merge request, creating it the first time and
/// updating it in place afterwards (one comment per matrix and hardware, however often the
/// job reruns).
///
/// `changed` says whether any cell regressed, improved or is new. With
/// `opts.only_on_change` and `!changed`, no comment is created; an existing comment of ours
/// is still updated, so a pull request never keeps showing a regression a later push fixed.
///
/// Contract for the CLI: an `Err` means the report did not reach the pull request (the
/// error says why and, for 401/403, which variable to check). It must be printed as a
/// warning and must NOT change the exit code that the verdict produced: a flaky API is no
/// reason to fail or pass a benchmark gate. `Ok` may still carry a failed commit status in
/// [`PostOutcome::status`], which deserves the same treatment.
///
/// It blocks (reqwest's blocking client, retries sleep); call it from plain threads, not
/// from inside an async runtime.
pub fn post(
    target: &Target,
    body: &str,
    marker: &Marker,
    changed: bool,
    opts: &PostOptions,
) -> Result<PostOutcome, PublishError> {
    let mut api = http::Api::new(target, opts)?;
    let mut notes = Vec::new();
    let action = match target.provider {
        Provider::GitHub => {
            let thread = github::PullRequest::new(target)?;
            upsert(&thread, &mut api, body, marker, changed, opts, &mut notes)?
        }
        Provider::GitLab => {
            let thread = gitlab::MergeRequest::new(target)?;
            upsert(&thread, &mut api, body, marker, changed, opts, &mut notes)?
        }
    };
    let (action, mut url) = action;
    if url.is_none() {
        url = target.comment_url(&action);
    }
    let status = match &opts.commit_status {
        None => StatusOutcome::NotRequested,
        Some(status) => set_status(target, &mut api, marker, status),
    };
    Ok(PostOutcome {
        action,
        url,
        status,
        retries: api.take_retries(),
        notes,
    })
}

/// The find-then-write loop shared by both providers.
fn upsert(
    thread: &dyn Thread,
    api: &mut http::Api,
    body: &str,
    marker: &Marker,
    changed: bool,
    opts: &PostOptions,
    notes: &mut Vec<String>,
) -> Result<(CommentAction, Option<String>), PublishError> {
    let full = compose(marker, body, thread.max_body_chars(), notes);
    let existing = thread.find(api, marker)?;
    if let Some((_, extra)) = &existing {
        if *extra > 0 {
            notes.push(format!(
                "{extra} more comment(s) carry the same marker; the oldest one is updated"
            ));
        }
    }
    match existing {
        Some((found, _)) if found.body == full => {
            Ok((CommentAction::Unchanged { id: found.id }, found.url))
        }
        Some((found, _)) => {
            let updated = thread.update(api, found.id, &full)?;
            Ok((CommentAction::Updated { id: updated.id }, updated.url))
        }
        None if opts.only_on_change && !changed => Ok((CommentAction::Skipped, None)),
        None => match thread.create(api, &full) {
            Ok(created) => Ok((CommentAction::Created { id: created.id }, created.url)),
            // A create that failed on the server side may still have created the comment
            // (the answer was lost, not the write). Look again before creating a second
            // one, so a flaky API never leaves duplicate comments.
            Err(e) if e.may_have_written() => match thread.find(api, marker)? {
                // Our create went through; only its answer was lost.
                Some((found, _)) if found.body == full => {
                    Ok((CommentAction::Created { id: found.id }, found.url))
                }
                Some((found, _)) => {
                    let updated = thread.update(api, found.id, &full)?;
                    Ok((CommentAction::Updated { id: updated.id }, updated.url))
                }
                None => {
                    let created = thread.create(api, &full)?;
                    Ok((CommentAction::Created { id: created.id }, created.url))
                }
            },
            Err(e) => Err(e),
        },
    }
}

/// Marker line, blank line, body; cut at a line boundary when the provider's limit is hit,
/// with a note in the comment saying so (the artifacts keep the full report).
fn compose(marker: &Marker, body: &str, max_chars: usize, notes: &mut Vec<String>) -> String {
    let head = format!("{}\n\n", marker.line());
    let full = format!("{head}{body}");
    let total = full.chars().count();
    if total <= max_chars {
        return full;
    }
    let tail = "\n\n_The report was cut here to fit the comment size limit; the full report is in the run's artifacts (summary.md)._\n";
    let budget = max_chars.saturating_sub(head.chars().count() + tail.chars().count());
    let cut: String = body.chars().take(budget).collect();
    let cut = match cut.rfind('\n') {
        Some(i) => &cut[..i],
        None => cut.as_str(),
    };
    notes.push(format!(
        "the report has {total} characters, more than the {max_chars} a comment holds; it was cut"
    ));
    format!("{head}{cut}{tail}")
}

fn set_status(
    target: &Target,
    api: &mut http::Api,
    marker: &Marker,
    status: &CommitStatus,
) -> StatusOutcome {
    match target.provider {
        Provider::GitLab => StatusOutcome::NotSupported(
            "commit statuses are set on GitHub only; on GitLab the job's own status carries the verdict"
                .into(),
        ),
        Provider::GitHub => {
            let Some(sha) = &target.sha else {
                return StatusOutcome::NotSupported(
                    "no commit sha: pass --sha or set GITHUB_SHA".into(),
                );
            };
            match github::set_status(target, api, sha, marker, status) {
                Ok(()) => StatusOutcome::Set {
                    context: marker.status_context(),
                },
                Err(e) => StatusOutcome::Failed(e.to_string()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_line_and_match() {
        let m = Marker::new("nightly-h100", "h100-sxm-80gb");
        assert_eq!(
            m.line(),
            "<!-- bench-report matrix=nightly-h100 hardware=h100-sxm-80gb -->"
        );
        assert!(m.matches(&format!("{}\n\nbody", m.line())));
        assert!(m.matches(&format!("\n  {}\nbody", m.line())));
        assert!(!m.matches(&format!("> {}\nquoted", m.line())));
        // A matrix whose name is a prefix of ours is another comment.
        let other = Marker::new("nightly", "h100-sxm-80gb");
        assert!(!other.matches(&m.line()));
        assert!(!m.matches(&other.line()));
    }

    #[test]
    fn marker_cleans_names() {
        let m = Marker::new("a b-->c", "");
        assert_eq!(m.line(), "<!-- bench-report matrix=a_b--_c hardware=_ -->");
    }

    #[test]
    fn compose_cuts_long_bodies_at_a_line() {
        let m = Marker::new("m", "h");
        let body: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let mut notes = vec![];
        let full = compose(&m, &body, 100_000, &mut notes);
        assert!(notes.is_empty());
        assert_eq!(full, format!("{}\n\n{}", m.line(), body));

        let full = compose(&m, &body, 300, &mut notes);
        assert!(full.chars().count() <= 300, "{}", full.chars().count());
        assert!(m.matches(&full));
        assert!(full.contains("cut here"));
        assert_eq!(notes.len(), 1);
        // The cut falls on a line boundary.
        let before_tail = full.split("\n\n_The report").next().unwrap();
        assert!(before_tail.ends_with(|c: char| c.is_ascii_digit()));
    }
}
