//! `bench matrix --dry-run` (the cells a matrix selects, and why the others are dropped)
//! and `bench schema`.

use std::io::Write;
use std::path::PathBuf;

use indexmap::IndexMap;
use serde::Serialize;

use super::{Expansion, MatrixError};
use crate::cell::{Params, Value};
use crate::error::CliError;
use crate::report::Format;
use crate::results::FILTER_DROP_PREFIX;

impl From<MatrixError> for CliError {
    fn from(e: MatrixError) -> Self {
        match e {
            // A matrix file that exists but cannot be read is still the user's input.
            MatrixError::Read { .. } | MatrixError::Invalid(_) | MatrixError::Filter(_) => {
                CliError::BadInput(miette::Report::msg(e.to_string()))
            }
        }
    }
}

/// Which matrix a command reads, the filters it applies and the budget it expands within.
#[derive(Debug, Clone)]
pub struct MatrixSource {
    /// The matrix file.
    pub file: PathBuf,
    /// Filter expressions (combined with `and`).
    pub filters: Vec<String>,
    /// Refuse a matrix that expands to more cells than this before rules and filters.
    pub max_cells: u64,
}

/// Resolved settings of `bench matrix --dry-run`.
#[derive(Debug, Clone)]
pub(crate) struct DryRunSettings {
    pub source: MatrixSource,
    /// Output format of the listing.
    pub format: Format,
    /// List every dropped cell's id under its rule, not only the counts.
    pub verbose: bool,
}

/// Loads the matrix `source` names and prints its warnings to stderr.
pub(crate) fn load(source: &MatrixSource) -> Result<Expansion, CliError> {
    let budget = super::budget::Budget {
        max_cells: source.max_cells,
    };
    let exp = super::load_within(&source.file, &source.filters, budget)?;
    for w in &exp.warnings {
        eprintln!("warning: {w}");
    }
    Ok(exp)
}

/// `bench matrix --dry-run`.
pub(crate) fn dry_run(args: &DryRunSettings) -> Result<i32, CliError> {
    let exp = load(&args.source)?;
    let mut out = std::io::stdout().lock();
    let written = match args.format {
        Format::Json => {
            let doc = DryRun::from(&exp);
            serde_json::to_writer_pretty(&mut out, &doc)
                .map_err(std::io::Error::other)
                .and_then(|_| writeln!(out))
        }
        Format::Human => write_human(&mut out, &exp, args.verbose),
    };
    // A closed pipe (`bench matrix --dry-run | head`) is not a failure of bench.
    match written {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(CliError::internal(
            miette::miette!("cannot write output: {e}"),
        )),
        _ => Ok(crate::exit::bench::OK),
    }
}

/// `bench schema`.
pub(crate) fn schema() -> Result<i32, CliError> {
    print!("{}", super::spec::schema_json());
    Ok(crate::exit::bench::OK)
}

#[derive(Serialize)]
struct Counts {
    combinations: usize,
    run: usize,
    dropped: usize,
    dropped_by_rules: usize,
    dropped_by_filters: usize,
}

#[derive(Serialize)]
struct CellDoc<'a> {
    id: &'a str,
    values: &'a IndexMap<String, Value>,
    params: &'a Params,
}

#[derive(Serialize)]
struct DroppedDoc<'a> {
    id: &'a str,
    values: &'a IndexMap<String, Value>,
    by: &'a str,
    reason: &'a str,
}

/// The JSON form of a dry run.
#[derive(Serialize)]
struct DryRun<'a> {
    matrix: &'a str,
    file: String,
    counts: Counts,
    cells: Vec<CellDoc<'a>>,
    dropped: Vec<DroppedDoc<'a>>,
    warnings: &'a [String],
}

