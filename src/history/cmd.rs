//! The history commands: `bench history import RUN_DIR...` (back-fill from run folders),
//! `bench history CELL` (the trend with its change points), `bench history study RUN_DIR...`
//! (the calibration table) and `bench baseline accept CELL --reason ...` (an intended
//! shift starts a new segment).

use std::path::PathBuf;

use crate::error::CliError;
use crate::exit::bench as exit;
use crate::results::RunResults;

use super::changepoint::{e_divisive, Settings};
use super::detect::Policy;
use super::record::RunRecord;
use super::store::{Point, Segment};
#[cfg(test)]
use super::study::switch_of;
use super::study::{pools, pools_from_store, table};

/// Prints `text` on stdout; a closed pipe (`| head`) is not a failure. What these commands
/// print holds text from the store (reasons, run ids, host names, written by whoever
/// shares it): its control characters are shown escaped, never sent to the terminal
/// ([`crate::sanitize::terminal`]).
fn print(text: &str) {
    let _ = crate::exit::write_stdout(&crate::sanitize::terminal(text));
}

/// Refuses a SQLite store that exists but is an empty file: the read-only commands
/// (`bench history CELL`, `study --history`, `baseline accept`) must not write a schema
/// into a file that someone else created (an empty file is not a history).
fn refuse_empty_file(location: &str) -> Result<(), CliError> {
    if let Ok(super::store::Location::Sqlite(path)) = super::store::parse_location(location) {
        if std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() == 0) {
            return Err(CliError::bad_input(miette::miette!(
                "{location}: an empty file, not a bench history (a read-only command does not create one; `bench history import` or `bench matrix --history` does)"
            )));
        }
    }
    Ok(())
}

/// Refuses a run folder whose metrics no measurement can have given (zero, negative,
/// 1e308, subnormal, non-finite; [`crate::bounds`]), naming its key path: once in
/// the history such a value makes up change points and verdicts. A metric the run could
/// not compute ([`crate::bounds::not_computed`]: NaN, an MFU or TFLOP/s of 0) is not
/// refused but left out of the record, as `bench matrix` leaves it out.
fn check_metrics(dir: &std::path::Path, results: &RunResults) -> Result<(), CliError> {
    // One definition with `bench report merge`'s check of its shards.
    match results.implausible_measurement() {
        Some(why) => Err(CliError::bad_input(miette::miette!(
            "{}: {why}; not imported",
            dir.join(RunResults::FILE).display(),
        ))),
        None => Ok(()),
    }
}

/// Resolved settings of `bench history CELL`.
#[derive(Debug, Clone)]
pub(crate) struct ShowSettings {
    /// The cell whose trend is shown.
    pub cell: String,
    /// The history store (a SQLite file or a postgres:// URL).
    pub history: String,
    /// Only this hardware key; `None`: every key the cell has history on.
    pub hardware: Option<String>,
    /// The metric to show.
    pub metric: String,
}

/// Resolved settings of `bench history import`.
#[derive(Debug, Clone)]
pub(crate) struct ImportSettings {
    /// Run folders, imported in this order.
    pub run_dirs: Vec<PathBuf>,
    /// The history store (a SQLite file or a postgres:// URL).
    pub history: String,
    /// The branch the runs measured (results do not record it).
    pub branch: Option<String>,
}

/// Resolved settings of `bench history study`.
#[derive(Debug, Clone)]
pub(crate) struct StudySettings {
    /// Run folders of the study (clean runs have no BENCH_FUSED_* switch set).
    pub run_dirs: Vec<PathBuf>,
    /// A history store to read the runs from instead of `run_dirs`.
    pub history: Option<String>,
    pub metric: String,
    /// Repeats per simulated run (one row each).
    pub repeats: Vec<usize>,
    pub detect_trials: usize,
    pub alarm_trials: usize,
    /// Band half-width in robust sigmas; `None`: the policy's.
    pub sigmas: Option<f64>,
    /// Relative floor of the band; `None`: the policy's for the metric.
    pub floor: Option<f64>,
    /// Relative floor of the repeats' two-sample test; `None`: the policy's for the metric.
    pub test_floor: Option<f64>,
    /// Runs of lookback; `None`: the policy's.
    pub lookback: Option<usize>,
}

