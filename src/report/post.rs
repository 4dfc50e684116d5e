//! `bench report post RUN_DIR`: the CLI glue between the Markdown report and the
//! pull-request / merge-request poster ([`crate::publish`]).
//!
//! The verdict is the run's, not the post's: a missing token, a missing pull request or a
//! failed request is reported as a warning, and the command still exits with the code the
//! comparison gives (0, or 1 for regressions and failed cells), so a CI job's pass/fail never
//! depends on the forge's API being up.

use crate::baseline::{compare::compare, Baselines};
use crate::cli::PostArgs;
use crate::error::CliError;
use crate::publish::{self, CommitStatus, Marker, PostOptions, StatusState};
use crate::results::RunResults;

/// Runs `bench report post`.
pub fn post_command(args: &PostArgs) -> Result<i32, CliError> {
    post_with_env(args, &|k| std::env::var(k).ok())
}

/// [`post_command`] with an injectable environment (tests).
pub fn post_with_env(
    args: &PostArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<i32, CliError> {
    let deadline = std::time::Duration::try_from_secs_f64(args.timeout)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            CliError::bad_input(miette::Report::msg(format!(
                "--timeout {}: expected a positive number of seconds",
                args.timeout
            )))
        })?;
    let results = RunResults::load(&args.run_dir)?;
    let baselines = Baselines::load_for(&args.baselines, &results.environment.hardware_key)?;
    let comparison = compare(&results, &baselines);
    let verdict = comparison.exit_code();
    let target = match publish::resolve_target(&args.target_flags(), env) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("warning: not posting the report: {e}");
            return Ok(verdict);
        }
    };
    let mut body =
        super::render_markdown(&results, &comparison, None, target.artifacts_url.as_deref());
    // The run's verdicts against its history (`bench matrix --history`), when it was judged.
    if let Some(h) = crate::history::gate::GateReport::load(&args.run_dir) {
        body.push('\n');
        body.push_str(&crate::history::report::markdown(&h));
    }
    let marker = Marker::new(&results.matrix_name, &results.environment.hardware_key);
    let counts = comparison.counts();
    let commit_status = args.commit_status.then(|| CommitStatus {
        state: if verdict == crate::exit::bench::OK {
            StatusState::Success
        } else {
            StatusState::Failure
        },
        description: format!(
            "{} regressed, {} improved, {} failed of {} cells",
            counts.regression,
            counts.improvement,
            counts.failed + counts.timed_out,
            counts.cells
        ),
    });
    let opts = PostOptions {
        only_on_change: args.only_on_change,
        commit_status,
        deadline,
        ..PostOptions::default()
    };
    match publish::post(&target, &body, &marker, comparison.has_changes(), &opts) {
        Ok(outcome) => println!("bench report post: {outcome}"),
        Err(e) => eprintln!("warning: posting the report failed: {e}"),
    }
    Ok(verdict)
}
