//! The fleet backend: a PostgreSQL server by URL (`postgres://user:pass@host:port/db`),
//! through the synchronous `postgres` client, without TLS (a history server sits inside the
//! CI network; put it behind a TLS-terminating proxy otherwise). Statements are written with
//! `?` placeholders and numbered (`$1`, `$2`, ...) here.
//!
//! Nothing here waits forever: the connection, TCP and start-up together, must be made
//! within `connect_timeout` (10 s unless the URL says otherwise; a server that accepts the
//! connection and never answers is given up on then); every statement is ended by the
//! server after `statement_timeout` (120 s unless the URL's `options` set one); TCP
//! keepalives and `tcp_user_timeout` notice a server that went away in the middle. While any
//! of it blocks, Ctrl-C and SIGTERM exit 130 ([`super::interrupt`]).
//!
//! Credentials never leave this file: [`redact`] is the URL as bench shows it (no password
//! in the user part, no `password=` parameter), and every message of the driver goes
//! through [`Secrets::scrub`] before it becomes an error.

use std::collections::BTreeSet;
use std::sync::{mpsc, LazyLock};
use std::time::Duration;

use postgres::types::{ToSql, Type};
use postgres::{Client, NoTls};
use regex::{Captures, Regex};

use super::interrupt::Guard;
use super::store::backend::{Backend, Sql};

/// The longest wait for a connection (TCP and the server's start-up) unless the URL's
/// `connect_timeout` says otherwise.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The server ends a statement after this unless the URL's `options` set
/// `statement_timeout`: the longest query of a fleet's store takes a few seconds.
const STATEMENT_TIMEOUT_MS: u64 = 120_000;
/// TCP keepalives: the first probe after this idle time, then every
/// [`KEEPALIVE_INTERVAL`], [`KEEPALIVE_RETRIES`] times, unless the URL sets them.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_RETRIES: u32 = 3;
/// Data sent and not acknowledged for this long drops the connection (Linux).
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) struct PgBackend {
    /// The thread that owns the connection: every statement runs there (see [`Conn`]).
    jobs: mpsc::Sender<Job>,
    secrets: Secrets,
}

/// Work for the connection's thread.
type Job = Box<dyn FnOnce(&mut Conn) + Send>;

/// The connection, owned by a thread of its own. The `postgres` client blocks on a tokio
/// runtime of its own, which panics inside another runtime ("Cannot start a runtime from
/// within a runtime"), and bench writes each finished cell from inside the runner's; on its
/// own thread the client is outside any runtime, whoever calls.
struct Conn {
    client: Client,
    /// Prepared statements by their SQL: an import repeats the same few thousands of times,
    /// and preparing costs a round trip to the server.
    prepared: std::collections::HashMap<String, postgres::Statement>,
}

