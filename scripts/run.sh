#!/usr/bin/env bash
# `make run`: the whole product on embedded defaults, in the foreground.
# Web server, Celery worker and beat, and a local vLLM registered as the demo
# deployment local-cpu (scripts/run_vllm.sh; VLLM_URL=... uses an existing one).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/.venv/bin
export DJANGO_DEBUG="${DJANGO_DEBUG:-true}"
export DJANGO_SECRET_KEY="${DJANGO_SECRET_KEY:-local-demo-secret-key-change-me}"
PORT="${PORT:-8000}"
mkdir -p var/log

$BIN/python manage.py migrate --noinput
$BIN/python manage.py collectstatic --noinput >/dev/null
$BIN/python manage.py seed_demo

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait || true; }
trap cleanup EXIT INT TERM

if [[ -f scripts/run_vllm.sh ]]; then
  source scripts/run_vllm.sh
fi

$BIN/celery -A config worker --loglevel=INFO --concurrency=2 >var/log/worker.log 2>&1 &
pids+=($!)
$BIN/celery -A config beat --loglevel=INFO --schedule var/celerybeat-schedule >var/log/beat.log 2>&1 &
pids+=($!)
$BIN/python manage.py runserver "127.0.0.1:$PORT" >var/log/web.log 2>&1 &
pids+=($!)

for _ in $(seq 1 60); do
  curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break
  sleep 0.5
done
cat <<MSG

  Adapter registry is running: http://127.0.0.1:$PORT/
  API docs:    http://127.0.0.1:$PORT/api/docs/
  Admin:       http://127.0.0.1:$PORT/admin/
  Logins (password 'demo-password'): admin, legal-member, legal-approver,
    finance-member, finance-approver, hr-member, hr-approver, support-member, support-approver
  Demo adapter archives: var/demo-adapters/
  Logs: var/log/   Stop with Ctrl-C.

MSG
if [[ -n "${DEMO_VLLM_URL:-}" ]]; then
  cat <<MSG
  vLLM for the demo deployment local-cpu: $DEMO_VLLM_URL
  Upload, approve, promote and query the demo adapters: docs/walkthrough.md

MSG
fi
wait -n "${pids[@]}"