/// Resolved settings of `bench baseline accept`.
#[derive(Debug, Clone)]
pub(crate) struct AcceptSettings {
    /// The cell id.
    pub cell: String,
    /// Why the shift is intended.
    pub reason: String,
    /// The history store (a SQLite file or a postgres:// URL).
    pub history: String,
    /// Hardware key; needed when the cell has history on several.
    pub hardware: Option<String>,
    /// The first run of the new segment; `None`: the cell's latest run.
    pub run: Option<String>,
}

/// `bench history import RUN_DIR...`: each run in its own transaction, in the order given.
pub(crate) fn import(args: &ImportSettings) -> Result<i32, CliError> {
    if args.run_dirs.is_empty() {
        return Err(CliError::bad_input(miette::miette!(
            "bench history import needs at least one run folder"
        )));
    }
    // Every run folder is read and checked before the store is opened or written: one
    // impossible value refuses the import with its key path, and nothing is half done.
    let mut runs = Vec::with_capacity(args.run_dirs.len());
    for dir in &args.run_dirs {
        let results = RunResults::load(dir)?;
        check_metrics(dir, &results)?;
        runs.push(results);
    }
    let mut store = super::store::open(&args.history)?;
    for (dir, results) in args.run_dirs.iter().zip(runs) {
        let telemetry =
            crate::telemetry::load(dir).map_err(|m| CliError::bad_input(miette::miette!("{m}")))?;
        let rec = RunRecord::from_results(&results, args.branch.clone(), telemetry);
        store.record_run(&rec)?;
        print(&format!(
            "imported {} ({} cells, {}) into {}\n",
            rec.run_id,
            rec.cells.len(),
            rec.hardware_key,
            store.location
        ));
    }
    Ok(exit::OK)
}

/// Eight levels of a Unicode sparkline.
const SPARKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// A sparkline of `values` scaled between their minimum and maximum (NaN as a space).
pub(crate) fn sparkline(values: &[f64]) -> String {
    let finite = values.iter().copied().filter(|v| v.is_finite());
    let lo = finite.clone().fold(f64::INFINITY, f64::min);
    let hi = finite.fold(f64::NEG_INFINITY, f64::max);
    values
        .iter()
        .map(|&v| {
            if !v.is_finite() {
                ' '
            } else if hi > lo {
                SPARKS[(((v - lo) / (hi - lo)) * 7.0).round() as usize]
            } else {
                SPARKS[3]
            }
        })
        .collect()
}

/// A value with four significant digits and an SI suffix (`487.0K`): a trend's steps are
/// often below the three digits the reports show.
pub(crate) fn human(v: f64) -> String {
    let (x, s) = crate::format::si_scaled(v);
    let digits = if x.abs() >= 100.0 {
        1
    } else if x.abs() >= 10.0 {
        2
    } else {
        3
    };
    format!("{x:.digits$}{s}")
}

fn short(c: &Option<String>) -> String {
    // By characters, not bytes: a stored commit is text from whoever shares the store, and a
    // byte slice through a multi-byte character would panic.
    c.as_deref().map_or("-".into(), |c| {
        shown(&c.chars().take(7).collect::<String>())
    })
}

/// A stored text (a reason, a branch, a host, a run id), written by whoever shares the
/// store, as one line of the trend: cut to [`crate::sanitize::MAX_SHOWN_CHARS`] (a 50 MB
/// reason wrote 105 MB to the terminal) with its newlines and escapes shown, not acted on
/// (a reason's newline printed a line that read as bench's).
fn shown(text: &str) -> String {
    crate::sanitize::inline(&crate::sanitize::bounded(
        text,
        crate::sanitize::MAX_SHOWN_CHARS,
    ))
    .into_owned()
}