impl<'a> From<&'a Expansion> for DryRun<'a> {
    fn from(exp: &'a Expansion) -> Self {
        let by_filters = exp
            .dropped
            .iter()
            .filter(|d| d.by.starts_with(FILTER_DROP_PREFIX))
            .count();
        DryRun {
            matrix: &exp.name,
            file: exp.file.display().to_string(),
            counts: Counts {
                combinations: exp.combinations,
                run: exp.cells.len(),
                dropped: exp.dropped.len(),
                dropped_by_rules: exp.dropped.len() - by_filters,
                dropped_by_filters: by_filters,
            },
            cells: exp
                .cells
                .iter()
                .map(|c| CellDoc {
                    id: c.id.as_str(),
                    values: &c.values,
                    params: &c.params,
                })
                .collect(),
            dropped: exp
                .dropped
                .iter()
                .map(|d| DroppedDoc {
                    id: d.cell.id.as_str(),
                    values: &d.cell.values,
                    by: &d.by,
                    reason: &d.reason,
                })
                .collect(),
            warnings: &exp.warnings,
        }
    }
}

fn fmt_duration(secs: u64) -> String {
    match secs {
        s if s % 3600 == 0 && s > 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 && s > 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

fn write_human(out: &mut impl Write, exp: &Expansion, verbose: bool) -> std::io::Result<()> {
    let by_filters = exp
        .dropped
        .iter()
        .filter(|d| d.by.starts_with(FILTER_DROP_PREFIX))
        .count();
    writeln!(out, "matrix {} ({})", exp.name, exp.file.display())?;
    writeln!(
        out,
        "  {} combinations -> {} to run, {} dropped ({} by rules, {} by filters)",
        exp.combinations,
        exp.cells.len(),
        exp.dropped.len(),
        exp.dropped.len() - by_filters,
        by_filters
    )?;
    writeln!(out)?;
    writeln!(out, "Cells to run ({}):", exp.cells.len())?;
    let w = exp
        .cells
        .iter()
        .map(|c| c.id.as_str().len())
        .max()
        .unwrap_or(4)
        .max(4);
    let n = exp.cells.len().to_string().len().max(1);
    writeln!(
        out,
        "  {:>n$}  {:<w$}  {:>5} {:>6} {:>5} {:>5} {:>6} {:>7} {:>7}  workload",
        "#", "cell", "steps", "seq", "mbs", "accum", "global", "repeats", "timeout"
    )?;
    for (i, c) in exp.cells.iter().enumerate() {
        let p = &c.params;
        let workload = match &p.workload {
            crate::cell::Workload::Builtin => "builtin".to_string(),
            crate::cell::Workload::Command { argv, .. } => {
                format!("command {}", argv.first().map(String::as_str).unwrap_or(""))
            }
            other => other.kind().to_string(),
        };
        writeln!(
            out,
            "  {:>n$}  {:<w$}  {:>5} {:>6} {:>5} {:>5} {:>6} {:>7} {:>7}  {}",
            i + 1,
            c.id.as_str(),
            p.steps,
            p.seq_len,
            p.micro_batch,
            p.grad_accum,
            p.global_batch,
            p.repeats,
            fmt_duration(p.timeout_s),
            workload
        )?;
    }
    if !exp.dropped.is_empty() {
        writeln!(out)?;
        writeln!(out, "Dropped ({}):", exp.dropped.len())?;
        // One line per rule (and per filter) with its count, in order of first appearance:
        // a nightly drops hundreds of combinations, and their ids drown the cells that run.
        // --verbose lists the ids under each line.
        let mut groups: IndexMap<(&str, &str), Vec<&str>> = IndexMap::new();
        for d in &exp.dropped {
            groups
                .entry((d.by.as_str(), d.reason.as_str()))
                .or_default()
                .push(d.cell.id.as_str());
        }
        let w = groups
            .values()
            .map(|ids| ids.len().to_string().len())
            .max()
            .unwrap_or(1);
        for ((by, reason), ids) in groups {
            let cells = if ids.len() == 1 { "cell " } else { "cells" };
            writeln!(out, "  {:>w$} {cells}  {by}: {reason}", ids.len())?;
            if verbose {
                for id in ids {
                    writeln!(out, "      {id}")?;
                }
            }
        }
        if !verbose {
            writeln!(out, "  (--verbose lists their ids)")?;
        }
    }
    Ok(())
}
