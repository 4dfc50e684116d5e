//! Resume: the run directory and results document a run continues, and the book of
//! results that is saved after every cell.
//!
//! A fresh run gets a folder named by `--run-id` or a UTC timestamp. `--resume DIR`
//! continues a run: cells it finished (passed, failed, timed out) are kept and not run
//! again; a resume with another launcher, or (locally) on other hardware, is refused.
//! A launcher whose cells run elsewhere keeps an environment its nodes reported
//! ([`super::node_env`]); any other starts from this host's.

use std::path::{Path, PathBuf};

use crate::matrix::Expansion;
use crate::results::{
    matrix_digest, CellResult, Environment, EnvironmentSource, Outcome, RunResults, SCHEMA_VERSION,
};
use crate::run::config::RunConfig;
use crate::run::error::RunError;
use crate::run::launcher::Launcher;

/// Whether a resumed run keeps a cell's earlier result instead of running it again.
pub(crate) fn is_finished(o: &Outcome) -> bool {
    matches!(
        o,
        Outcome::Passed | Outcome::Failed { .. } | Outcome::TimedOut { .. }
    )
}

pub(crate) fn is_failure(o: &Outcome) -> bool {
    matches!(o, Outcome::Failed { .. } | Outcome::TimedOut { .. })
}

/// UTC now as `20261122T134501Z`.
fn timestamp_id() -> String {
    let now = time::OffsetDateTime::now_utc();
    let fmt = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    now.format(&fmt).unwrap_or_else(|_| "run".to_string())
}

/// UTC now in RFC 3339.
pub(crate) fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// The run directory and the document to continue: a fresh one, or the one resumed.
///
/// `env` is this host's environment. Locally it is the run's, and a resumed run must
/// have been measured on the same hardware. Under Slurm it is only a fallback until a
/// job reports its node's ([`super::node_env`]): a resumed run whose environment came from its
/// nodes keeps it (the nodes of this session are checked against it as they report),
/// and any other starts from `env`, marked as the submitting host's.
pub(crate) fn open_run(
    config: &RunConfig,
    launcher: &dyn Launcher,
    expansion: &Expansion,
    env: &Environment,
) -> Result<(PathBuf, RunResults), RunError> {
    let elsewhere = launcher.runs_elsewhere();
    // The matrix was read moments ago, so an error here is a race with its deletion; the
    // run then records no digest rather than failing.
    let digest = matrix_digest(&config.matrix).ok();
    if let Some(dir) = &config.resume {
        let mut doc = RunResults::load(dir).map_err(RunError::Resume)?;
        // A different matrix would mix two matrices' cells in one results document.
        if let (Some(was), Some(now)) = (&doc.matrix_sha256, &digest) {
            if was != now {
                return Err(RunError::MatrixChanged {
                    path: dir.clone(),
                    was: doc.matrix.clone(),
                    now: config.matrix.clone(),
                });
            }
        }
        // Before the hardware: a run of the other launcher ran on other machines anyway,
        // and this is the error that says how to finish it.
        let now = launcher.name();
        if let Some(was) = doc.launcher.as_deref().filter(|was| *was != now) {
            return Err(RunError::LauncherChanged {
                path: dir.clone(),
                was: was.to_string(),
                now: now.to_string(),
            });
        }
        if !elsewhere && doc.environment.hardware_key != env.hardware_key {
            return Err(RunError::HardwareChanged {
                path: dir.clone(),
                was: doc.environment.hardware_key.clone(),
                now: env.hardware_key.clone(),
            });
        }
        let dir = if dir.is_dir() {
            dir.clone()
        } else {
            dir.parent().map(Path::to_path_buf).unwrap_or_default()
        };
        let from_nodes = matches!(
            doc.environment_source,
            Some(EnvironmentSource::SlurmNode { .. })
        );
        if !(elsewhere && from_nodes) {
            doc.environment = env.clone();
            doc.environment_source = elsewhere.then_some(EnvironmentSource::SubmitHost);
        }
        doc.interrupted = false;
        doc.interrupted_in = None;
        doc.finished_at = None;
        return Ok((dir, doc));
    }
    let (run_id, dir) = match &config.run_id {
        Some(id) => {
            let dir = config.results_dir.join(id);
            if dir.join(RunResults::FILE).exists() {
                return Err(RunError::Exists { path: dir });
            }
            (id.clone(), dir)
        }
        None => {
            // Two runs started in the same second get distinct folders.
            let base = timestamp_id();
            let mut id = base.clone();
            let mut n = 2;
            while config.results_dir.join(&id).exists() {
                id = format!("{base}-{n}");
                n += 1;
            }
            let dir = config.results_dir.join(&id);
            (id, dir)
        }
    };
    let doc = RunResults {
        schema_version: SCHEMA_VERSION,
        run_id,
        matrix: config.matrix.clone(),
        matrix_name: expansion.name.clone(),
        matrix_sha256: digest,
        filters: config.filters.clone(),
        started_at: now_rfc3339(),
        finished_at: None,
        interrupted: false,
        interrupted_in: None,
        environment: env.clone(),
        environment_source: elsewhere.then_some(EnvironmentSource::SubmitHost),
        launcher: None,
        cells: vec![],
        dropped: vec![],
    };
    Ok((dir, doc))
}

