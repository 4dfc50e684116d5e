//! `bench report` and its subcommands: judge a finished run folder again (against the
//! baselines as they are now, with the history's judgement it recorded) and render it:
//! every report (`bench report RUN_DIR`), one page over several runs (`bench report html`),
//! or the pull-request / merge-request comment (`bench report post`).
//!
//! The post's verdict is the run's, not the post's: a missing token, a missing pull request
//! or a failed request is reported as a warning, and the command still exits with the code
//! the run gives (0, 1 for regressions and failed cells, 130 for a run a signal stopped:
//! `RunResults::exit_code`), so a CI job's pass/fail
//! never depends on the forge's API being up.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::baseline::Comparison;
use crate::error::CliError;
use crate::format::Format;
use crate::publish::{self, CommitStatus, Marker, PostOptions, StatusState, TargetFlags};
use crate::results::RunResults;
use crate::trend::Trends;

/// Resolved settings of `bench report RUN_DIR`.
#[derive(Debug, Clone)]
pub(crate) struct ReportSettings {
    /// The run folder (or its `results.json`).
    pub run_dir: PathBuf,
    /// Folder of baseline files.
    pub baselines: PathBuf,
    /// Terminal output format.
    pub format: Format,
    /// List every dropped cell's id under its rule in the terminal summary.
    pub verbose: bool,
    /// Price of one GPU-hour, for the framework comparison's cost per 1T tokens.
    pub gpu_hour_price: Option<f64>,
}

/// `bench report RUN_DIR [--baselines DIR] [--format human|json]`: renders every report of
/// a finished run again from its `results.json`, against the baselines as they are now.
/// A run folder's results, refused (exit 2, naming the key path) when a metric is one no
/// measurement gives: the same bounds `bench report merge` and `bench history import`
/// hold a folder to, so a forged 1e308 tok/s is not rendered as a 300-digit improvement.
fn load_checked(dir: &Path) -> Result<RunResults, CliError> {
    let results = RunResults::load(dir)?;
    if let Some(why) = results.implausible_measurement() {
        let file = if dir.is_dir() {
            dir.join(RunResults::FILE)
        } else {
            dir.to_path_buf()
        };
        return Err(CliError::bad_input(miette::miette!(
            "{}: {why}; not reported",
            file.display()
        )));
    }
    Ok(results)
}

pub(crate) fn report(settings: &ReportSettings) -> Result<i32, CliError> {
    let run_dir = &settings.run_dir;
    if let Some(index) = super::fleet::runs_of(run_dir)? {
        let names: Vec<String> = index
            .runs
            .iter()
            .map(|(d, _)| d.display().to_string())
            .collect();
        return Err(CliError::bad_input(miette::miette!(
            "{}: the folder of a fleet (`bench report merge` of several runs): report one of its runs ({}), or merge the runs again",
            run_dir.display(),
            names.join(", ")
        )));
    }
    let results = load_checked(run_dir)?;
    let dir = if run_dir.is_dir() {
        run_dir.clone()
    } else {
        run_dir
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."))
    };
    let mut verdicts = crate::judge::of_run(&results, &settings.baselines, Some(&dir))?;
    // A merged run's unfinished shards fail it here as they did when it was merged.
    verdicts.comparison.run_failures = super::merge::shard_failures(&dir)?;
    let findings = super::triage::findings(&results, &verdicts, &dir)?;
    // The cost the reports state comes from files of the folder: refused, naming the file
    // and field, before any report is written again from them.
    if let Some(why) =
        crate::report::input::ReportInput::new(&results, &verdicts, &findings).implausible_cost()
    {
        return Err(CliError::bad_input(miette::miette!(
            "{}: {why}",
            dir.display()
        )));
    }
    crate::report::finish_run(
        &dir,
        &results,
        &verdicts,
        &findings,
        settings.format,
        settings.verbose,
        settings.gpu_hour_price,
    )
}

/// Resolved settings of `bench report html`.
#[derive(Debug, Clone)]
pub(crate) struct HtmlSettings {
    /// One or more run folders.
    pub run_dirs: Vec<PathBuf>,
    /// Trends of earlier runs to draw (a JSON file, see [`Trends::load`]).
    pub history: Option<PathBuf>,
    /// Folder of baseline files.
    pub baselines: PathBuf,
    /// Where to write the page; `None`: report.html in the run folder, or in the current
    /// folder for several runs.
    pub output: Option<PathBuf>,
}

