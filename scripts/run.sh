#!/usr/bin/env bash
# `make run`: the whole product on embedded defaults, in the foreground.
# Web server, one Celery worker per queue, beat, and a local vLLM registered as
# the demo deployment local-cpu (scripts/run_vllm.sh; VLLM_URL=... uses an
# existing one), all under scripts/supervise.py: a process that dies is
# restarted and logged ($VAR_DIR/log/supervisor.log), the others keep running, and
# Ctrl-C stops everything.
set -euo pipefail
# -P: the physical path. vLLM reports its base model's root as it was given
# (under $PWD), the registration records the resolved one; from a clone reached
# through a symlink they would differ and every promotion be refused.
cd -P "$(dirname "$0")/.."
BIN=$PWD/.venv/bin
# Debug off, as in production: a visitor gets the product's 404/403/500 pages,
# never Django's debug page (which lists every URL and setting). A developer
# opts in with `DJANGO_DEBUG=true make run`. Static files come from WhiteNoise
# either way (collectstatic below). This is plain HTTP on 127.0.0.1, so the
# production HTTPS defaults (secure cookies, SSL redirect, HSTS) are off here.
export DJANGO_DEBUG="${DJANGO_DEBUG:-false}"
export DJANGO_SECURE_COOKIES="${DJANGO_SECURE_COOKIES:-false}"
export DJANGO_SECURE_SSL_REDIRECT="${DJANGO_SECURE_SSL_REDIRECT:-false}"
export DJANGO_SECURE_HSTS_SECONDS="${DJANGO_SECURE_HSTS_SECONDS:-0}"
export DJANGO_SECRET_KEY="${DJANGO_SECRET_KEY:-local-demo-secret-key-change-me}"
# A worker's SIGTERM (Ctrl-C through the supervisor) is a bounded cold shutdown:
# see CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT in config/settings.py.
export REMAP_SIGTERM=SIGQUIT
PORT="${PORT:-8000}"
# The links in notifications and emails go to this web server, wherever PORT moved it.
export NOTIFICATIONS_SITE_URL="${NOTIFICATIONS_SITE_URL:-http://127.0.0.1:$PORT}"
VAR="${VAR_DIR:-$PWD/var}"
LOG="$VAR/log"
mkdir -p var/log "$LOG"

$BIN/python manage.py migrate --noinput
$BIN/python manage.py collectstatic --noinput >/dev/null
$BIN/python manage.py seed_demo
# Legal's inference key for the front door (docs/operators/keys-and-grants.md): the
# same one while it lives, kept in $VAR/demo-inference-key (mode 600).
DEMO_KEY="$($BIN/python manage.py demo_inference_key --file "$VAR/demo-inference-key")"

# The front door (docs/door.md): one HAProxy for the demo deployment, the
# client URL. The control plane keeps its routes (the runtime API on a socket in
# $VAR/gateway/local-cpu/).
DOOR_PORT="${DOOR_PORT:-${GATEWAY_PORT:-8200}}"  # GATEWAY_PORT: its old name
export SERVING_DOORS="${SERVING_DOORS:-local-cpu=127.0.0.1:$DOOR_PORT}"
export SERVING_DOOR_DIR="${SERVING_DOOR_DIR:-$VAR/gateway}"
DOOR_CMD=""
if ! command -v haproxy >/dev/null 2>&1; then
  { apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq haproxy; } \
    >>"$LOG/install.log" 2>&1 || true
fi
if command -v haproxy >/dev/null 2>&1; then
  $BIN/python manage.py door_sync local-cpu --base-model tiny-llama >/dev/null
  DOOR_CMD="$($BIN/python manage.py door_sync local-cpu --print-command)"
else
  echo "run: haproxy is not installed (apt-get install haproxy): no front door" >&2
fi

DEMO_VLLM_CMD=""
DEMO_VLLM_CMD_B=""
if [[ -f scripts/run_vllm.sh && "${RUN_WITHOUT_VLLM:-0}" != "1" ]]; then
  source scripts/run_vllm.sh
fi

# The worker commands of docs/operators/workers.md: rollouts never starve the
# reconcile, and the MLflow mirror (housekeeping) starves neither.
programs=(
  --program web "$BIN/python manage.py runserver --noreload 127.0.0.1:$PORT"
  --program worker-rollouts "$BIN/celery -A config worker -Q rollouts -n rollouts@%h --concurrency=2 --loglevel=INFO"
  --program worker-reconcile "$BIN/celery -A config worker -Q reconcile,celery -n reconcile@%h --concurrency=2 --loglevel=INFO"
  --program worker-housekeeping "$BIN/celery -A config worker -Q housekeeping -n housekeeping@%h --concurrency=1 --loglevel=INFO"
  --program beat "$BIN/celery -A config beat --loglevel=INFO --schedule $VAR/celerybeat-schedule"
)
if [[ -n "$DEMO_VLLM_CMD" ]]; then
  programs+=(--program vllm "$DEMO_VLLM_CMD")
fi
if [[ -n "$DEMO_VLLM_CMD_B" ]]; then
  programs+=(--program vllm-b "$DEMO_VLLM_CMD_B")
fi
if [[ -n "$DOOR_CMD" ]]; then
  programs+=(--program gateway "$DOOR_CMD")
fi

# Each worker must also keep consuming its liveness ping (config/celery_liveness.py):
# one alive but deaf is killed and restarted.
liveness=(--liveness worker-rollouts --liveness worker-reconcile --liveness worker-housekeeping)
$BIN/python scripts/supervise.py --log-dir "$LOG" "${programs[@]}" "${liveness[@]}" &
supervisor=$!
# Ctrl-C reaches the supervisor too (same process group); SIGTERM is passed on.
trap 'kill -TERM "$supervisor" 2>/dev/null || true; wait "$supervisor" || true; exit 0' INT TERM

if declare -F demo_vllm_register >/dev/null; then
  demo_vllm_register || echo "run: the demo deployment is not registered; the rest runs" >&2
fi
for _ in $(seq 1 60); do
  curl -fsS "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break
  sleep 0.5
done
cat <<MSG

  Adapter registry is running: http://127.0.0.1:$PORT/
  API docs:    http://127.0.0.1:$PORT/api/docs/
  Admin:       http://127.0.0.1:$PORT/admin/
  Logins (password 'demo-password'): admin, legal-member, legal-approver,
    finance-member, finance-approver, hr-member, hr-approver, support-member, support-approver
  Inference key (Legal's; send it as 'Authorization: Bearer <key>'; also in $VAR/demo-inference-key):
    $DEMO_KEY
  Demo adapter archives: var/demo-adapters/
  Logs: $LOG/ (restarts in supervisor.log)   Stop with Ctrl-C.

MSG
if [[ -n "$DOOR_CMD" ]]; then
  cat <<MSG
  Front door (OpenAI API for clients, routes by "model"): http://127.0.0.1:$DOOR_PORT/v1

MSG
fi
if [[ -n "${DEMO_VLLM_URL:-}" ]]; then
  cat <<MSG
  vLLM replicas of the demo deployment local-cpu: $DEMO_VLLM_URL ${DEMO_VLLM_URL_B:-}
  Upload, approve, promote and query the demo adapters: docs/walkthrough.md

MSG
fi
wait "$supervisor"
