//! `bench::publish` against a local server speaking the GitLab REST API (v4): merge-request
//! notes created then updated in place, `X-Next-Page` pagination, both token headers, and
//! what a refused job token is told.

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

const TOKEN: &str = "glpat-TESTtoken0123456789";

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

/// A merge-request pipeline on a self-hosted instance; the project is addressed by path
/// through `--repo` (as a user outside CI would) or by CI_PROJECT_ID.
fn ci_env(api: &FakeApi, token_var: &str, token: &str) -> HashMap<String, String> {
    [
        ("GITLAB_CI", "true"),
        ("CI_API_V4_URL", api.base.as_str()),
        ("CI_PROJECT_ID", "group/proj"),
        ("CI_PROJECT_URL", "https://gitlab.example.com/group/proj"),
        ("CI_MERGE_REQUEST_IID", "7"),
        (
            "CI_JOB_URL",
            "https://gitlab.example.com/group/proj/-/jobs/31",
        ),
        ("CI_COMMIT_SHA", "feedface"),
        (token_var, token),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn target(env: &HashMap<String, String>, extra: &[&str]) -> Target {
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

const MARKER_LINE: &str = "<!-- bench-report matrix=nightly-mi300x hardware=mi300x-192gb -->";

fn marker() -> Marker {
    Marker::new("nightly-mi300x", "mi300x-192gb")
}

#[test]
fn creates_then_updates_a_note_in_place() {
    let api = FakeApi::start(Flavor::GitLab, TOKEN, 20);
    api.add_comment("added 1 commit", true);
    let env = ci_env(&api, "GITLAB_TOKEN", TOKEN);
    let t = target(&env, &[]);
    assert_eq!(
        t.artifacts_url.as_deref(),
        Some("https://gitlab.example.com/group/proj/-/jobs/31/artifacts/browse")
    );

    let first = post(&t, "## 1 regression\n", &marker(), true, &fast()).unwrap();
    let CommentAction::Created { id } = first.action else {
        panic!("expected a new note, got {first:?}");
    };
    assert_eq!(
        first.url.as_deref(),
        Some(
            format!("https://gitlab.example.com/group/proj/-/merge_requests/7#note_{id}").as_str()
        )
    );
    let seen = api.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[0].url,
        "/api/v4/projects/group%2Fproj/merge_requests/7/notes?per_page=100&sort=asc&order_by=created_at"
    );
    assert_eq!(seen[1].method, "POST");
    assert_eq!(
        seen[1].path(),
        "/api/v4/projects/group%2Fproj/merge_requests/7/notes"
    );
    for req in &seen {
        assert_eq!(req.header("PRIVATE-TOKEN"), Some(TOKEN));
        assert_eq!(req.header("JOB-TOKEN"), None);
        assert_eq!(req.header("Authorization"), None);
    }
    assert_eq!(
        seen[1].json()["body"],
        format!("{MARKER_LINE}\n\n## 1 regression\n")
    );

    api.clear_seen();
    let second = post(&t, "## all good\n", &marker(), true, &fast()).unwrap();
    assert_eq!(second.action, CommentAction::Updated { id });
    let writes = api.writes();
    assert_eq!(writes.len(), 1);
    assert_eq!(writes[0].method, "PUT");
    assert_eq!(
        writes[0].path(),
        format!("/api/v4/projects/group%2Fproj/merge_requests/7/notes/{id}")
    );
    let notes = api.comments();
    assert_eq!(notes.len(), 2);
    assert_eq!(notes[1].body, format!("{MARKER_LINE}\n\n## all good\n"));
}

#[test]
fn pages_with_x_next_page_and_skips_system_notes() {
    let api = FakeApi::start(Flavor::GitLab, TOKEN, 2);
    api.add_comment("added 3 commits", true);
    // A system note that happens to start with our marker text is still GitLab's own.
    api.add_comment(&format!("{MARKER_LINE}\n\nsystem"), true);
    api.add_comment("please rebase", false);
    api.add_comment("done", false);
    let ours = api.add_comment(&format!("{MARKER_LINE}\n\nold"), false);
    let env = ci_env(&api, "GITLAB_TOKEN", TOKEN);
    let outcome = post(&target(&env, &[]), "new", &marker(), true, &fast()).unwrap();
    assert_eq!(outcome.action, CommentAction::Updated { id: ours });
    let gets: Vec<String> = api
        .seen()
        .into_iter()
        .filter(|s| s.method == "GET")
        .map(|s| s.url)
        .collect();
    let base = "/api/v4/projects/group%2Fproj/merge_requests/7/notes?per_page=100&sort=asc&order_by=created_at";
    assert_eq!(
        gets,
        [
            base.to_string(),
            format!("{base}&page=2"),
            format!("{base}&page=3"),
        ]
    );
    assert!(api.comments()[1].body.ends_with("system"));
}

#[test]
fn job_token_is_sent_as_job_token_and_a_refusal_says_what_to_do() {
    let api = FakeApi::start(Flavor::GitLab, "jobtoken-accepted", 20);
    let env = ci_env(&api, "CI_JOB_TOKEN", "jobtoken-accepted");
    let t = target(&env, &[]);
    post(&t, "report", &marker(), true, &fast()).unwrap();
    assert!(api
        .seen()
        .iter()
        .all(|s| s.header("JOB-TOKEN") == Some("jobtoken-accepted")
            && s.header("PRIVATE-TOKEN").is_none()));

    // The instance refuses this job token.
    let refusing = FakeApi::start(Flavor::GitLab, "some-other-token", 20);
    let env = ci_env(&refusing, "CI_JOB_TOKEN", "jobtoken-refused");
    let err = post(&target(&env, &[]), "report", &marker(), true, &fast()).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, PublishError::Auth { status: 401, .. }));
    assert!(text.contains("401 Unauthorized"), "{text}");
    assert!(text.contains("check CI_JOB_TOKEN"), "{text}");
    assert!(text.contains("set GITLAB_TOKEN"), "{text}");
    assert!(!text.contains("jobtoken-refused"));
    assert!(!format!("{err:?}").contains("jobtoken-refused"));
}

