#!/usr/bin/env bash
# Starts a real PostgreSQL server (Debian's `postgresql` package) on this machine, for the
# history store's PostgreSQL backend tests (tests/history_store.rs runs the same suite against
# SQLite and against this server).
#
# Run as root on a Debian machine, e.g. a fresh CI runner:
#     eval "$(scripts/postgres-ci-setup.sh)"     # exports BENCH_PG_URL and BENCH_PG_TESTS=1
# It prints the `export` lines on stdout (everything else goes to stderr). It is idempotent: a
# second run with the server up returns at once. It never uses systemd (CI containers have
# none): the cluster is started with pg_ctl as the postgres user, like the Slurm setup starts
# its daemons directly.
#
# Settings (environment):
#   BENCH_PG_DATA  the cluster's data folder (default /var/lib/bench-pg/data)
#   BENCH_PG_PORT  the port it listens on, on 127.0.0.1 only (default 54329)
#   BENCH_PG_DB    the database the tests use (default bench_history)
set -euo pipefail

log() { echo "postgres-ci-setup: $*" >&2; }
die() {
  log "FAILED: $*"
  if [ -f "${LOGFILE:-}" ]; then
    log "--- last lines of $LOGFILE ---"
    tail -n 20 "$LOGFILE" >&2 || true
  fi
  exit 1
}

[ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and starts a server)"

DATA="${BENCH_PG_DATA:-/var/lib/bench-pg/data}"
PORT="${BENCH_PG_PORT:-54329}"
DB="${BENCH_PG_DB:-bench_history}"
LOGFILE="$(dirname "$DATA")/server.log"

# 1. Packages, only when the server binaries are missing (a second run skips apt).
pg_bin() {
  # Debian keeps the server tools in /usr/lib/postgresql/<major>/bin, off PATH.
  find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n 1
}
if [ -z "$(pg_bin)" ] || [ ! -x "$(pg_bin)/pg_ctl" ]; then
  log "installing postgresql"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || die "apt-get update failed"
  apt-get install -y -qq --no-install-recommends postgresql >/dev/null \
    || die "apt-get install postgresql failed"
fi
BIN="$(pg_bin)"
[ -x "$BIN/pg_ctl" ] || die "no pg_ctl under /usr/lib/postgresql/*/bin"
id postgres >/dev/null 2>&1 || die "the package did not create the postgres user"

as_pg() { su postgres -s /bin/sh -c "$*"; }

# 2. A cluster of our own (not the package's default one, whose config may differ by image).
mkdir -p "$(dirname "$DATA")"
chown postgres:postgres "$(dirname "$DATA")"
if [ ! -s "$DATA/PG_VERSION" ]; then
  log "initdb $DATA"
  as_pg "'$BIN/initdb' -D '$DATA' -A trust -U postgres --no-sync >/dev/null" \
    || die "initdb failed"
fi

# 3. The server, listening on loopback only; trust authentication keeps CI free of secrets.
if ! as_pg "'$BIN/pg_ctl' -D '$DATA' status >/dev/null 2>&1"; then
  log "starting the server on 127.0.0.1:$PORT"
  mkdir -p /var/run/postgresql && chown postgres:postgres /var/run/postgresql
  as_pg "'$BIN/pg_ctl' -D '$DATA' -l '$LOGFILE' -w -t 60 \
    -o \"-p $PORT -c listen_addresses=127.0.0.1 -c fsync=off -k /var/run/postgresql\" start >/dev/null" \
    || die "pg_ctl start failed"
fi

# 4. The test database.
if ! as_pg "psql -h 127.0.0.1 -p $PORT -U postgres -tAc \"SELECT 1 FROM pg_database WHERE datname='$DB'\"" | grep -q 1; then
  log "creating database $DB"
  as_pg "psql -h 127.0.0.1 -p $PORT -U postgres -qc 'CREATE DATABASE $DB'" || die "CREATE DATABASE failed"
fi

echo "export BENCH_PG_URL=postgres://postgres@127.0.0.1:$PORT/$DB"
echo "export BENCH_PG_TESTS=1"
log "ready: postgres://postgres@127.0.0.1:$PORT/$DB"
