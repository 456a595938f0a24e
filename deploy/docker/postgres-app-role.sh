#!/bin/sh
# Runs once, when the PostgreSQL volume is initialised (docker-entrypoint-initdb.d):
# the application's login role, which owns nothing. The migrate service grants
# it rows (manage.py db_grant_app_role); the tables stay the owner's.
set -eu
password="$(cat /run/secrets/app_db_password)"
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  --set=password="$password" <<'SQL'
CREATE ROLE registry_app LOGIN PASSWORD :'password';
SQL
