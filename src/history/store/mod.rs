//! The history store: one [`Backend`] trait (plain SQL over a connection) with two real
//! implementations, [`super::sqlite`] and [`super::postgres`], and everything above it
//! written once: versioned schema migrations (table `bench_schema_migrations`), writing a
//! run in one transaction, and the queries the verdicts, trends and reports need.
//!
//! Every write of a run is a single transaction that first deletes any earlier copy of the
//! same run id (so importing a run folder twice is harmless): a writer killed in the middle
//! (`kill -9`) leaves the store exactly as it was before that run.
//!
//! The schema's migrations are in [`migrations`], the writing of a run in [`write`]; the
//! queries stay here, beside the rows they read.

pub(crate) mod backend;
mod migrations;
mod write;

pub(crate) use self::backend::{now, Backend, Sql};
pub use self::migrations::{schema_version_known, MIGRATIONS};
use self::write::{write_cells, write_run};
use super::error::HistoryError;
use super::record::{CellRecord, RunRecord, Versions};
use crate::telemetry::CellTelemetry;
use indexmap::IndexMap;

/// An open history store.
pub struct History {
    backend: Box<dyn Backend>,
    /// The file or URL (password removed), for messages.
    pub location: String,
    /// Whether this process records one share of a run (`bench matrix --shard`) whose
    /// other shares other jobs record under the same run id: writing the whole run then
    /// replaces only this share's cells, never the cells another shard recorded.
    share: bool,
    /// The rows already skipped as implausible (run, cell, metric; a run's cost is
    /// `(run, "", "bench_costs")`), so that each is warned
    /// about once however many times the store is read (opening it reads every trend).
    skipped: std::collections::HashSet<(String, String, String)>,
}

use crate::bounds::MAX_SAMPLES;
use crate::history::cost::{CellCost, Cost, Kept as CostKept, RunCost, MAX_CELL_ID, MAX_ROW_CELLS};

/// The longest `bench_costs.cost` text read: four figures for the run and for each of at
/// most [`crate::shard::MAX_SHARDS`] shards, about 150 characters each, and at most
/// [`MAX_ROW_CELLS`] cells of a cell id and four figures each. A longer text is skipped
/// unparsed.
const MAX_COST_TEXT: usize =
    (crate::shard::MAX_SHARDS as usize + 1) * 256 + MAX_ROW_CELLS * (MAX_CELL_ID + 256);

/// The longest `samples` text read: [`MAX_SAMPLES`] numbers of at most 32 characters each
/// and their commas. A longer text is skipped unparsed.
const MAX_SAMPLES_TEXT: usize = MAX_SAMPLES * 33 + 2;

/// Why a stored value or its samples cannot be a measurement of `metric`: the same
/// plausibility bounds ([`crate::bounds::check`]) as every door a figure comes in by, so a
/// row written by hand or by another tool (`inf`, `-inf`, a negative or zero speed, text)
/// never makes up a change point or a verdict.
fn implausible(metric: &str, value: Option<f64>, samples: &[f64]) -> Option<String> {
    let Some(value) = value else {
        return Some("value is not a number".into());
    };
    if let Err(why) = crate::bounds::check(metric, value) {
        return Some(format!("value: {why}"));
    }
    if samples.len() > MAX_SAMPLES {
        return Some(format!(
            "{} samples, more than the {MAX_SAMPLES} a value may hold",
            samples.len()
        ));
    }
    samples.iter().enumerate().find_map(|(j, v)| {
        crate::bounds::check(metric, *v)
            .err()
            .map(|why| format!("samples[{j}]: {why}"))
    })
}

/// Why a stored relative spread cannot be one: a spread is `(max - min) / median` of a
/// run's repeats, never negative nor a number, and at most [`crate::bounds::MAX_REL_SPREAD`].
fn implausible_spread(spread: Option<f64>) -> Option<String> {
    match spread {
        None => Some("rel_spread is not a number".into()),
        Some(s) => crate::bounds::check_rel_spread(s)
            .err()
            .map(|why| format!("rel_spread: {why}")),
    }
}

/// What a `--history` value names.
#[derive(Debug, Clone, PartialEq)]
pub enum Location {
    /// A `postgres://` or `postgresql://` URL (the scheme in any case; given to the driver
    /// in lower case, the only case it reads).
    Postgres(String),
    Sqlite(std::path::PathBuf),
}

/// The keywords of a PostgreSQL keyword/value connection string (libpq's `conninfo`)
/// that a mistaken `--history 'host=db password=...'` would start with.
const CONNINFO_KEYWORDS: [&str; 11] = [
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "sslmode",
    "options",
    "application_name",
    "connect_timeout",
];

