//! The embedded backend: one SQLite file (the `bundled` build of SQLite, so no system
//! library or server is needed), in write-ahead-log mode with full syncs, so a committed run
//! survives a crash of the writer or of the machine, and a reader never blocks a writer.

use std::path::Path;
use std::time::Duration;

use rusqlite::types::Value;
use rusqlite::Connection;

use super::store::{Backend, Sql};

pub(crate) struct SqliteBackend {
    conn: Connection,
}

impl SqliteBackend {
    /// Opens (or creates) the file, with its parent folders.
    pub(crate) fn open(path: &Path) -> Result<SqliteBackend, String> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        }
        let conn = Connection::open(path).map_err(|e| e.to_string())?;
        // Two writers (a nightly and an import) wait for each other instead of failing.
        conn.busy_timeout(Duration::from_secs(60))
            .map_err(|e| e.to_string())?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;",
        )
        .map_err(|e| e.to_string())?;
        Ok(SqliteBackend { conn })
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

    fn batch(&mut self, sql: &str) -> Result<(), String> {
        self.conn.execute_batch(sql).map_err(|e| e.to_string())
    }

    fn execute(&mut self, sql: &str, params: &[Sql]) -> Result<u64, String> {
        let values: Vec<Value> = params.iter().map(to_value).collect();
        // Cached: an import repeats the same few statements thousands of times.
        self.conn
            .prepare_cached(sql)
            .and_then(|mut stmt| stmt.execute(rusqlite::params_from_iter(values)))
            .map(|n| n as u64)
            .map_err(|e| e.to_string())
    }

    fn query(&mut self, sql: &str, params: &[Sql]) -> Result<Vec<Vec<Sql>>, String> {
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
