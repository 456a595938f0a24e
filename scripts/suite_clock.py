"""The clock of `make test`: prints the pytest time of each run and each tier,
and under CI=true fails when pytest took longer than the guard, naming the
slowest tiers, so that a slow creep is caught long before CI's hard limit.

    python scripts/suite_clock.py TIMES_FILE [--limit-minutes 70] [--file-seconds OUT]

TIMES_FILE holds JSON lines:
- {"run": name, "wall": seconds, "exit": code} from scripts/test_runs.sh, one
  per pytest run, and {"total": seconds, "side_by_side": 0|1} once at the end
  (the runs' walls add up to the total only when they ran one after the other);
- {"tier": name, "seconds": s, "tests": n} from tests/support/tier_clock.py,
  one per tier per run, and {"file": path, "seconds": s} for every file of the
  heavy tiers: --file-seconds writes those to OUT, which should be
  tests/support/heavy_file_seconds.json (the order in which the heavy run hands
  out its files, tests/support/file_order.py); `SUITE_FILE_SECONDS=<that path>
  make test` refreshes it;
- {"vllm_boot": name} from tests/support/vllm_servers.py for every real vLLM
  start (the benches' subprocesses included).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

LIMIT_MINUTES = 70.0


def read(path: Path) -> tuple[list[dict], dict[str, float], dict[str, int], dict | None, int]:
    """The runs, each tier's seconds and tests, the whole, and the vLLM starts."""
    boots = 0
    runs: list[dict] = []
    whole: dict | None = None
    tiers: dict[str, float] = defaultdict(float)
    tests: dict[str, int] = defaultdict(int)
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        if "run" in entry:
            runs.append(entry)
        elif "total" in entry:
            whole = entry
        elif "tier" in entry:  # a file's line is write_file_seconds'
            tiers[entry["tier"]] += entry["seconds"]
            tests[entry["tier"]] += entry["tests"]
        elif "vllm_boot" in entry:
            boots += 1
    return runs, tiers, tests, whole, boots


def report(path: Path, *, limit_minutes: float, strict: bool) -> tuple[list[str], bool]:
    """The lines to print, and whether the guard fails the run."""
    runs, tiers, tests, whole, boots = read(path)
    total = whole["total"] if whole else sum(run["wall"] for run in runs)
    side_by_side = bool(whole and whole.get("side_by_side"))
    lines = ["", "== pytest time of make test =="]
    for run in runs:
        lines.append(f"run {run['run']:<10}{run['wall'] / 60:6.1f} min  (exit {run['exit']})")
    how = "the runs side by side; " if side_by_side else ""
    lines.append(
        f"pytest total  {total / 60:6.1f} min  ({how}guard: {limit_minutes:g} min under CI=true)"
    )
    slowest = sorted(tiers.items(), key=lambda item: -item[1])
    lines.append("tier (time its tests kept a worker busy):")
    for tier, seconds in slowest:
        lines.append(f"  {tier:<12}{seconds / 60:6.1f} min  ({tests[tier]} tests)")
    # A real vLLM start is about 30 s of one core (tests/support/vllm_servers.py).
    lines.append(f"real vLLM servers started: {boots}")
    over = total > limit_minutes * 60
    if over:
        named = ", ".join(f"{tier} ({seconds / 60:.1f} min)" for tier, seconds in slowest[:3])
        verdict = "FAILS" if strict else "would fail under CI=true"
        lines.append(
            f"pytest took {total / 60:.1f} min, past the {limit_minutes:g}-minute guard: "
            f"the run {verdict}; the slowest tiers: {named}"
        )
    return lines, over and strict


def write_file_seconds(path: Path, out: Path) -> int:
    seconds = {}
    for line in path.read_text().splitlines():
        entry = json.loads(line) if line.strip() else {}
        if "file" in entry:
            seconds[entry["file"]] = entry["seconds"]
    ordered = dict(sorted(seconds.items(), key=lambda item: (-item[1], item[0])))
    out.write_text(json.dumps(ordered, indent=1) + "\n")
    return len(ordered)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("times", type=Path)
    parser.add_argument("--limit-minutes", type=float, default=LIMIT_MINUTES)
    parser.add_argument("--file-seconds", type=Path, help="write the heavy files' seconds here")
    args = parser.parse_args(argv)
    if args.file_seconds:
        count = write_file_seconds(args.times, args.file_seconds)
        print(f"the heavy files' seconds ({count} files) written to {args.file_seconds}")
    strict = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    lines, fails = report(args.times, limit_minutes=args.limit_minutes, strict=strict)
    print("\n".join(lines))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