/// Reads a `--history` value: a PostgreSQL URL, or else a SQLite file path. Anything else
/// that looks like a URL (`scheme://...`, e.g. `sqlite://`, `https://`) or a keyword/value
/// connection string is refused (exit 2), never taken for a file name that could hold a
/// password.
pub fn parse_location(location: &str) -> Result<Location, HistoryError> {
    let refuse = |message: String| HistoryError::Input {
        path: super::postgres::redact(location),
        message,
    };
    if location.trim().is_empty() {
        return Err(refuse(
            "no history store given: a SQLite file path or a postgres:// URL".into(),
        ));
    }
    if let Some((scheme, rest)) = location.split_once("://") {
        let is_scheme = scheme
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        if is_scheme {
            let lower = scheme.to_ascii_lowercase();
            if lower == "postgres" || lower == "postgresql" {
                return Ok(Location::Postgres(format!("{lower}://{rest}")));
            }
            return Err(refuse(format!(
                "a URL of scheme `{scheme}`: a history store is a SQLite file path or a postgres:// URL"
            )));
        }
    }
    // Any word that starts like a keyword's setting (`password=`, `host=`): a quoted value
    // may hold spaces, so the other words need not look like settings.
    let conninfo = location.split_whitespace().any(|t| {
        t.split_once('=')
            .is_some_and(|(key, _)| CONNINFO_KEYWORDS.contains(&key.to_ascii_lowercase().as_str()))
    });
    if conninfo {
        return Err(refuse(
            "a PostgreSQL keyword/value connection string: give the store as a postgres:// URL (postgres://user@host:port/db)".into(),
        ));
    }
    Ok(Location::Sqlite(std::path::PathBuf::from(location)))
}

/// Opens the store at `location`: a `postgres://` or `postgresql://` URL (the scheme in any
/// case), else a SQLite file path (created when missing). Migrates the schema to the newest
/// version. Refuses (exit 2) a URL of another scheme and a keyword/value connection string.
pub fn open(location: &str) -> Result<History, HistoryError> {
    open_at(location, true, false)
}

/// [`open`] for the commands that read what is there (`bench history CELL`, `bench
/// baseline accept`): a SQLite file that does not exist is refused (exit 2) instead of
/// created, so that a mistyped path leaves nothing behind, and a damaged one is refused
/// before it is read.
pub fn open_existing(location: &str) -> Result<History, HistoryError> {
    open_at(location, false, true)
}

/// Checks the store at `location` before a run relies on it (`bench matrix --history`
/// calls it before the first cell): a file that is not SQLite, a truncated or damaged one
/// (SQLite's `PRAGMA quick_check`), a store of a newer schema, and a row bench cannot read
/// (every trend is read) are each refused with exit 2 naming the store. A store that cannot
/// be trusted is the user's to repair or move aside, not an internal error of bench. A
/// SQLite file that does not exist yet is created, as the run would.
pub fn check(location: &str) -> Result<(), HistoryError> {
    open_at(location, true, true)?.check_rows()
}

fn open_at(location: &str, create: bool, verify: bool) -> Result<History, HistoryError> {
    let (backend, shown): (Box<dyn Backend>, String) = match parse_location(location)? {
        Location::Postgres(url) => {
            let shown = super::postgres::redact(location);
            let b = super::postgres::PgBackend::connect(&url).map_err(|message| {
                HistoryError::Open {
                    location: shown.clone(),
                    message,
                }
            })?;
            (Box::new(b), shown)
        }
        Location::Sqlite(path) => {
            let b = super::sqlite::SqliteBackend::open(&path, create).map_err(|message| {
                HistoryError::Open {
                    location: location.to_string(),
                    message,
                }
            })?;
            (Box::new(b), location.to_string())
        }
    };
    let mut h = History {
        share: false,
        skipped: Default::default(),
        backend,
        location: shown,
    };
    if verify {
        h.refuse_damage()?;
    }
    if let Err(e) = h.migrate() {
        // A migration that fails on a damaged file is the file's fault: said as such.
        h.refuse_damage()?;
        return Err(e);
    }
    if verify {
        h.refuse_missing_tables()?;
    }
    Ok(h)
}

/// Every table and column the newest schema has, as bench reads them: a store whose
/// migrations are recorded but a table or column is gone (dropped by hand, a partial
/// restore) is refused before a run relies on it, not after its cells ran.
const TABLES: &[(&str, &str)] = &[
    ("bench_schema_migrations", "version, description, applied_at"),
    (
        "bench_runs",
        "run_id, started_at, finished_at, commit_sha, git_dirty, branch, hardware_key, host, matrix_name, bench_version, libtorch, driver, cuda, rocm, nccl, gpu_model, switches, telemetry, throttled, recorded_at",
    ),
    (
        "bench_cells",
        "run_id, cell_id, status, loss_curve, telemetry, context, verdict",
    ),
    (
        "bench_metrics",
        "run_id, cell_id, metric, value, rel_spread, samples",
    ),
    (
        "bench_segments",
        "cell_id, hardware_key, starts_at, first_run_id, reason, accepted_at",
    ),
    ("bench_kernels", "run_id, cell_id, summary"),
    ("bench_triage", "run_id, findings"),
    ("bench_costs", "run_id, cost"),
];

impl History {
    /// Refuses (exit 2) a store that lacks a table or column of its recorded schema
    /// ([`TABLES`]), naming it.
    fn refuse_missing_tables(&mut self) -> Result<(), HistoryError> {
        for (table, columns) in TABLES {
            if let Err(message) = self
                .backend
                .query(&format!("SELECT {columns} FROM {table} LIMIT 0"), &[])
            {
                return Err(HistoryError::Input {
                    path: self.location.clone(),
                    message: format!(
                        "the store's schema version {} should have table {table} with columns {columns}, and reading it failed ({message}); restore the store from a backup or move it aside",
                        self.schema_version().unwrap_or(0)
                    ),
                });
            }
        }
        Ok(())
    }

    /// Refuses a store whose files the database finds damaged (exit 2).
    fn refuse_damage(&mut self) -> Result<(), HistoryError> {
        match self.backend.damage() {
            Ok(None) => Ok(()),
            Ok(Some(problems)) => Err(HistoryError::Input {
                path: self.location.clone(),
                message: format!(
                    "the store is damaged (SQLite quick_check: {problems}); restore it from a backup or move it aside"
                ),
            }),
            Err(m) => Err(HistoryError::Open {
                location: self.location.clone(),
                message: m,
            }),
        }
    }

