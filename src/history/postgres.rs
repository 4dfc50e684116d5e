//! The fleet backend: a PostgreSQL server by URL (`postgres://user:pass@host:port/db`),
//! through the synchronous `postgres` client, without TLS (a history server sits inside the
//! CI network; put it behind a TLS-terminating proxy otherwise). Statements are written with
//! `?` placeholders and numbered (`$1`, `$2`, ...) here.

use postgres::types::{ToSql, Type};
use postgres::{Client, NoTls};

use super::store::{Backend, Sql};

pub(crate) struct PgBackend {
    client: Client,
    /// Prepared statements by their SQL: an import repeats the same few thousands of times,
    /// and preparing costs a round trip to the server.
    prepared: std::collections::HashMap<String, postgres::Statement>,
}

impl PgBackend {
    pub(crate) fn connect(url: &str) -> Result<PgBackend, String> {
        let client = Client::connect(url, NoTls).map_err(|e| e.to_string())?;
        Ok(PgBackend {
            client,
            prepared: Default::default(),
        })
    }
}

/// The URL without its password, for messages and reports.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}@{host}")
        }
        None => url.to_string(),
    }
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

impl PgBackend {
    fn run<T>(
        &mut self,
        sql: &str,
        params: &[Sql],
        f: impl FnOnce(
            &mut Client,
            &postgres::Statement,
            &[&(dyn ToSql + Sync)],
        ) -> Result<T, postgres::Error>,
    ) -> Result<T, String> {
        let stmt = match self.prepared.get(sql) {
            Some(s) => s.clone(),
            None => {
                let s = self
                    .client
                    .prepare(&number_placeholders(sql))
                    .map_err(|e| e.to_string())?;
                self.prepared.insert(sql.to_string(), s.clone());
                s
            }
        };
        let boxed: Vec<Box<dyn ToSql + Sync>> = params
            .iter()
            .zip(stmt.params())
            .map(|(v, ty)| bind(v, ty))
            .collect();
        let refs: Vec<&(dyn ToSql + Sync)> = boxed.iter().map(|b| b.as_ref()).collect();
        f(&mut self.client, &stmt, &refs).map_err(|e| e.to_string())
    }
}

impl Backend for PgBackend {
    fn kind(&self) -> &'static str {
        "postgresql"
    }

    fn batch(&mut self, sql: &str) -> Result<(), String> {
        self.client.batch_execute(sql).map_err(|e| e.to_string())
    }

    fn execute(&mut self, sql: &str, params: &[Sql]) -> Result<u64, String> {
        self.run(sql, params, |c, stmt, p| c.execute(stmt, p))
    }

    fn query(&mut self, sql: &str, params: &[Sql]) -> Result<Vec<Vec<Sql>>, String> {
        let rows = self.run(sql, params, |c, stmt, p| c.query(stmt, p))?;
        rows.iter()
            .map(|row| {
                (0..row.len())
                    .map(|i| read(row, i))
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_and_passwords_hidden() {
        assert_eq!(
            number_placeholders("SELECT a FROM t WHERE b = ? AND c = ?"),
            "SELECT a FROM t WHERE b = $1 AND c = $2"
        );
        assert_eq!(
            redact("postgres://ci:s3cret@db.internal:5432/bench"),
            "postgres://ci@db.internal:5432/bench"
        );
        assert_eq!(redact("postgres://db/bench"), "postgres://db/bench");
    }
}
