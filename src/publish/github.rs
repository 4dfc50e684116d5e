//! GitHub's REST API: pull-request comments are issue comments
//! (`/repos/{owner}/{repo}/issues/{number}/comments`), paged through the `Link` header, and
//! commit statuses (`/repos/{owner}/{repo}/statuses/{sha}`).

use reqwest::{Method, Url};
use serde_json::json;

use super::http::{next_link, Api, Replay, Response};
use super::target::Target;
use super::{CommitStatus, Found, Marker, MarkerHits, PublishError, Thread};

/// GitHub refuses comment bodies longer than this many characters.
const MAX_BODY_CHARS: usize = 65_536;
/// GitHub keeps this many characters of a status description.
const MAX_DESCRIPTION_CHARS: usize = 140;
/// A guard against a server whose `next` links never end.
const MAX_PAGES: usize = 1_000;

pub(crate) struct PullRequest {
    owner: String,
    name: String,
    number: String,
}

impl PullRequest {
    pub fn new(target: &Target) -> Result<Self, PublishError> {
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

/// A comment object of the API: `id`, `body`, `html_url`.
fn comment(
    resp: &Response,
    value: &serde_json::Value,
    method: &Method,
) -> Result<Found, PublishError> {
    Found::from_json(resp, value, method, "comment", Some("html_url"))
}

impl Thread for PullRequest {
    fn find(&self, api: &mut Api, marker: &Marker) -> Result<Option<(Found, usize)>, PublishError> {
        let mut url = self.comments_url(api);
        let mut hits = MarkerHits::default();
        for _ in 0..MAX_PAGES {
            let resp = api.send(Method::GET, &url, None, Replay::Safe)?;
            let page = resp.json(&Method::GET)?;
            let items = page.as_array().ok_or_else(|| PublishError::Response {
                method: "GET".into(),
                path: resp.url.path().to_string(),
                message: "expected a list of comments".into(),
            })?;
            for item in items {
                let c = comment(&resp, item, &Method::GET)?;
                hits.offer(marker, c);
            }
            match resp.header("link").and_then(next_link) {
                Some(next) => url = api.same_origin(&next, &Method::GET)?,
                None => break,
            }
        }
        Ok(hits.finish())
    }

    fn create(&self, api: &mut Api, body: &str) -> Result<Found, PublishError> {
        let url = self.comments_url(api);
        let resp = api.send(
            Method::POST,
            &url,
            Some(&json!({ "body": body })),
            Replay::CreateOnce,
        )?;
        comment(&resp, &resp.json(&Method::POST)?, &Method::POST)
    }

    fn update(&self, api: &mut Api, id: u64, body: &str) -> Result<Found, PublishError> {
        let url = api.url(&[
            "repos",
            &self.owner,
            &self.name,
            "issues",
            "comments",
            &id.to_string(),
        ]);
        let resp = api.send(
            Method::PATCH,
            &url,
            Some(&json!({ "body": body })),
            Replay::Safe,
        )?;
        comment(&resp, &resp.json(&Method::PATCH)?, &Method::PATCH)
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