    /// Reads every trend the store holds (each cell, hardware key and metric), so that a
    /// row bench cannot read is found now, as [`HistoryError::Input`], rather than while a
    /// verdict is being made.
    fn check_rows(&mut self) -> Result<(), HistoryError> {
        let series = self.query(
            "SELECT DISTINCT m.cell_id, r.hardware_key, m.metric FROM bench_metrics m
             JOIN bench_runs r ON r.run_id = m.run_id ORDER BY 1, 2, 3",
            &[],
        )?;
        for s in &series {
            self.trend(&text(&s[0]), &text(&s[1]), &text(&s[2]))?;
        }
        Ok(())
    }

    /// Whether a row of `metric` (run `run`, cell `cell`) is kept: an implausible one
    /// (`why`) is skipped, with one warning naming the store, run, cell and metric the
    /// first time this store is seen to hold it.
    fn keep_row(&mut self, run: &str, cell: &str, metric: &str, why: Option<String>) -> bool {
        let Some(why) = why else {
            return true;
        };
        let row = || {
            format!(
                "run {} cell {} metric {}",
                crate::sanitize::terminal(run),
                crate::sanitize::terminal(cell),
                crate::sanitize::terminal(metric)
            )
        };
        self.skip_once((run.into(), cell.into(), metric.into()), row, &why);
        false
    }

    /// Warns, the first time this store is seen to hold the row `key`, that the row
    /// (`row()`, named for the message) is skipped, and why.
    fn skip_once(
        &mut self,
        key: (String, String, String),
        row: impl FnOnce() -> String,
        why: &str,
    ) {
        if self.skipped.insert(key) {
            eprintln!(
                "warning: {}: {}: {}; the row is skipped, not used",
                crate::sanitize::terminal(&self.location),
                row(),
                crate::sanitize::terminal(why)
            );
        }
    }

    /// A row of `cell` (`row[0]` is its run id) whose column does not read: the store is
    /// bad input (exit 2), named with the row.
    fn bad_row(&self, cell: &str, row: &[Sql], message: String) -> HistoryError {
        HistoryError::Input {
            path: self.location.clone(),
            message: format!(
                "run {} cell {cell}: a row bench cannot read: {message}",
                row.first().map(text).unwrap_or_default()
            ),
        }
    }
}

/// One point of a cell's trend: a run's value of one metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub run_id: String,
    pub started_at: String,
    pub commit: Option<String>,
    pub branch: Option<String>,
    pub host: String,
    pub throttled: bool,
    pub value: f64,
    pub rel_spread: f64,
    pub samples: Vec<f64>,
    pub loss_curve: Vec<f64>,
    /// The run's speed switches, versions and GPU model (for the suspects of a change).
    pub switches: IndexMap<String, String>,
    pub versions: Versions,
    /// The cell's telemetry over its measured steps, when recorded.
    pub telemetry: Option<CellTelemetry>,
    /// A framework cell's identity (see `record::context_of`).
    pub context: IndexMap<String, String>,
    /// The verdict the run got for this cell, when it was judged (`detect::HistoryVerdict`
    /// in its snake_case form).
    pub verdict: Option<String>,
}

impl Point {
    /// The run's repeats, or its value alone when it kept none.
    pub(crate) fn repeats(&self) -> Vec<f64> {
        if self.samples.is_empty() {
            vec![self.value]
        } else {
            self.samples.clone()
        }
    }
}

/// A segment boundary recorded by `bench baseline accept`.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    pub cell_id: String,
    pub hardware_key: String,
    /// Runs started at or after this time belong to the segment.
    pub starts_at: String,
    pub first_run_id: String,
    pub reason: String,
    pub accepted_at: String,
}

/// A run as listed by [`History::runs`].
#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    pub run_id: String,
    pub started_at: String,
    pub hardware_key: String,
    pub cells: i64,
}

impl History {
    fn err(&self, message: String) -> HistoryError {
        HistoryError::Query {
            location: self.location.clone(),
            message,
        }
    }

