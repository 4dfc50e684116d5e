//! The one HTTP client of the publish stage: authentication headers, retries with backoff,
//! rate limits, and errors that name the request and never the token.
//!
//! The retry loop is written here rather than taken from a crate because its decisions are
//! all about HTTP answers: which statuses are retried, that `Retry-After` and GitHub's
//! `x-ratelimit-*` headers set the wait, that a wait longer than the cap is reported
//! instead of slept through, and that a create is not repeated blindly after a 5xx (the
//! caller looks for the comment first, see `publish::upsert`).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::blocking::Client;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, AUTHORIZATION};
use reqwest::{Method, StatusCode, Url};

use super::error::PublishError;
use super::target::{Provider, Target, TokenKind};
use super::types::PostOptions;
// Defined with the stage's other values (types.rs); re-exported so that the paths
// `publish::http::RetryPolicy` and `publish::http::Retry` keep naming them.
pub use super::types::{Retry, RetryPolicy};

/// Whether a request may be sent again after the server may have acted on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replay {
    /// GET, PATCH, PUT and status POSTs: repeating them leaves the same state.
    Safe,
    /// Creating a comment: repeated only when the server surely did not act on it (a rate
    /// limit, or no connection at all). After a 5xx the caller looks before creating again.
    CreateOnce,
}

/// A successful (2xx) answer.
#[derive(Debug)]
pub(crate) struct Response {
    pub headers: HeaderMap,
    pub body: String,
    pub url: Url,
}

