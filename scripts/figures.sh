#!/usr/bin/env bash
# `make figures`: re-run every benchmark (full mode) and the fault tier, then
# rewrite the figure blocks of README.md and docs/figures.md from their output
# (scripts/figures.py), each stamped with the commit and the date.
#
# Long (most of an hour on 2 cores): each bench starts its own real servers.
# The fault tier needs PostgreSQL: DATABASE_URL=postgres://… (.ci/run's default
# is used when unset). A partial run keeps the blocks it did not measure:
#   FIGURES_BENCHES="a b"   only those benches
#   FIGURES_SKIP_FAULTS=1   keep the last fault figures (test-artifacts/faults.json)
# For tests: FIGURES_OUT (the JSON folder), FIGURES_FILES (the markdown files),
# FIGURES_BENCH_ARGS (extra bench arguments, e.g. --smoke).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
OUT="${FIGURES_OUT:-test-artifacts/figures}"
mkdir -p "$OUT"
render_args=()
if [[ -n "${FIGURES_BENCHES:-}" || "${FIGURES_SKIP_FAULTS:-0}" == "1" ]]; then
  render_args+=(--keep-missing)
fi
read -r -a bench_args <<<"${FIGURES_BENCH_ARGS:-}"

bash scripts/vllm/install.sh
benches="${FIGURES_BENCHES:-$(grep -l '^if __name__ == "__main__":' bench/*.py | xargs -n1 basename | sed 's/\.py$//' | sort)}"
failed=()
for bench in $benches; do
  echo "== bench.$bench (full mode) =="
  extra=()
  # scale's promotions section is bench.scale_promotions, which runs on its own here.
  [[ "$bench" == scale ]] && extra=(--sections tick,heal)
  if ! "$BIN/python" -m "bench.$bench" --json "$OUT/$bench.json" "${extra[@]}" "${bench_args[@]}"; then
    failed+=("$bench")
  fi
done

if [[ "${FIGURES_SKIP_FAULTS:-0}" != "1" ]]; then
  echo "== the fault tier =="
  DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}" \
    "$BIN/pytest" tests/faults -q -p no:randomly || failed+=("faults")
fi

read -r -a files <<<"${FIGURES_FILES:-README.md docs/figures.md}"
"$BIN/python" scripts/figures.py --results "$OUT" "${render_args[@]}" "${files[@]}" \
  || failed+=("figures.py")
if ((${#failed[@]})); then
  echo "make figures: FAILED: ${failed[*]} (their blocks keep the last figures)" >&2
  exit 1
fi