/// Below this size `results.json` is rewritten whole after every cell (a smoke run of a few
/// dozen cells never has a journal). Kept small on purpose: every rewrite frees an inode,
/// and ext4 scans past recently freed inodes on each file it creates (a profile of 1,000
/// short cells at 512 KiB: a fifth of bench's own time in `find_inode_bit` and
/// `recently_deleted`, creating the cells' log files).
const REWRITE_BELOW: usize = 64 * 1024;

/// The results being built: the document's header plus one slot per expansion cell.
///
/// Every finished cell is on disk before its `CellSaved` event. While the document is
/// under [`REWRITE_BELOW`], `results.json` is rewritten whole (atomically) after every
/// cell. A larger one would make a run of thousands of short cells quadratic in bytes
/// written (3.8 MB rewritten and synced per cell at 2,000 cells), so then the cell is
/// appended to the journal (`results.journal`, one synced line) and the document is
/// rewritten only when the journal has grown to half its size, and at the end: each cell
/// costs its own bytes plus at most three times them in rewrites, whatever the run's size.
/// [`RunResults::load`] merges the journal, so every reader sees every finished cell.
///
/// Each cell's JSON is rendered once, when its slot is set, and every rewrite splices
/// those renderings into the header's: a rewrite costs a copy of the document's bytes, not
/// a clone and a fresh serialization of every cell finished so far.
///
/// The header (`doc`) is written only by [`Book::save`]: whoever changes it saves.
pub(crate) struct Book {
    pub dir: PathBuf,
    /// The document's header; its `cells` stay empty until [`Book::finish`].
    pub doc: RunResults,
    slots: Vec<Option<Rendered>>,
    /// Cells of a resumed run that the current expansion no longer has: kept, not run.
    others: Vec<Rendered>,
    /// `doc.dropped` rendered, with how many cells it held then.
    dropped: Option<(usize, Vec<u8>)>,
    /// Bytes of `results.json` as last rewritten (0 before the first).
    written: usize,
    /// The journal, open for appending, and the bytes appended since the last rewrite.
    journal: Option<std::fs::File>,
    journal_len: usize,
    /// Whether a journal may be on disk (one left by a killed run is, until the first
    /// rewrite folds it in).
    journal_on_disk: bool,
}

/// A cell's result and its JSON as it stands in the document.
struct Rendered {
    result: CellResult,
    json: Vec<u8>,
}

impl Rendered {
    fn new(result: CellResult) -> Result<Rendered, RunError> {
        let json = element_json(&result)?;
        Ok(Rendered { result, json })
    }
}

