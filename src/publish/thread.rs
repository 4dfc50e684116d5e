//! One review thread (a pull request's or a merge request's comments), written once for
//! both providers: listing and paging through its comments, finding the one that carries
//! the [`Marker`] (and counting duplicates), creating and updating it. A provider says
//! only where its comments are ([`Thread`]'s required methods).

use reqwest::{Method, Url};

use super::error::PublishError;
use super::http;
use super::types::Marker;

/// A guard against a server whose next pages never end.
const MAX_PAGES: usize = 1_000;

/// One API's review thread: where its comments are and how they page. Listing, paging,
/// creating and updating are the same for both providers and written once here
/// ([`Thread::find`], [`Thread::create`], [`Thread::update`]); a provider says only where.
pub(crate) trait Thread {
    /// "comment" or "note": names the API's objects in errors.
    fn noun(&self) -> &'static str;
    /// The field of a comment object that links to it, where the provider has one.
    fn link_field(&self) -> Option<&'static str>;
    /// The first page of the listing, with its page size and order.
    fn list_url(&self, api: &http::Api) -> Url;
    /// Where a new comment is posted.
    fn create_url(&self, api: &http::Api) -> Url;
    /// How comment `id` is updated: the method and the URL.
    fn update_at(&self, api: &http::Api, id: u64) -> (Method, Url);
    /// The longest body the provider accepts, in characters.
    fn max_body_chars(&self) -> usize;

    /// Comments of the provider's own that are never ours (GitLab's system notes).
    fn is_system(&self, _item: &serde_json::Value) -> bool {
        false
    }

    /// The page after `resp`: its `Link` header's `next`, on the API's own origin.
    fn next_page(
        &self,
        api: &http::Api,
        resp: &http::Response,
    ) -> Result<Option<Url>, PublishError> {
        resp.header("link")
            .and_then(http::next_link)
            .map(|next| api.same_origin(&next, &Method::GET))
            .transpose()
    }

    /// A comment object of the API.
    fn comment(
        &self,
        resp: &http::Response,
        value: &serde_json::Value,
        method: &Method,
    ) -> Result<Found, PublishError> {
        Found::from_json(resp, value, method, self.noun(), self.link_field())
    }

    /// Finds our comment (the first whose body starts with the marker) by paging through
    /// every comment; returns its id and body and how many further matches exist.
    fn find(
        &self,
        api: &mut http::Api,
        marker: &Marker,
    ) -> Result<Option<(Found, usize)>, PublishError> {
        let mut url = self.list_url(api);
        let mut hits = MarkerHits::default();
        for _ in 0..MAX_PAGES {
            let resp = api.send(Method::GET, &url, None, http::Replay::Safe)?;
            let page = resp.json(&Method::GET)?;
            let items = page.as_array().ok_or_else(|| PublishError::Response {
                method: "GET".into(),
                path: resp.url.path().to_string(),
                message: format!("expected a list of {}s", self.noun()),
            })?;
            for item in items.iter().filter(|i| !self.is_system(i)) {
                hits.offer(marker, self.comment(&resp, item, &Method::GET)?);
            }
            match self.next_page(api, &resp)? {
                Some(next) => url = next,
                None => break,
            }
        }
        Ok(hits.finish())
    }

    fn create(&self, api: &mut http::Api, body: &str) -> Result<Found, PublishError> {
        let url = self.create_url(api);
        let payload = serde_json::json!({ "body": body });
        let resp = api.send(Method::POST, &url, Some(&payload), http::Replay::CreateOnce)?;
        self.comment(&resp, &resp.json(&Method::POST)?, &Method::POST)
    }

    fn update(&self, api: &mut http::Api, id: u64, body: &str) -> Result<Found, PublishError> {
        let (method, url) = self.update_at(api, id);
        let payload = serde_json::json!({ "body": body });
        let resp = api.send(method.clone(), &url, Some(&payload), http::Replay::Safe)?;
        self.comment(&resp, &resp.json(&method)?, &method)
    }
}

/// A comment as the API returned it.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    pub id: u64,
    pub body: String,
    pub url: Option<String>,
}

/// While paging through a thread: the first comment that carries the marker, and how many
/// more carry it (duplicates an earlier interrupted run may have left), for both providers.
#[derive(Debug, Default)]
pub(crate) struct MarkerHits {
    first: Option<Found>,
    extra: usize,
}

impl MarkerHits {
    /// Looks at one comment of the thread, in the order the API lists them.
    pub(crate) fn offer(&mut self, marker: &Marker, comment: Found) {
        if !marker.matches(&comment.body) {
            return;
        }
        if self.first.is_none() {
            self.first = Some(comment);
        } else {
            self.extra += 1;
        }
    }

    /// The first match and the number of further matches, if any matched.
    pub(crate) fn finish(self) -> Option<(Found, usize)> {
        self.first.map(|f| (f, self.extra))
    }
}

impl Found {
    /// Reads a comment (GitHub) or note (GitLab) object: both carry a numeric `id` and a
    /// `body`; `url_key` names the field with a link to it, where the provider has one.
    /// `what` ("comment", "note") names the object in the error.
    pub(crate) fn from_json(
        resp: &http::Response,
        value: &serde_json::Value,
        method: &reqwest::Method,
        what: &str,
        url_key: Option<&str>,
    ) -> Result<Found, PublishError> {
        let id =
            value
                .get("id")
                .and_then(|v| v.as_u64())
                .ok_or_else(|| PublishError::Response {
                    method: method.to_string(),
                    path: resp.url.path().to_string(),
                    message: format!("a {what} without a numeric `id`"),
                })?;
        Ok(Found {
            id,
            body: value
                .get("body")
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string(),
            url: url_key
                .and_then(|k| value.get(k))
                .and_then(|v| v.as_str())
                .map(str::to_string),
        })
    }
}
