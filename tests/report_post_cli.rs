//! `bench report post` end to end: the built binary renders a fixture run's report and posts
//! it to a local GitHub-shaped API, updates it in place on a second run, keeps the token out
//! of its output, and keeps the verdict's exit code whatever happens to the post.

mod publish_server;

use std::process::{Command, Output};

use publish_server::{FakeApi, Flavor};

const TOKEN: &str = "ghs_CLIsecret0123456789abcdef";

fn post(api_base: &str, run: &str, token: Option<&str>, extra: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bench"));
    cmd.args([
        "report",
        "post",
        run,
        "--baselines",
        "tests/fixtures/baselines",
    ])
    .args(extra)
    .env_clear()
    .env("PATH", std::env::var("PATH").unwrap_or_default())
    .env("GITHUB_API_URL", api_base)
    .env("GITHUB_REPOSITORY", "o/r")
    .env("GITHUB_REF", "refs/pull/42/merge")
    .env("GITHUB_SHA", "feedbeef");
    if let Some(t) = token {
        cmd.env("GITHUB_TOKEN", t);
    }
    cmd.output().unwrap()
}

fn all_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn posts_then_updates_in_place_and_never_prints_the_token() {
    let api = FakeApi::start(Flavor::GitHub, TOKEN, 30);
    let run = "tests/fixtures/runs/cpu-ok";
    let first = post(&api.base, run, Some(TOKEN), &[]);
    let text = all_text(&first);
    assert!(text.contains("created comment"), "{text}");
    assert!(!text.contains(TOKEN), "token leaked: {text}");
    let second = post(&api.base, run, Some(TOKEN), &[]);
    let text2 = all_text(&second);
    assert!(
        text2.contains("already up to date") || text2.contains("updated comment"),
        "{text2}"
    );
    assert!(!text2.contains(TOKEN), "token leaked: {text2}");
    let comments = api.comments();
    assert_eq!(comments.len(), 1, "one comment per matrix and hardware");
    assert!(
        comments[0].body.contains("<!-- bench-report"),
        "{}",
        comments[0].body
    );
    // The exit code is the verdict's, the same for both posts.
    assert_eq!(first.status.code(), second.status.code());
}

#[test]
fn a_rejected_token_is_a_warning_that_names_the_variable_and_keeps_the_verdict() {
    let api = FakeApi::start(Flavor::GitHub, TOKEN, 30);
    let run = "tests/fixtures/runs/cpu-ok";
    let ok = post(&api.base, run, Some(TOKEN), &[]);
    let bad = "ghs_WRONGtoken999";
    let out = post(&api.base, run, Some(bad), &[]);
    let text = all_text(&out);
    assert!(text.contains("GITHUB_TOKEN"), "{text}");
    assert!(!text.contains(bad), "token leaked: {text}");
    assert_eq!(out.status.code(), ok.status.code());
}

#[test]
fn no_token_says_what_is_missing_and_sends_nothing() {
    let api = FakeApi::start(Flavor::GitHub, TOKEN, 30);
    let out = post(&api.base, "tests/fixtures/runs/cpu-ok", None, &[]);
    let text = all_text(&out);
    assert!(text.contains("GITHUB_TOKEN"), "{text}");
    assert!(
        api.seen().is_empty(),
        "no request may be made without a token"
    );
}

#[test]
fn a_dry_run_prints_the_body_and_sends_nothing() {
    let api = FakeApi::start(Flavor::GitHub, TOKEN, 30);
    let run = "tests/fixtures/runs/cpu-ok";
    let posted = post(&api.base, run, Some(TOKEN), &[]);
    let before = api.seen().len();
    let dry = post(&api.base, run, Some(TOKEN), &["--dry-run"]);
    assert_eq!(api.seen().len(), before, "a dry run makes no request");
    let body = String::from_utf8_lossy(&dry.stdout);
    assert!(body.starts_with("### bench: `smoke`"), "{body}");
    // The body a dry run prints is the one a post sends (less the marker bench adds).
    let sent = &api.comments()[0].body;
    assert!(sent.contains(body.trim_end()), "{sent}\n---\n{body}");
    assert_eq!(dry.status.code(), posted.status.code());
}