impl Response {
    pub(crate) fn json(&self, method: &Method) -> Result<serde_json::Value, PublishError> {
        serde_json::from_str(&self.body).map_err(|e| PublishError::Response {
            method: method.to_string(),
            path: self.url.path().to_string(),
            message: format!("not JSON: {e}"),
        })
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// An authenticated client for one target.
pub(crate) struct Api {
    client: Client,
    provider: Provider,
    base: Url,
    headers: HeaderMap,
    token: super::target::Token,
    policy: RetryPolicy,
    retries: Vec<Retry>,
    /// When posting gives up (see [`PostOptions::deadline`]).
    deadline: Instant,
    budget: Duration,
    /// Per-request timeout, cut to what is left before the deadline.
    timeout: Duration,
}

impl Api {
    pub(crate) fn new(target: &Target, opts: &PostOptions) -> Result<Self, PublishError> {
        let base = Url::parse(&target.api_url).map_err(|e| PublishError::BadValue {
            source_name: "--api-url".into(),
            message: format!("`{}` is not a URL: {e}", target.api_url),
        })?;
        let token = target.token.clone();
        let bad_token = || PublishError::BadValue {
            source_name: token.var.to_string(),
            message: "holds characters that cannot be sent in an HTTP header".into(),
        };
        let mut headers = HeaderMap::new();
        let (name, value) = match token.kind {
            TokenKind::Bearer => (AUTHORIZATION, format!("Bearer {}", token.secret.expose())),
            TokenKind::GitLabPrivate => (
                HeaderName::from_static("private-token"),
                token.secret.expose().to_string(),
            ),
            TokenKind::GitLabJob => (
                HeaderName::from_static("job-token"),
                token.secret.expose().to_string(),
            ),
        };
        let mut value = HeaderValue::from_str(&value).map_err(|_| bad_token())?;
        // Sensitive values are left out of the HTTP stack's own Debug output.
        value.set_sensitive(true);
        headers.insert(name, value);
        if target.provider == Provider::GitHub {
            headers.insert(
                ACCEPT,
                HeaderValue::from_static("application/vnd.github+json"),
            );
            headers.insert(
                HeaderName::from_static("x-github-api-version"),
                HeaderValue::from_static("2022-11-28"),
            );
        }
        let origin = base.origin();
        let mut builder = Client::builder();
        // A proxy from HTTPS_PROXY is honoured, except for an API on this machine, which no
        // proxy can reach.
        if is_loopback(&base) {
            builder = builder.no_proxy();
        }
        let client = builder
            .user_agent(concat!("bench/", env!("CARGO_PKG_VERSION")))
            .timeout(opts.timeout)
            .connect_timeout(opts.timeout.min(Duration::from_secs(10)))
            // Follow redirects only within the API's own origin: GitLab's token headers are
            // not ones the HTTP stack strips on a cross-host redirect.
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().len() >= 5 || attempt.url().origin() != origin {
                    attempt.stop()
                } else {
                    attempt.follow()
                }
            }))
            .build()
            .map_err(|e| PublishError::Transport {
                method: "-".into(),
                url: target.api_url.clone(),
                message: format!("cannot build the HTTP client: {}", error_chain(&e)),
            })?;
        Ok(Api {
            client,
            provider: target.provider,
            base,
            headers,
            token,
            policy: opts.retry.clone(),
            retries: Vec::new(),
            deadline: Instant::now() + opts.deadline,
            budget: opts.deadline,
            timeout: opts.timeout,
        })
    }

    /// The API root joined with path segments; each segment is percent-encoded whole, so a
    /// GitLab project path `group/project` becomes `group%2Fproject` as the API wants.
    pub(crate) fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    /// A pagination link from a response, accepted only on the API's own origin so the
    /// token is never sent elsewhere.
    pub(crate) fn same_origin(&self, link: &str, method: &Method) -> Result<Url, PublishError> {
        let bad = |message: String| PublishError::Response {
            method: method.to_string(),
            path: self.base.path().to_string(),
            message,
        };
        let url = Url::parse(link).map_err(|e| bad(format!("bad pagination link: {e}")))?;
        if url.origin() != self.base.origin() {
            return Err(bad(format!(
                "pagination link leaves the API's host ({})",
                url.origin().ascii_serialization()
            )));
        }
        Ok(url)
    }

    pub(crate) fn take_retries(&mut self) -> Vec<Retry> {
        std::mem::take(&mut self.retries)
    }

    /// Sends one request, retrying as the policy and `replay` allow; returns the 2xx answer
    /// or the error the last answer amounts to.
    pub(crate) fn send(
        &mut self,
        method: Method,
        url: &Url,
        body: Option<&serde_json::Value>,
        replay: Replay,
    ) -> Result<Response, PublishError> {
        let mut attempt = 0u32;
        let mut last_reason: Option<String> = None;
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.past_deadline(&method, url, attempt, last_reason));
            }
            let mut req = self
                .client
                .request(method.clone(), url.clone())
                .timeout(self.timeout.min(left))
                .headers(self.headers.clone());
            if let Some(body) = body {
                req = req.json(body);
            }
            let outcome = req.send();
            let can_retry = attempt < self.policy.max_retries;
            match outcome {
                Err(e) => {
                    // Without a connection the server surely did not act; a timeout or a
                    // dropped answer may have followed a write.
                    let retryable = e.is_connect()
                        || (replay == Replay::Safe && (e.is_timeout() || e.is_request()));
                    if retryable && can_retry {
                        let reason = if e.is_connect() {
                            "connection failed"
                        } else {
                            "no answer"
                        };
                        if !self.wait(&method, url, reason.into(), self.backoff(attempt)) {
                            return Err(self.past_deadline(
                                &method,
                                url,
                                attempt + 1,
                                Some(reason.into()),
                            ));
                        }
                        attempt += 1;
                        last_reason = Some(reason.into());
                        continue;
                    }
                    if e.is_timeout() && self.deadline <= Instant::now() {
                        return Err(self.past_deadline(
                            &method,
                            url,
                            attempt + 1,
                            Some("no answer".into()),
                        ));
                    }
                    return Err(PublishError::Transport {
                        method: method.to_string(),
                        url: url.as_str().to_string(),
                        message: self.token.secret.scrub(&error_chain(&e)),
                    });
                }
                Ok(resp) => {
                    let status = resp.status();
                    let headers = resp.headers().clone();
                    let final_url = resp.url().clone();
                    let text = resp.text().unwrap_or_default();
                    if status.is_success() {
                        return Ok(Response {
                            headers,
                            body: text,
                            url: final_url,
                        });
                    }
                    if is_rate_limit(status, &headers) {
                        let wait = rate_limit_wait(&headers).unwrap_or(self.backoff(attempt));
                        if wait > self.policy.max_wait {
                            return Err(PublishError::RateLimited {
                                provider: self.provider,
                                method: method.to_string(),
                                path: url.path().to_string(),
                                wait_s: wait.as_secs(),
                                cap_s: self.policy.max_wait.as_secs(),
                            });
                        }
                        let reason = format!("HTTP {}", status.as_u16());
                        if can_retry && self.wait(&method, url, reason.clone(), wait) {
                            attempt += 1;
                            last_reason = Some(reason);
                            continue;
                        }
                    } else if status.is_server_error() && replay == Replay::Safe && can_retry {
                        let wait = retry_after(&headers)
                            .unwrap_or(self.backoff(attempt))
                            .min(self.policy.max_wait);
                        let reason = format!("HTTP {}", status.as_u16());
                        if self.wait(&method, url, reason.clone(), wait) {
                            attempt += 1;
                            last_reason = Some(reason);
                            continue;
                        }
                    }
                    return Err(self.status_error(&method, url, status, &text));
                }
            }
        }
    }

    fn backoff(&self, attempt: u32) -> Duration {
        self.policy
            .base_backoff
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.policy.max_wait)
    }

    /// Waits before a retry, saying so on stderr (a CI log shows why the step takes long);
    /// false, without waiting, when the retry could not start before the deadline.
    fn wait(&mut self, method: &Method, url: &Url, reason: String, wait: Duration) -> bool {
        if Instant::now() + wait >= self.deadline {
            return false;
        }
        eprintln!(
            "bench report post: {method} {} after {reason}; retrying in {:.1} s",
            url.path(),
            wait.as_secs_f64()
        );
        self.retries.push(Retry {
            method: method.to_string(),
            path: url.path().to_string(),
            reason,
            wait,
        });
        std::thread::sleep(wait);
        true
    }

    /// The error of a request still unanswered when the deadline came.
    fn past_deadline(
        &self,
        method: &Method,
        url: &Url,
        attempts: u32,
        reason: Option<String>,
    ) -> PublishError {
        PublishError::Transport {
            method: method.to_string(),
            url: url.as_str().to_string(),
            message: format!(
                "gave up after {attempts} attempt(s) ({}): posting may take at most {:.0} s in all (--timeout)",
                reason.as_deref().unwrap_or("no answer"),
                self.budget.as_secs_f64()
            ),
        }
    }

    /// The error a final non-2xx answer amounts to, with the API's own message (scrubbed)
    /// and, for 401/403/404, what to check.
    fn status_error(
        &self,
        method: &Method,
        url: &Url,
        status: StatusCode,
        body: &str,
    ) -> PublishError {
        let message = self.token.secret.scrub(&api_message(status, body));
        let method = method.to_string();
        let path = url.path().to_string();
        let var = self.token.var;
        match status.as_u16() {
            401 | 403 => PublishError::Auth {
                provider: self.provider,
                method,
                path,
                status: status.as_u16(),
                message,
                hint: match self.token.kind {
                    TokenKind::Bearer => format!(
                        "{var}: it must be valid and may write pull-request comments (workflow `permissions: pull-requests: write`; a pull request from a fork only gets a read-only token)"
                    ),
                    TokenKind::GitLabPrivate => format!(
                        "{var}: it must be an access token with the api scope and at least the Reporter role on the project"
                    ),
                    TokenKind::GitLabJob => format!(
                        "{var}: GitLab usually does not let the CI job token write merge-request notes; set GITLAB_TOKEN to a project access token with the api scope"
                    ),
                },
            },
            404 => PublishError::Http {
                provider: self.provider,
                method,
                path,
                status: 404,
                message,
                hint: format!(
                    "; check the repository or project (--repo), the pull-request number (--pr), and that {var} can see the repository"
                ),
            },
            code => PublishError::Http {
                provider: self.provider,
                method,
                path,
                status: code,
                message,
                hint: String::new(),
            },
        }
    }
}

