#!/usr/bin/env bash
# Start (or reuse) a disposable local PostgreSQL server for the PostgreSQL tests.
#
#   eval "$(scripts/start_postgres.sh)"      # exports MEMORY_TEST_POSTGRES_URL
#   scripts/start_postgres.sh stop           # stops the server (data is kept)
#
# CI gives each run its own MEMORY_PG_DIR (a fresh temporary folder, removed at the end),
# so two checkouts never share a cluster, a database or a remembered port.
#
# Installs PostgreSQL from the Debian packages when no server binaries are found (needs
# root and apt-get), creates a private cluster under $MEMORY_PG_DIR (default
# /tmp/memory-pipelines-pg) listening on 127.0.0.1 only, creates a user and a database,
# and prints one line on stdout:
#   export MEMORY_TEST_POSTGRES_URL=postgresql+psycopg://USER:PASS@127.0.0.1:PORT/DB
# Progress goes to stderr. A second run finds the running server and only prints the line.
# The cluster trades durability for speed (fsync off): it is for tests, never for data.
#
# Settings (environment): MEMORY_PG_DIR, MEMORY_PG_PORT (default: the first free port
# from 5432 on, remembered in $MEMORY_PG_DIR/port), MEMORY_PG_USER (memory),
# MEMORY_PG_PASSWORD (memory), MEMORY_PG_DB (memory_test).
set -euo pipefail

PG_DIR="${MEMORY_PG_DIR:-${TMPDIR:-/tmp}/memory-pipelines-pg}"
PG_USER="${MEMORY_PG_USER:-memory}"
PG_PASSWORD="${MEMORY_PG_PASSWORD:-memory}"
PG_DB="${MEMORY_PG_DB:-memory_test}"
DATA="$PG_DIR/data"
LOG="$PG_DIR/server.log"

say() { echo "start_postgres: $*" >&2; }
die() { say "error: $*"; exit 1; }

case "$PG_USER$PG_DB" in
  *[!A-Za-z0-9_]*) die "MEMORY_PG_USER and MEMORY_PG_DB may hold only letters, digits and _" ;;
esac
case "$PG_PASSWORD" in
  *[!A-Za-z0-9_.-]*) die "MEMORY_PG_PASSWORD may hold only letters, digits, _ . and -" ;;
esac

find_bindir() {
  local d
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
  if [ -n "$d" ] && [ -x "$d/initdb" ]; then
    echo "$d"
  elif command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
    dirname "$(command -v initdb)"
  fi
}

BIN="$(find_bindir)"
if [ -z "$BIN" ]; then
  [ "$(id -u)" -eq 0 ] || die "PostgreSQL is not installed; run as root or install it first"
  command -v apt-get >/dev/null 2>&1 || die "PostgreSQL is not installed and apt-get is missing"
  say "installing PostgreSQL from the Debian packages"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
  BIN="$(find_bindir)"
  [ -n "$BIN" ] || die "PostgreSQL was installed but initdb was not found"
fi

# The server refuses to run as root: run it as the postgres account when we are root.
if [ "$(id -u)" -eq 0 ]; then
  RUN_USER=postgres
  if ! id "$RUN_USER" >/dev/null 2>&1; then
    useradd --system --home-dir "$PG_DIR" --shell /bin/sh "$RUN_USER"
  fi
  as_pg() { runuser -u "$RUN_USER" -- "$@"; }
else
  RUN_USER="$(id -un)"
  as_pg() { "$@"; }
fi

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

psql_admin() {
  as_pg "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$PG_DIR" -p "$PORT" -U postgres -d postgres "$@"
}

if [ "${1:-start}" = "stop" ]; then
  if [ -f "$DATA/PG_VERSION" ] && as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
    as_pg "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >&2
  else
    say "no server running in $DATA"
  fi
  exit 0
fi
[ "${1:-start}" = "start" ] || die "usage: $0 [start|stop]"

mkdir -p "$PG_DIR"
if [ "$(id -u)" -eq 0 ]; then chown "$RUN_USER" "$PG_DIR"; fi
chmod 0700 "$PG_DIR"

next_free_port() {
  local port="$1"
  while port_in_use "$port"; do
    port=$((port + 1))
    [ "$port" -lt 5532 ] || die "no free port between 5432 and 5531"
  done
  echo "$port"
}

if [ -n "${MEMORY_PG_PORT:-}" ]; then
  PORT="$MEMORY_PG_PORT"
elif [ -f "$PG_DIR/port" ]; then
  PORT="$(cat "$PG_DIR/port")"
else
  PORT="$(next_free_port 5432)"
fi

if [ ! -f "$DATA/PG_VERSION" ]; then
  say "creating a cluster in $DATA"
  as_pg "$BIN/initdb" -D "$DATA" -U postgres -E UTF8 --locale=C \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  echo "include_if_exists = 'memory_pipelines.conf'" | as_pg tee -a "$DATA/postgresql.conf" >/dev/null
fi

# Written every start, so MEMORY_PG_PORT can move an existing cluster.
write_conf() {
  as_pg tee "$DATA/memory_pipelines.conf" >/dev/null <<EOF
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$PG_DIR'
timezone = 'UTC'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 200
EOF
  echo "$PORT" >"$PG_DIR/port"
}

# Another server (another checkout's cluster, a system PostgreSQL) may take the chosen
# port between the check and the bind: the start then fails saying so, and the next free
# port is tried, unless MEMORY_PG_PORT fixed it.
start_server() {
  local attempt
  for attempt in 1 2 3 4 5; do
    if [ -z "${MEMORY_PG_PORT:-}" ]; then
      PORT="$(next_free_port "$PORT")"
    fi
    port_in_use "$PORT" && die "port $PORT is taken by another program; set MEMORY_PG_PORT"
    write_conf
    say "starting the server on 127.0.0.1:$PORT (log: $LOG)"
    if as_pg "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null; then
      return 0
    fi
    if [ -z "${MEMORY_PG_PORT:-}" ] && grep -qi "address already in use\|could not bind\|could not create any TCP/IP sockets" "$LOG"; then
      say "port $PORT was taken meanwhile (attempt $attempt); trying another"
      PORT=$((PORT + 1))
      continue
    fi
    tail -n 20 "$LOG" >&2 || true
    die "the server did not start"
  done
  die "the server did not start after 5 attempts at a free port"
}

if as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
  write_conf
  RUNNING_PORT="$(sed -n 4p "$DATA/postmaster.pid" 2>/dev/null || true)"
  if [ "$RUNNING_PORT" != "$PORT" ]; then
    say "restarting the server on port $PORT (was $RUNNING_PORT)"
    as_pg "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -m fast -w -t 60 restart >&2
  else
    say "reusing the server in $DATA on port $PORT"
  fi
else
  start_server
fi

if [ "$(psql_admin -tAc "SELECT 1 FROM pg_roles WHERE rolname = '$PG_USER'")" != "1" ]; then
  psql_admin -c "CREATE ROLE \"$PG_USER\" LOGIN PASSWORD '$PG_PASSWORD'"
else
  psql_admin -c "ALTER ROLE \"$PG_USER\" LOGIN PASSWORD '$PG_PASSWORD'"
fi
if [ "$(psql_admin -tAc "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'")" != "1" ]; then
  psql_admin -c "CREATE DATABASE \"$PG_DB\" OWNER \"$PG_USER\""
fi

echo "export MEMORY_TEST_POSTGRES_URL=postgresql+psycopg://$PG_USER:$PG_PASSWORD@127.0.0.1:$PORT/$PG_DB"
