//! `junit.xml`: one testsuite per matrix (named by the matrix), one testcase per cell
//! (named by its id). A regression is a `<failure>` whose message carries the numbers; a
//! failed or timed-out cell is an `<error>` with its reason; skipped, unschedulable and
//! dropped cells (and baseline cells this run did not produce) are `<skipped>` with the
//! reason. Metrics are `<properties>` of their testcase, the run's provenance those of the
//! suite, in the shape pytest writes, which GitLab, Jenkins and junitparser read.
//!
//! The document is built with the junit-report crate; it has no `<properties>`, so one
//! streaming pass with quick-xml (the XML library junit-report itself uses) inserts them
//! and indents the document for people reading it in an artifact.

use std::io::Cursor;

use junit_report::{Report, TestCase, TestSuite};
use quick_xml::events::{BytesEnd, Event};
use quick_xml::{Reader, Writer};
use time::format_description::well_known::Rfc3339;

use crate::baseline::compare::{CellComparison, CellStatus};
use crate::baseline::store::hardware_words;
use crate::report::text::{group_change, grouped, metric_change, one_line};
use crate::report::{Exporter, ReportError, ReportInput};

/// The `junit.xml` sink.
pub struct JunitExporter;

type Properties = Vec<(String, String)>;

fn render_err(e: impl std::fmt::Display) -> ReportError {
    ReportError::Render {
        format: "junit.xml",
        message: e.to_string(),
    }
}

fn seconds(s: Option<f64>) -> time::Duration {
    time::Duration::seconds_f64(s.filter(|s| s.is_finite() && *s >= 0.0).unwrap_or(0.0))
}

fn testcase(cell: &CellComparison, classname: &str) -> TestCase {
    let time = seconds(cell.duration_s);
    let reason = one_line(cell.reason.as_deref().unwrap_or(""));
    let mut tc = match cell.status {
        CellStatus::Regression => {
            let lines: Vec<String> = grouped(cell.regressions())
                .into_iter()
                .map(|(m, also)| group_change(m, &also))
                .collect();
            TestCase::failure(&cell.id, time, "regression", &lines.join("; "))
        }
        CellStatus::Failed => TestCase::error(&cell.id, time, "failed", &reason),
        CellStatus::TimedOut => TestCase::error(&cell.id, time, "timeout", &reason),
        CellStatus::Skipped => TestCase::skipped_with_cause(&cell.id, "skipped", &reason),
        CellStatus::Dropped => {
            TestCase::skipped_with_cause(&cell.id, "dropped", &format!("dropped by {reason}"))
        }
        CellStatus::Missing => TestCase::skipped_with_cause(&cell.id, "missing", &reason),
        CellStatus::Improvement | CellStatus::Unchanged | CellStatus::New => {
            TestCase::success(&cell.id, time)
        }
    };
    tc.set_classname(classname);
    // Every measured metric against its baseline, one per line, for the CI's test view.
    let shown: Vec<String> = cell.metrics.iter().map(metric_change).collect();
    if !shown.is_empty() {
        tc.set_system_out(&shown.join("\n"));
    }
    tc
}

fn testcase_properties(cell: &CellComparison) -> Properties {
    let mut p = vec![("verdict".to_string(), cell.status.as_str().to_string())];
    if cell.flaky {
        p.push(("flaky".into(), "true".into()));
    }
    for m in &cell.metrics {
        if let Some(v) = m.current {
            p.push((m.metric.clone(), v.to_string()));
        }
        if let Some(b) = m.baseline {
            p.push((format!("{}.baseline", m.metric), b.to_string()));
        }
        if let Some(c) = m.change {
            p.push((format!("{}.change", m.metric), c.to_string()));
        }
    }
    p
}

impl Exporter for JunitExporter {
    fn file_name(&self) -> &'static str {
        "junit.xml"
    }

    fn render(&self, input: &ReportInput<'_>) -> Result<String, ReportError> {
        let r = input.results;
        let env = &r.environment;
        let mut suite = TestSuite::new(&r.matrix_name);
        suite.hostname = env.host.clone();
        suite.package = format!("bench/{}", env.hardware_key);
        // The suite's time is the run's start, so that rendering a report again later does
        // not change it.
        if let Ok(t) = time::OffsetDateTime::parse(&r.started_at, &Rfc3339) {
            suite.set_timestamp(t);
        }
        let mut case_props = Vec::new();
        for cell in &input.comparison.cells {
            suite.add_testcase(testcase(cell, &r.matrix_name));
            case_props.push(testcase_properties(cell));
        }
        let mut suite_props: Properties = vec![
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
                suite_props.push((k.into(), v.clone()));
            }
        }
        if env.git_dirty {
            suite_props.push(("git_dirty".into(), "true".into()));
        }
        for policy in crate::report::mfu_policies(r) {
            suite_props.push(("mfu_policy".into(), policy));
        }
        let mut report = Report::new();
        report.add_testsuite(suite);
        let mut raw = Vec::new();
        report.write_xml(&mut raw).map_err(render_err)?;
        let raw = String::from_utf8(raw).map_err(render_err)?;
        // Worker text is sanitized where it is read; this guards results from elsewhere
        // (an older bench, a hand-edited file): XML cannot hold NUL or ESC in any form.
        let xml = insert_properties(&crate::sanitize::xml_chars(&raw), &suite_props, &case_props)?;
        Ok(crate::sanitize::xml_chars(&xml).into_owned())
    }
}