    pub fn kind(&self) -> &'static str {
        self.backend.kind()
    }

    fn query(&mut self, sql: &str, params: &[Sql]) -> Result<Vec<Vec<Sql>>, HistoryError> {
        self.backend.query(sql, params).map_err(|m| self.err(m))
    }

    /// Runs `f` inside one transaction: committed when it succeeds, rolled back otherwise.
    fn transaction<T>(
        &mut self,
        f: impl FnOnce(&mut dyn Backend) -> Result<T, String>,
    ) -> Result<T, HistoryError> {
        let begin = self.backend.begin();
        self.backend.batch(begin).map_err(|m| self.err(m))?;
        match f(self.backend.as_mut()) {
            Ok(v) => {
                self.backend.batch("COMMIT").map_err(|m| self.err(m))?;
                Ok(v)
            }
            Err(m) => {
                // The first error is the one to report; a failed rollback adds nothing.
                let _ = self.backend.batch("ROLLBACK");
                Err(self.err(m))
            }
        }
    }

    /// The schema version the store is at (0 for an empty database).
    pub fn schema_version(&mut self) -> Result<i64, HistoryError> {
        let rows = self.query("SELECT MAX(version) FROM bench_schema_migrations", &[])?;
        Ok(rows.first().and_then(|r| r[0].int()).unwrap_or(0))
    }

    /// Applies the migrations the store lacks; refuses a store newer than this bench.
    fn migrate(&mut self) -> Result<(), HistoryError> {
        // In a write transaction (SQLite: BEGIN IMMEDIATE), which waits for another
        // writer's lock: as a statement of its own it starts as a read, and a writer that
        // creates the table meanwhile makes SQLite refuse the upgrade at once ("database is
        // locked", no busy wait), which two commands opening a new store together met.
        // The version and the check below are read under the schema lock, in the same
        // transaction: read apart, another process's migration committed between them would
        // look like a store whose record of its migrations was lost.
        let (found, lost) = self.transaction(|b| {
            b.lock_schema()?;
            b.batch(
                "CREATE TABLE IF NOT EXISTS bench_schema_migrations (
                    version BIGINT PRIMARY KEY,
                    description TEXT NOT NULL,
                    applied_at TEXT NOT NULL
                )",
            )?;
            let rows = b.query("SELECT MAX(version) FROM bench_schema_migrations", &[])?;
            let found = rows.first().and_then(|r| r[0].int()).unwrap_or(0);
            // No migration recorded, yet bench's tables are there: the record was lost (a
            // table dropped by hand, a partial restore). Migrating would fail half-way;
            // refusing names what is wrong.
            let lost = found == 0 && b.has_table("bench_runs")?;
            Ok((found, lost))
        })?;
        if lost {
            return Err(HistoryError::Input {
                path: self.location.clone(),
                message: "the store has bench's tables but no record of its schema migrations (bench_schema_migrations is empty or was dropped); restore it from a backup or move it aside".into(),
            });
        }
        if found > schema_version_known() {
            return Err(HistoryError::Newer {
                location: self.location.clone(),
                found,
                known: schema_version_known(),
            });
        }
        for &(version, description, sql) in MIGRATIONS.iter().filter(|m| m.0 > found) {
            self.transaction(|b| {
                b.lock_schema()?;
                // Another process may have applied it since we looked.
                let done = b.query(
                    "SELECT 1 FROM bench_schema_migrations WHERE version = ?",
                    &[Sql::Int(version)],
                )?;
                if !done.is_empty() {
                    return Ok(());
                }
                b.batch(sql)?;
                b.execute(
                    "INSERT INTO bench_schema_migrations (version, description, applied_at) VALUES (?, ?, ?)",
                    &[Sql::Int(version), Sql::Text(description.into()), Sql::Text(now())],
                )?;
                Ok(())
            })
            .map_err(|e| match e {
                HistoryError::Query { location, message } => HistoryError::Query {
                    location,
                    message: format!("migration {version} ({description}): {message}"),
                },
                other => other,
            })?;
        }
        Ok(())
    }

    /// The hardware key the store holds run `run_id` under, when it has that run.
    pub(crate) fn run_hardware_key(
        &mut self,
        run_id: &str,
    ) -> Result<Option<String>, HistoryError> {
        let location = self.location.clone();
        write::stored_key(self.backend.as_mut(), run_id)
            .map_err(|message| HistoryError::Query { location, message })
    }

    /// Refuses (bad input) a run of `hardware_key` whose id the store already holds for
    /// another hardware key: checked before the first cell runs, before `bench ingest`
    /// writes its run folder, and before every write (the write's own transaction checks
    /// again, for two jobs that start together).
    pub(crate) fn claim_run_id(
        &mut self,
        run_id: &str,
        hardware_key: &str,
    ) -> Result<(), HistoryError> {
        match self.run_hardware_key(run_id)? {
            Some(k) if k != hardware_key => Err(HistoryError::Input {
                path: self.location.clone(),
                message: write::collision(run_id, &k, hardware_key),
            }),
            _ => Ok(()),
        }
    }

    /// Marks this store as recording one share of a run (`bench matrix --shard`): the
    /// shards of one run id on one hardware key each record their own cells, so
    /// [`Self::record_run`] no longer deletes the run's other cells. The claim of the run
    /// id already accepts a second job of the same hardware key; a shard on other hardware
    /// is still refused, since one run id names one run of one hardware.
    pub(crate) fn record_as_share(&mut self) {
        self.share = true;
    }

    /// Writes `run` (replacing an earlier copy of the same run id) in one transaction; a
    /// share of a run ([`Self::record_as_share`]) replaces only its own cells.
    pub(crate) fn record_run(&mut self, run: &RunRecord) -> Result<(), HistoryError> {
        self.claim_run_id(&run.run_id, &run.hardware_key)?;
        if self.share {
            return self.transaction(|b| write_cells(b, run, &run.cells));
        }
        self.transaction(|b| write_run(b, run))
    }

    /// Writes the run's row and `cells` of it (replacing earlier copies of those cells),
    /// in one transaction; `run.cells` is not read.
    pub(crate) fn record_cells(
        &mut self,
        run: &RunRecord,
        cells: &[CellRecord],
    ) -> Result<(), HistoryError> {
        self.claim_run_id(&run.run_id, &run.hardware_key)?;
        self.transaction(|b| write_cells(b, run, cells))
    }

    /// Stores the verdicts a run got, per cell (`verdicts`: cell id and verdict word).
    pub(crate) fn set_verdicts(
        &mut self,
        run_id: &str,
        verdicts: &[(String, String)],
    ) -> Result<(), HistoryError> {
        self.transaction(|b| {
            for (cell, verdict) in verdicts {
                b.execute(
                    "UPDATE bench_cells SET verdict = ? WHERE run_id = ? AND cell_id = ?",
                    &[
                        Sql::Text(verdict.clone()),
                        Sql::Text(run_id.into()),
                        Sql::Text(cell.clone()),
                    ],
                )?;
            }
            Ok(())
        })
    }

    /// Keeps the kernel summary of one traced step of `cell` in run `run_id` (JSON, written
    /// by `crate::triage::kernels::KernelSummary`), replacing one recorded before.
    pub(crate) fn record_kernels(
        &mut self,
        run_id: &str,
        cell: &str,
        summary: &str,
    ) -> Result<(), HistoryError> {
        self.transaction(|b| {
            let key = [Sql::Text(run_id.into()), Sql::Text(cell.into())];
            b.execute(
                "DELETE FROM bench_kernels WHERE run_id = ? AND cell_id = ?",
                &key,
            )?;
            b.execute(
                "INSERT INTO bench_kernels (run_id, cell_id, summary) VALUES (?, ?, ?)",
                &[key[0].clone(), key[1].clone(), Sql::Text(summary.into())],
            )?;
            Ok(())
        })
    }

    /// The kernel summary recorded for `cell` in run `run_id`, if one was.
    pub(crate) fn kernels(
        &mut self,
        run_id: &str,
        cell: &str,
    ) -> Result<Option<String>, HistoryError> {
        let rows = self.query(
            "SELECT summary FROM bench_kernels WHERE run_id = ? AND cell_id = ?",
            &[Sql::Text(run_id.into()), Sql::Text(cell.into())],
        )?;
        Ok(rows
            .first()
            .and_then(|r| r.first())
            .and_then(|v| v.text())
            .map(str::to_string))
    }

    /// Keeps what a run's triage found beyond the grouping (the findings' bisections and
    /// kernel diffs, as the run folder's `triage.json` holds them), replacing what was kept
    /// for the run before: the store outlives the run folders (a CI job's artifacts expire),
    /// and `bench site` shows the open findings' triage from it.
    pub(crate) fn record_triage(
        &mut self,
        run_id: &str,
        findings: &str,
    ) -> Result<(), HistoryError> {
        self.record_triage_with(run_id, findings, |_, ours| ours.to_string())
    }

    /// [`Self::record_triage`] with what is kept for the run already joined to `findings` by
    /// `join(kept, findings)`, read and written in one transaction that writers of the store
    /// take in turn: the shards of one run finishing at once each add their chases, and
    /// neither's is lost to the other's read-then-write.
    pub(crate) fn record_triage_with(
        &mut self,
        run_id: &str,
        findings: &str,
        join: impl FnOnce(Option<&str>, &str) -> String,
    ) -> Result<(), HistoryError> {
        self.join_run_row("bench_triage", "findings", run_id, |kept| {
            Ok(join(kept, findings))
        })
    }

    /// Keeps what the verdict of run `run_id` cost ([`Cost`]), for `bench site` to show
    /// after the run folder is gone. `shard` is the share of the run this process measured
    /// (`bench matrix --shard`): the shards of one run each record theirs under the one run
    /// id, and the row holds their sum (see [`super::cost::Kept`]); without a shard the
    /// row is replaced.
    pub fn record_cost(
        &mut self,
        run_id: &str,
        shard: Option<crate::shard::Shard>,
        cost: Cost,
        cells: &[CellCost],
    ) -> Result<(), HistoryError> {
        self.join_run_row("bench_costs", "cost", run_id, |kept| {
            serde_json::to_string(&CostKept::join(kept, shard, cost, cells))
                .map_err(|e| format!("run {run_id}: the cost does not serialize: {e}"))
        })
    }

    /// Replaces the one-per-run row of `table` (its text in `column`) for `run_id` with
    /// `join(kept)`, `kept` being the row's text before (an `Err` of `join` rolls back),
    /// read and written in one transaction that writers of the store take in turn: the
    /// shards of one run finishing at once each add their share, and neither's is lost to
    /// the other's read-then-write.
    fn join_run_row(
        &mut self,
        table: &'static str,
        column: &'static str,
        run_id: &str,
        join: impl FnOnce(Option<&str>) -> Result<String, String>,
    ) -> Result<(), HistoryError> {
        self.transaction(|b| {
            // SQLite's write transaction already queues writers; a server's needs the lock.
            b.lock_schema()?;
            let key = Sql::Text(run_id.into());
            let kept = b.query(
                &format!("SELECT {column} FROM {table} WHERE run_id = ?"),
                std::slice::from_ref(&key),
            )?;
            let kept = kept.first().and_then(|r| r[0].text().map(str::to_string));
            let joined = join(kept.as_deref())?;
            b.execute(
                &format!("DELETE FROM {table} WHERE run_id = ?"),
                std::slice::from_ref(&key),
            )?;
            b.execute(
                &format!("INSERT INTO {table} (run_id, {column}) VALUES (?, ?)"),
                &[key, Sql::Text(joined)],
            )?;
            Ok(())
        })
    }

    /// Every run's kept cost ([`Self::record_cost`]), by run id: the total and the cells
    /// whose verdict took more than measuring them. A row that does not read as one, or
    /// whose figures no run can cost ([`RunCost::read`]: a negative or overflowed figure,
    /// a cell id no cell has, written by hand or another tool), is skipped with one
    /// warning naming the store and run, as implausible values of a trend are: a cost is
    /// shown beside the verdicts, and a forged one is never shown.
    pub fn costs(&mut self) -> Result<std::collections::HashMap<String, RunCost>, HistoryError> {
        let rows = self.query("SELECT run_id, cost FROM bench_costs ORDER BY run_id", &[])?;
        let mut out = std::collections::HashMap::with_capacity(rows.len());
        for r in rows {
            let run = text(&r[0]);
            let raw = r[1].text().unwrap_or_default();
            let read = if raw.len() > MAX_COST_TEXT {
                Err(format!("{} bytes, more than a run's cost holds", raw.len()))
            } else {
                RunCost::read(raw)
            };
            match read {
                Ok(c) => {
                    out.insert(run, c);
                }
                Err(why) => {
                    let row = || format!("bench_costs, run {}", crate::sanitize::terminal(&run));
                    self.skip_once(
                        (run.clone(), String::new(), "bench_costs".into()),
                        row,
                        &why,
                    );
                }
            }
        }
        Ok(out)
    }

    /// The triage kept for run `run_id` ([`Self::record_triage`]), if any.
    #[cfg(test)]
    pub(crate) fn triage(&mut self, run_id: &str) -> Result<Option<String>, HistoryError> {
        let rows = self.query(
            "SELECT findings FROM bench_triage WHERE run_id = ?",
            &[Sql::Text(run_id.into())],
        )?;
        Ok(rows
            .first()
            .and_then(|r| r.first())
            .and_then(|v| v.text())
            .map(str::to_string))
    }

    /// Every run's kept triage ([`Self::record_triage`]): run id and its JSON.
    pub(crate) fn all_triage(&mut self) -> Result<Vec<(String, String)>, HistoryError> {
        let rows = self.query(
            "SELECT run_id, findings FROM bench_triage ORDER BY run_id",
            &[],
        )?;
        Ok(rows.iter().map(|r| (text(&r[0]), text(&r[1]))).collect())
    }

    /// Every run, oldest first.
    pub fn runs(&mut self) -> Result<Vec<RunRow>, HistoryError> {
        let rows = self.query(
            "SELECT r.run_id, r.started_at, r.hardware_key,
                    (SELECT COUNT(*) FROM bench_cells c WHERE c.run_id = r.run_id)
             FROM bench_runs r ORDER BY r.started_at, r.run_id",
            &[],
        )?;
        Ok(rows
            .into_iter()
            .map(|r| RunRow {
                run_id: text(&r[0]),
                started_at: text(&r[1]),
                hardware_key: text(&r[2]),
                cells: r[3].int().unwrap_or(0),
            })
            .collect())
    }

    /// The cells that have a value of `metric`, by id.
    pub fn cells(&mut self, metric: &str) -> Result<Vec<String>, HistoryError> {
        let rows = self.query(
            "SELECT DISTINCT cell_id FROM bench_metrics WHERE metric = ? ORDER BY cell_id",
            &[Sql::Text(metric.into())],
        )?;
        Ok(rows.iter().map(|r| text(&r[0])).collect())
    }

    /// The hardware keys that have a value of `metric` for `cell`.
    pub fn hardware_keys(&mut self, cell: &str, metric: &str) -> Result<Vec<String>, HistoryError> {
        let rows = self.query(
            "SELECT DISTINCT r.hardware_key FROM bench_metrics m
             JOIN bench_runs r ON r.run_id = m.run_id
             WHERE m.cell_id = ? AND m.metric = ? ORDER BY r.hardware_key",
            &[Sql::Text(cell.into()), Sql::Text(metric.into())],
        )?;
        Ok(rows.iter().map(|r| text(&r[0])).collect())
    }

    /// The trend of `metric` for `cell` on `hardware_key`, oldest first, every segment.
    pub fn trend(
        &mut self,
        cell: &str,
        hardware_key: &str,
        metric: &str,
    ) -> Result<Vec<Point>, HistoryError> {
        let rows = self.query(
            "SELECT r.run_id, r.started_at, r.commit_sha, r.branch, r.host, r.throttled,
                    m.value, m.rel_spread, m.samples, c.loss_curve,
                    r.switches, r.bench_version, r.libtorch, r.driver, r.cuda, r.rocm, r.nccl,
                    r.gpu_model, c.telemetry, c.context, c.verdict
             FROM bench_metrics m
             JOIN bench_runs r ON r.run_id = m.run_id
             JOIN bench_cells c ON c.run_id = m.run_id AND c.cell_id = m.cell_id
             WHERE m.cell_id = ? AND r.hardware_key = ? AND m.metric = ?
             ORDER BY r.started_at, r.run_id",
            &[
                Sql::Text(cell.into()),
                Sql::Text(hardware_key.into()),
                Sql::Text(metric.into()),
            ],
        )?;
        let mut kept = Vec::with_capacity(rows.len());
        for r in rows {
            let samples_text = r[8].text().unwrap_or("[]");
            // The samples are parsed once, for the check and for the point.
            let (samples, why) = if samples_text.len() > MAX_SAMPLES_TEXT {
                let why = format!(
                    "samples of {} bytes, more than {MAX_SAMPLES} samples hold",
                    samples_text.len()
                );
                (Vec::new(), Some(why))
            } else {
                // A sample past f64 (`1e999`) is as implausible as an infinite value: the row
                // is skipped like it. Text that is not a JSON list of numbers is a damaged row,
                // which makes the store bad input, as every reader of it says.
                match serde_json::from_str::<Vec<Option<f64>>>(samples_text) {
                    Ok(samples) => {
                        let samples = nan_from_null(samples);
                        let why = implausible(metric, r[6].real(), &samples)
                            .or_else(|| implausible_spread(r[7].real()));
                        (samples, why)
                    }
                    Err(e) if e.to_string().starts_with("number out of range") => (
                        Vec::new(),
                        Some(format!("samples do not read as numbers: {e}")),
                    ),
                    Err(e) => {
                        return Err(self.bad_row(cell, &r, format!("bench_metrics.samples: {e}")))
                    }
                }
            };
            if self.keep_row(&text(&r[0]), cell, metric, why) {
                kept.push((r, samples));
            }
        }
        kept.into_iter()
            .map(|(r, samples)| {
                let loss_curve: Vec<Option<f64>> =
                    serde_json::from_str(r[9].text().unwrap_or("[]")).map_err(|e| {
                        self.bad_row(cell, &r, format!("bench_cells.loss_curve: {e}"))
                    })?;
                let json_col =
                    |i: usize, name: &str| -> Result<Option<serde_json::Value>, HistoryError> {
                        match r[i].text() {
                            Some(t) => serde_json::from_str(t)
                                .map(Some)
                                .map_err(|e| self.bad_row(cell, &r, format!("{name}: {e}"))),
                            None => Ok(None),
                        }
                    };
                let switches: IndexMap<String, String> = match json_col(10, "bench_runs.switches")?
                {
                    Some(v) => serde_json::from_value(v)
                        .map_err(|e| self.bad_row(cell, &r, format!("bench_runs.switches: {e}")))?,
                    None => IndexMap::new(),
                };
                let telemetry: Option<CellTelemetry> = match json_col(18, "bench_cells.telemetry")?
                {
                    Some(v) if !v.is_null() => Some(serde_json::from_value(v).map_err(|e| {
                        self.bad_row(cell, &r, format!("bench_cells.telemetry: {e}"))
                    })?),
                    _ => None,
                };
                let context: IndexMap<String, String> = match json_col(19, "bench_cells.context")? {
                    Some(v) if !v.is_null() => serde_json::from_value(v)
                        .map_err(|e| self.bad_row(cell, &r, format!("bench_cells.context: {e}")))?,
                    _ => IndexMap::new(),
                };
                let opt = |i: usize| r[i].text().map(str::to_string);
                Ok(Point {
                    switches,
                    versions: Versions {
                        bench: text(&r[11]),
                        libtorch: opt(12),
                        driver: opt(13),
                        cuda: opt(14),
                        rocm: opt(15),
                        nccl: opt(16),
                        gpu_model: opt(17),
                    },
                    telemetry,
                    context,
                    verdict: opt(20),
                    run_id: text(&r[0]),
                    started_at: text(&r[1]),
                    commit: r[2].text().map(str::to_string),
                    branch: r[3].text().map(str::to_string),
                    host: text(&r[4]),
                    throttled: r[5].int().unwrap_or(0) != 0,
                    value: r[6].real().unwrap_or(f64::NAN),
                    rel_spread: r[7].real().unwrap_or(0.0),
                    samples,
                    loss_curve: nan_from_null(loss_curve),
                })
            })
            .collect()
    }

    /// The segment boundaries of `cell` on `hardware_key`, oldest first.
    pub fn segments(
        &mut self,
        cell: &str,
        hardware_key: &str,
    ) -> Result<Vec<Segment>, HistoryError> {
        let rows = self.query(
            "SELECT cell_id, hardware_key, starts_at, first_run_id, reason, accepted_at
             FROM bench_segments WHERE cell_id = ? AND hardware_key = ? ORDER BY starts_at",
            &[Sql::Text(cell.into()), Sql::Text(hardware_key.into())],
        )?;
        Ok(rows.iter().map(|r| segment_of(r)).collect())
    }

    /// Records an intended shift: a new segment of `cell` on `hardware_key` starting with
    /// the run `first_run_id` (which must have a value for the cell).
    pub fn accept(
        &mut self,
        cell: &str,
        hardware_key: &str,
        first_run_id: &str,
        reason: &str,
    ) -> Result<Segment, HistoryError> {
        let rows = self.query(
            "SELECT r.started_at FROM bench_runs r JOIN bench_cells c ON c.run_id = r.run_id
             WHERE r.run_id = ? AND c.cell_id = ? AND r.hardware_key = ?",
            &[
                Sql::Text(first_run_id.into()),
                Sql::Text(cell.into()),
                Sql::Text(hardware_key.into()),
            ],
        )?;
        let Some(starts_at) = rows.first().map(|r| text(&r[0])) else {
            return Err(HistoryError::Input {
                path: self.location.clone(),
                message: format!(
                    "run {first_run_id} has no cell {cell} on hardware {hardware_key}"
                ),
            });
        };
        let seg = Segment {
            cell_id: cell.into(),
            hardware_key: hardware_key.into(),
            starts_at,
            first_run_id: first_run_id.into(),
            reason: reason.into(),
            accepted_at: now(),
        };
        let s = seg.clone();
        self.transaction(move |b| {
            let key = [
                Sql::Text(s.cell_id.clone()),
                Sql::Text(s.hardware_key.clone()),
                Sql::Text(s.starts_at.clone()),
            ];
            b.execute(
                "DELETE FROM bench_segments WHERE cell_id = ? AND hardware_key = ? AND starts_at = ?",
                &key,
            )?;
            b.execute(
                "INSERT INTO bench_segments (cell_id, hardware_key, starts_at, first_run_id, reason, accepted_at)
                 VALUES (?, ?, ?, ?, ?, ?)",
                &[
                    key[0].clone(),
                    key[1].clone(),
                    key[2].clone(),
                    Sql::Text(s.first_run_id.clone()),
                    Sql::Text(s.reason.clone()),
                    Sql::Text(s.accepted_at.clone()),
                ],
            )?;
            Ok(())
        })?;
        Ok(seg)
    }

    /// Deletes every row (tests share one PostgreSQL database and start from empty).
    pub fn clear(&mut self) -> Result<(), HistoryError> {
        self.transaction(|b| {
            for t in [
                "bench_costs",
                "bench_triage",
                "bench_kernels",
                "bench_segments",
                "bench_metrics",
                "bench_cells",
                "bench_runs",
            ] {
                b.execute(&format!("DELETE FROM {t}"), &[])?;
            }
            Ok(())
        })
    }
}

