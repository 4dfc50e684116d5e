//! `junit.xml`: one testsuite per matrix (named by the matrix), one testcase per cell that
//! was meant to run (named by its id). A regression is a `<failure>` whose message carries
//! the numbers; a failed or timed-out cell is an `<error>` with its reason; skipped and
//! unschedulable cells (and baseline cells this run did not produce) are `<skipped>` with the
//! reason. A cell that passed after retried infrastructure failures carries each failed
//! attempt as a `<flakyError>` (the Maven Surefire form nextest writes). Metrics are
//! `<properties>` of their testcase, the run's provenance those of the suite, in the shape
//! pytest writes, which GitLab, Jenkins and junitparser read.
//!
//! Cells the matrix's rules dropped are not testcases: hundreds of `<skipped>` combinations
//! nobody meant to run would bury the real skips in CI test views. Each rule is one suite
//! property instead (`dropped rules[1] (name)` = `3 cells: reason`); cells `--filter`
//! removed do not appear at all.
//!
//! Every text bench did not write (the matrix's name, a host, a reason, a finding's
//! headline) is cut to [`MAX_SHOWN_CHARS`] characters, as the terminal and Markdown reports
//! cut it: the matrix's name is each testcase's class, so uncut one 50 MB name was
//! written once per cell.
//!
//! The document is built with quick-junit (nextest's JUnit model), which has properties
//! and flaky reruns, so no second pass over the XML is needed.

use quick_junit::{
    NonSuccessKind, Property, Report, TestCase, TestCaseStatus, TestRerun, TestSuite,
};

use crate::baseline::compare::{CellComparison, CellStatus};
use crate::baseline::store::hardware_words;
use crate::report::input::{Exporter, ReportError, ReportInput};
use crate::report::text::{group_changes, metric_change, one_line, rule_drops};
use crate::results::CellResult;
use crate::sanitize::{bounded, MAX_SHOWN_CHARS};

/// The `junit.xml` sink.
pub struct JunitExporter;

fn render_err(e: impl std::fmt::Display) -> ReportError {
    ReportError::Render {
        format: "junit.xml",
        message: e.to_string(),
    }
}

fn seconds(s: Option<f64>) -> std::time::Duration {
    // Results are checked when read (a duration of more than a year is refused), but a
    // report never panics on one: `from_secs_f64` does past u64::MAX seconds.
    s.and_then(|s| std::time::Duration::try_from_secs_f64(s).ok())
        .unwrap_or_default()
}

/// A text bench did not write, cut to [`MAX_SHOWN_CHARS`] characters as the terminal and
/// Markdown reports cut it.
fn shown(s: &str) -> std::borrow::Cow<'_, str> {
    bounded(s, MAX_SHOWN_CHARS)
}

fn non_success(kind: NonSuccessKind, ty: &str, message: &str) -> TestCaseStatus {
    let mut status = TestCaseStatus::non_success(kind);
    status.set_type(ty).set_message(message);
    status
}

fn skipped(ty: &str, message: &str) -> TestCaseStatus {
    let mut status = TestCaseStatus::skipped();
    status.set_type(ty).set_message(message);
    status
}

