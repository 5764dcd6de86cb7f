#!/usr/bin/env bash
# A throwaway PostgreSQL server on 127.0.0.1 for the registry tests.
#
#   url=$(bash scripts/ci-postgres.sh start)   # installs Debian's postgresql if missing, prints the SQLAlchemy URL
#   bash scripts/ci-postgres.sh stop           # stops it and removes its data directory
#
# The cluster lives in $ARCHSPEC_PG_DIR (default /tmp/archspec-ci-pg), owned by the `postgres` user when run as root
# (the server refuses to run as root; otherwise it runs as the caller), trusts loopback connections (a test server
# that lives for one CI run), and listens on a free port. Everything but the URL goes to stderr.
set -euo pipefail

DIR="${ARCHSPEC_PG_DIR:-/tmp/archspec-ci-pg}"
DB="${ARCHSPEC_PG_DB:-archspec_test}"
log() { echo "ci-postgres: $*" >&2; }

as_postgres() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_bin() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  [ -n "$d" ] && [ -x "$d/initdb" ] && echo "$d"
}

install_server() {
  if pg_bin >/dev/null; then return; fi
  log "installing Debian's postgresql server"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  # Debian's package would also start a cluster of its own through the init system: not wanted, not needed.
  apt-get install -y -qq --no-install-recommends postgresql >&2
  pg_bin >/dev/null || { log "postgresql installed but no initdb found under /usr/lib/postgresql"; exit 1; }
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
  install_server
  local bin port
  bin=$(pg_bin)
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
  fi
  if [ -f "$DIR/port" ] && as_postgres "$bin/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1; then
    port=$(cat "$DIR/port")
    log "already running on port $port"
  else
    rm -rf "$DIR"
    mkdir -p "$DIR"
    if [ "$(id -u)" = 0 ]; then chown postgres: "$DIR"; fi
    as_postgres "$bin/initdb" -D "$DIR/data" -U postgres -A trust -E UTF8 --no-locale >"$DIR/initdb.log" 2>&1 \
      || { cat "$DIR/initdb.log" >&2; exit 1; }
    port=$(free_port)
    echo "$port" >"$DIR/port"
    # fsync off: a test server; the durability under test is SQLite's and the registry's, not the server's disk.
    as_postgres "$bin/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -p $port -k $DIR -c fsync=off -c max_connections=200" start >&2 \
      || { cat "$DIR/server.log" >&2; exit 1; }
  fi
  as_postgres "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -qAt -c "SELECT 1 FROM pg_database WHERE datname = '$DB'" \
    | grep -q 1 || as_postgres "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres "$DB"
  log "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port, database $DB"
  echo "postgresql+psycopg://postgres@127.0.0.1:$port/$DB"
}

stop() {
  local bin
  bin=$(pg_bin) || exit 0
  if [ -d "$DIR/data" ]; then
    as_postgres "$bin/pg_ctl" -D "$DIR/data" -m fast -w stop >&2 || true
  fi
  rm -rf "$DIR"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
