//! `bench matrix --dry-run` (the cells a matrix selects, and why the others are dropped)
//! and `bench schema`.

use std::io::Write;
use std::path::PathBuf;

use serde::Serialize;

use super::expand::plan::Plan;
use super::{Expansion, MatrixError};
use crate::error::CliError;
use crate::report::Format;

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
///
/// The listing is written cell by cell as the plan rebuilds each cell, through one buffer:
/// a matrix of a million combinations is never held as a million cells, nor as one JSON
/// document (see [`super::expand::plan`]).
pub(crate) fn dry_run(args: &DryRunSettings) -> Result<i32, CliError> {
    let budget = super::budget::Budget {
        max_cells: args.source.max_cells,
    };
    let (spec, src) = super::parse::parse_file(&args.source.file)?;
    let plan = Plan::new(
        &spec,
        &src,
        budget,
        &args.source.filters,
        &mut super::model_check(&spec, &src),
    )?;
    for w in &plan.warnings {
        eprintln!("warning: {w}");
    }
    let listing = Listing {
        name: super::budget::matrix_name(&spec, &src),
        file: src.path.display().to_string(),
        plan: &plan,
    };
    // Standard output is line-buffered; a listing of a million cells is tens of millions
    // of lines, so it goes through a buffer of its own.
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    let written = match args.format {
        Format::Json => serde_json::to_writer_pretty(&mut out, &listing.json())
            .map_err(std::io::Error::other)
            .and_then(|_| writeln!(out)),
        Format::Human => write_human(&mut out, &listing, args.verbose),
    }
    .and_then(|_| out.flush());
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

/// What a dry run lists: the matrix and its plan.
struct Listing<'p> {
    name: String,
    file: String,
    plan: &'p Plan<'p>,
}

impl<'p> Listing<'p> {
    fn counts(&self) -> Counts {
        let p = self.plan;
        Counts {
            combinations: p.combinations,
            run: p.run,
            dropped: p.dropped_by_rules + p.dropped_by_filters,
            dropped_by_rules: p.dropped_by_rules,
            dropped_by_filters: p.dropped_by_filters,
        }
    }

    fn json(&self) -> DryRun<'_> {
        DryRun {
            matrix: &self.name,
            file: &self.file,
            counts: self.counts(),
            cells: Cells(self.plan),
            dropped: DroppedCells(self.plan),
            warnings: &self.plan.warnings,
        }
    }
}

/// The JSON form of a dry run. Its lists serialize from the plan one cell at a time.
#[derive(Serialize)]
struct DryRun<'a> {
    matrix: &'a str,
    file: &'a str,
    counts: Counts,
    cells: Cells<'a>,
    dropped: DroppedCells<'a>,
    warnings: &'a [String],
}

/// The cells that run, each as `{id, values, params}`.
struct Cells<'a>(&'a Plan<'a>);

impl Serialize for Cells<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.cells())
    }
}

/// The dropped cells, each as `{id, values, by, reason}`.
struct DroppedCells<'a>(&'a Plan<'a>);

impl Serialize for DroppedCells<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.dropped_listing())
    }
}

fn fmt_duration(secs: u64) -> String {
    match secs {
        s if s % 3600 == 0 && s > 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 && s > 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

fn write_human(out: &mut impl Write, listing: &Listing, verbose: bool) -> std::io::Result<()> {
    let plan = listing.plan;
    let c = listing.counts();
    writeln!(out, "matrix {} ({})", listing.name, listing.file)?;
    writeln!(
        out,
        "  {} combinations -> {} to run, {} dropped ({} by rules, {} by filters)",
        c.combinations, c.run, c.dropped, c.dropped_by_rules, c.dropped_by_filters
    )?;
    writeln!(out)?;
    writeln!(out, "Cells to run ({}):", c.run)?;
    let w = plan.longest_id.max(4);
    let n = c.run.to_string().len().max(1);
    writeln!(
        out,
        "  {:>n$}  {:<w$}  {:>5} {:>6} {:>5} {:>5} {:>6} {:>7} {:>7}  workload",
        "#", "cell", "steps", "seq", "mbs", "accum", "global", "repeats", "timeout"
    )?;
    for (i, c) in plan.cells().enumerate() {
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
    if c.dropped > 0 {
        writeln!(out)?;
        writeln!(out, "Dropped ({}):", c.dropped)?;
        // One line per rule (and per filter) with its count, in order of first appearance:
        // a nightly drops hundreds of combinations, and their ids drown the cells that run.
        // --verbose lists the ids under each line.
        let groups = plan.drop_groups();
        let w = groups
            .iter()
            .map(|(_, _, n)| n.to_string().len())
            .max()
            .unwrap_or(1);
        for &(by, reason, count) in &groups {
            let cells = if count == 1 { "cell " } else { "cells" };
            writeln!(out, "  {:>w$} {cells}  {by}: {reason}", count)?;
            if verbose {
                for id in plan.dropped_ids(by, reason) {
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