#[test]
fn flags_address_the_project_outside_ci() {
    let api = FakeApi::start(Flavor::GitLab, TOKEN, 20);
    let env: HashMap<String, String> = [("GITLAB_TOKEN".to_string(), TOKEN.to_string())].into();
    let t = target(
        &env,
        &[
            "--provider",
            "gitlab",
            "--api-url",
            &api.base,
            "--repo",
            "group/proj",
            "--pr",
            "7",
        ],
    );
    let outcome = post(&t, "report", &marker(), true, &fast()).unwrap();
    assert!(matches!(outcome.action, CommentAction::Created { .. }));
    // No project URL is known outside CI, so no link is made up.
    assert_eq!(outcome.url, None);
}

#[test]
fn retries_and_commit_status_on_gitlab() {
    let api = FakeApi::start(Flavor::GitLab, TOKEN, 20);
    api.fault(Fault::new("GET", 429).header("Retry-After", "1"));
    api.fault(Fault::new("GET", 500));
    let env = ci_env(&api, "GITLAB_TOKEN", TOKEN);
    let opts = PostOptions {
        commit_status: Some(CommitStatus {
            state: StatusState::Success,
            description: "no regressions".into(),
        }),
        ..fast()
    };
    let outcome = post(&target(&env, &[]), "report", &marker(), true, &opts).unwrap();
    assert!(matches!(outcome.action, CommentAction::Created { .. }));
    let reasons: Vec<(&str, Duration)> = outcome
        .retries
        .iter()
        .map(|r| (r.reason.as_str(), r.wait))
        .collect();
    assert_eq!(
        reasons,
        [
            ("HTTP 429", Duration::from_secs(1)),
            ("HTTP 500", Duration::from_millis(20))
        ]
    );
    assert!(matches!(outcome.status, StatusOutcome::NotSupported(_)));
}

#[test]
fn a_branch_pipeline_says_what_is_missing_and_posts_nothing() {
    let api = FakeApi::start(Flavor::GitLab, TOKEN, 20);
    let mut env = ci_env(&api, "GITLAB_TOKEN", "");
    env.remove("CI_MERGE_REQUEST_IID");
    let err = resolve_target(&post_args(&[]).target_flags(), &|k: &str| {
        env.get(k).cloned()
    })
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("cannot post the report to GitLab: no merge-request iid"),
        "{text}"
    );
    assert!(text.contains("CI_MERGE_REQUEST_IID"));
    assert!(text.contains("set GITLAB_TOKEN"));
    assert!(api.seen().is_empty());
}

#[test]
fn a_wrong_merge_request_says_what_to_check() {
    let api = FakeApi::start(Flavor::GitLab, TOKEN, 20);
    let env = ci_env(&api, "GITLAB_TOKEN", TOKEN);
    let err = post(
        &target(&env, &["--pr", "8"]),
        "report",
        &marker(),
        true,
        &fast(),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, PublishError::Http { status: 404, .. }),
        "{err:?}"
    );
    assert!(
        text.starts_with("GitLab answered GET /api/v4/projects/group%2Fproj/merge_requests/8/notes with HTTP 404: 404 Not found; check"),
        "{text}"
    );
    assert!(
        text.contains("--pr") && text.contains("GITLAB_TOKEN"),
        "{text}"
    );
    assert_eq!(api.seen().len(), 1, "a 404 is not retried");
}