fn testcase(
    cell: &CellComparison,
    result: Option<&CellResult>,
    classname: &str,
    finding: Option<&crate::triage::Finding>,
) -> TestCase {
    // Cut as the terminal and Markdown cut them: a finding's headline (a culprit's subject
    // and author) is repeated on every cell of the finding, so one 50 MB subject would
    // otherwise make a junit.xml of that many times 50 MB.
    let mut reason = one_line(&bounded(
        cell.reason.as_deref().unwrap_or(""),
        MAX_SHOWN_CHARS,
    ));
    // Each failure names the finding its cause is grouped under.
    let of_finding =
        finding.map(|f| format!(" [finding {}]", bounded(&f.headline(), 4 * MAX_SHOWN_CHARS)));
    if let Some(f) = &of_finding {
        reason.push_str(f);
    }
    let status = match cell.status {
        // A cell the history judged carries its verdict line (`CellComparison::reason`).
        CellStatus::Regression if cell.reason.is_some() => {
            non_success(NonSuccessKind::Failure, "regression", &reason)
        }
        CellStatus::Regression => {
            let lines = group_changes(cell.regressions());
            non_success(
                NonSuccessKind::Failure,
                "regression",
                &(lines.join("; ") + of_finding.as_deref().unwrap_or("")),
            )
        }
        // Not a verdict on the code: the environment explains the loss, or the evidence
        // is not in yet. Skipped with the line, so CI test views show it without failing.
        CellStatus::Environment => skipped("environment", &reason),
        CellStatus::Suspect => skipped("unconfirmed", &reason),
        CellStatus::Unknown => skipped("unknown", &reason),
        CellStatus::Failed => non_success(NonSuccessKind::Error, "failed", &reason),
        CellStatus::TimedOut => non_success(NonSuccessKind::Error, "timeout", &reason),
        CellStatus::Skipped => skipped("skipped", &reason),
        CellStatus::Dropped => skipped("dropped", &format!("dropped by {reason}")),
        CellStatus::Missing => skipped("missing", &reason),
        CellStatus::Improvement | CellStatus::Unchanged | CellStatus::New => {
            let mut status = TestCaseStatus::success();
            // The attempts that failed before one succeeded, as flaky reruns.
            for a in result.into_iter().flat_map(|r| &r.attempts) {
                if let Some(error) = a.error.as_deref().filter(|_| cell.flaky) {
                    let mut rerun = TestRerun::new(NonSuccessKind::Error);
                    rerun
                        .set_type("attempt")
                        .set_message(one_line(error))
                        .set_time(seconds(Some(a.duration_s)));
                    status.add_rerun(rerun);
                }
            }
            status
        }
    };
    let mut tc = TestCase::new(cell.id.as_str(), status);
    tc.set_classname(classname);
    if cell.duration_s.is_some() {
        tc.set_time(seconds(cell.duration_s));
    }
    tc.add_property(Property::new("verdict", cell.status.as_str()));
    if let Some(f) = finding {
        tc.add_property(Property::new("finding", f.id.as_str()));
    }
    if cell.flaky {
        tc.add_property(Property::new("flaky", "true"));
    }
    for m in &cell.metrics {
        if let Some(v) = m.current {
            tc.add_property(Property::new(m.metric.as_str(), v.to_string()));
        }
        if let Some(b) = m.baseline {
            tc.add_property(Property::new(
                format!("{}.baseline", m.metric),
                b.to_string(),
            ));
        }
        if let Some(c) = m.change {
            tc.add_property(Property::new(format!("{}.change", m.metric), c.to_string()));
        }
    }
    // Every measured metric against its baseline, one per line, for the CI's test view.
    let shown: Vec<String> = cell.metrics.iter().map(metric_change).collect();
    if !shown.is_empty() {
        tc.set_system_out(shown.join("\n"));
    }
    tc
}

impl Exporter for JunitExporter {
    fn file_name(&self) -> &'static str {
        "junit.xml"
    }

    fn render(&self, input: &ReportInput<'_>) -> Result<String, ReportError> {
        let mut report = Report::new(shown(&input.results.matrix_name).as_ref());
        report.add_test_suite(suite(input)?);
        let mut out = report.to_string().map_err(render_err)?;
        if !out.ends_with('\n') {
            out.push('\n');
        }
        // Worker text is sanitized where it is read; this guards results from elsewhere
        // (an older bench, a hand-edited file): XML cannot hold NUL or ESC in any form.
        Ok(crate::sanitize::xml_chars(&out).into_owned())
    }
}