/// The widest host name the trend's table shows whole; a longer one is cut with an ellipsis.
const HOST_WIDTH: usize = 24;

fn host_cell(host: &str) -> String {
    if host.chars().count() <= HOST_WIDTH {
        host.to_string()
    } else {
        let mut cut: String = host.chars().take(HOST_WIDTH - 1).collect();
        cut.push('…');
        cut
    }
}

/// One line naming the hosts that ran the cell on this hardware key, each with its runs and
/// its median against the median of every run, when there are two or more: a CI pool has
/// several runners per key, and a runner that runs the cell a few percent below the others
/// is a fact of the pool (the gate calls its nights `environment` when the side-by-side
/// pairs say the code is the same), which a single trend line would hide.
fn hosts_line(trend: &[Point]) -> String {
    let mut by_host: indexmap::IndexMap<&str, Vec<f64>> = indexmap::IndexMap::new();
    for p in trend {
        by_host.entry(p.host.as_str()).or_default().push(p.value);
    }
    if by_host.len() < 2 {
        return String::new();
    }
    let all: Vec<f64> = trend.iter().map(|p| p.value).collect();
    let overall = crate::metrics::stats::median(&all).unwrap_or(0.0);
    let parts: Vec<String> = by_host
        .iter()
        .map(|(host, values)| {
            let m = crate::metrics::stats::median(values).unwrap_or(0.0);
            let rel = if overall > 0.0 {
                format!(" ({:+.1}%)", (m / overall - 1.0) * 100.0)
            } else {
                String::new()
            };
            let runs = if values.len() == 1 { "run" } else { "runs" };
            format!(
                "{} {} {runs}, median {}{rel}",
                host_cell(&shown(host)),
                values.len(),
                human(m)
            )
        })
        .collect();
    format!("  hosts: {}\n", parts.join("; "))
}

/// The text of one cell's trend on one hardware key.
pub(crate) fn render_trend(
    cell: &str,
    key: &str,
    metric: &str,
    trend: &[Point],
    segments: &[Segment],
) -> String {
    let mut out = String::new();
    let values: Vec<f64> = trend.iter().map(|p| p.value).collect();
    out.push_str(&format!(
        "{cell} on {key}: {metric}, {} runs\n",
        trend.len()
    ));
    if trend.is_empty() {
        return out;
    }
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    out.push_str(&format!(
        "  {}  ({} .. {})\n",
        sparkline(&values),
        human(lo),
        human(hi)
    ));
    for s in segments {
        out.push_str(&format!(
            "  segment from run {} ({}): accepted {}: {}\n",
            shown(&s.first_run_id),
            shown(&s.starts_at),
            shown(&s.accepted_at),
            shown(&s.reason)
        ));
    }
    let cps = e_divisive(&values, &Settings::default());
    if cps.is_empty() {
        out.push_str(
            "  no change points (E-divisive means, Matteson & James 2014; permutation p <= 0.05)\n",
        );
    } else {
        out.push_str(
            "  change points (E-divisive means, Matteson & James 2014; permutation p <= 0.05):\n",
        );
        for cp in &cps {
            let first = &trend[cp.index];
            let good = &trend[cp.index - 1];
            let accepted = segments
                .iter()
                .find(|s| s.first_run_id == first.run_id)
                .map(|s| format!(" [accepted: {}]", shown(&s.reason)))
                .unwrap_or_default();
            out.push_str(&format!(
                "    from run {} (commit {}, {}): {} -> {} ({:+.1}%, p={:.3}); last good: run {} (commit {}){accepted}\n",
                shown(&first.run_id),
                short(&first.commit),
                shown(&first.started_at),
                human(cp.mean_before),
                human(cp.mean_after),
                cp.rel_change() * 100.0,
                cp.p_value,
                shown(&good.run_id),
                short(&good.commit),
            ));
        }
    }
    out.push_str(&hosts_line(trend));
    let w = trend
        .iter()
        .map(|p| shown(&p.run_id).chars().count())
        .max()
        .unwrap_or(6)
        .max(6);
    let hw = trend
        .iter()
        .map(|p| p.host.chars().count().min(HOST_WIDTH))
        .max()
        .unwrap_or(4)
        .max(4);
    out.push_str(&format!(
        "  {:<w$}  {:<20}  {:<7}  {:<16}  {:<hw$}  {:>9}  {:>7}  flags\n",
        "run", "started", "commit", "branch", "host", "value", "spread"
    ));
    for p in trend {
        let mut flags = Vec::new();
        if p.throttled {
            flags.push("throttled".to_string());
        }
        if let Some(s) = segments.iter().find(|s| s.first_run_id == p.run_id) {
            flags.push(format!("new segment: {}", shown(&s.reason)));
        }
        out.push_str(&format!(
            "  {:<w$}  {:<20}  {:<7}  {:<16}  {:<hw$}  {:>9}  {:>6.2}%  {}\n",
            shown(&p.run_id),
            shown(&p.started_at),
            short(&p.commit),
            p.branch.as_deref().map_or("-".into(), shown),
            host_cell(&shown(&p.host)),
            human(p.value),
            p.rel_spread * 100.0,
            flags.join(", ")
        ));
    }
    out
}

