#!/usr/bin/env bash
# The pytest runs of `make test` (scripts/test.sh execs this after its installs
# and tool checks), then the clock. Two runs (docs/internals/testing.md, "Tiers
# and their times"):
# - light: every test outside the heavy tiers, on two pytest-xdist workers,
#   each with its own test database (pytest-django adds _gw0/_gw1 to its name);
# - heavy: the tiers that run real vLLM, Chromium, the fault scenarios, the
#   contract, conformance, the benches and the stress tests, on two workers of
#   its own (SUITE_HEAVY_WORKERS) with --dist loadfile: a file's tests stay on
#   one worker with its module's servers. Its tests mostly wait on servers (a
#   vLLM boot, a load, a swap window: one worker kept the CPU busy about 30%
#   of the time), so the second worker fills those waits.
# Both always run, and the script fails if either does. SUITE_RUNS=heavy (or
# light) runs one alone; arguments go to every run.
#
# Each run names its slowest tests and prints its tiers' times
# (tests/support/tier_clock.py); scripts/suite_clock.py then prints the pytest
# time of every run and tier and, under CI=true, fails when the whole pytest
# time passes the guard (SUITE_LIMIT_MINUTES, 70), naming the slowest tiers.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST="${PYTEST:-.venv/bin/pytest}"
PYTHON="${PYTHON:-.venv/bin/python}"
HEAVY="vllm or browser or faults or contract or conformance or bench or stress"

SUITE_TIER_TIMES="$(mktemp -t suite-tier-times.XXXXXX)"
export SUITE_TIER_TIMES
trap 'rm -f "$SUITE_TIER_TIMES"' EXIT
user_args=("$@")
suite_started=$SECONDS
failed=()

pytest_prefix=()
run_pytest() {
  local name="$1" started=$SECONDS rc=0
  shift
  echo "=== the $name run: ${pytest_prefix[*]} pytest $*"
  "${pytest_prefix[@]}" "$PYTEST" "$@" || rc=$?
  # 5, no tests collected: fine when the arguments chose tests of the other run only.
  if ((rc == 5 && ${#user_args[@]})); then rc=0; fi
  printf '{"run": "%s", "wall": %d, "exit": %d}\n' "$name" $((SECONDS - started)) "$rc" \
    >>"$SUITE_TIER_TIMES"
  ((rc == 0)) || failed+=("the $name run (pytest exit $rc)")
}

# A run's Redis database when the broker is Redis: the broker's number plus
# $1; each pytest-xdist worker adds its own index to it
# (tests/support/test_environment.py), so no run or worker meets another's
# tasks or purges. Anything else: the broker as it is.
broker_plus() {
  local url="${CELERY_BROKER_URL:-}"
  if [[ "$url" =~ ^(rediss?://[^/]+)/([0-9]+)$ ]]; then
    echo "${BASH_REMATCH[1]}/$((BASH_REMATCH[2] + $1))"
  else
    echo "$url"
  fi
}

# compose: its own tier, run by scripts/test.sh after these (scripts/compose/test.sh).
light_args=(-q --durations=25 -n "${SUITE_WORKERS:-2}" -m "not ($HEAVY or compose)" "$@")
heavy_args=(-q --durations=25 -m "$HEAVY" "$@")
heavy_workers="${SUITE_HEAVY_WORKERS:-2}"
if ((heavy_workers > 1)); then
  # The slowest files first (tests/support/file_order.py), in that order.
  heavy_args=(-n "$heavy_workers" --dist loadfile --no-loadscope-reorder "${heavy_args[@]}")
fi
runs="${SUITE_RUNS:-light heavy}"
# Side by side when both run against PostgreSQL and Redis (CI); on the
# embedded defaults both would share one SQLite broker file, so they run one
# after the other. The heavy run's tests mostly wait on servers (a vLLM boot,
# a load, a swap window), the light run's are CPU-bound: the light run goes
# under nice (SUITE_LIGHT_NICE, 10), so it takes only the CPU the heavy run
# leaves, and the heavy run's timings (a swap window, a worker's start) are
# what they would be alone. Without nice, side by side starved both and
# load-sensitive tests failed. The light tests that time a process of their
# own (a worker's 5-second stop) are in the heavy tiers for that reason.
overlap="${SUITE_OVERLAP:-auto}"
if [[ "$overlap" == auto ]]; then
  overlap=0
  if [[ "$runs" == "light heavy" && "${CELERY_BROKER_URL:-}" == redis* \
    && "${DATABASE_URL:-}" == postgres* ]]; then
    overlap=1
  fi
fi

if [[ "$overlap" == 1 ]]; then
  light_log="$(mktemp -t suite-light-run.XXXXXX)"
  echo "=== the light run, beside the heavy one; its output follows the heavy run's ($light_log)"
  (
    export CELERY_BROKER_URL
    CELERY_BROKER_URL="$(broker_plus 2)"
    pytest_prefix=(nice -n "${SUITE_LIGHT_NICE:-10}")
    run_pytest light "${light_args[@]}"
    ((${#failed[@]} == 0))
  ) >"$light_log" 2>&1 &
  light_pid=$!
  # The heavy run on databases of its own: pytest-django names a worker's test
  # database after the run's (test_<name>_gw0), and the light run's workers
  # already have those of $DATABASE_URL.
  (
    export CELERY_BROKER_URL DATABASE_URL
    CELERY_BROKER_URL="$(broker_plus 4)"
    if [[ "$DATABASE_URL" =~ ^([^?]+/)([^/?]+)(\?.*)?$ ]]; then
      DATABASE_URL="${BASH_REMATCH[1]}${BASH_REMATCH[2]}_heavy${BASH_REMATCH[3]}"
    fi
    run_pytest heavy "${heavy_args[@]}"
    ((${#failed[@]} == 0))
  ) || failed+=("the heavy run (exit $?)")
  light_rc=0
  wait "$light_pid" || light_rc=$?
  cat "$light_log"
  rm -f "$light_log"
  ((light_rc == 0)) || failed+=("the light run (exit $light_rc)")
else
  for run in $runs; do
    case "$run" in
      light) run_pytest light "${light_args[@]}" ;;
      heavy) run_pytest heavy "${heavy_args[@]}" ;;
      *)
        echo "SUITE_RUNS: unknown run '$run' (light, heavy)" >&2
        exit 2
        ;;
    esac
  done
fi

# The runs' walls add up only when they ran one after the other.
printf '{"total": %d, "side_by_side": %d}\n' "$((SECONDS - suite_started))" "$overlap" \
  >>"$SUITE_TIER_TIMES"
# SUITE_FILE_SECONDS=tests/support/heavy_file_seconds.json refreshes the heavy
# run's file order from this run's times.
"$PYTHON" scripts/suite_clock.py "$SUITE_TIER_TIMES" \
  --limit-minutes "${SUITE_LIMIT_MINUTES:-70}" ${SUITE_FILE_SECONDS:+--file-seconds "$SUITE_FILE_SECONDS"} \
  || failed+=("the pytest-time guard")
if ((${#failed[@]})); then
  printf 'make test FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
