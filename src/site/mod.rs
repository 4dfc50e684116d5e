//! `bench site --history STORE -o DIR`: a static site over the whole history store, for a
//! fleet's nightly to publish as a GitHub or GitLab Pages artifact or to open from disk (no
//! server, nothing fetched).
//!
//! It owns the site: reading the fleet from the store in four queries
//! ([`crate::history::History::fleet`], `fleet_runs`, `all_segments`, `all_triage`, and
//! `costs`), the
//! series per cell, hardware key and branch with their change points and open regressions
//! ([`model`], pure), each open finding's triage ([`triage`]: its bisection, kernels and
//! probed commits, from the history or the run folders), and the pages ([`pages`]):
//! `index.html` (every series with its last value and verdict and a sparkline, filters by
//! axis value, hardware key, branch and verdict, the open regressions first, grouped by the
//! run that opened them with their suspects and triage), one
//! page per cell (the trend per hardware key and branch with change points, verdict marks
//! and accepted shifts) and one page per run (its cells' verdicts, what its verdict cost
//! in GPU-seconds, and a link to its `report.html` when `--runs DIR` holds its run
//! folder). [`synthetic`] generates a store of
//! a fleet's year for the tests and `scripts/site-bench.sh`.
//!
//! It is a command-layer module (rank 7 in scripts/module-graph.py): it opens a store and
//! renders, which a reporter (`report`) never does.

mod model;
mod pages;
pub mod synthetic;
mod triage;

use std::path::{Path, PathBuf};

use crate::error::CliError;
use crate::exit::bench as exit;

pub use pages::Written;

/// Settings of `bench site`.
#[derive(Debug, Clone)]
pub struct SiteSettings {
    /// The history store (a SQLite file or a postgres:// URL).
    pub history: String,
    /// The folder the site is written into.
    pub output: PathBuf,
    /// Only this branch's runs.
    pub branch: Option<String>,
    /// A folder of run folders (`DIR/RUN_ID/report.html`), to link each run's report.
    pub runs: Option<PathBuf>,
    /// The metric the site draws.
    pub metric: String,
}

/// What a build wrote, for the command's line and the benchmark script.
#[derive(Debug, Clone, PartialEq)]
pub struct Built {
    pub series: usize,
    pub values: usize,
    pub findings: usize,
    pub written: Written,
}

/// `bench site`: builds the site and prints one line saying what it wrote.
pub(crate) fn command(settings: &SiteSettings) -> Result<i32, CliError> {
    let built = build(settings)?;
    println!(
        "bench site: {} cells, {} runs, {} series, {} values, {} open findings -> {} ({:.1} MB)",
        built.written.cells,
        built.written.runs,
        built.series,
        built.values,
        built.findings,
        settings.output.join("index.html").display(),
        built.written.bytes as f64 / 1e6
    );
    Ok(exit::OK)
}

/// Builds the site of `settings.history` into `settings.output`.
pub fn build(settings: &SiteSettings) -> Result<Built, CliError> {
    // What the site reads must not be inside what it replaces: a store or run folders
    // under `-o` were deleted with the previous site.
    if !settings.history.contains("://") {
        crate::files::input_outside_output(
            "--history",
            Path::new(&settings.history),
            &settings.output,
        )
        .map_err(|m| CliError::bad_input(miette::miette!("{m}")))?;
    }
    if let Some(dir) = &settings.runs {
        crate::files::input_outside_output("--runs", dir, &settings.output)
            .map_err(|m| CliError::bad_input(miette::miette!("{m}")))?;
    }
    let out = &output_folder(&settings.output)?;
    if let Some(dir) = &settings.runs {
        if !dir.is_dir() {
            return Err(CliError::bad_input(miette::miette!(
                "--runs {}: not a folder of run folders",
                dir.display()
            )));
        }
    }
    let mut store = crate::history::open_existing(&settings.history)?;
    let values = store.fleet(&settings.metric)?;
    if values.is_empty() {
        return Err(CliError::bad_input(miette::miette!(
            "{}: the store has no run with {}: nothing to show",
            store.location,
            settings.metric
        )));
    }
    let runs = store.fleet_runs()?;
    let segments = store.all_segments()?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let count = values.len();
    let fleet = model::build(runs, values, segments, settings.branch.as_deref(), threads);
    if fleet.series.is_empty() {
        // Every value was a bisection's round or a confirming re-run, or of another branch.
        return Err(CliError::bad_input(match settings.branch.as_deref() {
            Some(b) => miette::miette!("--branch {b}: no run of that branch in {}", store.location),
            None => miette::miette!(
                "{}: the store holds only bisection rounds and confirming re-runs of {}: no nightly's trend to show",
                store.location,
                settings.metric
            ),
        }));
    }
    let suspects = fleet
        .findings
        .iter()
        .map(|f| suspects(&mut store, &fleet, f, &settings.metric))
        .collect::<Result<Vec<_>, _>>()?;
    let kept = triage::Kept::of(store.all_triage()?, &store.location);
    let triage = fleet
        .findings
        .iter()
        .map(|f| triage::of(&mut store, &fleet, f, &kept, settings.runs.as_deref()))
        .collect::<Result<Vec<_>, _>>()?;
    std::fs::create_dir_all(out).map_err(|e| {
        CliError::bad_input(miette::miette!(
            "-o {}: cannot create it: {e}",
            out.display()
        ))
    })?;
    // After the folder exists: the links are made relative to where it really is.
    let reports = fleet
        .runs
        .iter()
        .map(|r| report_link(settings.runs.as_deref(), out, &r.run_id))
        .collect();
    // What each run's verdict cost, where the store kept it (schema 6 on): a run recorded
    // before shows none, and a forged row is skipped with a warning by the store.
    let mut costs = store.costs()?;
    let costs = fleet.runs.iter().map(|r| costs.remove(&r.run_id)).collect();
    let cx = pages::Context {
        store: &store.location,
        costs,
        metric: &settings.metric,
        branch: settings.branch.as_deref(),
        reports,
        suspects,
        triage,
        generated_at: crate::history::store::now(),
    };
    let written = write_fresh(out, |dir| pages::write_site(dir, &fleet, &cx))?;
    Ok(Built {
        series: fleet.series.len(),
        values: count,
        findings: fleet.findings.len(),
        written,
    })
}

