//! GitHub's REST API: pull-request comments are issue comments
//! (`/repos/{owner}/{repo}/issues/{number}/comments`), paged through the `Link` header, and
//! commit statuses (`/repos/{owner}/{repo}/statuses/{sha}`).

use reqwest::{Method, Url};
use serde_json::json;

use super::error::PublishError;
use super::http::{Api, Replay};
use super::target::Target;
use super::thread::Thread;
use super::types::{CommitStatus, Marker};

/// GitHub refuses comment bodies longer than this many characters.
const MAX_BODY_CHARS: usize = 65_536;
/// GitHub keeps this many characters of a status description.
const MAX_DESCRIPTION_CHARS: usize = 140;

pub(crate) struct PullRequest {
    owner: String,
    name: String,
    number: String,
}

impl PullRequest {
    pub(crate) fn new(target: &Target) -> Result<Self, PublishError> {
        let (owner, name) = split_repo(&target.repo)?;
        Ok(PullRequest {
            owner,
            name,
            number: target.number.to_string(),
        })
    }

    fn comments_url(&self, api: &Api) -> Url {
        let mut url = api.url(&[
            "repos",
            &self.owner,
            &self.name,
            "issues",
            &self.number,
            "comments",
        ]);
        url.query_pairs_mut().append_pair("per_page", "100");
        url
    }
}

fn split_repo(repo: &str) -> Result<(String, String), PublishError> {
    match repo.split_once('/') {
        Some((o, n)) if !o.is_empty() && !n.is_empty() && !n.contains('/') => {
            Ok((o.to_string(), n.to_string()))
        }
        _ => Err(PublishError::BadValue {
            source_name: "--repo".into(),
            message: format!("`{repo}` is not OWNER/NAME"),
        }),
    }
}

impl Thread for PullRequest {
    fn noun(&self) -> &'static str {
        "comment"
    }

    fn link_field(&self) -> Option<&'static str> {
        Some("html_url")
    }

    fn list_url(&self, api: &Api) -> Url {
        self.comments_url(api)
    }

    fn create_url(&self, api: &Api) -> Url {
        self.comments_url(api)
    }

    fn update_at(&self, api: &Api, id: u64) -> (Method, Url) {
        let url = api.url(&[
            "repos",
            &self.owner,
            &self.name,
            "issues",
            "comments",
            &id.to_string(),
        ]);
        (Method::PATCH, url)
    }

    fn max_body_chars(&self) -> usize {
        MAX_BODY_CHARS
    }
}

/// Sets the commit status of `sha` under the marker's context (one per matrix and
/// hardware), linking to the artifacts when known. Setting it again replaces it.
pub(crate) fn set_status(
    target: &Target,
    api: &mut Api,
    sha: &str,
    marker: &Marker,
    status: &CommitStatus,
) -> Result<(), PublishError> {
    let (owner, name) = split_repo(&target.repo)?;
    let url = api.url(&["repos", &owner, &name, "statuses", sha]);
    let description: String = status
        .description
        .chars()
        .take(MAX_DESCRIPTION_CHARS)
        .collect();
    let mut body = json!({
        "state": status.state.as_str(),
        "description": description,
        "context": marker.status_context(),
    });
    if let Some(link) = &target.artifacts_url {
        body["target_url"] = json!(link);
    }
    api.send(Method::POST, &url, Some(&body), Replay::Safe)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_must_be_owner_slash_name() {
        assert_eq!(
            split_repo("o/r").unwrap(),
            ("o".to_string(), "r".to_string())
        );
        for bad in ["o", "o/", "/r", "o/r/x"] {
            assert!(split_repo(bad).is_err(), "{bad}");
        }
    }
}