/// `value` as `serde_json::to_vec_pretty` writes it as an element of a list that is a field
/// of the document: the same text, every line after the first indented by four spaces
/// more. (JSON strings hold no raw newline, so every newline is between tokens.)
fn element_json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, RunError> {
    let text = serde_json::to_vec_pretty(value).map_err(encode_error)?;
    let mut out = Vec::with_capacity(text.len() + text.len() / 8);
    for &b in &text {
        out.push(b);
        if b == b'\n' {
            out.extend_from_slice(b"    ");
        }
    }
    Ok(out)
}

fn encode_error(e: serde_json::Error) -> RunError {
    RunError::Results(crate::results::ResultsError::Write {
        path: PathBuf::from(RunResults::FILE),
        source: std::io::Error::other(e),
    })
}

/// Replaces the empty list of the document's top-level field `key` in `doc` (as
/// `to_vec_pretty` wrote it: `\n  "key": []`) with `elements`, each rendered by
/// [`element_json`]. Only a top-level key has exactly two spaces of indentation.
fn splice<'e>(doc: &mut Vec<u8>, key: &str, elements: impl Iterator<Item = &'e [u8]>) {
    let marker = format!("\n  \"{key}\": []");
    let Some(at) = doc
        .windows(marker.len())
        .position(|w| w == marker.as_bytes())
    else {
        return;
    };
    let list_at = at + marker.len() - 2;
    let mut elements = elements.peekable();
    if elements.peek().is_none() {
        return;
    }
    // Copied slice by slice into a new buffer: a document of thousands of cells is
    // megabytes, and moving it byte by byte (as `Vec::splice` did) was most of a save.
    let mut out = Vec::with_capacity(doc.len() + (1 << 16));
    out.extend_from_slice(&doc[..list_at]);
    out.push(b'[');
    for (i, e) in elements.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"\n    ");
        out.extend_from_slice(e);
    }
    out.extend_from_slice(b"\n  ]");
    out.extend_from_slice(&doc[list_at + 2..]);
    *doc = out;
}

impl Book {
    /// A book for `slots` cells of the expansion, and `others` kept from a resumed run.
    pub(crate) fn new(
        dir: PathBuf,
        doc: RunResults,
        slots: usize,
        others: Vec<CellResult>,
    ) -> Result<Book, RunError> {
        let dir_has_journal = dir.join(RunResults::JOURNAL).exists();
        Ok(Book {
            dir,
            doc,
            slots: (0..slots).map(|_| None).collect(),
            others: others
                .into_iter()
                .map(Rendered::new)
                .collect::<Result<_, _>>()?,
            dropped: None,
            written: 0,
            journal: None,
            journal_len: 0,
            journal_on_disk: dir_has_journal,
        })
    }

    /// Records the result of cell `i` (rendering it once for every later save).
    pub(crate) fn set(&mut self, i: usize, result: CellResult) -> Result<(), RunError> {
        self.slots[i] = Some(Rendered::new(result)?);
        Ok(())
    }

    /// The results recorded for the expansion's cells, in expansion order.
    pub(crate) fn results(&self) -> impl Iterator<Item = &CellResult> {
        self.slots.iter().flatten().map(|r| &r.result)
    }

    /// Every cell of the document: the expansion's, then those kept from a resumed run.
    pub(crate) fn all(&self) -> impl Iterator<Item = &CellResult> {
        self.results().chain(self.others.iter().map(|r| &r.result))
    }

    /// The document as `results.json` holds it: the header, every cell, the dropped ones.
    fn render(&mut self) -> Result<Vec<u8>, RunError> {
        let n = self.doc.dropped.len();
        if self.dropped.as_ref().is_none_or(|(m, _)| *m != n) {
            let mut json = Vec::new();
            for (i, d) in self.doc.dropped.iter().enumerate() {
                if i > 0 {
                    json.extend_from_slice(b",\n    ");
                }
                json.extend_from_slice(&element_json(d)?);
            }
            self.dropped = Some((n, json));
        }
        // The header with both lists empty; they are spliced in below.
        let dropped = std::mem::take(&mut self.doc.dropped);
        let cells = std::mem::take(&mut self.doc.cells);
        let head = serde_json::to_vec_pretty(&self.doc).map_err(encode_error);
        self.doc.dropped = dropped;
        self.doc.cells = cells;
        let mut doc = head?;
        let cells = self
            .slots
            .iter()
            .flatten()
            .chain(self.others.iter())
            .map(|r| r.json.as_slice());
        splice(&mut doc, "cells", cells);
        if let Some((_, json)) = self.dropped.as_ref().filter(|(n, _)| *n > 0) {
            splice(&mut doc, "dropped", std::iter::once(json.as_slice()));
        }
        Ok(doc)
    }

