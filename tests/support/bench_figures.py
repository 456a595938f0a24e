"""What every bench run in the suite must write (tests/bench, and the tests
that run a bench at a larger size instead of its smoke)."""

from __future__ import annotations

from scripts.figures import SUMMARY


def check_figures(name: str, figures: dict | None, output: str) -> None:
    """What every bench run in the suite must write: figures with rows, and the
    headlines the README's summary takes from it."""
    assert figures is not None, f"bench.{name} wrote no figures:\n{output[-2000:]}"
    tables = figures["tables"]
    assert tables and all(table["rows"] for table in tables.values()), tables
    if name in SUMMARY:  # the README's summary block needs its rows
        assert figures["headlines"], f"bench.{name} wrote no headline for the summary"