impl PgBackend {
    /// Connects to `url` (a `postgres://` or `postgresql://` URL, scheme in lower case) with
    /// the timeouts of the module doc; the error is free of the URL's credentials.
    pub(crate) fn connect(url: &str) -> Result<PgBackend, String> {
        let _interruptible = Guard::new();
        let secrets = Secrets::of(url);
        let mut config: postgres::Config = url
            .parse()
            .map_err(|e: postgres::Error| secrets.scrub(&message(&e)))?;
        let given = param_names(url);
        let unless_given = |name: &str| !given.contains(name);
        if unless_given("connect_timeout") {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if unless_given("keepalives_idle") {
            config.keepalives_idle(KEEPALIVE_IDLE);
        }
        if unless_given("keepalives_interval") {
            config.keepalives_interval(KEEPALIVE_INTERVAL);
        }
        if unless_given("keepalives_retries") {
            config.keepalives_retries(KEEPALIVE_RETRIES);
        }
        if unless_given("tcp_user_timeout") {
            config.tcp_user_timeout(TCP_USER_TIMEOUT);
        }
        let options = config.get_options().unwrap_or("").to_string();
        if !options.contains("statement_timeout") {
            config.options(
                format!("{options} -c statement_timeout={STATEMENT_TIMEOUT_MS}").trim_start(),
            );
        }
        // The driver's `connect_timeout` covers the TCP connection only; a server that
        // accepts it and never answers the start-up would hold `connect` forever. So the
        // connection's thread is given up on at the deadline (it then stays blocked until
        // bench exits, holding nothing but its socket, and ends if the server answers).
        let deadline = config
            .get_connect_timeout()
            .copied()
            .unwrap_or(CONNECT_TIMEOUT);
        let (ready_tx, ready_rx) = mpsc::channel();
        let (jobs, job_rx) = mpsc::channel::<Job>();
        std::thread::spawn(move || {
            let client = match config.connect(NoTls) {
                Ok(c) => c,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            if ready_tx.send(Ok(())).is_err() {
                return;
            }
            let mut conn = Conn {
                client,
                prepared: Default::default(),
            };
            for job in job_rx {
                job(&mut conn);
            }
        });
        match ready_rx.recv_timeout(deadline) {
            Ok(Ok(())) => Ok(PgBackend { jobs, secrets }),
            Ok(Err(e)) => Err(secrets.scrub(&message(&e))),
            Err(_) => Err(format!(
                "no answer from the server within {} s (connect_timeout): it accepted no connection or never completed the start-up",
                deadline.as_secs_f64()
            )),
        }
    }

    /// Runs `f` on the connection's thread and waits for it (interruptible: Ctrl-C exits
    /// 130 while it waits); its error is free of credentials.
    fn call<T: Send + 'static>(
        &mut self,
        f: impl FnOnce(&mut Conn) -> Result<T, postgres::Error> + Send + 'static,
    ) -> Result<T, String> {
        let _interruptible = Guard::new();
        let (tx, rx) = mpsc::channel();
        let job: Job = Box::new(move |c| {
            let _ = tx.send(f(c));
        });
        let gone = || "the connection to the server is gone (its thread ended)".to_string();
        self.jobs.send(job).map_err(|_| gone())?;
        match rx.recv() {
            Ok(r) => r.map_err(|e| self.secrets.scrub(&message(&e))),
            Err(_) => Err(gone()),
        }
    }
}

/// The driver's error with the server's own words: its `Display` of a server error is only
/// "db error".
fn message(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut m = format!("{}: {}", db.severity(), db.message());
            if let Some(d) = db.detail() {
                m.push_str(&format!(" ({d})"));
            }
            m
        }
        None => e.to_string(),
    }
}

/// The credentials a location carries, as given and as the driver decodes them, so that
/// they can be removed from any text (the driver's messages included).
#[derive(Debug, Clone, Default)]
pub(crate) struct Secrets(Vec<String>);

impl Secrets {
    pub(crate) fn of(location: &str) -> Secrets {
        let mut found = BTreeSet::new();
        if let Some((_, rest)) = location.split_once("://") {
            // The driver takes everything before the first `@` as the user part.
            if let Some((userinfo, _)) = rest.split_once('@') {
                if let Some((_, pass)) = userinfo.split_once(':') {
                    found.insert(pass.to_string());
                    found.insert(percent_decode(pass));
                }
            }
        }
        for c in PARAM.captures_iter(location) {
            if is_secret_key(&c[1]) {
                let value = c[2].trim_matches('\'');
                found.insert(value.to_string());
                found.insert(percent_decode(value));
            }
        }
        // A secret of one or two characters would mask letters all over a message; the
        // structural redaction still removes it from where it was given.
        let mut found: Vec<String> = found
            .into_iter()
            .filter(|s| s.chars().count() >= 3)
            .collect();
        // The longest first, so that a secret inside another one does not break it up.
        found.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Secrets(found)
    }

    /// `text` with every credential replaced by `***`, and every `password=...` parameter
    /// masked.
    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut out = redact(text);
        for s in &self.0 {
            out = out.replace(s.as_str(), "***");
        }
        out
    }
}

/// `key=value` parameters of a URL's query string or a keyword/value connection string;
/// a value may be single-quoted (keyword form).
static PARAM: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"([^\s?&=@/:]+)=('(?:[^'\\]|\\.)*'|[^\s&]*)").expect("static regex")
});