/// The file a site bench wrote holds at its root: a later `bench site -o` over the folder
/// knows it is bench's own to replace.
const MARKER: &str = ".bench-site";

/// The folder `-o` names, checked before anything is read: a new folder, an empty one, or
/// a site bench wrote (the folder a symbolic link names, when `-o` is one). A folder
/// holding anything else is refused, since the site replaces its output whole; so are a
/// file, a dangling link and a path that cannot be read or written (exit 2, naming `-o`;
/// [`crate::files::output_folder`], as every command's output folder).
fn output_folder(out: &Path) -> Result<PathBuf, CliError> {
    let bad = |why: String| CliError::bad_input(miette::miette!("-o {}: {why}", out.display()));
    crate::files::output_folder("-o", out)?;
    let meta = match std::fs::symlink_metadata(out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(crate::files::resolved(out))
        }
        Err(e) => return Err(bad(format!("cannot read it: {e}"))),
        Ok(m) => m,
    };
    // A link's folder exists: the check above refused a dangling one.
    // The folder itself, with `..` and links resolved: `-o site/cells/..` is `site`, which
    // the site is then put in place of (renaming `site/cells/..` failed after the build).
    let dir = if meta.file_type().is_symlink() {
        std::fs::canonicalize(out).map_err(|e| bad(format!("cannot follow the link: {e}")))?
    } else {
        crate::files::resolved(out)
    };
    let mut entries = std::fs::read_dir(&dir).map_err(|e| bad(format!("cannot list it: {e}")))?;
    let empty = entries.next().is_none();
    // Sites written before the marker have their index and script.
    // The marker counts only with the words bench writes in it: an empty `.bench-site`
    // beside a user's files made the rebuild delete them.
    let marked = crate::files::read_to_string_bounded(&dir.join(MARKER), 4096)
        .is_ok_and(|t| t.starts_with("written by bench site"));
    let a_site =
        marked || (dir.join("index.html").is_file() && dir.join("assets/site.js").is_file());
    if !empty && !a_site {
        return Err(bad(format!(
            "a folder holding files bench site did not write (no {MARKER} in it); the site replaces its output folder whole, so give a new or empty folder, or a site bench wrote"
        )));
    }
    // A site bench wrote, with something a person put beside its pages (a CNAME, the
    // store itself): refused, since the rebuild would delete it.
    crate::files::only_listed_entries(&dir, out, "bench site")
        .map_err(|m| CliError::bad_input(miette::miette!("{m}")))?;
    Ok(dir)
}