/// Whether `--history` names a history store (a PostgreSQL URL or a SQLite file, by its
/// header) rather than a JSON trend file.
fn is_store(path: &Path) -> bool {
    let text = path.to_string_lossy();
    if text.starts_with("postgres://") || text.starts_with("postgresql://") {
        return true;
    }
    let mut head = [0u8; 16];
    // A FIFO or a device is neither: opened without blocking, and refused unless regular.
    crate::files::open_regular(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .is_ok_and(|()| &head == b"SQLite format 3\0")
}

/// `bench report html RUN_DIR... [--history FILE] [-o FILE]`: one page over several runs,
/// each compared with the baselines of its own hardware key. Prints the page's path.
pub(crate) fn html_command(args: &HtmlSettings) -> Result<i32, CliError> {
    let mut findings = Vec::new();
    let mut runs = Vec::new();
    for dir in &args.run_dirs {
        let (results, verdicts, run_findings) = judged(dir, &args.baselines)?;
        // Each run's findings, named by their run when the page shows several.
        for f in run_findings {
            let mut view = crate::report::html::FindingView::of(&f);
            if args.run_dirs.len() > 1 {
                view.headline = format!("run {}: {}", results.run_id, view.headline);
            }
            findings.push(view);
        }
        runs.push((results, verdicts.comparison));
    }
    let trends = match &args.history {
        Some(path) if is_store(path) => {
            // A history store (what `bench matrix --history` records into): each run's
            // cells' trends and change points, read as the run's own report reads them.
            let location = path.to_string_lossy();
            let mut all = Trends::default();
            for (results, _) in &runs {
                let t = crate::history::trends::for_run(&location, results)?;
                for s in t.series {
                    if !all
                        .series
                        .iter()
                        .any(|x| x.cell == s.cell && x.metric == s.metric)
                    {
                        all.series.push(s);
                    }
                }
            }
            Some(all)
        }
        Some(path) => {
            Some(Trends::load(path).map_err(|e| CliError::bad_input(miette::miette!("{e}")))?)
        }
        None => None,
    };
    let pairs: Vec<(&RunResults, &Comparison)> = runs.iter().map(|(r, c)| (r, c)).collect();
    let mut data = crate::report::html::HtmlData::build(&pairs, trends.as_ref());
    data.findings = findings;
    let out = match (&args.output, args.run_dirs.as_slice()) {
        (Some(o), _) => o.clone(),
        (None, [one]) if one.is_dir() => one.join("report.html"),
        (None, _) => PathBuf::from("report.html"),
    };
    crate::report::html::write_page(&out, &data)?;
    println!("{}", out.display());
    Ok(crate::exit::bench::OK)
}

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
    /// Print the body instead of posting it.
    pub dry_run: bool,
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
    if let Some(index) = super::fleet::runs_of(&args.run_dir)? {
        return post_fleet(args, env, &index.runs, &index.missing);
    }
    let (results, verdicts, findings) = judged(&args.run_dir, &args.baselines)?;
    let comparison = &verdicts.comparison;
    // The run's code, as its reports state it: 130 for a run a signal stopped.
    let verdict = results.exit_code(verdicts.exit_code());
    let body = |artifacts_url: Option<&str>| {
        crate::report::markdown::render_comment(
            &results,
            comparison,
            verdicts.trends.as_ref(),
            verdicts.history.as_ref(),
            &findings,
            artifacts_url,
        )
    };
    let marker = Marker::new(&results.matrix_name, &results.environment.hardware_key);
    deliver(args, env, &body, &marker, &[comparison], verdict)
}

/// A finished run's folder as the reports show it: its results, the judge's verdicts
/// against the baselines of its hardware key (the history's, when the run was judged against
/// one, are its verdicts) and its findings with what its triage kept.
fn judged(
    dir: &Path,
    baselines: &Path,
) -> Result<
    (
        RunResults,
        crate::judge::Verdicts,
        Vec<crate::triage::Finding>,
    ),
    CliError,