/// Whether a parameter's name (percent-encoded or not, in any case) names a credential:
/// `password`, `sslpassword`.
fn is_secret_key(key: &str) -> bool {
    percent_decode(key)
        .to_ascii_lowercase()
        .contains("password")
}

/// `%XX` escapes decoded (the rest, invalid escapes included, as it is); bytes that are not
/// UTF-8 are replaced.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The names of the parameters a URL's query string gives, decoded.
fn param_names(url: &str) -> BTreeSet<String> {
    url.split_once('?')
        .map(|(_, q)| {
            q.split('&')
                .filter_map(|kv| kv.split_once('=').map(|(k, _)| percent_decode(k)))
                .collect()
        })
        .unwrap_or_default()
}

/// The location as bench shows it, in messages, reports and `history.json`: the password
/// of the user part replaced by `***`, and the value of every parameter that names a
/// credential (`?password=`, `sslpassword=`, a keyword/value string's `password='...'`)
/// too. Anything else, a file path included, is kept as it is.
pub fn redact(location: &str) -> String {
    let structural = match location.split_once("://") {
        // The driver takes everything before the first `@` as the user part.
        Some((scheme, rest)) => match rest.split_once('@') {
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
                None => location.to_string(),
            },
            None => location.to_string(),
        },
        None => location.to_string(),
    };
    PARAM
        .replace_all(&structural, |c: &Captures| {
            if is_secret_key(&c[1]) {
                format!("{}=***", &c[1])
            } else {
                c[0].to_string()
            }
        })
        .into_owned()
}

/// `?` placeholders numbered as PostgreSQL wants them (`$1`, `$2`, ...). Our statements
/// have no `?` inside string literals.
pub(crate) fn number_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut n = 0;
    for ch in sql.chars() {
        if ch == '?' {
            n += 1;
            out.push_str(&format!("${n}"));
        } else {
            out.push(ch);
        }
    }
    out
}

/// A parameter in the type the server inferred for its placeholder.
fn bind(v: &Sql, ty: &Type) -> Box<dyn ToSql + Sync> {
    match (v, ty) {
        (Sql::Null, t) if *t == Type::INT8 => Box::new(None::<i64>),
        (Sql::Null, t) if *t == Type::FLOAT8 => Box::new(None::<f64>),
        (Sql::Null, _) => Box::new(None::<String>),
        (Sql::Int(i), t) if *t == Type::INT4 => Box::new(*i as i32),
        (Sql::Int(i), t) if *t == Type::FLOAT8 => Box::new(*i as f64),
        (Sql::Int(i), _) => Box::new(*i),
        (Sql::Real(r), _) => Box::new(*r),
        (Sql::Text(s), _) => Box::new(s.clone()),
    }
}

fn read(row: &postgres::Row, i: usize) -> Result<Sql, postgres::Error> {
    let ty = row.columns()[i].type_();
    Ok(if *ty == Type::INT8 {
        row.try_get::<_, Option<i64>>(i)?
            .map_or(Sql::Null, Sql::Int)
    } else if *ty == Type::INT4 {
        row.try_get::<_, Option<i32>>(i)?
            .map_or(Sql::Null, |v| Sql::Int(v.into()))
    } else if *ty == Type::FLOAT8 {
        row.try_get::<_, Option<f64>>(i)?
            .map_or(Sql::Null, Sql::Real)
    } else {
        row.try_get::<_, Option<String>>(i)?
            .map_or(Sql::Null, Sql::Text)
    })
}

impl Conn {
    /// The prepared statement of `sql` and `params` bound to its placeholders' types.
    fn prepare(
        &mut self,
        sql: &str,
        params: &[Sql],
    ) -> Result<(postgres::Statement, Vec<Box<dyn ToSql + Sync>>), postgres::Error> {
        let stmt = match self.prepared.get(sql) {
            Some(s) => s.clone(),
            None => {
                let s = self.client.prepare(&number_placeholders(sql))?;
                self.prepared.insert(sql.to_string(), s.clone());
                s
            }
        };
        let boxed = params
            .iter()
            .zip(stmt.params())
            .map(|(v, ty)| bind(v, ty))
            .collect();
        Ok((stmt, boxed))
    }
}