fn write_properties<W: std::io::Write>(
    w: &mut Writer<W>,
    props: &Properties,
) -> std::io::Result<()> {
    if props.is_empty() {
        return Ok(());
    }
    w.create_element("properties").write_inner_content(|w| {
        for (name, value) in props {
            w.create_element("property")
                .with_attributes([("name", name.as_str()), ("value", value.as_str())])
                .write_empty()?;
        }
        Ok(())
    })?;
    Ok(())
}

/// Rewrites junit-report's document with `<properties>` as the first child of the (one)
/// testsuite and of each testcase, in document order, and indents it.
fn insert_properties(
    xml: &str,
    suite_props: &Properties,
    case_props: &[Properties],
) -> Result<String, ReportError> {
    let mut reader = Reader::from_str(xml);
    reader.config_mut().trim_text(true);
    let mut w = Writer::new_with_indent(Cursor::new(Vec::new()), b' ', 2);
    let mut cases = case_props.iter();
    loop {
        let event = reader.read_event().map_err(render_err)?;
        match event {
            Event::Eof => break,
            Event::Start(e) if e.name().as_ref() == b"testsuite" => {
                w.write_event(Event::Start(e)).map_err(render_err)?;
                write_properties(&mut w, suite_props).map_err(render_err)?;
            }
            Event::Empty(e) if e.name().as_ref() == b"testsuite" => {
                w.write_event(Event::Start(e)).map_err(render_err)?;
                write_properties(&mut w, suite_props).map_err(render_err)?;
                w.write_event(Event::End(BytesEnd::new("testsuite")))
                    .map_err(render_err)?;
            }
            Event::Start(e) if e.name().as_ref() == b"testcase" => {
                w.write_event(Event::Start(e)).map_err(render_err)?;
                if let Some(p) = cases.next() {
                    write_properties(&mut w, p).map_err(render_err)?;
                }
            }
            Event::Empty(e) if e.name().as_ref() == b"testcase" => match cases.next() {
                Some(p) if !p.is_empty() => {
                    w.write_event(Event::Start(e)).map_err(render_err)?;
                    write_properties(&mut w, p).map_err(render_err)?;
                    w.write_event(Event::End(BytesEnd::new("testcase")))
                        .map_err(render_err)?;
                }
                _ => w.write_event(Event::Empty(e)).map_err(render_err)?,
            },
            other => w.write_event(other).map_err(render_err)?,
        }
    }
    let mut out = String::from_utf8(w.into_inner().into_inner()).map_err(render_err)?;
    out.push('\n');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_go_first_in_suite_and_cases() {
        let raw = r#"<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite id="0" name="m"><testcase name="a" time="1"/><testcase name="b" time="2"><failure type="regression" message="x"/></testcase></testsuite><testsuite id="1" name="empty"/></testsuites>"#;
        let suite = vec![("run_id".to_string(), "r1".to_string())];
        let cases = vec![
            vec![("verdict".to_string(), "new".to_string())],
            vec![("verdict".to_string(), "regression".to_string())],
        ];
        let out = insert_properties(raw, &suite, &cases).unwrap();
        let expected = r#"<?xml version="1.0" encoding="utf-8"?>
<testsuites>
  <testsuite id="0" name="m">
    <properties>
      <property name="run_id" value="r1"/>
    </properties>
    <testcase name="a" time="1">
      <properties>
        <property name="verdict" value="new"/>
      </properties>
    </testcase>
    <testcase name="b" time="2">
      <properties>
        <property name="verdict" value="regression"/>
      </properties>
      <failure type="regression" message="x"/>
    </testcase>
  </testsuite>
  <testsuite id="1" name="empty">
    <properties>
      <property name="run_id" value="r1"/>
    </properties>
  </testsuite>
</testsuites>
"#;
        assert_eq!(out, expected);
    }
}
