"""Render the benchmarks' and the fault tier's figures into marked blocks of
markdown files (`make figures` runs the benches and the tier first).

    python scripts/figures.py [--results DIR] [--faults FILE] README.md docs/figures.md

A block is

    <!-- figures:NAME:start -->
    (anything: replaced)
    <!-- figures:NAME:end -->

where NAME is a bench (`promote_to_served`: every table, verdict and note it
wrote with `--json`, bench/results.py), one of its tables
(`promote_to_served.cases`), `faults` (the fault tier's convergence table,
from test-artifacts/faults.json, written by tests/faults/conftest.py), or
`summary` (the README's table: each bench's headlines, in SUMMARY order, and
the fault tier's outcome, its audit chain's check included). Each block
ends with the commit and date of the run it came from. A block whose figures
are missing fails the run (exit 1) and is left as it was, unless
--keep-missing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RESULTS = REPO_ROOT / "test-artifacts" / "figures"
DEFAULT_FAULTS = REPO_ROOT / "test-artifacts" / "faults.json"
BLOCK = re.compile(
    r"(?P<start><!-- figures:(?P<name>[\w.-]+):start -->\n)(?P<body>.*?)"
    r"(?P<end><!-- figures:(?P=name):end -->)",
    re.DOTALL,
)


def load_results(results_dir: Path, faults_file: Path) -> dict[str, dict]:
    found = {}
    for path in sorted(results_dir.glob("*.json")) if results_dir.is_dir() else []:
        data = json.loads(path.read_text())
        found[data["bench"]] = data
    if faults_file.is_file():
        found["faults"] = {"faults": json.loads(faults_file.read_text())}
    return found


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}"
    return str(value).replace("|", "\\|")


def markdown_table(table: dict) -> list[str]:
    lines = [
        "| " + " | ".join(table["columns"]) + " |",
        "| " + " | ".join("---" for _ in table["columns"]) + " |",
    ]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in table["rows"]]
    return lines


def _verdict(verdict: dict) -> str:
    value = verdict["value"]
    shown = (
        f"{value:.2f}{verdict['unit']}"
        if verdict["unit"] == "x"
        else f"{_cell(value)} {verdict['unit']}"
    )
    state = "met" if verdict["met"] else "**MISSED**"
    return f"- {verdict['label']}: {shown} (target {verdict['target']}: {state})"


def _footer(data: dict) -> str:
    smoke = " (SMOKE mode: tiny sizes, not figures to quote)" if data.get("smoke") else ""
    return (
        f"_Measured at {data['commit']} on {data['date']}, {data['host']}: "
        f"`{data['command']}`{smoke}._"
    )


def render_bench(data: dict, table_name: str | None = None) -> list[str]:
    lines: list[str] = []
    tables = data["tables"]
    names = [table_name] if table_name else list(tables)
    for name in names:
        table = tables[name]
        if not table_name and len(names) > 1:
            lines += [f"**{table['title']}**", ""]
        lines += markdown_table(table) + [""]
    if not table_name:
        lines += [_verdict(v) for v in data.get("verdicts", [])]
        if data.get("verdicts"):
            lines.append("")
        for note in data.get("notes", []):
            lines += [note, ""]
    lines.append(_footer(data))
    return lines


def _chain(row: dict) -> str:
    # `manage.py audit_verify` on the hash chain after the scenario
    # (tests/faults/conftest.py Measure.settle); None: the scenario never settled.
    return {True: "verified", False: "**broken**"}.get(row.get("chain_ok"), "not checked")


def fault_rows(rows: list[dict]) -> list[str]:
    """The fault table, one row per scenario; tests/faults/conftest.py writes
    the same table to test-artifacts/faults.md."""
    lines = [
        "| scenario | converged after the fault ended | rows left stuck | audit events lost "
        "| audit chain |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in sorted(rows, key=lambda r: r["scenario"]):
        seconds = row["converged_seconds"]
        shown = (
            f"{seconds:.1f} s (limit {row['limit_seconds']:.0f} s)"
            if seconds is not None
            else f"**not within {row['limit_seconds']:.0f} s**"
        )
        lines.append(
            f"| {row['scenario']} | {shown} | {row['rows_stuck']} | {row['audit_events_lost']} "
            f"| {_chain(row)} |"
        )
    return lines


def render_faults(faults: dict) -> list[str]:
    run = faults["run"]
    dirty = " (uncommitted changes)" if run.get("dirty") else ""
    return fault_rows(faults["scenarios"]) + [
        "",
        f"_Measured by the fault tier at {run['commit']}{dirty} on {run['finished_at']}, "
        f"{run['machine']}, {run['database']}; the tier took {run['tier_seconds']:.0f} s._",
    ]


# The benches whose headlines make the README's summary, in its order.
SUMMARY = [
    "promote_to_served",
    "scale",
    "scale_promotions",
    "new_pod_to_served",
    "upload_throughput",
    "swap_under_traffic",
    "swap_through_gateway",
    "door_overhead",
    "placement",
    "many_adapters",
]


def render_summary(results: dict[str, dict]) -> list[str] | None:
    if any(name not in results for name in [*SUMMARY, "faults"]):
        return None
    lines = [
        "| what | figure | baseline, same run | target |",
        "| --- | --- | --- | --- |",
    ]
    for name in SUMMARY:
        for row in results[name].get("headlines", []):
            cells = [row["what"], row["figure"], row["baseline"], row["target"]]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    faults = results["faults"]["faults"]
    scenarios = faults["scenarios"]
    late = [r for r in scenarios if r["converged_seconds"] is None]
    stuck = sum(r["rows_stuck"] for r in scenarios)
    lost = sum(r["audit_events_lost"] for r in scenarios)
    # A scenario whose chain was not checked (chain_ok None) is not a verified one.
    unverified = [r for r in scenarios if r.get("chain_ok") is not True]
    chain = (
        "audit chain verified in every case"
        if not unverified
        else f"**audit chain not verified in {len(unverified)}**"
    )
    figure = (
        "all converge" if not late else f"**{len(late)} did not converge**"
    ) + f", {stuck} rows stuck, {lost} audit events lost, {chain}"
    met = not late and not stuck and not lost and not unverified
    lines.append(
        f"| fault tier, {len(scenarios)} cases | {figure} | each scenario's limit | "
        f"{'met' if met else '**MISSED**'} |"
    )
    stamps = sorted({results[name]["commit"] for name in SUMMARY} | {faults["run"]["commit"]})
    dates = sorted(results[name]["date"] for name in SUMMARY)
    lines += [
        "",
        f"_Measured by `make figures` at {', '.join(stamps)}, {dates[0]} to {dates[-1]}._",
    ]
    return lines


def render(name: str, results: dict[str, dict]) -> list[str] | None:
    if name == "summary":
        return render_summary(results)
    bench, _, table = name.partition(".")
    data = results.get(bench)
    if data is None:
        return None
    if bench == "faults":
        return render_faults(data["faults"])
    if table and table not in data["tables"]:
        return None
    return render_bench(data, table or None)


def rewrite(text: str, results: dict[str, dict]) -> tuple[str, list[str], list[str]]:
    """The text with every block rendered; (text, names rendered, names missing)."""
    rendered, missing = [], []

    def replace(match: re.Match) -> str:
        lines = render(match["name"], results)
        if lines is None:
            missing.append(match["name"])
            return match[0]
        rendered.append(match["name"])
        return match["start"] + "\n".join(lines) + "\n" + match["end"]

    return BLOCK.sub(replace, text), rendered, missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--faults", type=Path, default=DEFAULT_FAULTS)
    parser.add_argument("--keep-missing", action="store_true")
    args = parser.parse_args(argv)
    results = load_results(args.results, args.faults)
    failed = False
    for path in args.files:
        text, rendered, missing = rewrite(path.read_text(), results)
        path.write_text(text)
        print(f"{path}: {len(rendered)} block(s) rendered: {', '.join(rendered) or '-'}")
        if missing:
            print(
                f"{path}: NO FIGURES for {', '.join(missing)} (left as they were)", file=sys.stderr
            )
            failed = failed or not args.keep_missing
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