fn refs(boxed: &[Box<dyn ToSql + Sync>]) -> Vec<&(dyn ToSql + Sync)> {
    boxed.iter().map(|b| b.as_ref()).collect()
}

impl Backend for PgBackend {
    fn kind(&self) -> &'static str {
        "postgresql"
    }

    fn lock_schema(&mut self) -> Result<(), String> {
        // Without it, two connections migrating at once both see a migration as not yet
        // applied (READ COMMITTED shows neither's uncommitted row), and the second's ALTER
        // fails on the first's column once that commits; two concurrent `CREATE TABLE IF NOT
        // EXISTS` can fail too. A transaction-scoped advisory lock queues them: the second
        // then sees the first's row and skips. The key is bench's own ("bench" in ASCII).
        self.batch("SELECT pg_advisory_xact_lock(422608528232)")
    }

    fn has_table(&mut self, name: &str) -> Result<bool, String> {
        // The schema the connection's search_path names first, where bench creates its
        // tables.
        let rows = self.query(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = ?",
            &[Sql::Text(name.into())],
        )?;
        Ok(!rows.is_empty())
    }

    fn batch(&mut self, sql: &str) -> Result<(), String> {
        let sql = sql.to_string();
        self.call(move |c| c.client.batch_execute(&sql))
    }

    fn execute(&mut self, sql: &str, params: &[Sql]) -> Result<u64, String> {
        let (sql, params) = (sql.to_string(), params.to_vec());
        self.call(move |c| {
            let (stmt, boxed) = c.prepare(&sql, &params)?;
            c.client.execute(&stmt, &refs(&boxed))
        })
    }

    fn query(&mut self, sql: &str, params: &[Sql]) -> Result<Vec<Vec<Sql>>, String> {
        let (sql, params) = (sql.to_string(), params.to_vec());
        self.call(move |c| {
            let (stmt, boxed) = c.prepare(&sql, &params)?;
            let rows = c.client.query(&stmt, &refs(&boxed))?;
            rows.iter()
                .map(|row| (0..row.len()).map(|i| read(row, i)).collect())
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered() {
        assert_eq!(
            number_placeholders("SELECT a FROM t WHERE b = ? AND c = ?"),
            "SELECT a FROM t WHERE b = $1 AND c = $2"
        );
    }

    #[test]
    fn every_form_of_password_is_hidden() {
        for (given, shown) in [
            (
                "postgres://ci:s3cret@db.internal:5432/bench",
                "postgres://ci:***@db.internal:5432/bench",
            ),
            ("postgres://db/bench", "postgres://db/bench"),
            (
                "POSTGRES://ci:s3cret@db/bench",
                "POSTGRES://ci:***@db/bench",
            ),
            (
                "postgres://ci@db/bench?sslmode=disable&password=s3cret&application_name=x",
                "postgres://ci@db/bench?sslmode=disable&password=***&application_name=x",
            ),
            (
                "postgresql://db/bench?PassWord=s3cret",
                "postgresql://db/bench?PassWord=***",
            ),
            (
                "postgres://db/bench?p%61ssword=s3cret&sslpassword=k3y",
                "postgres://db/bench?p%61ssword=***&sslpassword=***",
            ),
            (
                "host=db user=ci password='s3 cret' dbname=bench",
                "host=db user=ci password=*** dbname=bench",
            ),
            // The driver takes everything before the first `@` as the user part.
            (
                "postgres://db/bench?password=a@b:5432",
                "postgres://db/bench?password=***",
            ),
            ("results/history.sqlite", "results/history.sqlite"),
        ] {
            assert_eq!(redact(given), shown, "{given}");
        }
    }

    #[test]
    fn driver_messages_lose_the_decoded_password() {
        let s = Secrets::of("postgres://ci:p%40ss%20word@db/bench?password=t0ken!");
        assert_eq!(
            s.scrub("password authentication failed: got p@ss word and t0ken! and p%40ss%20word"),
            "password authentication failed: got *** and *** and ***"
        );
        // Short secrets are left to the structural redaction.
        let s = Secrets::of("postgres://ci:ab@db/bench");
        assert_eq!(s.scrub("a cab"), "a cab");
    }
}
