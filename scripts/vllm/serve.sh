#!/usr/bin/env bash
# Run ONE vLLM OpenAI-compatible server (CPU) in the foreground, with runtime
# LoRA loading enabled. Meant for tests, the demo and benchmarks on a small
# CPU-only box: tiny model, float32, 256-token context, 64 MiB KV cache.
#
# Usage: scripts/vllm/serve.sh [--port N] [--model DIR] [--name NAME]
#            [--max-loras N] [--max-cpu-loras N] [--max-lora-rank N]
#            [--threads N] [--cpu-bind SPEC] [--] [extra vllm args...]
#
# Every option also has an env var (the flag wins):
#   SERVE_PORT (8100)            SERVE_HOST (127.0.0.1)
#   SERVE_MODEL (<repo>/var/models/tiny-llama; that default path is generated
#                                if missing, any other path must exist)
#   SERVE_NAME (tiny-llama)      served model name
#   SERVE_MAX_LORAS (2)          adapters batched at once
#   SERVE_MAX_CPU_LORAS (4)      adapters cached (LRU)
#   SERVE_MAX_LORA_RANK (16)
#   SERVE_API_KEY                optional; passed to vLLM through the env
#                                var VLLM_API_KEY, never on the command line
#   SERVE_API_KEY_FILE           optional; the key read from this file (a
#                                Docker or Kubernetes secret) instead
#   SERVE_THREADS (1)            OpenMP/torch threads of this server
#   SERVE_CPU_BIND (nobind)      VLLM_CPU_OMP_THREADS_BIND: "nobind" lets the
#                                OS place threads; "0" / "1" pins to a core.
#                                vLLM's default "auto" pins every server to
#                                the same core, so side-by-side servers fight.
#   SERVE_EAGER (1)              --enforce-eager: no torch.compile, faster start
#   SERVE_ONE_ENGINE_PROC (1)    run the model worker inside the EngineCore
#                                process (--distributed-executor-backend uni +
#                                VLLM_ENABLE_V1_MULTIPROCESSING=0): 2 processes
#                                instead of 3, ~25 s faster start, ~0.7 GB less
#   SERVE_KV_CACHE_BYTES (67108864)  --kv-cache-memory-bytes; 64 MiB holds
#                                ~32k tokens of the tiny model. If
#                                VLLM_CPU_KVCACHE_SPACE (GiB) is set in the
#                                env, vLLM lets it win (and RSS grows by it).
#   SERVE_OTLP_TRACES_ENDPOINT   optional; the control plane's OTLP receiver,
#                                http(s)://<host>/otlp/<deployment>/v1/traces:
#                                vLLM then reports every request's prompt and
#                                completion tokens (metering, docs/operators/usage.md)
#   SERVE_OTLP_TOKEN / SERVE_OTLP_TOKEN_FILE  the deployment's metering token
#                                (`manage.py metering_token <deployment>`), sent
#                                as Authorization: Bearer; never on the command line
#   VLLM_VENV (<repo>/.venv-vllm)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${VLLM_VENV:-$REPO_ROOT/.venv-vllm}"
PORT="${SERVE_PORT:-8100}"
HOST="${SERVE_HOST:-127.0.0.1}"
MODEL="${SERVE_MODEL:-$REPO_ROOT/var/models/tiny-llama}"
NAME="${SERVE_NAME:-tiny-llama}"
MAX_LORAS="${SERVE_MAX_LORAS:-2}"
MAX_CPU_LORAS="${SERVE_MAX_CPU_LORAS:-4}"
MAX_LORA_RANK="${SERVE_MAX_LORA_RANK:-16}"
THREADS="${SERVE_THREADS:-1}"
CPU_BIND="${SERVE_CPU_BIND:-nobind}"
EAGER="${SERVE_EAGER:-1}"
ONE_ENGINE_PROC="${SERVE_ONE_ENGINE_PROC:-1}"
KV_CACHE_BYTES="${SERVE_KV_CACHE_BYTES:-67108864}"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --port) PORT="$2"; shift 2 ;;
    --host) HOST="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --name) NAME="$2"; shift 2 ;;
    --max-loras) MAX_LORAS="$2"; shift 2 ;;
    --max-cpu-loras) MAX_CPU_LORAS="$2"; shift 2 ;;
    --max-lora-rank) MAX_LORA_RANK="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --cpu-bind) CPU_BIND="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n "2,43p" "$0"; exit 0 ;;
    *) break ;;
  esac
done

PY="$VENV/bin/python"
if [[ ! -x "$PY" ]]; then
  echo "serve.sh: no vLLM venv at $VENV; run scripts/vllm/install.sh" >&2
  exit 2
