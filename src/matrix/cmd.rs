//! `bench matrix --dry-run` (the cells a matrix selects, and why the others are dropped)
//! and `bench schema`.

use std::io::Write;
use std::path::PathBuf;

#[cfg(test)]
use serde::ser::SerializeSeq;
use serde::Serialize;

use super::expand::plan::{DroppedRef, Plan};
use super::{Expansion, MatrixError};
use crate::error::CliError;
use crate::format::Format;

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
    super::check_workloads(&spec, &src)?;
    super::check_triage(&spec, &src)?;
    // The run's own check of every cell's workload (the one the run makes before its first
    // cell: crate::cell::command::check), so the dry run refuses what the run refuses (an
    // empty argv, an unknown placeholder). It is made on each cell that runs as the walk
    // builds it, in the order the listing has them, not in a walk of its own (which cost
    // a million cells rebuilt); its first error is reported where that walk reported it:
    // after every error of the expansion itself and after the warnings.
    let mut model_check = super::model_check(&spec, &src);
    let mut launch_error = None;
    let plan = Plan::new(&spec, &src, budget, &args.source.filters, &mut |cell| {
        model_check(cell)?;
        if launch_error.is_none() {
            launch_error = crate::cell::command::check(cell).err();
        }
        Ok(())
    })?;
    for w in &plan.warnings {
        eprintln!("warning: {w}");
    }
    if let Some(e) = launch_error {
        // As the run reports it: bad input (exit 2), the error's own words.
        return Err(CliError::bad_input(miette::miette!("{e}")));
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
        Format::Json => write_json(&mut out, &listing).and_then(|_| writeln!(out)),
        Format::Human => write_human(&mut out, &listing, args.verbose),
    }
    .and_then(|_| out.flush());
    // A closed pipe (`bench matrix --dry-run | head`) ends bench with 141, as SIGPIPE would
    // end a program: under `set -o pipefail` a listing that was cut does not pass for whole.
    crate::exit::or_broken_pipe(written)
        .map_err(|e| CliError::internal(miette::miette!("cannot write output: {e}")))?;
    Ok(crate::exit::bench::OK)
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

    #[cfg(test)]
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

/// The JSON form of a dry run through serde, which [`write_json`] writes by hand in
/// parallel: the tests check that both give the same bytes.
#[cfg(test)]
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
#[cfg(test)]
struct Cells<'a>(&'a Plan<'a>);

#[cfg(test)]
impl Serialize for Cells<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.run))?;
        self.0.each_cell(|c| seq.serialize_element(c))?;
        seq.end()
    }
}

/// The dropped cells, each as `{id, values, by, reason}`.
#[cfg(test)]
struct DroppedCells<'a>(&'a Plan<'a>);

#[cfg(test)]
impl Serialize for DroppedCells<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let p = self.0;
        let mut seq = s.serialize_seq(Some(p.dropped_by_rules + p.dropped_by_filters))?;
        p.each_dropped(|id, values, by, reason| {
            seq.serialize_element(&DroppedRef {
                id,
                values,
                by,
                reason,
            })
        })?;
        seq.end()
    }
}

/// Combinations per block of a JSON listing: one thread renders a block while another
/// renders the next (about 2.5 MB of text each at most, a few blocks in flight).
const BLOCK: usize = 4096;

/// One block of a JSON list: cells of the product in `range` (those that run, or those
/// dropped by rules or by filters), then, when `added`, the matching cells include added.
struct Block {
    range: std::ops::Range<usize>,
    added: bool,
    dropped_by_rules: Option<bool>,
}

/// Writes what `serde_json::to_writer_pretty` writes for [`DryRun`], with the two long
/// lists rendered by blocks on several threads (serializing a million cells was most of a
/// dry run's time) and written in order as they come, a few blocks buffered at most.
fn write_json(out: &mut impl Write, listing: &Listing) -> std::io::Result<()> {
    let plan = listing.plan;
    let to_io = std::io::Error::other;
    out.write_all(b"{\n  \"matrix\": ")?;
    serde_json::to_writer(&mut *out, &listing.name).map_err(to_io)?;
    out.write_all(b",\n  \"file\": ")?;
    serde_json::to_writer(&mut *out, &listing.file).map_err(to_io)?;
    out.write_all(b",\n  \"counts\": ")?;
    write_nested(out, &listing.counts(), 2)?;
    let n = plan.combinations;
    let blocks = |dropped_by_rules: Option<bool>, added: bool| {
        let mut v: Vec<Block> = (0..n)
            .step_by(BLOCK)
            .map(|start| Block {
                range: start..(start + BLOCK).min(n),
                added: false,
                dropped_by_rules,
            })
            .collect();
        v.push(Block {
            range: n..n,
            added,
            dropped_by_rules,
        });
        v
    };
    out.write_all(b",\n  \"cells\": ")?;
    write_list(out, plan, &blocks(None, true))?;
    out.write_all(b",\n  \"dropped\": ")?;
    let mut dropped = blocks(Some(true), false);
    dropped.extend(blocks(Some(false), true));
    write_list(out, plan, &dropped)?;
    out.write_all(b",\n  \"warnings\": ")?;
    write_nested(out, &plan.warnings, 2)?;
    out.write_all(b"\n}")
}