    /// Records the result of cell `i` and makes it durable: appended to the journal when
    /// the document is large and the journal still small (see [`Book`]), else by rewriting
    /// `results.json`.
    pub(crate) fn record(&mut self, i: usize, result: CellResult) -> Result<(), RunError> {
        if self.written < REWRITE_BELOW {
            self.set(i, result)?;
            return self.save();
        }
        let line =
            crate::results::JournalEntry::line(&self.doc.run_id, &result).map_err(encode_error)?;
        self.set(i, result)?;
        if 2 * (self.journal_len + line.len()) > self.written {
            return self.save();
        }
        let path = self.dir.join(RunResults::JOURNAL);
        let write_error = |source| {
            RunError::Results(crate::results::ResultsError::Write {
                path: path.clone(),
                source,
            })
        };
        let file = match &mut self.journal {
            Some(file) => file,
            None => {
                // A regular file only, opened without blocking: a FIFO someone put at the
                // journal's path must not hang the run (crate::files).
                let file = crate::files::open_append_regular(&path).map_err(write_error)?;
                self.journal_on_disk = true;
                self.journal.insert(file)
            }
        };
        use std::io::Write;
        file.write_all(&line).map_err(write_error)?;
        file.sync_data().map_err(write_error)?;
        self.journal_len += line.len();
        Ok(())
    }

