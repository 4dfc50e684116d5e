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

/// A hardware kind `--expect-kinds` names: a hardware key, or the start of keys before a
/// `-` (`h100` is `h100-sxm-80gb` and `h100-pcie-80gb`), with the shards its run must have.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ExpectedKind {
    pub kind: String,
    pub shards: Option<u32>,
}

impl ExpectedKind {
    /// `KIND` or `KIND=SHARDS`.
    fn parse(text: &str) -> Result<ExpectedKind, CliError> {
        let bad =
            |why: String| CliError::bad_input(miette::miette!("--expect-kinds {text:?}: {why}"));
        let (kind, shards) = match text.split_once('=') {
            Some((k, n)) => {
                let n: u32 = n
                    .parse()
                    .ok()
                    .filter(|n| (1..=crate::shard::MAX_SHARDS).contains(n))
                    .ok_or_else(|| {
                        bad(format!(
                            "{n:?} is not a shard count between 1 and {}",
                            crate::shard::MAX_SHARDS
                        ))
                    })?;
                (k, Some(n))
            }
            None => (text, None),
        };
        crate::ids::check_hardware_key("--expect-kinds", kind).map_err(|e| bad(e.to_string()))?;
        Ok(ExpectedKind {
            kind: kind.to_string(),
            shards,
        })
    }

    fn matches(&self, key: &str) -> bool {
        key == self.kind
            || key
                .strip_prefix(self.kind.as_str())
                .is_some_and(|rest| rest.starts_with('-'))
    }
}

/// What the fleet was told to expect and did not get, one line each: a kind no run was
/// measured on, or a kind whose run has another number of shards.
fn missing_kinds(expected: &[ExpectedKind], runs: &[Vec<Folder>]) -> Vec<String> {
    let mut out = Vec::new();
    for e in expected {
        let mine: Vec<&Vec<Folder>> = runs
            .iter()
            .filter(|r| e.matches(&merge::hardware_key(r)))
            .collect();
        if mine.is_empty() {
            out.push(format!(
                "hardware kind {}: no run was given (it never uploaded, or failed before its first cell){}",
                e.kind,
                e.shards
                    .map(|n| format!("; {n} shard{} expected", if n == 1 { "" } else { "s" }))
                    .unwrap_or_default()
            ));
            continue;
        }
        if let Some(n) = e.shards {
            for r in mine {
                let got = merge::shard_count(r);
                if got != n {
                    out.push(format!(
                        "hardware kind {}: run {} has {got} shard{}, {n} expected",
                        e.kind,
                        merge::run_id(r),
                        if got == 1 { "" } else { "s" }
                    ));
                }
            }
        }
    }
    out
}

/// `bench report merge DIR... -o OUT`: the folders of one run become one run folder; the
/// folders of several runs (an H100 nightly and an MI300X nightly, each sharded or not)
/// become a fleet folder: each run merged into a folder of its own,
/// judged against its own hardware key, under one summary, JUnit, report and exit code.
/// With `--expect-kinds`, the output is a fleet folder that names each expected hardware
/// kind no run was given for.
///
/// Everything is written into a new folder beside `OUT` that replaces it only once the
/// merge succeeded: `OUT` then holds this merge's files alone (an earlier merge's
/// history, triage or fleet index never reads as this one's), and a refused merge leaves
/// nothing behind.
pub(crate) fn merge_command(args: &MergeSettings) -> Result<i32, CliError> {
    let expected = args
        .expect_kinds
        .iter()
        .map(|k| ExpectedKind::parse(k))
        .collect::<Result<Vec<_>, _>>()?;
    let mut folders = Vec::new();
    for dir in &args.run_dirs {
        folders.push(merge::read_folder(dir)?);
    }
    let out = check_output(&args.output, &args.run_dirs, &args.baselines)?;
    let runs = merge::by_run(folders);
    let missing = missing_kinds(&expected, &runs);
    // Every run is merged and checked (its baseline file too) before anything is written:
    // a fleet whose second run is refused must not have written its first run's folder
    // and summary lines already.
    let mut runs = runs
        .into_iter()
        .map(|folders| merge::check_run(folders, args))
        .collect::<Result<Vec<_>, _>>()?;
    let stage = Stage::new(&out)?;
    let exit = if runs.len() == 1 && expected.is_empty() {
        let run = runs.remove(0);
        merge::merge_run(run, stage.path(), args).map(|m| m.exit)
    } else {
        // In JSON the fleet's report is stdout's one document (each run's would be one more).
        let args = MergeSettings {
            run_stdout: args.format != crate::format::Format::Json,
            ..args.clone()
        };
        merge_fleet(runs, stage.path(), &out, &missing, &args)
    };
    // The list of what the merge wrote, so a later merge over the folder can tell a file a
    // person put there from its own.
    let exit = exit.and_then(|exit| {
        crate::files::list_written(stage.path())
            .map(|()| exit)
            .map_err(|e| CliError::internal(miette::miette!("{}: {e}", stage.path().display())))
    });
    match exit {
        Ok(exit) => {
            stage.commit()?;
            Ok(exit)
        }
        Err(e) => {
            stage.discard();
            Err(e)
        }
    }
}

