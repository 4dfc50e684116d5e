//! `bench report post RUN_DIR`: the CLI glue between the Markdown report and the
//! pull-request / merge-request poster ([`crate::publish`]).
//!
//! The verdict is the run's, not the post's: a missing token, a missing pull request or a
//! failed request is reported as a warning, and the command still exits with the code the
//! comparison gives (0, or 1 for regressions and failed cells), so a CI job's pass/fail never
//! depends on the forge's API being up.

use crate::baseline::Baselines;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::CliError;
use crate::publish::{self, CommitStatus, Marker, PostOptions, StatusState, TargetFlags};
use crate::results::RunResults;

/// Resolved settings of `bench report post`.
#[derive(Debug, Clone)]
pub(crate) struct PostSettings {
    /// The run folder.
    pub run_dir: PathBuf,
    /// Folder of baseline files.
    pub baselines: PathBuf,
    /// Where to post, as the flags said it; the CI environment fills in the rest
    /// ([`publish::resolve_target`]).
    pub target: TargetFlags,
    /// Post nothing when no cell regressed, improved or is new.
    pub only_on_change: bool,
    /// Also set a commit status carrying the verdict.
    pub commit_status: bool,
    /// The whole time posting may take (connecting, answers, retries); positive.
    pub deadline: Duration,
}

/// Runs `bench report post`.
pub(crate) fn post_command(settings: &PostSettings) -> Result<i32, CliError> {
    post_with_env(settings, &|k| std::env::var(k).ok())
}

/// [`post_command`] with an injectable environment (tests).
pub(crate) fn post_with_env(
    args: &PostSettings,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<i32, CliError> {
    let results = RunResults::load(&args.run_dir)?;
    let baselines = Baselines::load_for(&args.baselines, &results.environment.hardware_key)?;
    // The history's verdicts, when the run was judged against one, are the run's verdicts.
    let (comparison, gate) =
        crate::history::gate::judged_comparison(&results, &baselines, Some(&args.run_dir));
    let verdict = comparison.exit_code();
    let target = match publish::resolve_target(&args.target, env) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("warning: not posting the report: {e}");
            return Ok(verdict);
        }
    };
    let trends = gate
        .as_ref()
        .and_then(|g| crate::history::trends::for_run(&g.store, &results).ok());
    let body = super::markdown::render_comment(
        &results,
        &comparison,
        trends.as_ref(),
        gate.as_ref(),
        target.artifacts_url.as_deref(),
    );
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
        deadline: args.deadline,
        ..PostOptions::default()
    };
    match publish::post(&target, &body, &marker, comparison.has_changes(), &opts) {
        Ok(outcome) => println!("bench report post: {outcome}"),
        Err(e) => eprintln!("warning: posting the report failed: {e}"),
    }
    Ok(verdict)
}
