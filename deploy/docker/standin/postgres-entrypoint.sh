#!/bin/sh
# What the postgres image's entrypoint does, for Debian's PostgreSQL: on an empty
# volume, initdb with POSTGRES_USER and POSTGRES_PASSWORD_FILE, create
# POSTGRES_DB and run /docker-entrypoint-initdb.d/*.sh once; then the server on
# every interface, password (scram) logins from the network only.
set -eu
bin=/usr/lib/postgresql/15/bin
PGDATA=/var/lib/postgresql/data
as_pg() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
mkdir -p "$PGDATA"
chown postgres:postgres "$PGDATA"
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pw="$(mktemp)"
  cat "$POSTGRES_PASSWORD_FILE" >"$pw"
  chown postgres "$pw"
  as_pg "$bin/initdb" -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pw" \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pw"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  as_pg "$bin/pg_ctl" -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  as_pg psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d postgres -c "CREATE DATABASE \"$POSTGRES_DB\""
  for f in /docker-entrypoint-initdb.d/*.sh; do
    [ -e "$f" ] || continue
    echo "standin-postgres: running $f"
    POSTGRES_USER="$POSTGRES_USER" POSTGRES_DB="$POSTGRES_DB" sh "$f"
  done
  as_pg "$bin/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups \
  "$bin/postgres" -D "$PGDATA" -c listen_addresses='*'