/// The folder a merge is written into before it replaces its output.
struct Stage {
    out: PathBuf,
    path: PathBuf,
}

impl Stage {
    fn new(out: &Path) -> Result<Stage, CliError> {
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent)
            .map_err(|e| CliError::internal(miette::miette!("{}: {e}", parent.display())))?;
        let name = out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "merge".into());
        let path = parent.join(format!(".{name}.merging-{}", std::process::id()));
        // A folder of that name is a merge of this process id that died: its leftovers.
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir(&path)
            .map_err(|e| CliError::internal(miette::miette!("{}: {e}", path.display())))?;
        Ok(Stage {
            out: out.to_path_buf(),
            path,
        })
    }

    fn path(&self) -> &Path {
        &self.path
    }

    /// Puts the merge in place of the output (an earlier merge's folder goes).
    fn commit(self) -> Result<(), CliError> {
        let internal = |p: &Path, e: std::io::Error| {
            CliError::internal(miette::miette!("{}: {e}", p.display()))
        };
        let mut old = self.path.clone().into_os_string();
        old.push(".old");
        let old = PathBuf::from(old);
        if self.out.exists() {
            std::fs::rename(&self.out, &old).map_err(|e| internal(&self.out, e))?;
        }
        std::fs::rename(&self.path, &self.out).map_err(|e| internal(&self.out, e))?;
        if old.exists() {
            if let Err(e) = std::fs::remove_dir_all(&old) {
                eprintln!("warning: {}: {e}", old.display());
            }
        }
        Ok(())
    }

    fn discard(self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The output must be a folder apart from every input (written over an input it would
/// truncate that shard's logs while copying them onto themselves and replace its
/// results), new, empty or an earlier merge's (it is replaced whole), and a folder that
/// can be written ([`crate::files::output_folder`]: not a link that leads nowhere, a file,
/// or under one, nor read-only). Returns the folder to write: where a link to a folder
/// leads.
fn check_output(out: &Path, inputs: &[PathBuf], baselines: &Path) -> Result<PathBuf, CliError> {
    crate::files::output_folder("-o", out)?;
    let o = crate::files::resolved(out);
    for input in inputs {
        let i = crate::files::resolved(input);
        if o == i || o.starts_with(&i) || i.starts_with(&o) {
            return Err(CliError::bad_input(miette::miette!(
                "-o {} and the input {} are one folder or one holds the other: write the merge to a folder of its own",
                out.display(),
                input.display()
            )));
        }
    }
    // The baselines the merge reads would go with the folder it replaces.
    crate::files::input_outside_output("--baselines", baselines, out)
        .map_err(|m| CliError::bad_input(miette::miette!("{m}")))?;
    if o.is_dir() {
        let mut entries = std::fs::read_dir(&o)
            .map_err(|e| CliError::bad_input(miette::miette!("-o {}: {e}", out.display())))?;
        // Only a folder a merge wrote (its shards.json readable as the merge writes it, with
        // the run's results.json beside it, or a fleet's readable index) is replaced: a
        // forged `shards.json` of `{}` beside a user's files made the merge delete them.
        let merged_before = shard_failures_readable(&o)
            || runs_of(&o).is_ok_and(|i| i.is_some_and(|i| !i.runs.is_empty()));
        if !merged_before && entries.next().is_some() {
            return Err(CliError::bad_input(miette::miette!(
                "-o {}: a folder that holds files and is not an earlier merge's output (it has neither {} nor {FILE}), which the merge would replace: write the merge to a new or empty folder",
                out.display(),
                merge::SHARDS_FILE
            )));
        }
        // An earlier merge's folder holding what the merge did not write (a note, a
        // baselines folder) is refused rather than replaced with it.
        crate::files::only_listed_entries(&o, out, "bench report merge")
            .map_err(|m| CliError::bad_input(miette::miette!("{m}")))?;
    }
    Ok(o)
}

/// Merges each run of `runs` into its folder under `out` (the stage of `shown`, the output
/// the user named) and writes the fleet's files; returns the worst run's exit code, or 1
/// when an expected kind is `missing`.
pub(crate) fn merge_fleet(
    runs: Vec<merge::Checked>,
    out: &Path,
    shown: &Path,
    missing: &[String],
    args: &MergeSettings,
) -> Result<i32, CliError> {
    std::fs::create_dir_all(out)
        .map_err(|e| CliError::internal(miette::miette!("{}: {e}", out.display())))?;
    let mut merged: Vec<(String, MergedRun)> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for checked in runs {
        let key = checked.key().to_string();
        let name = folder_name(&key, checked.run_id(), &names);
        names.push(name.clone());
        eprintln!(
            "== run {} on {key}: merged into {} ==",
            checked.run_id(),
            shown.join(&name).display()
        );
        let run = merge::merge_run(checked, &out.join(&name), args)?;
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
    let exit = fleet::exit_code(&parts, missing);
    super::write_json(
        &out.join(FILE),
        &serde_json::json!({ "runs": index, "missing": missing, "exit_code": exit }),
    )?;
    let summary = fleet::render_summary(&parts, &summaries, missing);
    write("summary.md", &summary)?;
    write("junit.xml", &fleet::render_junit(&parts, missing)?)?;
    let json = fleet::render_json(&parts, missing)?;
    write("report.json", &json)?;
    write("report.html", &fleet::render_html(&parts, missing))?;
    // The fleet's summary replaces the runs' own in the job's page: each run's was
    // appended when it was merged, which a reader then sees in full below the fleet's.
    if let Err(e) = crate::report::append_step_summary(&summary) {
        eprintln!("warning: {e}");
    }
    for m in missing {
        eprintln!("missing: {m}");
    }
    eprintln!(
        "fleet: {} runs merged into {}{}; exit {exit}",
        parts.len(),
        shown.display(),
        if missing.is_empty() {
            String::new()
        } else {
            format!(", {} expected missing", missing.len())
        }
    );
    for p in &parts {
        eprintln!(
            "  {} ({}): exit {}",
            p.folder, p.input.results.run_id, p.exit
        );
    }
    // Stdout ends with the fleet's verdict, the exit code this command returns: each run's
    // summary above it ends with that run's own, which a missing kind does not change.
    let stdout = match args.format {
        crate::format::Format::Json => {
            let mut j = json;
            if !j.ends_with('\n') {
                j.push('\n');
            }
            j
        }
        crate::format::Format::Human => {
            let word = if exit == 0 { "ok" } else { "FAILED" };
            let missing_words = if missing.is_empty() {
                String::new()
            } else {
                format!(
                    "; expected, never merged: {}",
                    missing
                        .iter()
                        .map(|m| crate::sanitize::inline(m).into_owned())
                        .collect::<Vec<_>>()
                        .join("; ")
                )
            };
            format!(
                "\nfleet: {} run(s) merged{missing_words}\nresult: {word} (exit {exit})\n",
                parts.len()
            )
        }
    };
    let _ = crate::exit::write_stdout(&stdout);
    Ok(exit)
}

/// Whether `dir` holds one run's merge: a `shards.json` that reads as the merge writes it,
/// naming at least one shard, and the run's `results.json`.
fn shard_failures_readable(dir: &Path) -> bool {
    #[derive(serde::Deserialize)]
    struct File {
        shards: Vec<serde_json::Value>,
    }
    dir.join(crate::results::RunResults::FILE).is_file()
        && super::read_json::<File>(&dir.join(merge::SHARDS_FILE))
            .is_ok_and(|f| f.is_some_and(|f| !f.shards.is_empty()))
}

/// A fleet folder's index: its runs' folders with each one's exit code, and the expected
/// hardware kinds it named missing.
pub(crate) struct FleetIndex {
    pub runs: Vec<(PathBuf, i32)>,
    pub missing: Vec<String>,
}

/// The index of a fleet folder, for `bench report post`: `None` when `dir` is one run's.
pub(crate) fn runs_of(dir: &Path) -> Result<Option<FleetIndex>, CliError> {
    #[derive(serde::Deserialize)]
    struct Run {
        folder: String,
        exit_code: i32,
    }
    #[derive(serde::Deserialize)]
    struct Index {
        runs: Vec<Run>,
        #[serde(default)]
        missing: Vec<String>,
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
    Ok(Some(FleetIndex {
        runs: dirs,
        missing: index.missing,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_kinds_are_keys_or_their_start_with_an_optional_shard_count() {
        let k = ExpectedKind::parse("h100=2").unwrap();
        assert_eq!(
            k,
            ExpectedKind {
                kind: "h100".into(),
                shards: Some(2)
            }
        );
        assert!(k.matches("h100") && k.matches("h100-sxm-80gb"));
        assert!(!k.matches("h1000-sxm") && !k.matches("xh100") && !k.matches("h10"));
        assert_eq!(ExpectedKind::parse("mi300x").unwrap().shards, None);
        for bad in ["h100=0", "h100=x", "h100=99999", "../x", "", "a b"] {
            assert!(ExpectedKind::parse(bad).is_err(), "{bad:?}");
        }
    }

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
