#!/usr/bin/env bash
# The whole suite. Installs what the real-server tiers need, once per run.
#
# CI=true (.ci/run sets it): every tier is required. An install that fails or a
# tool that is missing stops the run at once, naming the tier; SKIP_VLLM=1 and
# SKIP_MLFLOW=1 are refused; and the skip report at the end of pytest
# (tests/support/skip_report.py) fails the run for any skip outside
# tests/skip_allowlist.toml. Without CI=true a tier that cannot run is skipped,
# and this script says so loudly before pytest starts.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin

case "${CI:-}" in
  true | 1 | yes) strict=1 ;;
  *) strict=0 ;;
esac
will_skip=()

# A tier that cannot run: fatal under CI=true, a loud warning otherwise.
cannot_run() {
  local tier="$1" why="$2"
  if ((strict)); then
    echo "CI=true: the $tier tier cannot run: $why" >&2
    exit 1
  fi
  echo "WARNING: $why: the $tier tests will be SKIPPED (CI=true fails here)" >&2
  will_skip+=("$tier ($why)")
}

# Waits for dpkg's lock (another apt run on the machine) instead of failing the tier.
apt_install() {
  apt-get -o DPkg::Lock::Timeout=600 update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@"
}

if ((strict)); then
  for flag in SKIP_VLLM SKIP_MLFLOW SKIP_COMPOSE; do
    if [[ "${!flag:-0}" == "1" ]]; then
      echo "CI=true: $flag=1 is refused (every tier is required in CI)" >&2
      exit 1
    fi
  done
  # The fault tier and the race tests need PostgreSQL (tests/skip_allowlist.toml
  # lets them skip on SQLite only): CI must give it one.
  if [[ "${DATABASE_URL:-}" != postgres://* && "${DATABASE_URL:-}" != postgresql://* ]]; then
    echo "CI=true: the faults tier cannot run: DATABASE_URL is not PostgreSQL" >&2
    exit 1
  fi
  # Set before looking for the tools, so a tier whose tool vanishes later (or
  # whose check in the tests disagrees with this script's) fails instead of skipping.
  export REQUIRE_MLFLOW=1 REQUIRE_OIDC=1 REQUIRE_DEPLOY_TOOLS=1 REQUIRE_HAPROXY=1
fi

if [[ "${SKIP_VLLM:-0}" == "1" ]]; then
  cannot_run vllm "SKIP_VLLM=1"
else
  bash scripts/vllm/install.sh || cannot_run vllm "scripts/vllm/install.sh failed"
  # peft for the conformance tier's cases (tests/conformance), into the same venv.
  bash scripts/conformance/install.sh || cannot_run conformance "scripts/conformance/install.sh failed"
fi
if [[ "${SKIP_MLFLOW:-0}" == "1" ]]; then
  cannot_run mlflow "SKIP_MLFLOW=1"
elif bash scripts/mlflow/install.sh; then
  export REQUIRE_MLFLOW=1 # installed: the MLflow tests must run, not skip
else
  cannot_run mlflow "scripts/mlflow/install.sh failed"
fi

echo "database: ${DATABASE_URL:-sqlite (embedded default)}"
echo "broker:   ${CELERY_BROKER_URL:-sqlite (embedded default)}"
$BIN/ruff check .
# The browser tier drives Debian's chromium through Playwright (no browser download).
if [[ ! -x /usr/bin/chromium ]]; then
  apt_install chromium || true
  [[ -x /usr/bin/chromium ]] || cannot_run browser "chromium could not be installed"
fi
# The fault tier starts a redis-server of its own (restarting it must never touch
# a shared one); Debian's package brings the binary.
if ! command -v redis-server >/dev/null; then
  apt_install redis-server || true
  command -v redis-server >/dev/null || cannot_run faults "redis-server could not be installed"
fi
# tests/docs/test_walkthrough.py runs docs/walkthrough.md as written: curl and jq.
if ! command -v jq >/dev/null || ! command -v curl >/dev/null; then
  apt_install jq curl || true
  command -v jq >/dev/null && command -v curl >/dev/null \
    || cannot_run walkthrough "jq or curl could not be installed"
fi
# Scenario 6a of the fault tier holds vLLM inside an adapter read with strace
# (tests/support/slow_reads.py), to kill the replica while it reads.
if ! command -v strace >/dev/null; then
  apt_install strace || true
  command -v strace >/dev/null || cannot_run faults "strace could not be installed"
fi
# The SSO tier runs npm's oidc-provider (tests/support/oidc/) with Node.js >= 20;
# its npm packages are installed by the test fixture (npm ci, once per lockfile).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  apt_install nodejs npm || true
fi
if command -v node >/dev/null && command -v npm >/dev/null; then
  export REQUIRE_OIDC=1 # installed: the SSO tests must run, not skip
else
  cannot_run oidc "node/npm could not be installed"
fi
# The deploy tests build the kustomize overlays and resolve docker-compose.yml.
deploy_packages=()
command -v kubectl >/dev/null 2>&1 || deploy_packages+=(kubernetes-client)
command -v docker-compose >/dev/null 2>&1 || deploy_packages+=(docker-compose)
if ((${#deploy_packages[@]})); then
  apt_install "${deploy_packages[@]}" || true
fi
if command -v kubectl >/dev/null 2>&1 && command -v docker-compose >/dev/null 2>&1; then
  export REQUIRE_DEPLOY_TOOLS=1 # installed: the deploy tests must run, not skip
else
  cannot_run deploy "kubectl and docker-compose could not be installed"
fi
# The front door (serving/door/) is Debian's haproxy; its tests run a real one.
if ! command -v haproxy >/dev/null 2>&1; then
  apt_install haproxy || true
fi
if command -v haproxy >/dev/null 2>&1; then
  export REQUIRE_HAPROXY=1 # installed: the front door tests must run, not skip
else
  cannot_run gateway "haproxy could not be installed"
fi
# The Prometheus tier runs Debian's prometheus (and promtool for the alert rules).
if [[ ! -x /usr/bin/prometheus || ! -x /usr/bin/promtool ]]; then
  apt_install prometheus || true
  [[ -x /usr/bin/prometheus && -x /usr/bin/promtool ]] \
    || cannot_run prometheus "prometheus/promtool could not be installed"
fi

if ((${#will_skip[@]})); then
  echo "==================================================================" >&2
  echo "LOCAL RUN: these tiers will SKIP (the skip report lists each test):" >&2
  printf '  - %s\n' "${will_skip[@]}" >&2
  echo "==================================================================" >&2
fi
if ((!strict)) && [[ "${DATABASE_URL:-}" != postgres* ]]; then
  echo "NOTE: SQLite: the fault tier and the PostgreSQL race tests will skip" \
    "(allowed on SQLite by tests/skip_allowlist.toml)" >&2
fi
# The pytest runs (light on two workers, heavy one test at a time) and the clock.
rc=0
bash scripts/test_runs.sh "$@" || rc=$?
# The compose tier, after them and alone (it builds images and starts a dozen
# containers): scripts/compose/test.sh installs podman itself and fails under
# CI=true when it cannot run. Left out when arguments choose tests.
if (($# == 0)); then
  if [[ "${SKIP_COMPOSE:-0}" == 1 ]]; then
    cannot_run compose "SKIP_COMPOSE=1"
  else
    compose_started=$SECONDS
    bash scripts/compose/test.sh || { rc=1; echo "make test FAILED: the compose tier" >&2; }
    echo "the compose tier: $(((SECONDS - compose_started) / 60)) min $(((SECONDS - compose_started) % 60)) s"
  fi
fi
exit "$rc"