/// `bench history CELL`.
pub(crate) fn show(args: &ShowSettings) -> Result<i32, CliError> {
    let cell = args.cell.as_str();
    refuse_empty_file(&args.history)?;
    let mut store = super::store::open_existing(&args.history)?;
    let known = store.hardware_keys(cell, &args.metric)?;
    let keys = match &args.hardware {
        // A hardware key with no history of the cell is bad input, as an unknown cell is.
        Some(k) if !known.contains(k) => {
            return Err(CliError::bad_input(miette::miette!(
                "{}: --hardware {}: no run of cell {} on that hardware key has {} (keys with history: {})",
                store.location,
                crate::sanitize::terminal(k),
                crate::sanitize::inline(cell),
                args.metric,
                if known.is_empty() { "none".to_string() } else { crate::sanitize::terminal(&known.join(", ")).into_owned() }
            )))
        }
        Some(k) => vec![k.clone()],
        None => known,
    };
    if keys.is_empty() {
        return Err(CliError::bad_input(miette::miette!(
            "{}: no run in the history has {} for cell {}",
            store.location,
            crate::sanitize::terminal(&args.metric),
            // The argument is text from outside: its escape sequences never reach the
            // terminal (issue 42).
            crate::sanitize::inline(cell)
        )));
    }
    for key in keys {
        let trend = store.trend(cell, &key, &args.metric)?;
        let segments = store.segments(cell, &key)?;
        print(&render_trend(cell, &key, &args.metric, &trend, &segments));
    }
    Ok(exit::OK)
}