/// One value of a metric in [`History::fleet`]: the run it came from and the verdict the
/// run got for the cell (the run's own facts are in [`History::fleet_runs`], once per run).
#[derive(Debug, Clone, PartialEq)]
pub struct FleetValue {
    pub cell_id: String,
    pub hardware_key: String,
    pub run_id: String,
    pub value: f64,
    pub verdict: Option<String>,
}

/// A run's own facts, as the fleet's site lists them.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetRun {
    pub run_id: String,
    pub started_at: String,
    pub hardware_key: String,
    pub commit: Option<String>,
    pub branch: Option<String>,
    pub host: String,
    pub matrix_name: String,
}

impl History {
    /// Every value of `metric` the store holds, ordered by cell, hardware key, run start
    /// and run id: the whole fleet in one query. `bench site` reads 365,000 values of a
    /// year of a 1,000-cell nightly this way in about a second, where a [`History::trend`]
    /// per cell would parse every row's telemetry and switches it does not draw.
    pub fn fleet(&mut self, metric: &str) -> Result<Vec<FleetValue>, HistoryError> {
        let rows = self.query(
            "SELECT m.cell_id, r.hardware_key, m.run_id, m.value, c.verdict
             FROM bench_metrics m
             JOIN bench_runs r ON r.run_id = m.run_id
             JOIN bench_cells c ON c.run_id = m.run_id AND c.cell_id = m.cell_id
             WHERE m.metric = ?
             ORDER BY m.cell_id, r.hardware_key, r.started_at, m.run_id",
            &[Sql::Text(metric.into())],
        )?;
        let mut kept = Vec::with_capacity(rows.len());
        for r in rows {
            let why = implausible(metric, r[3].real(), &[]);
            if self.keep_row(&text(&r[2]), &text(&r[0]), metric, why) {
                kept.push(r);
            }
        }
        Ok(kept
            .into_iter()
            .map(|r| FleetValue {
                cell_id: text(&r[0]),
                hardware_key: text(&r[1]),
                run_id: text(&r[2]),
                value: r[3].real().unwrap_or(f64::NAN),
                verdict: r[4].text().map(str::to_string),
            })
            .collect())
    }