/// The run's testsuite: a testcase per cell meant to run, the run's provenance as the
/// suite's properties. A fleet's JUnit holds one per run.
pub(crate) fn suite(input: &ReportInput<'_>) -> Result<TestSuite, ReportError> {
    {
        let r = input.results;
        let env = &r.environment;
        // The matrix's name is every testcase's class: cut once, as the other reports cut
        // it, or one 50 MB name would be written once per cell.
        let name = shown(&r.matrix_name);
        let mut suite = TestSuite::new(name.as_ref());
        suite.extra.insert(
            "package".into(),
            format!("bench/{}", env.hardware_key).into(),
        );
        suite
            .extra
            .insert("hostname".into(), shown(&env.host).as_ref().into());
        // The suite's time is the run's start, so that rendering a report again later does
        // not change it.
        if let Ok(t) = chrono::DateTime::parse_from_rfc3339(&r.started_at) {
            suite.set_timestamp(t);
        }
        let mut total = 0.0;
        for cell in input
            .comparison
            .cells
            .iter()
            .filter(|c| c.status != CellStatus::Dropped)
        {
            let result = r.cells.iter().find(|c| c.id.as_str() == cell.id);
            total += cell.duration_s.unwrap_or(0.0);
            let finding = input.findings.iter().find(|f| f.has(&cell.id));
            suite.add_test_case(testcase(cell, result, &name, finding));
        }
        if r.interrupted || r.interrupted_in.is_some() {
            // A cancelled run is not a pass: without this case a CI test view would show
            // every cell that ran as green and say nothing of those that never ran (or of a
            // triage a signal cut short, which makes the run's exit code 130).
            let ran = r.cells.len();
            let what = match r.interrupted_in {
                Some(stage) => format!("the run was interrupted {}", stage.words()),
                None => "the run was stopped before every cell ran".to_string(),
            };
            let cells = if r.interrupted {
                format!(" ({ran} cell{} ran)", if ran == 1 { "" } else { "s" })
            } else {
                String::new()
            };
            let message = format!("{what}{cells}; exit {}", input.exit_code());
            let mut tc = TestCase::new(
                "run.interrupted",
                non_success(NonSuccessKind::Error, "interrupted", &message),
            );
            tc.set_classname(name.as_ref());
            suite.add_test_case(tc);
        }
        // A failure of the run beyond its cells (a merged run's shard that did not finish):
        // a CI test view must not show the run green while its exit code is 1.
        for (i, why) in input.comparison.run_failures.iter().enumerate() {
            let message = format!("{}; exit {}", shown(why), input.exit_code());
            let mut tc = TestCase::new(
                format!("run.failure.{}", i + 1),
                non_success(NonSuccessKind::Failure, "run", &message),
            );
            tc.set_classname(name.as_ref());
            suite.add_test_case(tc);
        }
        suite.set_time(seconds(Some(total)));
        let mut props: Vec<(String, String)> = vec![
            ("run_id".into(), r.run_id.clone()),
            ("hardware_key".into(), env.hardware_key.clone()),
            ("hardware".into(), hardware_words(env)),
            ("bench_version".into(), env.bench_version.clone()),
            (
                "baseline_file".into(),
                input.comparison.baseline_file.clone(),
            ),
        ];
        let optional = [
            ("commit", env.git_commit.as_ref()),
            ("driver", env.driver.as_ref()),
            ("cuda", env.cuda.as_ref()),
            ("rocm", env.rocm.as_ref()),
            ("libtorch", env.libtorch.as_ref()),
            ("nccl", env.nccl.as_ref()),
        ];
        for (k, v) in optional {
            if let Some(v) = v {
                props.push((k.into(), v.clone()));
            }
        }
        if env.git_dirty {
            props.push(("git_dirty".into(), "true".into()));
        }
        for policy in crate::report::input::mfu_policies(r) {
            props.push(("mfu_policy".into(), policy));
        }
        for g in rule_drops(r) {
            let cells = if g.ids.len() == 1 { "cell" } else { "cells" };
            props.push((
                format!("dropped {}", shown(g.by)),
                format!("{} {cells}: {}", g.ids.len(), one_line(&shown(g.reason))),
            ));
        }
        suite.add_properties(
            props
                .into_iter()
                .map(|(k, v)| Property::new(k, shown(&v).into_owned())),
        );
        Ok(suite)
    }
}
