# Sourced by scripts/run.sh (`make run`), after seed_demo: two local vLLM
# replicas (CPU build, tiny generated model) registered as the demo deployment
# "local-cpu", behind its front door (HAProxy, started by run.sh).
# With VLLM_URL set, that one server is registered instead.
#
# Sourcing installs what is needed and sets DEMO_VLLM_CMD and DEMO_VLLM_CMD_B
# (empty with VLLM_URL): run.sh hands them to its supervisor with the other
# programs, then calls demo_vllm_register, which waits until both answer and
# registers them.
#
#   DEMO_VLLM_PORT (8100)     port of the first local vLLM; the second is the next port
#   VLLM_URL                  use this running vLLM instead of starting one
#   VLLM_BASE_MODEL_PATH      with VLLM_URL: a folder with the base model's
#                             config.json (else read from /v1/models if local)
#   VLLM_API_KEY              with VLLM_URL: its --api-key, if any
#
# Expects run.sh's BIN, VAR and PORT (the web server: its OTLP receiver meters tokens).
# With VLLM_URL, that server's tokens are metered only if it was started with
# --otlp-traces-endpoint http://127.0.0.1:$PORT/otlp/local-cpu/v1/traces and the
# token `manage.py metering_token local-cpu` prints (docs/operators/usage.md).

DEMO_VLLM_PORT="${DEMO_VLLM_PORT:-8100}"
DEMO_MODEL_DIR="$PWD/var/models/tiny-llama"

_vllm_ready() {  # $1 = base URL, $2 = api key: /health answers, /v1/models lists a model
  curl -fsS -m 2 "$1/health" >/dev/null 2>&1 &&
    curl -fsS -m 5 ${2:+-H "Authorization: Bearer $2"} \
      "$1/v1/models" 2>/dev/null | grep -q '"id"'
}

if [[ -n "${VLLM_URL:-}" ]]; then
  DEMO_VLLM_URL="${VLLM_URL%/}"
  DEMO_VLLM_URL="${DEMO_VLLM_URL%/v1}"
  echo "run: using the vLLM at $DEMO_VLLM_URL (VLLM_URL)"
  if ! _vllm_ready "$DEMO_VLLM_URL" "${VLLM_API_KEY:-}"; then
    echo "run: $DEMO_VLLM_URL does not answer /health and /v1/models" >&2
    exit 1
  fi
  register_args=(--url "$DEMO_VLLM_URL")
  if [[ -n "${VLLM_BASE_MODEL_PATH:-}" ]]; then
    register_args+=(--base-model-path "$VLLM_BASE_MODEL_PATH")
  fi
  if [[ -n "${VLLM_API_KEY:-}" ]]; then
    register_args+=(--api-key "$VLLM_API_KEY")
  fi
else
  DEMO_VLLM_URL="http://127.0.0.1:$DEMO_VLLM_PORT"
  DEMO_VLLM_URL_B="http://127.0.0.1:$((DEMO_VLLM_PORT + 1))"
  for url in "$DEMO_VLLM_URL" "$DEMO_VLLM_URL_B"; do
    if curl -fsS -m 2 "$url/health" >/dev/null 2>&1; then
      echo "run: something already answers on $url; stop it, set DEMO_VLLM_PORT," >&2
      echo "     or use it with VLLM_URL=$url" >&2
      exit 1
    fi
  done
  echo "run: installing vLLM (CPU) into .venv-vllm if needed; the first time takes a few minutes"
  if ! bash scripts/vllm/install.sh >>var/log/vllm-install.log 2>&1; then
    echo "run: vLLM install failed; see var/log/vllm-install.log" >&2
    exit 1
  fi
  "${VLLM_VENV:-$PWD/.venv-vllm}/bin/python" scripts/vllm/make_tiny_model.py "$DEMO_MODEL_DIR" \
    >>var/log/vllm-install.log 2>&1
  # Every request's tokens, as vLLM counted them, go to the web server's OTLP
  # receiver (docs/operators/usage.md): without the exporter the usage page stays
  # empty and token limits refuse nobody. The token is read from a 0600 file by
  # serve.sh, never put on a command line (the process list shows those).
  DEMO_OTLP_TOKEN_FILE="$VAR/demo-metering-token"
  (umask 077 && $BIN/python manage.py metering_token local-cpu --unregistered >"$DEMO_OTLP_TOKEN_FILE")
  DEMO_OTLP="SERVE_OTLP_TRACES_ENDPOINT=http://127.0.0.1:$PORT/otlp/local-cpu/v1/traces \
    SERVE_OTLP_TOKEN_FILE=$DEMO_OTLP_TOKEN_FILE"
  # Four demo adapters fit at once (max-loras) and in the CPU cache (max-cpu-loras).
  # No inherited VLLM_API_KEY: the demo server runs without one.
  DEMO_VLLM_CMD="env -u VLLM_API_KEY $DEMO_OTLP bash scripts/vllm/serve.sh --port $DEMO_VLLM_PORT \
    --model $DEMO_MODEL_DIR --name tiny-llama --max-loras 4 --max-cpu-loras 8 --max-lora-rank 16"
  # The second replica: the front door then has a choice, and a swap drains one
  # replica while the other serves.
  DEMO_VLLM_CMD_B="env -u VLLM_API_KEY $DEMO_OTLP bash scripts/vllm/serve.sh --port $((DEMO_VLLM_PORT + 1)) \
    --model $DEMO_MODEL_DIR --name tiny-llama --max-loras 4 --max-cpu-loras 8 --max-lora-rank 16"
  register_args=(--url "$DEMO_VLLM_URL" --url "$DEMO_VLLM_URL_B" --base-model-path "$DEMO_MODEL_DIR")
fi

demo_vllm_register() {
  if [[ -n "${DEMO_VLLM_CMD:-}" ]]; then
    echo "run: starting vLLM on $DEMO_VLLM_URL and $DEMO_VLLM_URL_B (logs: vllm.log, vllm-b.log, about 30 s)"
    for url in "$DEMO_VLLM_URL" "$DEMO_VLLM_URL_B"; do
      for _ in $(seq 1 480); do
        _vllm_ready "$url" && break
        sleep 0.5
      done
      if ! _vllm_ready "$url"; then
        echo "run: vLLM at $url not ready after 240 s; see $LOG/vllm.log and vllm-b.log" >&2
        return 1
      fi
    done
  fi
  $BIN/python manage.py register_local_deployment --name local-cpu --environment local \
    --max-loras 4 --max-cpu-loras 8 --max-lora-rank 16 "${register_args[@]}"
  # Route through the front door at once, not at the first reconcile.
  $BIN/python manage.py door_sync local-cpu
}
