//! `bench report merge` over the folders of several runs: a fleet's night, e.g. an H100
//! pool's nightly and an MI300X pool's, each sharded or not. Each run is merged into a
//! folder of its own under the output (named for its hardware key) and judged there against
//! its own key's baselines and the history verdicts its shards got, exactly as a merge of
//! that run alone; then the fleet's files join them: `summary.md`, `junit.xml`,
//! `report.json`, `report.html` ([`crate::report::fleet`]) and [`FILE`], which `bench report
//! post` reads to post one comment for the fleet. The exit code is the worst run's.
//!
//! It also owns the command's entry ([`merge_command`]): the folders of one run go to
//! [`super::merge`] alone, so that module never imports this one.

use std::path::{Path, PathBuf};

use super::merge::{self, Folder, MergeSettings, MergedRun};
use crate::error::CliError;
use crate::report::fleet::{self, FleetPart};
use crate::report::ReportInput;

/// The fleet's index in its folder: each run's folder, key, matrix and exit code.
pub(crate) const FILE: &str = "fleet.json";

/// The files a fleet's folder holds, which no run's folder may be named.
const RESERVED: &[&str] = &[
    FILE,
    "summary.md",
    "junit.xml",
    "report.json",
    "report.html",
    "report.png",
    "results.json",
    "results.journal",
    "history.json",
    "shards.json",
    "triage.json",
    "shard.json",
];

/// A run's folder name under the fleet's: its hardware key, with the run id after it when
/// two runs share a key; only letters, digits and `-_.`, so a key from a results file never
/// names a path outside the fleet's folder.
fn folder_name(key: &str, run_id: &str, taken: &[String]) -> String {
    let clean = |s: &str| -> String {
        let c: String = s
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                    c
                } else {
                    '_'
                }
            })
            .take(100)
            .collect();
        // A name of dots alone would be this folder or its parent, and one that begins
        // with a dot is hidden.
        if c.is_empty() || c.starts_with('.') {
            format!("run{c}")
        } else {
            c
        }
    };
    // The fleet's own files are never a run's folder.
    let busy = |n: &String| taken.contains(n) || RESERVED.contains(&n.as_str());
    let mut name = clean(key);
    if busy(&name) {
        name = format!("{name}.{}", clean(run_id));
    }
    let mut n = 2;
    let base = name.clone();
    while busy(&name) {
        name = format!("{base}.{n}");
        n += 1;
    }
    name
}

/// `bench report merge DIR... -o OUT`: the folders of one run become one run folder; the
/// folders of several runs (an H100 nightly and an MI300X nightly, each sharded or not)
/// become a fleet folder: each run merged into a folder of its own,
/// judged against its own hardware key, under one summary, JUnit, report and exit code.
pub(crate) fn merge_command(args: &MergeSettings) -> Result<i32, CliError> {
    let mut folders = Vec::new();
    for dir in &args.run_dirs {
        folders.push(merge::read_folder(dir)?);
    }
    check_output(&args.output, &args.run_dirs)?;
    let mut runs = merge::by_run(folders);
    if runs.len() == 1 {
        // A fleet merged here before would otherwise still be what `report post` finds.
        remove_stale(&args.output, &[FILE])?;
        let folders = runs.remove(0);
        return Ok(merge::merge_run(folders, &args.output, args)?.exit);
    }
    // And a single run merged here before would still read as this folder's run.
    remove_stale(
        &args.output,
        &[
            crate::results::RunResults::FILE,
            crate::results::RunResults::JOURNAL,
            crate::history::verdicts::GateReport::FILE,
            "shards.json",
            super::triage::FILE,
            super::shard::FILE,
        ],
    )?;
    merge_fleet(runs, args)
}

/// `path` absolute, with the links of its existing part resolved, so that two spellings of
/// one folder compare equal.
fn resolved(path: &Path) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut existing = abs.clone();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.file_name(), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name.to_os_string());
                existing = parent.to_path_buf();
            }
            _ => return abs,
        }
    }
    let mut out = std::fs::canonicalize(&existing).unwrap_or(existing);
    for name in rest.into_iter().rev() {
        out.push(name);
    }
    out
}

/// The output must be a folder apart from every input: written over an input it would
/// truncate that shard's logs while copying them onto themselves and replace its results.
fn check_output(out: &Path, inputs: &[PathBuf]) -> Result<(), CliError> {
    if out.exists() && !out.is_dir() {
        return Err(CliError::bad_input(miette::miette!(
            "-o {}: not a folder",
            out.display()
        )));
    }
    let o = resolved(out);
    for input in inputs {
        let i = resolved(input);
        if o == i || o.starts_with(&i) || i.starts_with(&o) {
            return Err(CliError::bad_input(miette::miette!(
                "-o {} and the input {} are one folder or one holds the other: write the merge to a folder of its own",
                out.display(),
                input.display()
            )));
        }
    }
    Ok(())
}

