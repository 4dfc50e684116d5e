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
//!
//! The values that cross the stage live in `types` and its error in `error`, apart from this
//! file: the resolver, the HTTP layer and the providers use them, and this file, which
//! holds [`post`] and re-exports them, imports those.

mod error;
mod github;
mod gitlab;
pub mod http;
pub mod target;
mod thread;
mod types;

pub use error::PublishError;
pub use target::{resolve_target, Secret, Target, TargetFlags, Token};
pub(crate) use thread::Thread;
pub use types::{
    CommentAction, CommitStatus, Marker, PostOptions, PostOutcome, Provider, Retry, RetryPolicy,
    StatusOutcome, StatusState,
};

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