> {
    let results = load_checked(dir)?;
    let mut verdicts = crate::judge::of_run(&results, baselines, Some(dir))?;
    if dir.is_dir() {
        verdicts.comparison.run_failures = super::merge::shard_failures(dir)?;
    }
    let findings = super::triage::findings(&results, &verdicts, dir)?;
    Ok((results, verdicts, findings))
}

/// `bench report post` of a fleet folder: one comment for all its runs, each judged as its
/// own folder holds it, and one commit status with the worst run's verdict.
fn post_fleet(
    args: &PostSettings,
    env: &dyn Fn(&str) -> Option<String>,
    runs: &[(PathBuf, i32)],
    missing: &[String],
) -> Result<i32, CliError> {
    let mut loaded = Vec::new();
    for (dir, exit) in runs {
        let (results, verdicts, findings) = judged(dir, &args.baselines)?;
        // The fleet's index keeps each run's exit code (a shard that did not finish fails
        // a run whose cells all passed); the verdicts alone cannot be worse than it.
        let exit = (*exit).max(results.exit_code(verdicts.exit_code()));
        loaded.push((dir, results, verdicts, findings, exit));
    }
    let parts: Vec<crate::report::fleet::FleetPart<'_>> = loaded
        .iter()
        .map(
            |(dir, results, verdicts, findings, exit)| crate::report::fleet::FleetPart {
                folder: dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                input: crate::report::ReportInput::new(results, verdicts, findings),
                exit: *exit,
                shards: Vec::new(),
            },
        )
        .collect();
    let verdict = crate::report::fleet::exit_code(&parts, missing);
    let body = |artifacts_url: Option<&str>| {
        crate::report::fleet::render_comment(&parts, missing, artifacts_url)
    };
    // Sorted and once each: the same fleet merged in another order updates its comment.
    let mut matrices: Vec<&str> = loaded.iter().map(|l| l.1.matrix_name.as_str()).collect();
    matrices.sort_unstable();
    matrices.dedup();
    let marker = Marker::new(&matrices.join("+"), "fleet");
    let comparisons: Vec<&Comparison> = loaded.iter().map(|l| &l.2.comparison).collect();
    deliver(args, env, &body, &marker, &comparisons, verdict)
}

/// Prints the comment (`--dry-run`) or posts it, with the commit status when asked, and
/// returns `verdict`: posting never changes the exit code, and a failure to post is a
/// warning.
fn deliver(
    args: &PostSettings,
    env: &dyn Fn(&str) -> Option<String>,
    body: &dyn Fn(Option<&str>) -> String,
    marker: &Marker,
    comparisons: &[&Comparison],
    verdict: i32,
) -> Result<i32, CliError> {
    if args.dry_run {
        // The body as a pull request would show it, with the artifacts link `--artifacts-url`
        // gives; nothing is resolved that only posting needs (token, repository, number).
        print!("{}", body(args.target.artifacts_url.as_deref()));
        return Ok(verdict);
    }
    let target = match publish::resolve_target(&args.target, env) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("warning: not posting the report: {e}");
            return Ok(verdict);
        }
    };
    let body = body(target.artifacts_url.as_deref());
    let (mut regressed, mut improved, mut failed, mut cells) = (0, 0, 0, 0);
    for c in comparisons {
        let n = c.counts();
        regressed += n.regression;
        improved += n.improvement;
        failed += n.failed + n.timed_out;
        cells += n.cells;
    }
    let commit_status = args.commit_status.then(|| CommitStatus {
        state: if verdict == crate::exit::bench::OK {
            StatusState::Success
        } else {
            StatusState::Failure
        },
        description: format!(
            "{regressed} regressed, {improved} improved, {failed} failed of {cells} cells"
        ),
    });
    let opts = PostOptions {
        only_on_change: args.only_on_change,
        commit_status,
        deadline: args.deadline,
        ..PostOptions::default()
    };
    let changes = comparisons.iter().any(|c| c.has_changes());
    match publish::post(&target, &body, marker, changes, &opts) {
        Ok(outcome) => println!("bench report post: {outcome}"),
        Err(e) => eprintln!("warning: posting the report failed: {e}"),
    }
    Ok(verdict)
}
