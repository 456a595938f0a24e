#!/usr/bin/env bash
# Writes the secret files docker-compose.yml reads, with random values, once:
# an existing file is never overwritten (the database and MinIO were
# initialised with it). The folder is its owner's only; the files themselves
# are world-readable because Compose bind-mounts them into containers whose
# users (uid 10001, postgres, ...) are not the owner.
#
# Usage: scripts/compose-secrets.sh [DIR]     (default: <repo>/secrets)
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$REPO_ROOT/secrets}"
mkdir -p "$DIR"
chmod 700 "$DIR"

random() {  # URL-safe, so it can sit inside DATABASE_URL as it is
  python3 -c "import secrets; print(secrets.token_urlsafe($1))"
}

write() {  # name value
  if [[ -s "$DIR/$1" ]]; then
    echo "kept    $DIR/$1"
  else
    printf '%s' "$2" > "$DIR/$1"
    chmod 644 "$DIR/$1"
    echo "written $DIR/$1"
  fi
}

write django_secret_key "$(random 48)"
# Decrypts the secrets kept in the database (vLLM keys); the workers read it,
# never django_secret_key.
write field_encryption_key "$(random 48)"
# vLLM's API key: the replicas require it, the deployment is registered with it.
write vllm_api_key "$(random 32)"
write postgres_password "$(random 24)"
write s3_secret_key "$(random 24)"
write app_db_password "$(random 24)"
# Derived from the passwords actually on disk, new or kept. The migrate service
# connects as the owner; everything else as the application role.
write migrate_database_url "postgres://registry:$(cat "$DIR/postgres_password")@postgres:5432/registry"
write database_url "postgres://registry_app:$(cat "$DIR/app_db_password")@postgres:5432/registry"
# The demo deployment's metering token: what its replicas send the OTLP receiver
# (observability/otlp.py's metering_token: Django's salted_hmac, SHA-256, of the
# deployment's name under the secret key). Derived, so it follows a new secret
# key only when this file is removed and the script run again.
write metering_token "$(python3 - "$DIR/django_secret_key" local-cpu <<'PY'
import hashlib, hmac, sys
secret = open(sys.argv[1], "rb").read().strip()
key = hashlib.sha256(b"observability.otlp.metering-token" + secret).digest()
print(hmac.new(key, sys.argv[2].encode(), hashlib.sha256).hexdigest(), end="")
PY
)"
