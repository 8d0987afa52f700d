#!/usr/bin/env bash
# Start a throwaway local PostgreSQL cluster for trying the PostgreSQL store,
# and print the URL to use. Stop it with the command it prints.
#   usage: scripts/pg-dev.sh [FOLDER]   (default: a new short temp folder)
# Listens on a unix socket only (no TCP). Run as root, the server runs as the
# postgres user, since initdb refuses root.
set -euo pipefail

bin=${STATEQUEUE_PG_BIN:-}
if [ -z "$bin" ]; then
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5 -n -r) /usr/local/pgsql/bin; do
        if [ -x "$d/initdb" ]; then bin=$d; break; fi
    done
fi
if [ -z "$bin" ] && command -v pg_ctl >/dev/null; then bin=$(dirname "$(command -v pg_ctl)"); fi
if [ -z "$bin" ]; then echo "pg-dev.sh: initdb and pg_ctl not found (set STATEQUEUE_PG_BIN)" >&2; exit 1; fi

root=${1:-$(mktemp -d /tmp/sqpg.XXXXXX)}  # short: unix socket paths are limited to ~107 bytes
mkdir -p "$root/s"
as=()
if [ "$(id -u)" = 0 ]; then
    chown -R postgres:postgres "$root"
    as=(runuser -u postgres --)
fi
"${as[@]}" "$bin/initdb" -D "$root/data" -U postgres -A trust -E UTF8 --no-locale >"$root/initdb.log"
"${as[@]}" "$bin/pg_ctl" -D "$root/data" -l "$root/log" -w \
    -o "-c listen_addresses='' -c unix_socket_directories=$root/s" start >/dev/null
"${as[@]}" "$bin/createdb" -h "$root/s" -U postgres statequeue

echo "export STATEQUEUE_STORE='postgresql://postgres@/statequeue?host=$root/s'"
echo "# stop: ${as[*]} $bin/pg_ctl -D $root/data -m fast stop && rm -rf $root" >&2
