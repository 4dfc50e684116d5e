//! Where to post: the provider, API URL, repository or project, pull-request number and
//! token, resolved from `bench report post` flags first and the CI environment second.
//!
//! GitHub Actions gives GITHUB_API_URL (so GitHub Enterprise Server works unchanged),
//! GITHUB_REPOSITORY, the event payload at GITHUB_EVENT_PATH (the pull-request number and
//! head commit), GITHUB_REF and GITHUB_SHA. GitLab CI gives CI_API_V4_URL (self-hosted
//! instances work unchanged), CI_PROJECT_ID and, in merge-request pipelines only,
//! CI_MERGE_REQUEST_IID. The environment is read through an injected function so tests
//! need not touch the process environment. Nothing here makes a request.

use std::fmt;

use reqwest::Url;

use super::error::PublishError;
use super::types::CommentAction;
// Defined with the stage's other values (types.rs), where the error can name it without
// importing this file; re-exported so that `publish::target::Provider` keeps naming it.
pub use super::types::Provider;

/// A token. `Debug` and `Display` print `***`; the value is reachable only inside this
/// module tree, where it goes into a sensitive request header and nowhere else.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub(crate) fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with every occurrence of the secret replaced by `***`. Applied to every text
    /// that comes from outside (error messages of the HTTP stack, response bodies) before
    /// it is put into an error, in case a server or proxy echoes the token back.
    pub(crate) fn scrub(&self, text: &str) -> String {
        if self.0.is_empty() {
            text.to_string()
        } else {
            text.replace(&self.0, "***")
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// How the token is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// GitHub: `Authorization: Bearer <token>`.
    Bearer,
    /// GitLab personal, project or group access token: `PRIVATE-TOKEN: <token>`.
    GitLabPrivate,
    /// GitLab CI job token: `JOB-TOKEN: <token>`.
    GitLabJob,
}

/// A token and the variable it came from (named in messages about it).
#[derive(Debug, Clone)]
pub struct Token {
    pub secret: Secret,
    /// e.g. `GITHUB_TOKEN`; error messages tell the user to check this variable.
    pub var: &'static str,
    pub kind: TokenKind,
}

/// A resolved place to post to.
#[derive(Debug, Clone)]
pub struct Target {
    pub provider: Provider,
    /// API root without a trailing slash, e.g. `https://api.github.com`,
    /// `https://ghe.example.com/api/v3`, `https://gitlab.example.com/api/v4`.
    pub api_url: String,
    /// `owner/name` on GitHub; numeric id or `group/project` path on GitLab.
    pub repo: String,
    /// Pull-request number (GitHub) or merge-request iid (GitLab).
    pub number: u64,
    /// Commit for the optional commit status.
    pub sha: Option<String>,
    pub token: Token,
    /// Link to the CI run's artifacts, for the report body (the CLI passes it to the
    /// Markdown renderer) and the commit status.
    pub artifacts_url: Option<String>,
    /// Project web URL (GitLab), used to link the note in the log.
    pub web_url: Option<String>,
}

impl Target {
    /// A link to the comment when the API response carried none (GitLab notes).
    pub(crate) fn comment_url(&self, action: &CommentAction) -> Option<String> {
        let id = match action {
            CommentAction::Created { id }
            | CommentAction::Updated { id }
            | CommentAction::Unchanged { id } => *id,
            CommentAction::Skipped => return None,
        };
        match (self.provider, &self.web_url) {
            (Provider::GitLab, Some(web)) => Some(format!(
                "{}/-/merge_requests/{}#note_{id}",
                web.trim_end_matches('/'),
                self.number
            )),
            _ => None,
        }
    }
}

/// What `bench report post` was told about where to post (its flags, resolved by the CLI);
/// what is unset comes from the CI environment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TargetFlags {
    /// `--provider`; detected from the environment when unset.
    pub provider: Option<Provider>,
    pub api_url: Option<String>,
    pub repo: Option<String>,
    pub pr: Option<u64>,
    pub artifacts_url: Option<String>,
    pub sha: Option<String>,
}

