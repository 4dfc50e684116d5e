//! The embedded backend: one SQLite file (the `bundled` build of SQLite, so no system
//! library or server is needed), in write-ahead-log mode with full syncs, so a committed run
//! survives a crash of the writer or of the machine, and a reader never blocks a writer.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::types::Value;
use rusqlite::{Connection, OpenFlags};

use super::interrupt::Guard;
use super::store::backend::{Backend, Sql};

/// How long a writer waits for another one's lock before it gives up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) struct SqliteBackend {
    conn: Connection,
}

impl SqliteBackend {
    /// Opens the file; when `create`, a missing file is created with its parent folders,
    /// otherwise a missing file is refused (a reading command given a mistyped path must
    /// not leave an empty store behind).
    pub(crate) fn open(path: &Path, create: bool) -> Result<SqliteBackend, String> {
        let _interruptible = Guard::new();
        if !path.exists() && !create {
            return Err(
                "no such file (a command that only reads the history does not create it)".into(),
            );
        }
        if path.exists() && !path.is_file() {
            return Err("not a regular file".into());
        }
        // SQLite opens its journal, WAL and shared-memory files beside the store itself:
        // a FIFO or a folder there would block or break it, so only regular files (or none)
        // may stand there.
        for suffix in ["-journal", "-wal", "-shm"] {
            let mut side = path.as_os_str().to_owned();
            side.push(suffix);
            let side = std::path::PathBuf::from(side);
            if let Ok(meta) = std::fs::symlink_metadata(&side) {
                if !meta.file_type().is_file() {
                    return Err(format!(
                        "{} is not a regular file: SQLite keeps its journal there; remove it",
                        side.display()
                    ));
                }
            }
        }
        if create {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
            }
        }
        // Without `SQLITE_OPEN_URI` (which `Connection::open` sets): a path is a path, never
        // `file:...?mode=...`.
        let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        if create {
            flags |= OpenFlags::SQLITE_OPEN_CREATE;
        }
        let conn = Connection::open_with_flags(path, flags).map_err(|e| e.to_string())?;
        // Two writers (a nightly and an import) wait for each other instead of failing.
        conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| e.to_string())?;
        // Switching a new file to WAL needs it alone, and SQLite answers "database is
        // locked" at once, without its busy handler, while another connection is creating
        // or switching the same file (two bisections started together on a new store):
        // that is waited out like any other lock, up to the same limit.
        let deadline = Instant::now() + BUSY_TIMEOUT;
        loop {
            match conn.execute_batch(
                "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;",
            ) {
                Ok(()) => break,
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if e.code == rusqlite::ErrorCode::DatabaseBusy && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        // A cell's history is one row per night, and a night writes every cell's rows
        // together, so the rows of one cell lie on as many pages as it has nights, each page
        // shared with the other cells of that night. With SQLite's default 2 MiB page cache
        // a judged 1,000-cell run read each page again for every cell on it (1.5 GB of
        // pread for a 92 MB store of 365 nights: most of the judging time); a cache of up to
        // 128 MiB reads each page once. It is an upper bound, filled only as pages are read.
        conn.execute_batch("PRAGMA cache_size = -131072;")
            .map_err(|e| e.to_string())?;
        Ok(SqliteBackend { conn })
    }

    /// SQLite's own check of the file's structure (`PRAGMA quick_check`): the first
    /// problems it reports, or `None` when it says `ok`.
    fn quick_check(&mut self) -> Result<Option<String>, String> {
        let _interruptible = Guard::new();
        let mut stmt = self
            .conn
            .prepare("PRAGMA quick_check(20)")
            .map_err(|e| e.to_string())?;
        let lines: Vec<String> = stmt
            .query_map([], |row| row.get::<_, String>(0))
            .and_then(|rows| rows.collect())
            .map_err(|e| e.to_string())?;
        if lines.len() == 1 && lines[0] == "ok" {
            return Ok(None);
        }
        // Its first line names the database (`*** in database main ***`), not a problem.
        let problems: Vec<&str> = lines
            .iter()
            .flat_map(|l| l.lines())
            .filter(|l| !l.starts_with("***"))
            .collect();
        let shown: Vec<&str> = problems.iter().take(3).copied().collect();
        let more = problems.len().saturating_sub(shown.len());
        Ok(Some(if more > 0 {
            format!("{} (and {more} more)", shown.join("; "))
        } else {
            shown.join("; ")
        }))
    }
}