/// `value` pretty-printed as a field of an object `indent` spaces deep.
fn write_nested(
    out: &mut impl Write,
    value: &impl Serialize,
    indent: usize,
) -> std::io::Result<()> {
    let text = serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?;
    let mut nested = Vec::with_capacity(text.len() + text.len() / 4);
    indent_into(&mut nested, &text, indent);
    out.write_all(&nested)
}

/// Appends `text` (pretty-printed JSON) to `buf` with every line after the first indented
/// by `indent` spaces more: the value as it looks nested in a document. JSON strings hold
/// no raw newline, so every newline is between tokens.
fn indent_into(buf: &mut Vec<u8>, text: &[u8], indent: usize) {
    let mut rest = text;
    while let Some(at) = rest.iter().position(|&b| b == b'\n') {
        buf.extend_from_slice(&rest[..=at]);
        buf.resize(buf.len() + indent, b' ');
        rest = &rest[at + 1..];
    }
    buf.extend_from_slice(rest);
}

/// Renders the elements of `block` into `buf`, each as `,\n    <element>`.
fn render_block(plan: &Plan, block: &Block, buf: &mut Vec<u8>) -> std::io::Result<()> {
    let mut text = Vec::new();
    let mut element = |buf: &mut Vec<u8>, value: &dyn erased::Element| {
        text.clear();
        value.write_to(&mut text)?;
        buf.extend_from_slice(b",\n    ");
        indent_into(buf, &text, 4);
        Ok::<(), std::io::Error>(())
    };
    match block.dropped_by_rules {
        None => plan.each_cell_in(block.range.clone(), block.added, |c| element(buf, c)),
        Some(by_rules) => plan.each_dropped_in(
            by_rules,
            block.range.clone(),
            block.added,
            |id, values, by, reason| {
                element(
                    buf,
                    &DroppedRef {
                        id,
                        values,
                        by,
                        reason,
                    },
                )
            },
        ),
    }
}

/// The one kind of value a block renders, as a trait object.
mod erased {
    use serde::Serialize;

    pub(super) trait Element {
        fn write_to(&self, out: &mut Vec<u8>) -> std::io::Result<()>;
    }

    impl<T: Serialize> Element for T {
        fn write_to(&self, out: &mut Vec<u8>) -> std::io::Result<()> {
            serde_json::to_writer_pretty(out, self).map_err(std::io::Error::other)
        }
    }
}

/// Writes a JSON list of the elements of `blocks` (as `to_writer_pretty` writes a list one
/// level deep), rendering blocks on up to four threads and writing them in order.
fn write_list(out: &mut impl Write, plan: &Plan, blocks: &[Block]) -> std::io::Result<()> {
    out.write_all(b"[")?;
    let mut any = false;
    render_in_order(
        blocks,
        |block, buf| render_block(plan, block, buf),
        |buf| {
            if buf.is_empty() {
                return Ok(());
            }
            // Every element comes with a leading comma; the list's first has none.
            out.write_all(if any { &buf } else { &buf[1..] })?;
            any = true;
            Ok(())
        },
    )?;
    out.write_all(if any { b"\n  ]" } else { b"]" })
}