/// Removes the files of the other kind of merge that an earlier `bench report merge` left
/// in `out`.
fn remove_stale(out: &Path, names: &[&str]) -> Result<(), CliError> {
    for name in names {
        let path = out.join(name);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(CliError::internal(miette::miette!(
                    "{}: {e}",
                    path.display()
                )))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Merges each run of `runs` into its folder under `args.output` and writes the fleet's
/// files; returns the worst run's exit code.
pub(crate) fn merge_fleet(runs: Vec<Vec<Folder>>, args: &MergeSettings) -> Result<i32, CliError> {
    let out = &args.output;
    std::fs::create_dir_all(out)
        .map_err(|e| CliError::internal(miette::miette!("{}: {e}", out.display())))?;
    let mut merged: Vec<(String, MergedRun)> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for folders in runs {
        let key = merge::hardware_key(&folders);
        let name = folder_name(&key, merge::run_id(&folders), &names);
        names.push(name.clone());
        eprintln!(
            "== run {} on {key}: merged into {} ==",
            merge::run_id(&folders),
            out.join(&name).display()
        );
        let run = merge::merge_run(folders, &out.join(&name), args)?;
        merged.push((name, run));
    }
    let parts: Vec<FleetPart<'_>> = merged
        .iter()
        .map(|(name, m)| FleetPart {
            folder: name.clone(),
            input: ReportInput::new(&m.results, &m.verdicts, &m.findings),
            exit: m.exit,
            shards: if m.shards.len() > 1 || !m.complete {
                m.shards.iter().map(|s| s.line()).collect()
            } else {
                Vec::new()
            },
        })
        .collect();
    let summaries: Vec<String> = merged
        .iter()
        .map(|(name, _)| {
            std::fs::read_to_string(out.join(name).join("summary.md")).unwrap_or_default()
        })
        .collect();
    let write = |file: &str, text: &str| -> Result<PathBuf, CliError> {
        let path = out.join(file);
        crate::atomic::write(&path, text.as_bytes())
            .map_err(|e| CliError::internal(miette::miette!("{}: {e}", path.display())))?;
        Ok(path)
    };
    let index: Vec<fleet::PartJson> = parts.iter().map(|p| fleet::part_json(p, None)).collect();
    let exit = fleet::exit_code(&parts);
    super::write_json(
        &out.join(FILE),
        &serde_json::json!({ "runs": index, "exit_code": exit }),
    )?;
    let summary = fleet::render_summary(&parts, &summaries);
    write("summary.md", &summary)?;
    write("junit.xml", &fleet::render_junit(&parts)?)?;
    write("report.json", &fleet::render_json(&parts)?)?;
    write("report.html", &fleet::render_html(&parts))?;
    // The fleet's summary replaces the runs' own in the job's page: each run's was
    // appended when it was merged, which a reader then sees in full below the fleet's.
    if let Err(e) = crate::report::append_step_summary(&summary) {
        eprintln!("warning: {e}");
    }
    eprintln!(
        "fleet: {} runs merged into {}; exit {exit}",
        parts.len(),
        out.display()
    );
    for p in &parts {
        eprintln!(
            "  {} ({}): exit {}",
            p.folder, p.input.results.run_id, p.exit
        );
    }
    Ok(exit)
}

/// The runs of a fleet folder with each one's exit code, for `bench report post`: `None`
/// when `dir` is one run's.
pub(crate) fn runs_of(dir: &Path) -> Result<Option<Vec<(PathBuf, i32)>>, CliError> {
    #[derive(serde::Deserialize)]
    struct Run {
        folder: String,
        exit_code: i32,
    }
    #[derive(serde::Deserialize)]
    struct Index {
        runs: Vec<Run>,
    }
    let path = dir.join(FILE);
    let Some(index) = super::read_json::<Index>(&path)? else {
        return Ok(None);
    };
    let mut dirs: Vec<(PathBuf, i32)> = Vec::new();
    for r in index.runs {
        if !(0..=255).contains(&r.exit_code) {
            return Err(CliError::bad_input(miette::miette!(
                "{}: run {:?} has exit_code {}, not an exit status (0-255)",
                path.display(),
                r.folder,
                r.exit_code
            )));
        }
        // Only a plain folder name inside the fleet's folder, as the merge writes it.
        let plain = !r.folder.is_empty()
            && Path::new(&r.folder)
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
            && !r.folder.contains('/');
        if !plain {
            return Err(CliError::bad_input(miette::miette!(
                "{}: run folder {:?} is not a folder name inside the fleet's folder",
                path.display(),
                r.folder
            )));
        }
        let run = dir.join(&r.folder);
        if dirs.iter().any(|(d, _)| *d == run) {
            return Err(CliError::bad_input(miette::miette!(
                "{}: run folder {:?} is listed twice",
                path.display(),
                r.folder
            )));
        }
        if std::fs::symlink_metadata(&run).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(CliError::bad_input(miette::miette!(
                "{}: a link, not a run folder the merge wrote",
                run.display()
            )));
        }
        dirs.push((run, r.exit_code));
    }
    if dirs.is_empty() {
        return Err(CliError::bad_input(miette::miette!(
            "{}: no runs",
            path.display()
        )));
    }
    Ok(Some(dirs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_folders_are_plain_names_and_never_collide() {
        assert_eq!(folder_name("h100-sxm-80gb", "n1", &[]), "h100-sxm-80gb");
        let taken = vec!["h100-sxm-80gb".to_string()];
        assert_eq!(
            folder_name("h100-sxm-80gb", "n/2", &taken),
            "h100-sxm-80gb.n_2"
        );
        assert_eq!(folder_name("../..", "x", &[]), "run.._..");
        assert_eq!(folder_name("..", "x", &[]), "run..");
        assert_eq!(folder_name("a/b<c>", "x", &[]), "a_b_c_");
        let taken = vec!["k".to_string(), "k.r".to_string()];
        assert_eq!(folder_name("k", "r", &taken), "k.r.2");
        // The fleet's own files are never a run's folder.
        assert_eq!(folder_name("report.html", "r1", &[]), "report.html.r1");
        assert_eq!(
            folder_name("report", "html", &["report".into()]),
            "report.html.2"
        );
        assert_eq!(
            folder_name("fleet.json", "fleet.json", &[]),
            "fleet.json.fleet.json"
        );
    }
}