/// Writes the site with `write` into a new folder beside `out`, then puts it in `out`'s
/// place, so `out` holds exactly this build's pages (none of a cell or run the store no
/// longer has) and a build that fails halfway leaves the previous site as it was.
fn write_fresh(
    out: &Path,
    write: impl FnOnce(&Path) -> Result<Written, String>,
) -> Result<Written, CliError> {
    let io = |what: &str, p: &Path, e: std::io::Error| {
        CliError::internal(miette::miette!("bench site: {what} {}: {e}", p.display()))
    };
    let out = std::path::absolute(out).map_err(|e| io("cannot resolve", out, e))?;
    let parent = out.parent().unwrap_or(Path::new("/")).to_path_buf();
    // `-o public/site` where `public` is new: the staging folder goes beside the site, so
    // the folders above it are made first (the output check found them writable).
    std::fs::create_dir_all(&parent).map_err(|e| io("cannot make", &parent, e))?;
    let staging = tempfile::Builder::new()
        .prefix(".bench-site-new-")
        .tempdir_in(&parent)
        .map_err(|e| {
            CliError::bad_input(miette::miette!(
                "-o {}: cannot write beside it in {}: {e}",
                out.display(),
                parent.display()
            ))
        })?;
    let mut written = write(staging.path())
        .map_err(|m| CliError::internal(miette::miette!("bench site: writing {m}")))?;
    let marker = format!("written by bench site {}\n", env!("CARGO_PKG_VERSION"));
    std::fs::write(staging.path().join(MARKER), &marker)
        .map_err(|e| io("cannot write", &staging.path().join(MARKER), e))?;
    written.bytes += marker.len() as u64;
    crate::files::list_written(staging.path()).map_err(|e| {
        io(
            "cannot write",
            &staging.path().join(crate::files::WRITTEN_LIST),
            e,
        )
    })?;
    let new = staging.keep();
    if out.exists() {
        let old = tempfile::Builder::new()
            .prefix(".bench-site-old-")
            .tempdir_in(&parent)
            .map_err(|e| io("cannot make room in", &parent, e))?
            .keep();
        // `old` exists (empty): the rename of a folder onto an empty one replaces it.
        std::fs::rename(&out, &old).map_err(|e| io("cannot move aside", &out, e))?;
        if let Err(e) = std::fs::rename(&new, &out) {
            // Put the previous site back rather than leave no site at all.
            let _ = std::fs::rename(&old, &out);
            let _ = std::fs::remove_dir_all(&new);
            return Err(io("cannot put the new site at", &out, e));
        }
        std::fs::remove_dir_all(&old)
            .map_err(|e| io("cannot remove the previous site", &old, e))?;
    } else {
        std::fs::rename(&new, &out).map_err(|e| io("cannot put the new site at", &out, e))?;
    }
    Ok(written)
}

/// What changed between a finding's last good run and the run that opened it (commits,
/// switches, versions, host), read from its first cell's full trend: one query per open
/// finding, not per cell, since the cells of a finding share both runs.
fn suspects(
    store: &mut crate::history::History,
    fleet: &model::Fleet,
    f: &model::Finding,
    metric: &str,
) -> Result<Vec<String>, CliError> {
    let o = &f.cells[0];
    let s = &fleet.series[o.series];
    let Some(good) = o.last_good else {
        return Ok(Vec::new());
    };
    let (good, bad) = (
        &fleet.runs[s.values[good].run].run_id,
        &fleet.runs[s.values[o.first_bad].run].run_id,
    );
    let trend = store.trend(&s.cell, &s.key, metric)?;
    let find = |id: &str| trend.iter().find(|p| p.run_id == id);
    let (Some(g), Some(b)) = (find(good), find(bad)) else {
        return Ok(Vec::new());
    };
    use crate::history::suspects::{changes, Identity};
    Ok(changes(&Identity::of_point(g), &Identity::of_point(b))
        .iter()
        .map(|c| c.render())
        .collect())
}

/// The link from a run page (in `OUT/runs/`) to the run's `report.html`, when `runs` holds
/// `RUN_ID/report.html`: a relative path when the run folders and the site share a root
/// (a Pages artifact that carries both), else a `file://` URL of the absolute path. A run
/// id that is not a valid id (`../x`) is never joined to a path.
fn report_link(runs: Option<&Path>, out: &Path, run_id: &str) -> Option<String> {
    let runs = runs?;
    if !crate::ids::is_valid(run_id) {
        return None;
    }
    let report = runs.join(run_id).join("report.html");
    if !report.is_file() {
        return None;
    }
    let report = std::fs::canonicalize(&report).ok()?;
    let from = std::fs::canonicalize(out).ok()?.join("runs");
    let rel = relative(&from, &report);
    Some(rel.unwrap_or_else(|| format!("file://{}", report.display())))
}

/// `to` relative to the folder `from` (both absolute), with `/` separators and every
/// component percent-encoded where a URL needs it.
fn relative(from: &Path, to: &Path) -> Option<String> {
    let a: Vec<_> = from.components().collect();
    let b: Vec<_> = to.components().collect();
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    if common == 0 {
        return None;
    }
    let mut parts: Vec<String> = vec!["..".into(); a.len() - common];
    for c in &b[common..] {
        let s = c.as_os_str().to_str()?;
        parts.push(
            s.bytes()
                .map(|ch| match ch {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                        (ch as char).to_string()
                    }
                    _ => format!("%{ch:02X}"),
                })
                .collect(),
        );
    }
    Some(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_link_is_relative_to_the_run_pages() {
        let d = tempfile::tempdir().unwrap();
        let runs = d.path().join("results");
        std::fs::create_dir_all(runs.join("night 1")).unwrap();
        std::fs::create_dir_all(runs.join("n2")).unwrap();
        std::fs::write(runs.join("n2/report.html"), "x").unwrap();
        let out = d.path().join("site");
        std::fs::create_dir_all(&out).unwrap();
        assert_eq!(
            report_link(Some(&runs), &out, "n2").as_deref(),
            Some("../../results/n2/report.html")
        );
        assert_eq!(report_link(Some(&runs), &out, "n1"), None);
        assert_eq!(report_link(Some(&runs), &out, "../results/n2"), None);
        assert_eq!(
            relative(Path::new("/a/b"), Path::new("/a/c d/r.html")).as_deref(),
            Some("../c%20d/r.html")
        );
    }
}
