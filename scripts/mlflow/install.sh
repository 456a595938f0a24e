#!/usr/bin/env bash
# Install the full MLflow tracking server into its own virtualenv, for tests.
#
# The app itself only needs mlflow-skinny (requirements.txt). The server package
# pins heavy dependencies (sqlalchemy, alembic, flask, pandas, ...) that must not
# fight the app's venv, so it lives apart.
#
# Usage: scripts/mlflow/install.sh [VENV_DIR]      (default: <repo>/.venv-mlflow)
#
# Env:
#   MLFLOW_SERVER_VERSION   package version (default: the mlflow-skinny pin in
#                           requirements.txt, so client and server speak the same API)
#   PYTHON                  interpreter for the venv (default python3.11 or python3)
#   MLFLOW_INSTALL_FORCE=1  reinstall even if the marker is present
#
# Idempotent: a marker file (VENV_DIR/.mlflow-installed) is written at the end;
# when it names the wanted version and the server entry point exists, it exits at once.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV_DIR="${1:-${MLFLOW_VENV:-$REPO_ROOT/.venv-mlflow}}"
if [[ -z "${MLFLOW_SERVER_VERSION:-}" ]]; then
  MLFLOW_SERVER_VERSION="$(sed -n 's/^mlflow-skinny==\([0-9.]*\).*/\1/p' "$REPO_ROOT/requirements.txt")"
fi
: "${MLFLOW_SERVER_VERSION:?set MLFLOW_SERVER_VERSION or pin mlflow-skinny==X in requirements.txt}"
WANT="mlflow==$MLFLOW_SERVER_VERSION"
MARKER="$VENV_DIR/.mlflow-installed"

if [[ -z "${PYTHON:-}" ]]; then
  if command -v python3.11 >/dev/null 2>&1; then PYTHON=python3.11; else PYTHON=python3; fi
fi

t0=$(date +%s)
log() { echo "[install-mlflow +$(( $(date +%s) - t0 ))s] $*"; }

if [[ "${MLFLOW_INSTALL_FORCE:-0}" != "1" && -f "$MARKER" ]] && grep -qx "$WANT" "$MARKER" \
   && [[ -x "$VENV_DIR/bin/mlflow" ]]; then
  log "already installed in $VENV_DIR ($WANT)"
  exit 0
fi
rm -f "$MARKER"

if [[ ! -x "$VENV_DIR/bin/python" ]]; then
  log "creating venv $VENV_DIR with $PYTHON"
  "$PYTHON" -m venv "$VENV_DIR"
fi
PY="$VENV_DIR/bin/python"

log "pip install $WANT"
# pip warns once per local index folder that lacks a package; drop only that noise.
quiet() { "$@" 2>&1 | { grep -v "^WARNING: Location '.*' is ignored" || true; }; }
quiet "$PY" -m pip install --quiet --upgrade pip
quiet "$PY" -m pip install --quiet "$WANT"
"$VENV_DIR/bin/mlflow" --version
echo "$WANT" > "$MARKER"
log "done; venv size: $(du -sh "$VENV_DIR" | cut -f1)"