    /// Every run's own facts, oldest first.
    pub fn fleet_runs(&mut self) -> Result<Vec<FleetRun>, HistoryError> {
        let rows = self.query(
            "SELECT run_id, started_at, hardware_key, commit_sha, branch, host, matrix_name
             FROM bench_runs ORDER BY started_at, run_id",
            &[],
        )?;
        Ok(rows
            .into_iter()
            .map(|r| FleetRun {
                run_id: text(&r[0]),
                started_at: text(&r[1]),
                hardware_key: text(&r[2]),
                commit: r[3].text().map(str::to_string),
                branch: r[4].text().map(str::to_string),
                host: text(&r[5]),
                matrix_name: text(&r[6]),
            })
            .collect())
    }

    /// Every accepted shift (`bench baseline accept`) of every cell, oldest first.
    pub fn all_segments(&mut self) -> Result<Vec<Segment>, HistoryError> {
        let rows = self.query(
            "SELECT cell_id, hardware_key, starts_at, first_run_id, reason, accepted_at
             FROM bench_segments ORDER BY cell_id, hardware_key, starts_at",
            &[],
        )?;
        Ok(rows.iter().map(|r| segment_of(r)).collect())
    }
}

/// A row of `bench_segments` as the segment queries select it: cell_id, hardware_key,
/// starts_at, first_run_id, reason, accepted_at.
fn segment_of(r: &[Sql]) -> Segment {
    Segment {
        cell_id: text(&r[0]),
        hardware_key: text(&r[1]),
        starts_at: text(&r[2]),
        first_run_id: text(&r[3]),
        reason: text(&r[4]),
        accepted_at: text(&r[5]),
    }
}

/// The points of `trend` in the current segment (after the last accepted boundary).
pub fn current_segment<'a>(trend: &'a [Point], segments: &[Segment]) -> &'a [Point] {
    match segments.last() {
        Some(s) => {
            let start = trend
                .iter()
                .position(|p| p.started_at >= s.starts_at)
                .unwrap_or(trend.len());
            &trend[start..]
        }
        None => trend,
    }
}

fn text(v: &Sql) -> String {
    v.text().unwrap_or_default().to_string()
}

/// JSON has no NaN: a NaN loss is stored as `null` and read back as NaN.
fn nan_from_null(v: Vec<Option<f64>>) -> Vec<f64> {
    v.into_iter().map(|x| x.unwrap_or(f64::NAN)).collect()
}