fi
DEFAULT_MODEL="$REPO_ROOT/var/models/tiny-llama"
if [[ ! -f "$MODEL/config.json" ]]; then
  if [[ "$MODEL" == "$DEFAULT_MODEL" ]]; then
    "$PY" "$REPO_ROOT/scripts/vllm/make_tiny_model.py" "$MODEL"
  else
    echo "serve.sh: no model at $MODEL (only the default $DEFAULT_MODEL is generated on demand)" >&2
    exit 2
  fi
fi

# Offline, quiet, CPU-sized.
export VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_CPU_OMP_THREADS_BIND="$CPU_BIND"
export OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS"
export TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1
# Our own knob, not a vLLM setting: keep it out of vLLM's env check.
unset VLLM_VENV
if [[ -n "${SERVE_API_KEY_FILE:-}" ]]; then
  SERVE_API_KEY="$(<"$SERVE_API_KEY_FILE")"
  [[ -n "$SERVE_API_KEY" ]] || { echo "serve.sh: $SERVE_API_KEY_FILE is empty" >&2; exit 2; }
fi
unset SERVE_API_KEY_FILE
if [[ -n "${SERVE_API_KEY:-}" ]]; then
  export VLLM_API_KEY="$SERVE_API_KEY"
fi

if [[ -n "${SERVE_OTLP_TOKEN_FILE:-}" ]]; then
  SERVE_OTLP_TOKEN="$(<"$SERVE_OTLP_TOKEN_FILE")"
  [[ -n "$SERVE_OTLP_TOKEN" ]] || { echo "serve.sh: $SERVE_OTLP_TOKEN_FILE is empty" >&2; exit 2; }
fi
unset SERVE_OTLP_TOKEN_FILE

args=(
  --host "$HOST" --port "$PORT"
  --model "$MODEL" --served-model-name "$NAME"
  --max-model-len 256 --dtype float32
  --enable-lora --max-loras "$MAX_LORAS" --max-cpu-loras "$MAX_CPU_LORAS"
  --max-lora-rank "$MAX_LORA_RANK"
  --max-num-seqs 8
  --kv-cache-memory-bytes "$KV_CACHE_BYTES"
  # Every stream ends with a usage chunk, whatever the client asked.
  --enable-force-include-usage
)
if [[ -n "${SERVE_OTLP_TRACES_ENDPOINT:-}" ]]; then
  # One `llm_request` span per request, over OTLP/HTTP protobuf (vLLM's default
  # is gRPC); the token rides in the exporter's headers (URL-encoded).
  export OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf
  # A batch leaves within 1 s (the SDK waits 5 s); a receiver that is away
  # is retried for 60 s (the SDK gives up after 10 s and drops the batch),
  # while up to 16384 finished requests wait in memory (the SDK keeps 2048
  # and drops the rest). docs/operators/usage.md says what is lost when.
  export OTEL_BSP_SCHEDULE_DELAY="${OTEL_BSP_SCHEDULE_DELAY:-1000}"
  export OTEL_BSP_MAX_QUEUE_SIZE="${OTEL_BSP_MAX_QUEUE_SIZE:-16384}"
  export OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="${OTEL_EXPORTER_OTLP_TRACES_TIMEOUT:-60}"
  if [[ -n "${SERVE_OTLP_TOKEN:-}" ]]; then
    export OTEL_EXPORTER_OTLP_TRACES_HEADERS="authorization=Bearer%20${SERVE_OTLP_TOKEN}"
  fi
  args+=(--otlp-traces-endpoint "$SERVE_OTLP_TRACES_ENDPOINT")
fi
unset SERVE_OTLP_TOKEN
if [[ "$ONE_ENGINE_PROC" == "1" ]]; then
  # The API server always runs EngineCore in a child process; with this the
  # worker runs inside EngineCore instead of in a third process.
  export VLLM_ENABLE_V1_MULTIPROCESSING=0
  args+=(--distributed-executor-backend uni)
fi
if [[ "$EAGER" == "1" ]]; then
  args+=(--enforce-eager)
fi

echo "serve.sh: vLLM on $HOST:$PORT model=$MODEL name=$NAME loras=$MAX_LORAS/$MAX_CPU_LORAS rank<=$MAX_LORA_RANK threads=$THREADS bind=$CPU_BIND eager=$EAGER api_key=$([[ -n "${VLLM_API_KEY:-}" ]] && echo set || echo none)"
exec "$PY" -m vllm.entrypoints.openai.api_server "${args[@]}" "$@"
