"""What every benchmark shares for its output: `--smoke` (tiny sizes, the same
real parts, a few seconds: tests/bench runs each so a bench that no longer
runs fails CI) and `--json PATH` (its figures, machine-readable, for
scripts/figures.py to render into the README and docs/figures.md).

    results = Results("promote_to_served", args)
    table = results.table("overhead", ["case", "median ms", "p95 ms"])
    table.row("product, 1 replica", 41, 55)
    results.verdict("overhead, 1 replica", 1.62, target="<= 1.5x", met=False)
    results.note("latency model: real vLLM 0.32")
    results.write()            # to args.json, if given
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, a few seconds, the same real parts: proves the bench runs",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here (JSON)")


def seed_sqlite(var_dir: Path) -> None:
    """With BENCH_SQLITE_TEMPLATE (a migrated SQLite file; tests/bench makes one
    per tier), start from a copy, so `migrate` has nothing left to do: the smoke
    tier pays for the migrations once, not once per bench. Never with DATABASE_URL."""
    import os
    import shutil

    template = os.environ.get("BENCH_SQLITE_TEMPLATE")
    if template and not os.environ.get("DATABASE_URL"):
        Path(var_dir).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, Path(var_dir) / "db.sqlite3")


def commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=10,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def cell(value) -> str | int | float | None:
    """A JSON-safe table cell; floats keep 3 significant decimals' worth."""
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return str(value)
        return round(value, 4)
    if value is None or isinstance(value, int | str):
        return value
    return str(value)


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list] = field(default_factory=list)

    def row(self, *cells) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{self.title}: {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append([cell(c) for c in cells])


@dataclass
class Results:
    bench: str
    args: argparse.Namespace
    tables: dict[str, Table] = field(default_factory=dict)
    verdicts: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    headlines: list[dict] = field(default_factory=list)
    data: dict = field(default_factory=dict)  # anything else the bench measured

    def table(self, name: str, columns: list[str], title: str = "") -> Table:
        self.tables[name] = Table(title or name, columns)
        return self.tables[name]

    def verdict(self, label: str, value: float, *, target: str, met: bool, unit: str = "x"):
        self.verdicts.append(
            {"label": label, "value": cell(value), "unit": unit, "target": target, "met": met}
        )
        return "met" if met else "MISSED"

    def note(self, text: str) -> None:
        self.notes.append(text)

    def headline(self, what: str, figure: str, baseline: str, target: str = "") -> None:
        """A row of the README's summary table (scripts/figures.py, block `summary`)."""
        self.headlines.append(
            {"what": what, "figure": figure, "baseline": baseline, "target": target}
        )

    def as_dict(self) -> dict:
        return {
            "bench": self.bench,
            "commit": commit(),
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "host": f"{platform.machine()}, {_cpus()} CPU",
            "smoke": bool(getattr(self.args, "smoke", False)),
            "command": " ".join(["python -m bench." + self.bench, *sys.argv[1:]]),
            "tables": {
                name: {"title": t.title, "columns": t.columns, "rows": t.rows}
                for name, t in self.tables.items()
            },
            "verdicts": self.verdicts,
            "notes": self.notes,
            "headlines": self.headlines,
            "data": self.data,
        }

    def write(self) -> None:
        path = getattr(self.args, "json", None)
        if not path:
            return
        if not any(t.rows for t in self.tables.values()):
            raise RuntimeError(f"{self.bench}: no figures to write")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.as_dict(), indent=2) + "\n")
        print(f"figures written to {path}")


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