/// Resolves the target from the flags, then the environment (`env("NAME")`, where an empty
/// value counts as unset). With no token or no pull request it returns
/// [`PublishError::Missing`] naming every missing piece and the flag or variable that
/// supplies it; no request is made by this function in any case.
pub fn resolve_target(
    args: &TargetFlags,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Target, PublishError> {
    let get = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let provider = match args.provider {
        Some(p) => p,
        None if get("GITHUB_ACTIONS").as_deref() == Some("true") => Provider::GitHub,
        None if get("GITLAB_CI").as_deref() == Some("true") => Provider::GitLab,
        None if get("GITHUB_REPOSITORY").is_some() => Provider::GitHub,
        None if get("CI_PROJECT_ID").is_some() => Provider::GitLab,
        None => return Err(PublishError::NoProvider),
    };
    match provider {
        Provider::GitHub => github(args, &get),
        Provider::GitLab => gitlab(args, &get),
    }
}

fn github(
    args: &TargetFlags,
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<Target, PublishError> {
    let (api_url, api_from) = match (&args.api_url, get("GITHUB_API_URL")) {
        (Some(u), _) => (u.clone(), "--api-url"),
        (None, Some(u)) => (u, "GITHUB_API_URL"),
        (None, None) => ("https://api.github.com".to_string(), "--api-url"),
    };
    let api_url = check_api_url(&api_url, api_from)?;
    let mut missing = Vec::new();

    let repo = match (&args.repo, get("GITHUB_REPOSITORY")) {
        (Some(r), _) => Some((r.clone(), "--repo")),
        (None, Some(r)) => Some((r, "GITHUB_REPOSITORY")),
        (None, None) => {
            missing.push("no repository (pass --repo OWNER/NAME or set GITHUB_REPOSITORY)".into());
            None
        }
    };
    if let Some((repo, from)) = &repo {
        let parts: Vec<&str> = repo.split('/').collect();
        if parts.len() != 2 || parts.iter().any(|p| p.is_empty()) {
            return Err(PublishError::BadValue {
                source_name: from.to_string(),
                message: format!("`{repo}` is not OWNER/NAME"),
            });
        }
    }

    let event = match get("GITHUB_EVENT_PATH") {
        Some(path) => read_event(&path)?,
        None => Event::default(),
    };
    let from_ref = get("GITHUB_REF").and_then(|r| pr_from_ref(&r));
    let number = args.pr.or(event.number).or(from_ref);
    if number.is_none() {
        let why = match get("GITHUB_EVENT_NAME") {
            Some(name) => format!(" (this run's event is `{name}`, not a pull request)"),
            None => String::new(),
        };
        missing.push(format!(
            "no pull-request number{why} (pass --pr N, or run on a pull_request event: GITHUB_EVENT_PATH or GITHUB_REF=refs/pull/N/merge)"
        ));
    }

    let token = match get("GITHUB_TOKEN") {
        Some(t) => Some(Token {
            secret: Secret::new(t.trim()),
            var: "GITHUB_TOKEN",
            kind: TokenKind::Bearer,
        }),
        None => {
            missing.push("no token (set GITHUB_TOKEN; in a workflow step: `env: GITHUB_TOKEN: ${{ secrets.GITHUB_TOKEN }}`)".into());
            None
        }
    };

    let (Some((repo, _)), Some(number), Some(token)) = (repo, number, token) else {
        return Err(PublishError::Missing {
            provider: Provider::GitHub,
            missing,
        });
    };
    let artifacts_url = args.artifacts_url.clone().or_else(|| {
        let server = get("GITHUB_SERVER_URL")?;
        let run = get("GITHUB_RUN_ID")?;
        Some(format!(
            "{}/{repo}/actions/runs/{run}",
            server.trim_end_matches('/')
        ))
    });
    Ok(Target {
        provider: Provider::GitHub,
        api_url,
        repo,
        number,
        sha: args
            .sha
            .clone()
            .or(event.head_sha)
            .or_else(|| get("GITHUB_SHA")),
        token,
        artifacts_url,
        web_url: None,
    })
}

fn gitlab(
    args: &TargetFlags,
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<Target, PublishError> {
    let (api_url, api_from) = match (&args.api_url, get("CI_API_V4_URL"), get("CI_SERVER_URL")) {
        (Some(u), _, _) => (u.clone(), "--api-url"),
        (None, Some(u), _) => (u, "CI_API_V4_URL"),
        (None, None, Some(server)) => (
            format!("{}/api/v4", server.trim_end_matches('/')),
            "CI_SERVER_URL",
        ),
        (None, None, None) => ("https://gitlab.com/api/v4".to_string(), "--api-url"),
    };
    let api_url = check_api_url(&api_url, api_from)?;
    let mut missing = Vec::new();

    let repo = args.repo.clone().or_else(|| get("CI_PROJECT_ID"));
    if repo.is_none() {
        missing.push("no project (pass --repo ID-OR-PATH or set CI_PROJECT_ID)".into());
    }
    let number = args
        .pr
        .or_else(|| get("CI_MERGE_REQUEST_IID").and_then(|v| v.trim().parse::<u64>().ok()));
    if number.is_none() {
        missing.push(
            "no merge-request iid (pass --pr IID, or run in a merge-request pipeline, which sets CI_MERGE_REQUEST_IID)"
                .into(),
        );
    }
    let token = match (get("GITLAB_TOKEN"), get("CI_JOB_TOKEN")) {
        (Some(t), _) => Some(Token {
            secret: Secret::new(t.trim()),
            var: "GITLAB_TOKEN",
            kind: TokenKind::GitLabPrivate,
        }),
        (None, Some(t)) => Some(Token {
            secret: Secret::new(t.trim()),
            var: "CI_JOB_TOKEN",
            kind: TokenKind::GitLabJob,
        }),
        (None, None) => {
            missing.push(
                "no token (set GITLAB_TOKEN to an access token with the api scope, or CI_JOB_TOKEN)"
                    .into(),
            );
            None
        }
    };
    let (Some(repo), Some(number), Some(token)) = (repo, number, token) else {
        return Err(PublishError::Missing {
            provider: Provider::GitLab,
            missing,
        });
    };
    let artifacts_url = args.artifacts_url.clone().or_else(|| {
        get("CI_JOB_URL").map(|u| format!("{}/artifacts/browse", u.trim_end_matches('/')))
    });
    // The project URL names the project the note lands on only when the project came from
    // the environment too.
    let web_url = if args.repo.is_none() {
        get("CI_PROJECT_URL")
    } else {
        None
    };
    Ok(Target {
        provider: Provider::GitLab,
        api_url,
        repo,
        number,
        sha: args.sha.clone().or_else(|| get("CI_COMMIT_SHA")),
        token,
        artifacts_url,
        web_url,
    })
}

fn check_api_url(url: &str, from: &str) -> Result<String, PublishError> {
    let trimmed = url.trim().trim_end_matches('/');
    match Url::parse(trimmed) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {
            Ok(trimmed.to_string())
        }
        Ok(_) => Err(PublishError::BadValue {
            source_name: from.to_string(),
            message: format!("`{trimmed}` is not an http(s) URL"),
        }),
        Err(e) => Err(PublishError::BadValue {
            source_name: from.to_string(),
            message: format!("`{trimmed}` is not a URL: {e}"),
        }),
    }
}

/// What the GitHub event payload tells about the pull request.
#[derive(Debug, Default)]
struct Event {
    number: Option<u64>,
    head_sha: Option<String>,
}

/// Reads the pull-request number and head commit from the event payload: `pull_request`
/// events (and `pull_request_target`) carry `pull_request`; comments on a pull request
/// carry `issue` with an `issue.pull_request` key. Other events carry neither.
fn read_event(path: &str) -> Result<Event, PublishError> {
    let text = crate::files::read_to_string_bounded(
        std::path::Path::new(path),
        crate::files::MAX_CONFIG_BYTES,
    )
    .map_err(|e| PublishError::EventFile {
        path: path.to_string(),
        message: e.to_string(),
    })?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| PublishError::EventFile {
            path: path.to_string(),
            message: format!("not JSON: {e}"),
        })?;
    if let Some(pr) = v.get("pull_request") {
        return Ok(Event {
            number: pr.get("number").and_then(|n| n.as_u64()),
            head_sha: pr
                .pointer("/head/sha")
                .and_then(|s| s.as_str())
                .map(str::to_string),
        });
    }
    if let Some(issue) = v.get("issue") {
        if issue.get("pull_request").is_some() {
            return Ok(Event {
                number: issue.get("number").and_then(|n| n.as_u64()),
                head_sha: None,
            });
        }
    }
    Ok(Event::default())
}

/// `refs/pull/123/merge` or `refs/pull/123/head` -> 123.
fn pr_from_ref(r: &str) -> Option<u64> {
    let rest = r.strip_prefix("refs/pull/")?;
    let (n, tail) = rest.split_once('/')?;
    if tail == "merge" || tail == "head" {
        n.parse().ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn args() -> TargetFlags {
        TargetFlags::default()
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k: &str| map.get(k).cloned()
    }

    #[test]
    fn github_from_actions_environment() {
        let dir = tempfile::tempdir().unwrap();
        let event = dir.path().join("event.json");
        std::fs::write(
            &event,
            r#"{"action":"labeled","pull_request":{"number":42,"head":{"sha":"abc123"}}}"#,
        )
        .unwrap();
        let e = env(&[
            ("GITHUB_ACTIONS", "true"),
            ("GITHUB_API_URL", "https://ghe.example.com/api/v3/"),
            ("GITHUB_SERVER_URL", "https://ghe.example.com"),
            ("GITHUB_REPOSITORY", "org/repo"),
            ("GITHUB_RUN_ID", "99"),
            ("GITHUB_EVENT_PATH", event.to_str().unwrap()),
            ("GITHUB_REF", "refs/pull/7/merge"),
            ("GITHUB_SHA", "mergesha"),
            ("GITHUB_TOKEN", "ghs_secret\n"),
        ]);
        let t = resolve_target(&args(), &e).unwrap();
        assert_eq!(t.provider, Provider::GitHub);
        assert_eq!(t.api_url, "https://ghe.example.com/api/v3");
        assert_eq!(t.repo, "org/repo");
        // The event payload wins over GITHUB_REF, and its head sha over the merge sha.
        assert_eq!(t.number, 42);
        assert_eq!(t.sha.as_deref(), Some("abc123"));
        assert_eq!(t.token.secret.expose(), "ghs_secret");
        assert_eq!(t.token.var, "GITHUB_TOKEN");
        assert_eq!(
            t.artifacts_url.as_deref(),
            Some("https://ghe.example.com/org/repo/actions/runs/99")
        );
        let debug = format!("{t:?}");
        assert!(!debug.contains("ghs_secret"), "{debug}");
    }

    #[test]
    fn github_number_from_ref_and_flags_win() {
        let e = env(&[
            ("GITHUB_REPOSITORY", "org/repo"),
            ("GITHUB_REF", "refs/pull/7/merge"),
            ("GITHUB_TOKEN", "t0ken"),
        ]);
        let t = resolve_target(&args(), &e).unwrap();
        assert_eq!(t.number, 7);
        assert_eq!(t.api_url, "https://api.github.com");
        let mut a = args();
        a.pr = Some(9);
        a.repo = Some("me/fork".into());
        a.api_url = Some("http://127.0.0.1:8080".into());
        a.sha = Some("s".into());
        let t = resolve_target(&a, &e).unwrap();
        assert_eq!(
            (t.number, t.repo.as_str(), t.api_url.as_str()),
            (9, "me/fork", "http://127.0.0.1:8080")
        );
        assert_eq!(t.sha.as_deref(), Some("s"));
    }

    #[test]
    fn github_missing_pieces_are_named() {
        let e = env(&[
            ("GITHUB_ACTIONS", "true"),
            ("GITHUB_REPOSITORY", "org/repo"),
            ("GITHUB_EVENT_NAME", "schedule"),
            ("GITHUB_REF", "refs/heads/main"),
            ("GITHUB_TOKEN", ""),
        ]);
        let err = resolve_target(&args(), &e).unwrap_err();
        let msg = err.to_string();
        assert!(err.is_bad_input());
        assert!(msg.contains("GITHUB_TOKEN"), "{msg}");
        assert!(msg.contains("--pr"), "{msg}");
        assert!(msg.contains("`schedule`"), "{msg}");
        assert!(!msg.contains("repository"), "{msg}");
    }

    #[test]
    fn issue_comment_event_on_a_pull_request() {
        let dir = tempfile::tempdir().unwrap();
        let event = dir.path().join("event.json");
        std::fs::write(&event, r#"{"issue":{"number":5,"pull_request":{}}}"#).unwrap();
        let e = env(&[
            ("GITHUB_REPOSITORY", "o/r"),
            ("GITHUB_EVENT_PATH", event.to_str().unwrap()),
            ("GITHUB_TOKEN", "x"),
        ]);
        assert_eq!(resolve_target(&args(), &e).unwrap().number, 5);
    }

    #[test]
    fn bad_values_name_their_source() {
        let e = env(&[("GITHUB_REPOSITORY", "noslash"), ("GITHUB_TOKEN", "x")]);
        let mut a = args();
        a.pr = Some(1);
        let msg = resolve_target(&a, &e).unwrap_err().to_string();
        assert!(msg.starts_with("GITHUB_REPOSITORY:"), "{msg}");
        a.api_url = Some("ftp://x".into());
        let msg = resolve_target(&a, &e).unwrap_err().to_string();
        assert!(msg.starts_with("--api-url:"), "{msg}");
        let e = env(&[
            ("GITHUB_REPOSITORY", "o/r"),
            ("GITHUB_EVENT_PATH", "/nonexistent/event.json"),
        ]);
        let msg = resolve_target(&args(), &e).unwrap_err().to_string();
        assert!(msg.contains("/nonexistent/event.json"), "{msg}");
    }

    #[test]
    fn gitlab_from_ci_environment() {
        let e = env(&[
            ("GITLAB_CI", "true"),
            ("CI_API_V4_URL", "https://gitlab.example.com/api/v4"),
            ("CI_PROJECT_ID", "123"),
            ("CI_PROJECT_URL", "https://gitlab.example.com/g/p"),
            ("CI_MERGE_REQUEST_IID", "17"),
            ("CI_JOB_URL", "https://gitlab.example.com/g/p/-/jobs/5"),
            ("CI_COMMIT_SHA", "deadbeef"),
            ("CI_JOB_TOKEN", "jobtok"),
        ]);
        let t = resolve_target(&args(), &e).unwrap();
        assert_eq!(t.provider, Provider::GitLab);
        assert_eq!(t.api_url, "https://gitlab.example.com/api/v4");
        assert_eq!((t.repo.as_str(), t.number), ("123", 17));
        assert_eq!(t.token.kind, TokenKind::GitLabJob);
        assert_eq!(t.token.var, "CI_JOB_TOKEN");
        assert_eq!(
            t.artifacts_url.as_deref(),
            Some("https://gitlab.example.com/g/p/-/jobs/5/artifacts/browse")
        );
        assert_eq!(
            t.comment_url(&CommentAction::Created { id: 3 }).as_deref(),
            Some("https://gitlab.example.com/g/p/-/merge_requests/17#note_3")
        );
    }

    #[test]
    fn gitlab_prefers_gitlab_token_and_derives_api_url() {
        let e = env(&[
            ("CI_PROJECT_ID", "123"),
            ("CI_SERVER_URL", "https://git.corp/"),
            ("CI_MERGE_REQUEST_IID", "2"),
            ("CI_JOB_TOKEN", "jobtok"),
            ("GITLAB_TOKEN", "glpat-x"),
        ]);
        let t = resolve_target(&args(), &e).unwrap();
        assert_eq!(t.api_url, "https://git.corp/api/v4");
        assert_eq!(t.token.kind, TokenKind::GitLabPrivate);
        assert_eq!(t.token.var, "GITLAB_TOKEN");
    }

    #[test]
    fn gitlab_branch_pipeline_says_what_is_missing() {
        let e = env(&[("GITLAB_CI", "true"), ("CI_PROJECT_ID", "123")]);
        let msg = resolve_target(&args(), &e).unwrap_err().to_string();
        assert!(msg.contains("CI_MERGE_REQUEST_IID"), "{msg}");
        assert!(msg.contains("GITLAB_TOKEN"), "{msg}");
        assert!(msg.contains("CI_JOB_TOKEN"), "{msg}");
    }

    #[test]
    fn no_provider() {
        let err = resolve_target(&args(), &env(&[])).unwrap_err();
        assert!(matches!(err, PublishError::NoProvider));
        assert!(err.to_string().contains("--provider"));
    }

    #[test]
    fn secret_redacts_and_scrubs() {
        let s = Secret::new("ghp_abc");
        assert_eq!(format!("{s} {s:?}"), "*** Secret(***)");
        assert_eq!(s.scrub("bad token ghp_abc!"), "bad token ***!");
        assert_eq!(Secret::new("").scrub("text"), "text");
    }

    #[test]
    fn refs() {
        assert_eq!(pr_from_ref("refs/pull/12/merge"), Some(12));
        assert_eq!(pr_from_ref("refs/pull/12/head"), Some(12));
        assert_eq!(pr_from_ref("refs/heads/pull/12/merge"), None);
        assert_eq!(pr_from_ref("refs/pull/x/merge"), None);
    }
}