    /// Rewrites `results.json` atomically (see [`RunResults::save_atomic`]) with every cell
    /// and the header as they stand, then removes the journal, whose cells it now holds.
    pub(crate) fn save(&mut self) -> Result<(), RunError> {
        let bytes = self.render()?;
        let path = self.dir.join(RunResults::FILE);
        let write_error = |path: PathBuf, source| {
            RunError::Results(crate::results::ResultsError::Write { path, source })
        };
        crate::atomic::write(&path, &bytes).map_err(|e| write_error(path.clone(), e))?;
        self.written = bytes.len();
        if self.journal_on_disk {
            // The rename must be on disk before the journal goes: a crash in between
            // otherwise could keep the old document and lose the journal.
            std::fs::File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| write_error(self.dir.clone(), e))?;
            let journal = self.dir.join(RunResults::JOURNAL);
            self.journal = None;
            match std::fs::remove_file(&journal) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(write_error(journal, e)),
            }
            self.journal_on_disk = false;
        }
        self.journal_len = 0;
        Ok(())
    }

    /// The finished document, cells included.
    pub(crate) fn finish(self) -> (PathBuf, RunResults) {
        let mut doc = self.doc;
        doc.cells = self
            .slots
            .into_iter()
            .flatten()
            .chain(self.others)
            .map(|r| r.result)
            .collect();
        (self.dir, doc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::DroppedCell;

    fn result(id: &str, reason: &str) -> CellResult {
        serde_json::from_value(serde_json::json!({
            "id": id,
            "values": {"model": "gpt2-125m", "note": "a \"quoted\"\nline"},
            "params": crate::cell::Params::default(),
            "status": "failed",
            "reason": reason,
            "duration_s": 1.5,
        }))
        .unwrap()
    }

    /// What a save writes is what `to_vec_pretty` writes for the whole document.
    #[test]
    fn a_save_is_the_pretty_document() {
        let doc: RunResults = serde_json::from_value(serde_json::json!({
            "schema_version": 1, "run_id": "r", "matrix": "m.yaml", "matrix_name": "m",
            "filters": ["x"], "started_at": "t", "environment": Environment::default(),
            "cells": [], "dropped": [],
        }))
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let dropped = DroppedCell {
            id: crate::cell::CellId("d".into()),
            values: Default::default(),
            by: "rules[0] exclude".into(),
            reason: "why\nnot".into(),
        };
        for (cells, others, dropped) in [
            (0, 0, vec![]),
            (1, 0, vec![]),
            (3, 2, vec![dropped.clone()]),
            (0, 1, vec![dropped.clone(), dropped]),
        ] {
            let mut want = doc.clone();
            want.dropped = dropped;
            let mut book = Book::new(
                dir.path().to_path_buf(),
                want.clone(),
                cells + 1,
                (0..others)
                    .map(|k| result(&format!("o{k}"), "old"))
                    .collect(),
            )
            .unwrap();
            for i in 0..cells {
                book.set(i, result(&format!("c{i}"), "]\n  \"cells\": []"))
                    .unwrap();
            }
            book.save().unwrap();
            want.cells = book.all().cloned().collect();
            let text = std::fs::read(dir.path().join(RunResults::FILE)).unwrap();
            assert_eq!(
                String::from_utf8(text).unwrap(),
                String::from_utf8(serde_json::to_vec_pretty(&want).unwrap()).unwrap()
            );
            assert_eq!(book.finish().1, want);
        }
    }

    /// Past [`REWRITE_BELOW`] cells go to the journal, a reader sees every recorded cell at
    /// every point, the document is rewritten only a few times more, and the final save
    /// leaves the whole pretty document and no journal.
    #[test]
    fn a_large_run_journals_its_cells_and_every_load_sees_them_all() {
        use std::os::unix::fs::MetadataExt;
        let doc: RunResults = serde_json::from_value(serde_json::json!({
            "schema_version": 1, "run_id": "r", "matrix": "m.yaml", "matrix_name": "m",
            "filters": [], "started_at": "t", "environment": Environment::default(),
            "cells": [],
        }))
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join(RunResults::JOURNAL);
        let file = dir.path().join(RunResults::FILE);
        let big = "x".repeat(4096);
        let n = 300;
        let mut book = Book::new(dir.path().to_path_buf(), doc.clone(), n, vec![]).unwrap();
        let (mut journaled, mut rewrites_past_threshold, mut inode) = (0, 0, 0);
        for i in 0..n {
            book.record(i, result(&format!("c{i:03}"), &big)).unwrap();
            let meta = std::fs::metadata(&file).unwrap();
            // Every rewrite is a new file renamed into place.
            if meta.ino() != inode && book.written >= REWRITE_BELOW && journaled > 0 {
                rewrites_past_threshold += 1;
            }
            inode = meta.ino();
            if journal.exists() {
                journaled += 1;
            }
            if i % 25 == 0 || i == n - 1 {
                let loaded = RunResults::load(dir.path()).unwrap();
                let want: Vec<_> = book.results().cloned().collect();
                assert_eq!(loaded.cells, want, "after cell {i}");
            }
        }
        assert!(journaled > n / 2, "{journaled} cells journaled");
        // A rewrite each time the journal reaches half the document: the document grows
        // about 1.5x from one rewrite to the next.
        let most = ((book.written as f64 / REWRITE_BELOW as f64).ln() / 1.5f64.ln()).ceil() + 1.0;
        assert!(
            rewrites_past_threshold >= 1 && rewrites_past_threshold as f64 <= most,
            "{rewrites_past_threshold} rewrites, at most {most}"
        );
        book.save().unwrap();
        assert!(!journal.exists());
        let mut want = doc;
        want.cells = book.results().cloned().collect();
        assert_eq!(
            String::from_utf8(std::fs::read(&file).unwrap()).unwrap(),
            String::from_utf8(serde_json::to_vec_pretty(&want).unwrap()).unwrap()
        );

        // A journal left by a killed run goes with the resumed run's first save (whose
        // document took its cells in when it was loaded).
        std::fs::write(
            &journal,
            crate::results::JournalEntry::line("r", &result("late", "x")).unwrap(),
        )
        .unwrap();
        let mut book = Book::new(dir.path().to_path_buf(), want, 1, vec![]).unwrap();
        book.save().unwrap();
        assert!(!journal.exists());
    }
}