fn is_loopback(url: &Url) -> bool {
    match url.host_str() {
        Some(host) if host.eq_ignore_ascii_case("localhost") => true,
        Some(host) => host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback()),
        None => false,
    }
}

/// 429 always; 403 when GitHub says the quota is spent (`x-ratelimit-remaining: 0`) or asks
/// to wait (`retry-after`, its secondary rate limit). Any other 403 is a permission error.
fn is_rate_limit(status: StatusCode, headers: &HeaderMap) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS
        || (status == StatusCode::FORBIDDEN
            && (header(headers, "x-ratelimit-remaining") == Some("0")
                || header(headers, "retry-after").is_some()))
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

/// `Retry-After` in seconds (both APIs send seconds; an HTTP date falls back to backoff).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    header(headers, "retry-after")?
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

/// `Retry-After`, else the time until `x-ratelimit-reset` (epoch seconds; GitHub, and
/// GitLab's `ratelimit-reset`).
fn rate_limit_wait(headers: &HeaderMap) -> Option<Duration> {
    if let Some(d) = retry_after(headers) {
        return Some(d);
    }
    let reset = header(headers, "x-ratelimit-reset")
        .or_else(|| header(headers, "ratelimit-reset"))?
        .parse::<u64>()
        .ok()?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(Duration::from_secs(reset.saturating_sub(now) + 1))
}

