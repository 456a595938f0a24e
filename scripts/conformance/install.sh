#!/usr/bin/env bash
# PEFT for the conformance tier (tests/conformance), into the vLLM virtualenv:
# the cases are made with real peft + transformers on the venv's CPU torch.
#
# Usage: scripts/conformance/install.sh [VENV_DIR]   (default: <repo>/.venv-vllm)
# Env:   PEFT_VERSION (default 0.21.2), CONFORMANCE_INSTALL_FORCE=1
#
# Idempotent: the marker VENV_DIR/.peft-installed holds the installed spec; when
# it matches and peft is importable (find_spec), the script exits at once.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV_DIR="${1:-${VLLM_VENV:-$REPO_ROOT/.venv-vllm}}"
WANT="peft==${PEFT_VERSION:-0.21.2}"
MARKER="$VENV_DIR/.peft-installed"
PY="$VENV_DIR/bin/python"

if [[ ! -x "$PY" ]]; then
  bash "$REPO_ROOT/scripts/vllm/install.sh" "$VENV_DIR"
fi
if [[ "${CONFORMANCE_INSTALL_FORCE:-0}" != "1" && -f "$MARKER" ]] && grep -qx "$WANT" "$MARKER" \
  && "$PY" -c "import importlib.util as u, sys; sys.exit(0 if u.find_spec('peft') else 1)"; then
  echo "[install-peft] already installed in $VENV_DIR ($WANT)"
  exit 0
fi
rm -f "$MARKER"
# Additive only: pip keeps the venv's torch and transformers (peft accepts them).
"$PY" -m pip install --quiet --disable-pip-version-check "$WANT"
"$PY" -c "import peft; print('[install-peft] peft', peft.__version__)"
echo "$WANT" > "$MARKER"