/// Renders `blocks` on a few threads and hands each rendered block to `sink` in the blocks'
/// order, as it comes. Rendering a million cells is most of a dry run's time, and it
/// splits; the writing stays in order on this thread.
fn render_in_order<B: Sync>(
    blocks: &[B],
    render: impl Fn(&B, &mut Vec<u8>) -> std::io::Result<()> + Sync,
    mut sink: impl FnMut(Vec<u8>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 4);
    let render = &render;
    std::thread::scope(|scope| -> std::io::Result<()> {
        let mut queues = Vec::with_capacity(threads);
        for t in 0..threads {
            // Two rendered blocks wait per thread at most, so memory stays bounded
            // however fast the threads render and however slowly the sink takes them.
            let (tx, rx) = std::sync::mpsc::sync_channel::<std::io::Result<Vec<u8>>>(2);
            queues.push(rx);
            scope.spawn(move || {
                for block in blocks.iter().skip(t).step_by(threads) {
                    let mut buf = Vec::new();
                    let rendered = render(block, &mut buf).map(|()| buf);
                    // A closed queue means the writer stopped (an error): so do we.
                    if tx.send(rendered).is_err() {
                        return;
                    }
                }
            });
        }
        for k in 0..blocks.len() {
            let buf = queues[k % threads]
                .recv()
                .map_err(std::io::Error::other)??;
            sink(buf)?;
        }
        Ok(())
    })
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
    // The matrix's name and path, a rule's reason and a command's program are the user's
    // text: an ESC or BEL in them must not retitle or clear the terminal the listing is
    // printed on.
    let shown = crate::sanitize::clean;
    writeln!(
        out,
        "matrix {} ({})",
        shown(&listing.name),
        shown(&listing.file)
    )?;
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
    // The rows are rendered by blocks of combinations on a few threads, each without its
    // number (which depends on how many cells the blocks before it hold); the numbers are
    // put in front as the rows are written in order.
    let combos = plan.combinations;
    let mut blocks: Vec<(std::ops::Range<usize>, bool)> = (0..combos)
        .step_by(BLOCK)
        .map(|start| (start..(start + BLOCK).min(combos), false))
        .collect();
    blocks.push((combos..combos, true));
    let mut i = 0usize;
    render_in_order(
        &blocks,
        |(range, added), buf| {
            plan.each_cell_in(range.clone(), *added, |c| {
                let p = &c.params;
                let workload = match &p.workload {
                    crate::cell::Workload::Builtin => "builtin".to_string(),
                    crate::cell::Workload::Command { argv, .. } => {
                        let first = argv.first().map(String::as_str).unwrap_or("");
                        // A control character in the program's name (a newline, an escape)
                        // is shown escaped: a row is one line of text.
                        if first.chars().any(char::is_control) {
                            format!("command {}", first.escape_default())
                        } else {
                            format!("command {first}")
                        }
                    }
                    other => other.kind().to_string(),
                };
                writeln!(
                    buf,
                    "{:<w$}  {:>5} {:>6} {:>5} {:>5} {:>6} {:>7} {:>7}  {}",
                    c.id.as_str(),
                    p.steps,
                    p.seq_len,
                    p.micro_batch,
                    p.grad_accum,
                    p.global_batch,
                    p.repeats,
                    fmt_duration(p.timeout_s),
                    workload
                )
            })
        },
        |buf| {
            // Each row ends with its newline, and no row holds one inside (cell ids follow
            // the id rule of src/ids.rs; the workload's word is escaped above).
            for row in buf.split_inclusive(|&b| b == b'\n') {
                i += 1;
                write!(out, "  {i:>n$}  ")?;
                out.write_all(row)?;
            }
            Ok(())
        },
    )?;
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
            writeln!(
                out,
                "  {:>w$} {cells}  {}: {}",
                count,
                shown(by),
                shown(reason)
            )?;
            if verbose {
                plan.each_dropped_id(by, reason, |id| writeln!(out, "      {id}"))?;
            }
        }
        if !verbose {
            writeln!(out, "  (--verbose lists their ids)")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::budget::Budget;
    use crate::matrix::parse::parse_str;
    use std::path::Path;

    /// The hand-written, parallel JSON listing is byte for byte what serde writes.
    #[test]
    fn json_listing_is_the_pretty_document() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut yamls: Vec<String> = [
            "matrix/nightly-h100.yaml",
            "tests/fixtures/matrix/showcase.yaml",
        ]
        .iter()
        .map(|f| std::fs::read_to_string(root.join(f)).unwrap())
        .collect();
        // More combinations than a block, an added cell, a rule matching nothing.
        let seeds: Vec<String> = (0..5000).map(|i| i.to_string()).collect();
        yamls.push(format!(
            "axes:\n  m: [a, b]\n  seed: [{}]\nrules:\n  - exclude: {{m: a}}\n    reason: r\n  - when: m=a and m=b\n    reason: never\ninclude:\n  - {{m: c, note: x}}\n",
            seeds.join(", ")
        ));
        yamls.push("axes:\n  m: [a]\nrules:\n  - exclude: {m: a}\n    reason: all\n".into());
        for yaml in &yamls {
            for filters in [
                vec![],
                vec!["seed>10".to_string()],
                vec!["fsdp".to_string()],
            ] {
                let (spec, src) = parse_str(Path::new("t.yaml"), yaml.clone()).unwrap();
                let Ok(plan) = Plan::new(&spec, &src, Budget::default(), &filters, &mut |_| Ok(()))
                else {
                    continue;
                };
                let listing = Listing {
                    name: "t".into(),
                    file: "t.yaml".into(),
                    plan: &plan,
                };
                let mut ours = Vec::new();
                write_json(&mut ours, &listing).unwrap();
                let theirs = serde_json::to_vec_pretty(&listing.json()).unwrap();
                assert_eq!(
                    String::from_utf8(ours).unwrap(),
                    String::from_utf8(theirs).unwrap()
                );
            }
        }
    }
}
