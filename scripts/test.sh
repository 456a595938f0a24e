#!/usr/bin/env bash
# The whole suite. Installs what the real-server tiers need, once per run.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin

if [[ "${SKIP_VLLM:-0}" != "1" ]]; then
  bash scripts/vllm/install.sh
  # peft for the conformance tier's cases (tests/conformance), into the same venv.
  bash scripts/conformance/install.sh
fi
if [[ "${SKIP_MLFLOW:-0}" != "1" ]]; then
  bash scripts/mlflow/install.sh
  export REQUIRE_MLFLOW=1  # installed: the MLflow tests must run, not skip
fi

echo "database: ${DATABASE_URL:-sqlite (embedded default)}"
echo "broker:   ${CELERY_BROKER_URL:-sqlite (embedded default)}"
$BIN/ruff check .
# The browser tier drives Debian's chromium through Playwright (no browser download).
if [[ ! -x /usr/bin/chromium ]]; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
    || echo "could not install chromium: the browser tests will be skipped" >&2
fi
# The fault tier starts a redis-server of its own (restarting it must never touch
# a shared one); Debian's package brings the binary.
if ! command -v redis-server >/dev/null; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; } \
    || echo "could not install redis-server: the fault tier will be skipped" >&2
fi
# The SSO tier runs npm's oidc-provider (tests/support/oidc/) with Node.js >= 20;
# its npm packages are installed by the test fixture (npm ci, once per lockfile).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; } \
    || echo "could not install nodejs: the SSO tests will be skipped" >&2
fi
if command -v node >/dev/null && command -v npm >/dev/null; then
  export REQUIRE_OIDC=1  # installed: the SSO tests must run, not skip
fi
# The deploy tests build the kustomize overlays and resolve docker-compose.yml.
deploy_packages=()
command -v kubectl >/dev/null 2>&1 || deploy_packages+=(kubernetes-client)
command -v docker-compose >/dev/null 2>&1 || deploy_packages+=(docker-compose)
if (( ${#deploy_packages[@]} )); then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${deploy_packages[@]}"; } \
    || echo "could not install ${deploy_packages[*]}: the deploy tests will be skipped" >&2
fi
if command -v kubectl >/dev/null 2>&1 && command -v docker-compose >/dev/null 2>&1; then
  export REQUIRE_DEPLOY_TOOLS=1  # installed: the deploy tests must run, not skip
fi
# The Prometheus tier runs Debian's prometheus (and promtool for the alert rules).
if [[ ! -x /usr/bin/prometheus || ! -x /usr/bin/promtool ]]; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus; } \
    || echo "could not install prometheus: the Prometheus tests will be skipped" >&2
fi
exec $BIN/pytest -q "$@"
