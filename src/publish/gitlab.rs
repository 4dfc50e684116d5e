//! GitLab's REST API (v4): merge-request notes
//! (`/projects/{id}/merge_requests/{iid}/notes`), paged through `Link` or `X-Next-Page`.
//! The project may be a numeric id or a `group/project` path, sent percent-encoded.

use reqwest::{Method, Url};
use serde_json::json;

use super::http::{next_link, Api, Replay, Response};
use super::target::Target;
use super::{Found, Marker, MarkerHits, PublishError, Thread};

/// GitLab refuses note bodies longer than this many characters.
const MAX_BODY_CHARS: usize = 1_000_000;
/// A guard against a server whose next pages never end.
const MAX_PAGES: usize = 1_000;

pub(crate) struct MergeRequest {
    project: String,
    iid: String,
}

impl MergeRequest {
    pub fn new(target: &Target) -> Result<Self, PublishError> {
        if target.repo.trim().is_empty() {
            return Err(PublishError::BadValue {
                source_name: "--repo".into(),
                message: "the GitLab project is empty".into(),
            });
        }
        Ok(MergeRequest {
            project: target.repo.trim().to_string(),
            iid: target.number.to_string(),
        })
    }

    fn notes_url(&self, api: &Api) -> Url {
        api.url(&[
            "projects",
            &self.project,
            "merge_requests",
            &self.iid,
            "notes",
        ])
    }
}

/// A note object of the API: `id`, `body` (notes carry no link; the target builds one).
fn note(
    resp: &Response,
    value: &serde_json::Value,
    method: &Method,
) -> Result<Found, PublishError> {
    Found::from_json(resp, value, method, "note", None)
}

/// `url` with its `page` parameter set to `page`.
fn with_page(url: &Url, page: &str) -> Url {
    let pairs: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| k != "page")
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let mut next = url.clone();
    {
        let mut q = next.query_pairs_mut();
        q.clear();
        for (k, v) in &pairs {
            q.append_pair(k, v);
        }
        q.append_pair("page", page);
    }
    next
}

impl Thread for MergeRequest {
    fn find(&self, api: &mut Api, marker: &Marker) -> Result<Option<(Found, usize)>, PublishError> {
        let mut url = self.notes_url(api);
        url.query_pairs_mut()
            .append_pair("per_page", "100")
            .append_pair("sort", "asc")
            .append_pair("order_by", "created_at");
        let mut hits = MarkerHits::default();
        for _ in 0..MAX_PAGES {
            let resp = api.send(Method::GET, &url, None, Replay::Safe)?;
            let page = resp.json(&Method::GET)?;
            let items = page.as_array().ok_or_else(|| PublishError::Response {
                method: "GET".into(),
                path: resp.url.path().to_string(),
                message: "expected a list of notes".into(),
            })?;
            for item in items {
                // System notes ("added 1 commit") are GitLab's own, never ours.
                if item.get("system").and_then(|v| v.as_bool()) == Some(true) {
                    continue;
                }
                let n = note(&resp, item, &Method::GET)?;
                hits.offer(marker, n);
            }
            if let Some(next) = resp.header("link").and_then(next_link) {
                url = api.same_origin(&next, &Method::GET)?;
            } else if let Some(page) = resp
                .header("x-next-page")
                .map(str::trim)
                .filter(|p| !p.is_empty())
            {
                url = with_page(&resp.url, page);
            } else {
                break;
            }
        }
        Ok(hits.finish())
    }

    fn create(&self, api: &mut Api, body: &str) -> Result<Found, PublishError> {
        let url = self.notes_url(api);
        let resp = api.send(
            Method::POST,
            &url,
            Some(&json!({ "body": body })),
            Replay::CreateOnce,
        )?;
        note(&resp, &resp.json(&Method::POST)?, &Method::POST)
    }

    fn update(&self, api: &mut Api, id: u64, body: &str) -> Result<Found, PublishError> {
        let mut url = self.notes_url(api);
        if let Ok(mut path) = url.path_segments_mut() {
            path.push(&id.to_string());
        }
        let resp = api.send(
            Method::PUT,
            &url,
            Some(&json!({ "body": body })),
            Replay::Safe,
        )?;
        note(&resp, &resp.json(&Method::PUT)?, &Method::PUT)
    }

    fn max_body_chars(&self) -> usize {
        MAX_BODY_CHARS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_parameter_is_replaced() {
        let u =
            Url::parse("https://g/api/v4/projects/1/notes?per_page=100&page=1&sort=asc").unwrap();
        assert_eq!(
            with_page(&u, "2").as_str(),
            "https://g/api/v4/projects/1/notes?per_page=100&sort=asc&page=2"
        );
    }
}