/// `bench baseline accept CELL --reason ...`.
pub(crate) fn accept(args: &AcceptSettings) -> Result<i32, CliError> {
    if args.reason.trim().is_empty() {
        return Err(CliError::bad_input(miette::miette!(
            "--reason: say why the shift is intended (it is kept with the segment)"
        )));
    }
    refuse_empty_file(&args.history)?;
    let mut store = super::store::open_existing(&args.history)?;
    let key = match &args.hardware {
        Some(k) => k.clone(),
        None => {
            let keys = store.hardware_keys(&args.cell, super::gate::METRIC)?;
            match keys.as_slice() {
                [one] => one.clone(),
                [] => {
                    return Err(CliError::bad_input(miette::miette!(
                        "{}: no run in the history has cell {}",
                        store.location,
                        crate::sanitize::inline(&args.cell)
                    )))
                }
                many => {
                    return Err(CliError::bad_input(miette::miette!(
                    "cell {} has history on several hardware keys ({}): name one with --hardware",
                    crate::sanitize::inline(&args.cell),
                    many.join(", ")
                )))
                }
            }
        }
    };
    let run = match &args.run {
        Some(r) => r.clone(),
        None => {
            let trend = store.trend(&args.cell, &key, super::gate::METRIC)?;
            // The latest run of the cell, never a confirming re-run (a segment that began
            // at `<run>-confirm` would leave its own run out of the new normal).
            match trend
                .iter()
                .rev()
                .find(|p| !super::gate::is_confirm_run(&p.run_id))
            {
                Some(p) => p.run_id.clone(),
                None => {
                    return Err(CliError::bad_input(miette::miette!(
                        "{}: no run of cell {} on {key}",
                        store.location,
                        crate::sanitize::inline(&args.cell)
                    )))
                }
            }
        }
    };
    let seg = store.accept(&args.cell, &key, &run, &args.reason)?;
    print(&format!(
        "{}: new segment of {} on {} from run {} ({}): {}\n",
        store.location,
        shown(&seg.cell_id),
        shown(&seg.hardware_key),
        shown(&seg.first_run_id),
        shown(&seg.starts_at),
        shown(&seg.reason)
    ));
    Ok(exit::OK)
}