fn to_value(v: &Sql) -> Value {
    match v {
        Sql::Null => Value::Null,
        Sql::Int(i) => Value::Integer(*i),
        Sql::Real(r) => Value::Real(*r),
        Sql::Text(s) => Value::Text(s.clone()),
    }
}

fn from_value(v: Value) -> Sql {
    match v {
        Value::Null => Sql::Null,
        Value::Integer(i) => Sql::Int(i),
        Value::Real(r) => Sql::Real(r),
        Value::Text(s) => Sql::Text(s),
        Value::Blob(b) => Sql::Text(String::from_utf8_lossy(&b).into_owned()),
    }
}

impl Backend for SqliteBackend {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    fn begin(&self) -> &'static str {
        "BEGIN IMMEDIATE"
    }

    fn has_table(&mut self, name: &str) -> Result<bool, String> {
        let rows = self.query(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
            &[Sql::Text(name.into())],
        )?;
        Ok(!rows.is_empty())
    }

    fn damage(&mut self) -> Result<Option<String>, String> {
        self.quick_check()
    }

    fn batch(&mut self, sql: &str) -> Result<(), String> {
        let _interruptible = Guard::new();
        self.conn.execute_batch(sql).map_err(|e| e.to_string())
    }

    fn execute(&mut self, sql: &str, params: &[Sql]) -> Result<u64, String> {
        let _interruptible = Guard::new();
        let values: Vec<Value> = params.iter().map(to_value).collect();
        // Cached: an import repeats the same few statements thousands of times.
        self.conn
            .prepare_cached(sql)
            .and_then(|mut stmt| stmt.execute(rusqlite::params_from_iter(values)))
            .map(|n| n as u64)
            .map_err(|e| e.to_string())
    }

    fn query(&mut self, sql: &str, params: &[Sql]) -> Result<Vec<Vec<Sql>>, String> {
        let _interruptible = Guard::new();
        let values: Vec<Value> = params.iter().map(to_value).collect();
        let mut stmt = self.conn.prepare_cached(sql).map_err(|e| e.to_string())?;
        let n = stmt.column_count();
        let rows = stmt
            .query_map(rusqlite::params_from_iter(values), |row| {
                (0..n)
                    .map(|i| row.get::<_, Value>(i).map(from_value))
                    .collect::<Result<Vec<Sql>, _>>()
            })
            .map_err(|e| e.to_string())?;
        // Bound to a local so that `rows`, which borrows `stmt`, is dropped before `stmt`
        // (a tail expression's temporaries outlive the block's locals in edition 2021).
        #[allow(clippy::let_and_return)]
        let out = rows
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string());
        out
    }
}

#[cfg(test)]
mod tests {
    /// Several writers opening a store that does not exist yet all get it, however their
    /// schema creation interleaves: none fails with "database is locked" (two bisections
    /// started at once on a new store did).
    #[test]
    fn writers_opening_a_new_store_at_once_all_succeed() {
        for round in 0..12 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(format!("new-{round}.sqlite"));
            let n = 6;
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(n));
            let handles: Vec<_> = (0..n)
                .map(|_| {
                    let (barrier, path) = (barrier.clone(), path.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        crate::history::open(path.to_str().unwrap()).map(|_| ())
                    })
                })
                .collect();
            for h in handles {
                let r = h.join().unwrap();
                assert!(r.is_ok(), "round {round}: {:?}", r.err());
            }
        }
    }

    /// Shards of one run finishing at once each add their chases to the run's kept triage:
    /// the read and the write are one transaction, so none is lost.
    #[test]
    fn shards_keeping_their_triage_at_once_lose_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sqlite");
        drop(crate::history::open(path.to_str().unwrap()).unwrap());
        let n = 6;
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(n));
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (barrier, path) = (barrier.clone(), path.clone());
                std::thread::spawn(move || {
                    let mut h = crate::history::open(path.to_str().unwrap()).unwrap();
                    barrier.wait();
                    h.record_triage_with("night", &format!("[{i}]"), |kept, ours| match kept {
                        Some(k) => format!("{k}{ours}"),
                        None => ours.to_string(),
                    })
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap().unwrap();
        }
        let mut h = crate::history::open(path.to_str().unwrap()).unwrap();
        let kept = h.triage("night").unwrap().unwrap();
        for i in 0..n {
            assert!(kept.contains(&format!("[{i}]")), "{kept}");
        }
    }
}
