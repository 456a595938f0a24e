#!/usr/bin/env bash
# The pytest runs of `make test` (scripts/test.sh execs this after its installs
# and tool checks), then the clock. Two runs (docs/internals/testing.md, "Tiers
# and their times"):
# - light: every test outside the heavy tiers, on two pytest-xdist workers,
#   each with its own test database (pytest-django adds _gw0/_gw1 to its name);
# - heavy: the tiers that run real vLLM, Chromium, the fault scenarios, the
#   contract, conformance, the benches and the stress tests, one test at a
#   time: on two cores two of them side by side starve each other's servers.
# Both always run, and the script fails if either does. SUITE_RUNS=heavy (or
# light) runs one alone; arguments go to every run.
#
# Each run names its slowest tests and prints its tiers' times
# (tests/support/tier_clock.py); scripts/suite_clock.py then prints the pytest
# time of every run and tier and, under CI=true, fails when the whole pytest
# time passes the guard (SUITE_LIMIT_MINUTES, 60), naming the slowest tiers.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST="${PYTEST:-.venv/bin/pytest}"
PYTHON="${PYTHON:-.venv/bin/python}"
HEAVY="vllm or browser or faults or contract or conformance or bench or stress"

SUITE_TIER_TIMES="$(mktemp -t suite-tier-times.XXXXXX)"
export SUITE_TIER_TIMES
trap 'rm -f "$SUITE_TIER_TIMES"' EXIT
user_args=("$@")
failed=()

run_pytest() {
  local name="$1" started=$SECONDS rc=0
  shift
  echo "=== the $name run: pytest $*"
  "$PYTEST" "$@" || rc=$?
  # 5, no tests collected: fine when the arguments chose tests of the other run only.
  if ((rc == 5 && ${#user_args[@]})); then rc=0; fi
  printf '{"run": "%s", "wall": %d, "exit": %d}\n' "$name" $((SECONDS - started)) "$rc" \
    >>"$SUITE_TIER_TIMES"
  ((rc == 0)) || failed+=("the $name run (pytest exit $rc)")
}

for run in ${SUITE_RUNS:-light heavy}; do
  case "$run" in
    light) run_pytest light -q --durations=25 -n "${SUITE_WORKERS:-2}" -m "not ($HEAVY)" "$@" ;;
    heavy) run_pytest heavy -q --durations=25 -m "$HEAVY" "$@" ;;
    *)
      echo "SUITE_RUNS: unknown run '$run' (light, heavy)" >&2
      exit 2
      ;;
  esac
done

"$PYTHON" scripts/suite_clock.py "$SUITE_TIER_TIMES" \
  --limit-minutes "${SUITE_LIMIT_MINUTES:-60}" || failed+=("the pytest-time guard")
if ((${#failed[@]})); then
  printf 'make test FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