/// `bench history study RUN_DIR...`.
pub(crate) fn study(args: &StudySettings) -> Result<i32, CliError> {
    // The simulations are minutes of pure computation with no stop of their own: Ctrl-C
    // and SIGTERM end them at once (exit 130), even where the shell started bench with
    // SIGINT ignored (a background job of a script).
    let _interruptible = super::interrupt::Guard::new();
    let (cells, sequences, source) = match &args.history {
        Some(location) => {
            refuse_empty_file(location)?;
            let mut store = crate::history::store::open_existing(location)?;
            let cells = pools_from_store(&mut store, &args.metric)?;
            let sequences = super::sequence::from_store(&mut store, &args.metric)?;
            (cells, sequences, format!("the history {}", store.location))
        }
        None => {
            let mut runs: Vec<RunResults> = Vec::new();
            let mut seen: Vec<(std::path::PathBuf, &std::path::PathBuf)> = Vec::new();
            for d in &args.run_dirs {
                // A folder named twice (or two names of one folder) would count its runs
                // twice and make the study's rates up; the same run id in two folders too.
                let real = std::fs::canonicalize(d).unwrap_or_else(|_| d.clone());
                if let Some((_, first)) = seen.iter().find(|(r, _)| r == &real) {
                    return Err(CliError::bad_input(miette::miette!(
                        "{}: the same run folder as {}, given twice: each run counts once",
                        d.display(),
                        first.display()
                    )));
                }
                seen.push((real, d));
                let r = RunResults::load(d)?;
                if let Some(other) = runs.iter().position(|x| x.run_id == r.run_id) {
                    return Err(CliError::bad_input(miette::miette!(
                        "{}: run {} is also in {}: each run counts once",
                        d.display(),
                        crate::sanitize::clean(&r.run_id),
                        args.run_dirs[other].display()
                    )));
                }
                runs.push(r);
            }
            (
                pools(&runs, &args.metric),
                super::sequence::from_results(&runs, &args.metric),
                format!("{} run folder(s)", runs.len()),
            )
        }
    };
    if cells.is_empty() {
        return Err(CliError::bad_input(miette::miette!(
            "no cell has two or more clean repeats of {} in {source}",
            args.metric,
        )));
    }
    // The shipped policy of the metric (the energy metrics' floors are wider), with the
    // knobs given.
    let shipped = Policy::default().for_metric(&args.metric);
    let policy = Policy {
        threshold_sigmas: args.sigmas.unwrap_or(shipped.threshold_sigmas),
        floor_rel: args.floor.unwrap_or(shipped.floor_rel),
        lookback: args.lookback.unwrap_or(shipped.lookback),
        two_sample: super::twosample::TwoSamplePolicy {
            floor_rel: args.test_floor.unwrap_or(shipped.two_sample.floor_rel),
            ..shipped.two_sample
        },
        ..shipped
    };
    print(&format!("Study of {source}.\n\n"));
    print(&table(
        &cells,
        &policy,
        &args.repeats,
        args.detect_trials,
        args.alarm_trials,
    ));
    // The same runs as months of ordered nights through the shipped verdict.
    print("\n");
    print(&super::sequence::table(
        &sequences,
        &policy,
        (args.alarm_trials / 30).clamp(1, 2000),
    ));
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(run: &str, host: &str, value: f64) -> Point {
        Point {
            run_id: run.into(),
            started_at: "2026-11-01T00:00:00Z".into(),
            commit: Some(format!("{run}-sha")),
            branch: Some("main".into()),
            host: host.into(),
            throttled: false,
            value,
            rel_spread: 0.0,
            samples: vec![value],
            loss_curve: Vec::new(),
            switches: indexmap::IndexMap::new(),
            versions: Default::default(),
            telemetry: None,
            context: indexmap::IndexMap::new(),
            verdict: None,
        }
    }

    #[test]
    fn the_trend_tells_the_hosts_of_a_key_apart() {
        let one = [
            point("n1", "runner-a", 100.0),
            point("n2", "runner-a", 101.0),
        ];
        assert_eq!(hosts_line(&one), "", "one host needs no hosts line");
        let two = [
            point("n1", "runner-a", 100.0),
            point("n2", "runner-b", 98.0),
            point("n3", "runner-a", 100.0),
            point("n4", "runner-b", 98.0),
            point("n5", "runner-a", 100.0),
        ];
        assert_eq!(
            hosts_line(&two),
            "  hosts: runner-a 3 runs, median 100.0 (+0.0%); runner-b 2 runs, median 98.00 (-2.0%)\n"
        );
        let text = render_trend("c", "k", "tokens_per_s", &two, &[]);
        let header = text
            .lines()
            .find(|l| l.trim_start().starts_with("run "))
            .unwrap();
        assert!(header.contains(" host "), "{text}");
        assert!(
            text.lines()
                .any(|l| l.contains("n4") && l.contains("runner-b")),
            "{text}"
        );
        let long = "h".repeat(100);
        assert_eq!(host_cell(&long).chars().count(), HOST_WIDTH);
    }

    #[test]
    fn sparklines_span_the_eight_levels() {
        assert_eq!(sparkline(&[1.0, 2.0, 8.0]), "▁▂█");
        assert_eq!(sparkline(&[5.0, 5.0]), "▄▄");
        assert_eq!(sparkline(&[1.0, f64::NAN, 2.0]), "▁ █");
        assert_eq!(sparkline(&[]), "");
    }

    #[test]
    fn a_run_with_a_workload_switch_is_not_a_clean_run() {
        let sw = |pairs: &[(&str, &str)]| -> indexmap::IndexMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(switch_of(&sw(&[("NCCL_ALGO", "Ring")]), "nightly-7"), "");
        assert_eq!(
            switch_of(
                &sw(&[
                    ("BENCH_FP8_SCALING", "delayed"),
                    ("BENCH_FUSED_RMS", "0"),
                    ("BENCH_OVERLAP_ADAMW", "1"),
                    ("OMP_NUM_THREADS", "8"),
                ]),
                "nightly-8"
            ),
            "BENCH_FP8_SCALING=delayed,BENCH_FUSED_RMS=0,BENCH_OVERLAP_ADAMW=1"
        );
        // Older results name the slowed switch in the run id only.
        assert_eq!(
            switch_of(&sw(&[]), "slow-003-BENCH_FUSED_ADAMW"),
            "BENCH_FUSED_ADAMW=0"
        );
    }

    #[test]
    fn human_numbers_keep_four_digits() {
        assert_eq!(human(487_012.0), "487.0K");
        assert_eq!(human(56_712.0), "56.71K");
        assert_eq!(human(1.5e6), "1.500M");
        assert_eq!(human(0.4312), "0.431");
    }
}
