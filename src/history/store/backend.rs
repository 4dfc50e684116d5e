//! What a history store's database backends share: the values bound to and read from SQL
//! ([`Sql`]), the connection trait each backend implements ([`Backend`]: SQLite in
//! `history::sqlite`, PostgreSQL in `history::postgres`), and the encodings every backend
//! writes the same way. It lives apart from the function that picks a backend
//! (`history::store::open`), so the backends import this file and nothing that imports them.

/// A value bound to, or read from, SQL. The schema uses only these four kinds (`TEXT`,
/// `BIGINT`, `DOUBLE PRECISION`, NULL), which both backends map without loss.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Sql {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
}

impl Sql {
    pub(crate) fn text(&self) -> Option<&str> {
        match self {
            Sql::Text(s) => Some(s),
            _ => None,
        }
    }
    pub(crate) fn int(&self) -> Option<i64> {
        match self {
            Sql::Int(i) => Some(*i),
            _ => None,
        }
    }
    pub(crate) fn real(&self) -> Option<f64> {
        match self {
            Sql::Real(r) => Some(*r),
            Sql::Int(i) => Some(*i as f64),
            _ => None,
        }
    }
    pub(crate) fn opt_text(s: &Option<String>) -> Sql {
        s.as_ref().map_or(Sql::Null, |s| Sql::Text(s.clone()))
    }
}

/// One connection to a database. Statements use `?` placeholders (a backend that numbers
/// them rewrites them); every row comes back as [`Sql`] values in column order.
pub(crate) trait Backend: Send {
    /// `sqlite` or `postgresql`.
    fn kind(&self) -> &'static str;
    /// Runs statements without parameters (DDL, BEGIN/COMMIT).
    fn batch(&mut self, sql: &str) -> Result<(), String>;
    fn execute(&mut self, sql: &str, params: &[Sql]) -> Result<u64, String>;
    fn query(&mut self, sql: &str, params: &[Sql]) -> Result<Vec<Vec<Sql>>, String>;
    /// The statement that opens a write transaction (SQLite takes the write lock at once
    /// with `BEGIN IMMEDIATE`, so two writers queue instead of failing at commit).
    fn begin(&self) -> &'static str {
        "BEGIN"
    }
    /// Within a transaction, waits until no other connection is changing the schema (or
    /// the run's kept triage, which is read and rewritten), and holds that until the
    /// transaction ends: what lets the shards of a fleet open a new store (or one this bench
    /// upgrades) at once. SQLite's `BEGIN IMMEDIATE` already
    /// queues every writer; a server needs a lock of its own.
    fn lock_schema(&mut self) -> Result<(), String> {
        Ok(())
    }
    /// Whether the table `name` exists, asked of the catalog: a query of a missing table
    /// would abort a server's transaction, not just fail.
    fn has_table(&mut self, name: &str) -> Result<bool, String>;
    /// What the database's own check of its files finds wrong, `None` when nothing (SQLite:
    /// `PRAGMA quick_check`; a server keeps its files itself).
    fn damage(&mut self) -> Result<Option<String>, String> {
        Ok(None)
    }
}

pub(crate) fn json_floats(v: &[f64]) -> String {
    let opt: Vec<Option<f64>> = v.iter().map(|x| x.is_finite().then_some(*x)).collect();
    serde_json::to_string(&opt).unwrap_or_else(|_| "[]".into())
}

/// The current time, RFC 3339 UTC.
pub(crate) fn now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}
