//! `bench::publish` against a local server speaking the GitHub REST API: pull-request
//! comments created then updated in place, pagination, retries, rate limits, auth errors,
//! commit statuses, and the token kept out of every text.

mod publish_server;

use std::collections::HashMap;
use std::time::Duration;

use bench::cli::{Cli, Command, PostArgs, ReportCommand};
use bench::publish::{
    post, resolve_target, CommentAction, CommitStatus, Marker, PostOptions, PublishError,
    RetryPolicy, StatusOutcome, StatusState, Target,
};
use clap::Parser;
use publish_server::{FakeApi, Fault, Flavor};

const TOKEN: &str = "ghs_TESTtoken0123456789abcdef";

fn post_args(extra: &[&str]) -> PostArgs {
    let argv = ["bench", "report", "post", "results/run"]
        .into_iter()
        .chain(extra.iter().copied());
    match Cli::try_parse_from(argv).expect("valid arguments").command {
        Command::Report(r) => match r.command {
            Some(ReportCommand::Post(p)) => p,
            other => panic!("not a post command: {other:?}"),
        },
        other => panic!("not a report command: {other:?}"),
    }
}

/// The environment of a `pull_request` job on GitHub Enterprise, pointed at the server.
fn actions_env(api: &FakeApi, token: &str) -> HashMap<String, String> {
    [
        ("GITHUB_ACTIONS", "true"),
        ("GITHUB_API_URL", api.base.as_str()),
        ("GITHUB_SERVER_URL", "https://ghe.example.com"),
        ("GITHUB_REPOSITORY", "o/r"),
        ("GITHUB_RUN_ID", "555"),
        ("GITHUB_REF", "refs/pull/42/merge"),
        ("GITHUB_SHA", "0123abcd"),
        ("GITHUB_TOKEN", token),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn target(api: &FakeApi, extra: &[&str]) -> Target {
    let env = actions_env(api, TOKEN);
    resolve_target(&post_args(extra).target_flags(), &|k: &str| {
        env.get(k).cloned()
    })
    .expect("target")
}

fn fast() -> PostOptions {
    PostOptions {
        retry: RetryPolicy {
            max_retries: 3,
            base_backoff: Duration::from_millis(10),
            max_wait: Duration::from_secs(60),
        },
        ..PostOptions::default()
    }
}

fn marker() -> Marker {
    Marker::new("nightly-h100", "h100-sxm-80gb")
}

const MARKER_LINE: &str = "<!-- bench-report matrix=nightly-h100 hardware=h100-sxm-80gb -->";

#[test]
fn creates_then_updates_in_place() {
    let api = FakeApi::start(Flavor::GitHub, TOKEN, 30);
    api.add_comment("LGTM", false);
    let t = target(&api, &[]);

    let first = post(&t, "## bench: 1 regression\n", &marker(), true, &fast()).unwrap();
    let CommentAction::Created { id } = first.action else {
        panic!("expected a new comment, got {first:?}");
    };
    assert_eq!(
        first.url.as_deref(),
        Some(format!("{}/o/r/pull/42#issuecomment-{id}", api.base).as_str())
    );

    let seen = api.seen();
    assert_eq!(seen.len(), 2, "{seen:#?}");
    let (list, create) = (&seen[0], &seen[1]);
    assert_eq!(list.method, "GET");
    assert_eq!(list.url, "/repos/o/r/issues/42/comments?per_page=100");
    assert_eq!(create.method, "POST");
    assert_eq!(create.path(), "/repos/o/r/issues/42/comments");
    for req in [list, create] {
        assert_eq!(
            req.header("Authorization"),
            Some(format!("Bearer {TOKEN}").as_str())
        );
        assert_eq!(req.header("Accept"), Some("application/vnd.github+json"));
        assert_eq!(req.header("X-GitHub-Api-Version"), Some("2022-11-28"));
        assert!(req.header("User-Agent").unwrap().starts_with("bench/"));
    }
    assert_eq!(
        create.json()["body"],
        format!("{MARKER_LINE}\n\n## bench: 1 regression\n")
    );

    // The rerun after a fix edits the same comment.
    api.clear_seen();
    let second = post(&t, "## bench: all good\n", &marker(), true, &fast()).unwrap();
    assert_eq!(second.action, CommentAction::Updated { id });
    let writes = api.writes();
    assert_eq!(writes.len(), 1);
    assert_eq!(writes[0].method, "PATCH");
    assert_eq!(writes[0].path(), format!("/repos/o/r/issues/comments/{id}"));
    assert_eq!(
        writes[0].json()["body"],
        format!("{MARKER_LINE}\n\n## bench: all good\n")
    );
    let comments = api.comments();
    assert_eq!(comments.len(), 2, "the human comment and ours");
    assert_eq!(comments[0].body, "LGTM");
    assert!(comments[1].body.ends_with("all good\n"));

    // The same body again writes nothing.
    api.clear_seen();
    let third = post(&t, "## bench: all good\n", &marker(), true, &fast()).unwrap();
    assert_eq!(third.action, CommentAction::Unchanged { id });
    assert!(api.writes().is_empty());
}

#[test]
fn each_matrix_and_hardware_has_its_own_comment() {
    let api = FakeApi::start(Flavor::GitHub, TOKEN, 30);
    let t = target(&api, &[]);
    let h100 = post(&t, "h100", &marker(), true, &fast()).unwrap();
    let h200 = post(
        &t,
        "h200",
        &Marker::new("nightly-h100", "h200-sxm-141gb"),
        true,
        &fast(),
    )
    .unwrap();
    assert!(matches!(h100.action, CommentAction::Created { .. }));
    assert!(matches!(h200.action, CommentAction::Created { .. }));
    let again = post(&t, "h100 again", &marker(), true, &fast()).unwrap();
    assert!(matches!(again.action, CommentAction::Updated { .. }));
    let bodies: Vec<String> = api.comments().into_iter().map(|c| c.body).collect();
    assert_eq!(bodies.len(), 2);
    assert!(bodies[0].ends_with("h100 again"));
    assert!(bodies[1].ends_with("h200"));
}

#[test]
fn finds_its_comment_on_a_later_page() {
    // Pages of 3: our comment is the 5th, on page 2, reached through the Link header.
    let api = FakeApi::start(Flavor::GitHub, TOKEN, 3);
    for i in 0..4 {
        api.add_comment(&format!("review comment {i}"), false);
    }
    // A human quoting our comment is not ours.
    api.add_comment(&format!("> {MARKER_LINE}\n> old numbers"), false);
    let ours = api.add_comment(&format!("{MARKER_LINE}\n\nold report"), false);
    api.add_comment("another review comment", false);
    let t = target(&api, &[]);

    let outcome = post(&t, "new report", &marker(), true, &fast()).unwrap();
    assert_eq!(outcome.action, CommentAction::Updated { id: ours });
    let gets: Vec<String> = api
        .seen()
        .into_iter()
        .filter(|s| s.method == "GET")
        .map(|s| s.url)
        .collect();
    assert_eq!(
        gets,
        [
            "/repos/o/r/issues/42/comments?per_page=100",
            "/repositories/1/issues/42/comments?per_page=100&page=2",
            "/repositories/1/issues/42/comments?per_page=100&page=3",
        ]
    );
    assert_eq!(api.comments().len(), 7);
    assert!(api.comments()[4].body.starts_with("> "));
}

#[test]
fn retries_a_rate_limit_honouring_retry_after() {
    let api = FakeApi::start(Flavor::GitHub, TOKEN, 30);
    api.fault(
        Fault::new("GET", 429)
            .header("Retry-After", "1")
            .body(r#"{"message":"API rate limit exceeded"}"#),
    );
    // GitHub's primary limit: 403 with the quota spent.
    api.fault(
        Fault::new("POST", 403)
            .header("x-ratelimit-remaining", "0")
            .header("Retry-After", "1")
            .body(r#"{"message":"API rate limit exceeded"}"#),
    );
    let t = target(&api, &[]);
    let outcome = post(&t, "report", &marker(), true, &fast()).unwrap();
    assert!(matches!(outcome.action, CommentAction::Created { .. }));
    let waits: Vec<(String, String, Duration)> = outcome
        .retries
        .iter()
        .map(|r| (r.method.clone(), r.reason.clone(), r.wait))
        .collect();
    assert_eq!(
        waits,
        [
            ("GET".into(), "HTTP 429".into(), Duration::from_secs(1)),
            ("POST".into(), "HTTP 403".into(), Duration::from_secs(1)),
        ]
    );
    assert_eq!(api.comments().len(), 1, "the rate-limited create ran once");
    assert!(outcome.to_string().contains("after HTTP 429, waited 1.0 s"));
}

#[test]
fn a_rate_limit_longer_than_the_cap_fails_at_once() {
    let api = FakeApi::start(Flavor::GitHub, TOKEN, 30);
    api.fault(Fault::new("GET", 429).header("Retry-After", "3600"));
    let t = target(&api, &[]);
    let err = post(&t, "report", &marker(), true, &fast()).unwrap_err();
    assert!(matches!(
        err,
        PublishError::RateLimited { wait_s: 3600, .. }
    ));
    assert!(err.to_string().contains("3600 s"), "{err}");
    assert_eq!(api.seen().len(), 1);
}

#[test]
fn retries_server_errors() {
    let api = FakeApi::start(Flavor::GitHub, TOKEN, 30);
    let id = api.add_comment(&format!("{MARKER_LINE}\n\nold"), false);
    api.fault(Fault::new("GET", 502).body("<html>Bad Gateway</html>"));
    api.fault(Fault::new("PATCH", 503).header("Retry-After", "0"));
    let t = target(&api, &[]);
    let outcome = post(&t, "new", &marker(), true, &fast()).unwrap();
    assert_eq!(outcome.action, CommentAction::Updated { id });
    let reasons: Vec<&str> = outcome.retries.iter().map(|r| r.reason.as_str()).collect();
    assert_eq!(reasons, ["HTTP 502", "HTTP 503"]);
    assert_eq!(outcome.retries[0].wait, Duration::from_millis(10));
    assert_eq!(outcome.retries[1].wait, Duration::ZERO);
}

#[test]
fn persistent_server_errors_are_reported() {
    let api = FakeApi::start(Flavor::GitHub, TOKEN, 30);
    for _ in 0..4 {
        api.fault(Fault::new("GET", 500).body(r#"{"message":"Server Error"}"#));
    }
    let t = target(&api, &[]);
    let err = post(&t, "new", &marker(), true, &fast()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "GitHub answered GET /repos/o/r/issues/42/comments with HTTP 500: Server Error"
    );
    assert_eq!(api.seen().len(), 4, "one attempt and three retries");
}

#[test]
fn a_create_whose_answer_was_lost_is_not_duplicated() {
    let api = FakeApi::start(Flavor::GitHub, TOKEN, 30);
    // The server stores the comment, then the answer becomes a 502.
    api.fault(Fault::new("POST", 502).after_applying());
    let t = target(&api, &[]);
    let outcome = post(&t, "report", &marker(), true, &fast()).unwrap();
    assert!(
        matches!(outcome.action, CommentAction::Created { .. }),
        "{outcome:?}"
    );
    assert_eq!(api.comments().len(), 1);
    let methods: Vec<String> = api.seen().into_iter().map(|s| s.method).collect();
    assert_eq!(methods, ["GET", "POST", "GET"]);

    // A create the server refused before writing is simply made again.
    let api = FakeApi::start(Flavor::GitHub, TOKEN, 30);
    api.fault(Fault::new("POST", 503));
    let t = target(&api, &[]);
    let outcome = post(&t, "report", &marker(), true, &fast()).unwrap();
    assert!(matches!(outcome.action, CommentAction::Created { .. }));
    assert_eq!(api.comments().len(), 1);
}

#[test]
fn unauthorized_names_the_variable_and_not_the_token() {
    let api = FakeApi::start(Flavor::GitHub, "the-right-token", 30);
    let t = target(&api, &[]);
    let err = post(&t, "report", &marker(), true, &fast()).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, PublishError::Auth { status: 401, .. }));
    assert!(text.contains("HTTP 401: Bad credentials"), "{text}");
    assert!(text.contains("check GITHUB_TOKEN"), "{text}");
    assert!(text.contains("pull-requests: write"), "{text}");
    for shown in [text, format!("{err:?}"), format!("{t:?}")] {
        assert!(!shown.contains(TOKEN), "{shown}");
    }
    assert_eq!(api.seen().len(), 1, "a 401 is not retried");
}

#[test]
fn the_token_is_scrubbed_from_echoed_answers() {
    let api = FakeApi::start(Flavor::GitHub, TOKEN, 30);
    let id = api.add_comment(&format!("{MARKER_LINE}\n\nold"), false);
    api.fault(Fault::new("PATCH", 422).echoing_auth());
    let t = target(&api, &[]);
    let err = post(&t, "new", &marker(), true, &fast()).unwrap_err();
    let text = err.to_string();
    assert_eq!(
        text,
        format!(
            "GitHub answered PATCH /repos/o/r/issues/comments/{id} with HTTP 422: rejected request with credentials Bearer ***"
        )
    );
    assert!(!format!("{err:?}").contains(TOKEN));
}

#[test]
fn only_on_change_posts_nothing_when_nothing_changed() {
    let api = FakeApi::start(Flavor::GitHub, TOKEN, 30);
    let t = target(&api, &["--only-on-change"]);
    let opts = PostOptions {
        only_on_change: true,
        ..fast()
    };
    let outcome = post(&t, "all within tolerance", &marker(), false, &opts).unwrap();
    assert_eq!(outcome.action, CommentAction::Skipped);
    assert!(api.writes().is_empty());
    assert!(api.comments().is_empty());
    assert!(outcome.to_string().contains("posted nothing"));

    // Something changed: it posts.
    let outcome = post(&t, "1 regression", &marker(), true, &opts).unwrap();
    assert!(matches!(outcome.action, CommentAction::Created { .. }));
    // Back to no change: the earlier comment is brought up to date rather than left
    // showing a regression that is gone.
    let outcome = post(&t, "all within tolerance", &marker(), false, &opts).unwrap();
    assert!(matches!(outcome.action, CommentAction::Updated { .. }));
    assert!(api.comments()[0].body.ends_with("all within tolerance"));
}

#[test]
fn sets_a_commit_status_carrying_the_verdict() {
    let api = FakeApi::start(Flavor::GitHub, TOKEN, 30);
    let t = target(&api, &["--commit-status"]);
    let opts = PostOptions {
        commit_status: Some(CommitStatus {
            state: StatusState::Failure,
            description: format!("2 regressions in 12 cells {}", "x".repeat(200)),
        }),
        ..fast()
    };
    let outcome = post(&t, "report", &marker(), true, &opts).unwrap();
    assert_eq!(
        outcome.status,
        StatusOutcome::Set {
            context: "bench/nightly-h100/h100-sxm-80gb".into()
        }
    );
    let statuses = api.statuses();
    assert_eq!(statuses.len(), 1);
    let (sha, body) = &statuses[0];
    assert_eq!(sha, "0123abcd");
    assert_eq!(body["state"], "failure");
    assert_eq!(body["context"], "bench/nightly-h100/h100-sxm-80gb");
    assert_eq!(
        body["target_url"],
        "https://ghe.example.com/o/r/actions/runs/555"
    );
    let description = body["description"].as_str().unwrap();
    assert!(description.starts_with("2 regressions in 12 cells"));
    assert_eq!(description.chars().count(), 140);
}

#[test]
fn no_token_or_no_pull_request_makes_no_request() {
    let api = FakeApi::start(Flavor::GitHub, TOKEN, 30);
    let mut env = actions_env(&api, "");
    env.insert("GITHUB_REF".into(), "refs/heads/main".into());
    env.insert("GITHUB_EVENT_NAME".into(), "schedule".into());
    let err = resolve_target(&post_args(&[]).target_flags(), &|k: &str| {
        env.get(k).cloned()
    })
    .unwrap_err();
    let text = err.to_string();
    assert!(err.is_bad_input());
    assert!(
        text.starts_with("cannot post the report to GitHub: no pull-request number"),
        "{text}"
    );
    assert!(text.contains("--pr N"), "{text}");
    assert!(text.contains("set GITHUB_TOKEN"), "{text}");
    assert!(api.seen().is_empty());
}

#[test]
fn an_unreachable_api_is_reported_after_retries() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let env: HashMap<String, String> = [
        ("GITHUB_API_URL", format!("http://127.0.0.1:{port}")),
        ("GITHUB_REPOSITORY", "o/r".into()),
        ("GITHUB_REF", "refs/pull/42/merge".into()),
        ("GITHUB_TOKEN", TOKEN.into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let t = resolve_target(&post_args(&[]).target_flags(), &|k: &str| {
        env.get(k).cloned()
    })
    .unwrap();
    let err = post(&t, "report", &marker(), true, &fast()).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, PublishError::Transport { .. }), "{err:?}");
    assert!(
        text.starts_with(&format!(
            "GET http://127.0.0.1:{port}/repos/o/r/issues/42/comments?per_page=100 failed:"
        )),
        "{text}"
    );
    assert!(!text.contains(TOKEN));
}
