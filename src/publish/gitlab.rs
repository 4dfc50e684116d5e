//! GitLab's REST API (v4): merge-request notes
//! (`/projects/{id}/merge_requests/{iid}/notes`), paged through `Link` or `X-Next-Page`.
//! The project may be a numeric id or a `group/project` path, sent percent-encoded.

use reqwest::{Method, Url};

use super::error::PublishError;
use super::http::{next_link, Api, Response};
use super::target::Target;
use super::thread::Thread;

/// GitLab refuses note bodies longer than this many characters.
const MAX_BODY_CHARS: usize = 1_000_000;

pub(crate) struct MergeRequest {
    project: String,
    iid: String,
}

impl MergeRequest {
    pub(crate) fn new(target: &Target) -> Result<Self, PublishError> {
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
    fn noun(&self) -> &'static str {
        "note"
    }

    /// Notes carry no link; the target builds one.
    fn link_field(&self) -> Option<&'static str> {
        None
    }

    fn list_url(&self, api: &Api) -> Url {
        let mut url = self.notes_url(api);
        url.query_pairs_mut()
            .append_pair("per_page", "100")
            .append_pair("sort", "asc")
            .append_pair("order_by", "created_at");
        url
    }

    fn create_url(&self, api: &Api) -> Url {
        self.notes_url(api)
    }

    fn update_at(&self, api: &Api, id: u64) -> (Method, Url) {
        let mut url = self.notes_url(api);
        if let Ok(mut path) = url.path_segments_mut() {
            path.push(&id.to_string());
        }
        (Method::PUT, url)
    }

    fn max_body_chars(&self) -> usize {
        MAX_BODY_CHARS
    }

    /// System notes ("added 1 commit") are GitLab's own, never ours.
    fn is_system(&self, item: &serde_json::Value) -> bool {
        item.get("system").and_then(|v| v.as_bool()) == Some(true)
    }

    /// GitLab pages through `Link`, or `X-Next-Page` where a proxy dropped the former.
    fn next_page(&self, api: &Api, resp: &Response) -> Result<Option<Url>, PublishError> {
        if let Some(next) = resp.header("link").and_then(next_link) {
            return api.same_origin(&next, &Method::GET).map(Some);
        }
        Ok(resp
            .header("x-next-page")
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|page| with_page(&resp.url, page)))
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
