//! Every `bench` command the README and the book show is a command `bench` accepts: each
//! line of a shell block, and each code span, that starts with `bench ` is split as a shell
//! would split it and parsed by the real clap definition (`bench::cli::Cli`), so a renamed
//! flag or subcommand fails here instead of in a reader's terminal. The ten-line matrix of
//! the README is dry-run by the built binary, and the book's own pages are the ones
//! docs/SUMMARY.md lists (scripts/book-check.py checks their links).

use std::path::{Path, PathBuf};

use clap::Parser;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The README and every page of the book, in the SUMMARY's order.
fn pages() -> Vec<PathBuf> {
    let docs = root().join("docs");
    let summary = std::fs::read_to_string(docs.join("SUMMARY.md")).unwrap();
    let mut pages = vec![root().join("README.md")];
    for part in summary.split("](").skip(1) {
        let target = part.split(')').next().unwrap();
        if target.ends_with(".md") {
            pages.push(docs.join(target));
        }
    }
    assert!(pages.len() > 10, "{pages:?}");
    pages
}

/// (line number, command, whether it is whole) of each `bench ...` command of a page:
/// whole lines of shell blocks (with their `\` continuations joined and their `#` comments
/// dropped) and code spans of the prose.
fn commands(path: &Path) -> Vec<(usize, String, bool)> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    let mut fence: Option<String> = None;
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let no = i + 1;
        let trimmed = line.trim_start();
        if let Some(lang) = trimmed.strip_prefix("```") {
            fence = match fence {
                Some(_) => None,
                None => Some(lang.trim().to_string()),
            };
            continue;
        }
        match fence.as_deref() {
            Some("sh" | "bash" | "shell" | "console") => {
                let mut line = trimmed.trim_start_matches("$ ").to_string();
                if let Some((n, head)) = pending.take() {
                    line = format!("{head} {line}");
                    pending = Some((n, String::new()));
                }
                let start = pending.take().map_or(no, |(n, _)| n);
                if let Some(head) = line.strip_suffix('\\') {
                    pending = Some((start, head.to_string()));
                    continue;
                }
                if line.starts_with("bench ") {
                    out.push((start, line, true));
                }
            }
            Some(_) => {}
            None => {
                // Code spans of the prose: `bench ...`.
                for (k, span) in line.split('`').enumerate() {
                    if k % 2 == 1 && span.starts_with("bench ") {
                        out.push((no, span.to_string(), false));
                    }
                }
            }
        }
    }
    out
}

/// The command without its shell comment, split into arguments; `None` for a line that is
/// not one command (a pipe, a redirection or an ellipsis standing for the rest).
fn words(command: &str) -> Option<Vec<String>> {
    // A placeholder such as `<run id>` is one argument, whatever its words.
    let command = regex::Regex::new(r"<[^<>]*>")
        .unwrap()
        .replace_all(command, "PLACEHOLDER");
    if command.contains("COMMAND") {
        return None; // `bench COMMAND --help`: any command
    }
    let mut words = shlex::split(&command)?;
    if let Some(at) = words.iter().position(|w| w.starts_with('#')) {
        words.truncate(at);
    }
    if words.iter().any(|w| {
        matches!(w.as_str(), "|" | ">" | "<" | "&&" | "||" | ";" | "2>&1")
            || w.starts_with('>')
            || w.contains("...")
            || w == "…"
    }) {
        return None;
    }
    Some(words)
}

#[test]
fn every_bench_command_the_docs_show_parses() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for page in pages() {
        for (no, command, whole) in commands(&page) {
            let Some(args) = words(&command) else {
                continue;
            };
            checked += 1;
            if let Err(e) = bench::cli::Cli::try_parse_from(&args) {
                // A code span in the prose names a command and some of its flags (`bench
                // matrix --history`); what it leaves out is not an error, a name bench does
                // not know is. A line of a shell block is a whole command.
                use clap::error::ErrorKind::*;
                let omitted = matches!(
                    e.kind(),
                    MissingRequiredArgument
                        | InvalidValue
                        | MissingSubcommand
                        | DisplayHelpOnMissingArgumentOrSubcommand
                );
                if !whole && omitted {
                    continue;
                }
                let first = e.to_string().lines().next().unwrap_or_default().to_string();
                failures.push(format!(
                    "{}:{no}: `{command}`: {first}",
                    page.strip_prefix(root()).unwrap().display()
                ));
            }
        }
    }
    assert!(
        checked > 40,
        "only {checked} commands found: the extraction broke"
    );
    assert!(
        failures.is_empty(),
        "{} of {checked} commands the docs show are refused by bench's own parser:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_readme_ten_line_matrix_expands() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let yaml = readme
        .split("```yaml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the README shows a matrix");
    assert!(yaml.lines().count() <= 10, "{yaml}");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bench.yaml"), yaml).unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["matrix", "bench.yaml", "--dry-run"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("4 combinations -> 4 to run"), "{out}");
}