/// The API's own explanation: GitHub's and GitLab's `message`, GitLab's `error`, else the
/// start of the body, else the status text.
fn api_message(status: StatusCode, body: &str) -> String {
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(body) {
        for key in ["message", "error", "error_description"] {
            match v.get(key) {
                Some(serde_json::Value::String(s)) => return s.clone(),
                Some(other) if !other.is_null() => return other.to_string(),
                _ => {}
            }
        }
    }
    let text: String = body.trim().chars().take(200).collect();
    if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("no explanation")
            .to_string()
    } else {
        text
    }
}

/// An error and its sources on one line (the HTTP stack nests the useful part).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

/// The `rel="next"` URL of a `Link` header (RFC 8288), as GitHub and GitLab send it:
/// `<https://api/...&page=2>; rel="next", <...>; rel="last"`.
pub(crate) fn next_link(link: &str) -> Option<String> {
    link.split(',').find_map(|part| {
        let (url, params) = part.trim().split_once(';')?;
        let url = url.trim().strip_prefix('<')?.strip_suffix('>')?;
        let is_next = params.split(';').any(|p| {
            let p = p.trim();
            p.strip_prefix("rel=")
                .map(|v| v.trim_matches('"').split_whitespace().any(|r| r == "next"))
                .unwrap_or(false)
        });
        is_next.then(|| url.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_header() {
        let h = r#"<https://api.github.com/repositories/1/issues/2/comments?page=2>; rel="next", <https://api.github.com/repositories/1/issues/2/comments?page=5>; rel="last""#;
        assert_eq!(
            next_link(h).as_deref(),
            Some("https://api.github.com/repositories/1/issues/2/comments?page=2")
        );
        let last = r#"<https://x/?page=1>; rel="first", <https://x/?page=4>; rel="prev""#;
        assert_eq!(next_link(last), None);
        assert_eq!(next_link(""), None);
        assert_eq!(
            next_link(r#"<https://x/?page=3>; rel="prev next""#).as_deref(),
            Some("https://x/?page=3")
        );
    }

    #[test]
    fn loopback_hosts() {
        for (url, local) in [
            ("http://127.0.0.1:8080/api", true),
            ("http://localhost/api/v4", true),
            ("http://[::1]:9/", true),
            ("https://api.github.com", false),
            ("https://10.0.0.1/api/v3", false),
        ] {
            assert_eq!(is_loopback(&Url::parse(url).unwrap()), local, "{url}");
        }
    }

    #[test]
    fn rate_limit_classes() {
        let mut h = HeaderMap::new();
        assert!(is_rate_limit(StatusCode::TOO_MANY_REQUESTS, &h));
        assert!(!is_rate_limit(StatusCode::FORBIDDEN, &h));
        h.insert("x-ratelimit-remaining", HeaderValue::from_static("0"));
        assert!(is_rate_limit(StatusCode::FORBIDDEN, &h));
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("3"));
        assert!(is_rate_limit(StatusCode::FORBIDDEN, &h));
        assert_eq!(rate_limit_wait(&h), Some(Duration::from_secs(3)));
    }

    #[test]
    fn messages_from_bodies() {
        assert_eq!(
            api_message(StatusCode::UNAUTHORIZED, r#"{"message":"Bad credentials"}"#),
            "Bad credentials"
        );
        assert_eq!(
            api_message(
                StatusCode::BAD_REQUEST,
                r#"{"message":{"note":["is too long"]}}"#
            ),
            r#"{"note":["is too long"]}"#
        );
        assert_eq!(api_message(StatusCode::BAD_GATEWAY, ""), "Bad Gateway");
    }
}
