"""scripts/figures.py renders bench and fault figures into marked blocks, from
the JSON the benches write (bench/results.py) and the fault tier's file."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from bench.results import Results

REPO = Path(__file__).resolve().parents[2]

DOC = """# Title
Prose before stays.

<!-- figures:demo:start -->
old figures
<!-- figures:demo:end -->

Between.

<!-- figures:demo.latency:start -->
<!-- figures:demo.latency:end -->

<!-- figures:faults:start -->
stale
<!-- figures:faults:end -->
Prose after stays.
"""

FAULTS = {
    "run": {
        "finished_at": "2026-12-01T12:00:00+00:00", "commit": "abc1234", "dirty": False,
        "machine": "ci (2 cores)", "tier_seconds": 205.0, "database": "postgresql",
    },
    "scenarios": [
        {"scenario": "2. Redis restarted", "limit_seconds": 60, "converged_seconds": 3.1,
         "rows_stuck": 0, "audit_events_lost": 0, "chain_ok": True},
        {"scenario": "1. worker SIGKILLed", "limit_seconds": 60, "converged_seconds": None,
         "rows_stuck": 1, "audit_events_lost": 0, "chain_ok": False},
    ],
}  # fmt: skip


def write_demo_results(folder: Path) -> None:
    results = Results("demo", argparse.Namespace(smoke=False, json=folder / "demo.json"))
    table = results.table("latency", ["case", "median ms"], "demo latency")
    table.row("product", 123.4)
    table.row("bare", 45.67)
    results.verdict("overhead", 2.7, target="<= 1.5x", met=False)
    results.note("latency model: zero")
    results.write()


def render(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "scripts/figures.py", "--results", str(tmp_path / "results"),
         "--faults", str(tmp_path / "faults.json"), str(tmp_path / "doc.md"), *extra],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_blocks_are_rendered_from_the_json_and_nothing_else_changes(tmp_path):
    write_demo_results(tmp_path / "results")
    (tmp_path / "faults.json").write_text(json.dumps(FAULTS))
    (tmp_path / "doc.md").write_text(DOC)

    result = render(tmp_path)

    assert result.returncode == 0, result.stderr
    text = (tmp_path / "doc.md").read_text()
    assert "old figures" not in text and "stale" not in text
    for kept in ("# Title\nProse before stays.\n", "\nBetween.\n", "Prose after stays.\n"):
        assert kept in text
    demo = text.split("<!-- figures:demo:start -->\n")[1].split("<!-- figures:demo:end -->")[0]
    assert "| case | median ms |\n| --- | --- |\n| product | 123 |\n| bare | 45.7 |" in demo
    assert "- overhead: 2.70x (target <= 1.5x: **MISSED**)" in demo
    assert "latency model: zero" in demo
    assert "_Measured at " in demo and " UTC, " in demo
    one = text.split("<!-- figures:demo.latency:start -->\n")[1].split("<!-- figures:")[0]
    assert "| product | 123 |" in one and "overhead" not in one
    faults = text.split("<!-- figures:faults:start -->\n")[1].split("<!-- figures:")[0]
    rows = [
        line for line in faults.splitlines() if line.startswith("| 1.") or line.startswith("| 2.")
    ]
    assert rows == [
        "| 1. worker SIGKILLed | **not within 60 s** | 1 | 0 | **broken** |",
        "| 2. Redis restarted | 3.1 s (limit 60 s) | 0 | 0 | verified |",
    ]
    assert "at abc1234 on 2026-12-01T12:00:00+00:00" in faults

    again = render(tmp_path)
    assert again.returncode == 0
    assert (tmp_path / "doc.md").read_text() == text  # rendering twice changes nothing


def test_a_block_without_figures_fails_and_is_left_as_it_was(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "doc.md").write_text(DOC)

    result = render(tmp_path)

    assert result.returncode == 1
    assert "NO FIGURES for demo, demo.latency, faults" in result.stderr
    assert (tmp_path / "doc.md").read_text() == DOC
    assert render(tmp_path, "--keep-missing").returncode == 0


def test_docs_figures_page_has_a_block_for_every_bench_and_the_fault_tier():
    from tests.bench.test_bench_smoke import benches_with_main

    text = (REPO / "docs" / "figures.md").read_text()
    for name in [*benches_with_main(), "faults"]:
        assert f"<!-- figures:{name}:start -->" in text and f"<!-- figures:{name}:end -->" in text


def test_the_summary_block_takes_each_bench_headlines_and_the_fault_outcome(tmp_path):
    from scripts.figures import SUMMARY

    for index, name in enumerate(SUMMARY):
        results = Results(name, argparse.Namespace(json=tmp_path / "results" / f"{name}.json"))
        results.table("t", ["a"]).row(1)
        results.headline(f"what {index}", f"{index} ms", "bare", "< 1 s: met")
        results.write()
    (tmp_path / "faults.json").write_text(json.dumps(FAULTS))
    doc = "<!-- figures:summary:start -->\n<!-- figures:summary:end -->\n"
    (tmp_path / "doc.md").write_text(doc)

    assert render(tmp_path).returncode == 0
    text = (tmp_path / "doc.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| what ")][1:]
    assert rows == [f"| what {i} | {i} ms | bare | < 1 s: met |" for i in range(len(SUMMARY))]
    assert (
        "| fault tier, 2 cases | **1 did not converge**, 1 rows stuck, 0 audit events lost, "
        "**audit chain not verified in 1** | each scenario's limit | **MISSED** |"
    ) in text

    # Every case converged, nothing stuck or lost, but one chain unchecked
    # (a scenario that never settled): the fault tier's target is not met.
    clean = [{**row, "converged_seconds": 1.0, "rows_stuck": 0} for row in FAULTS["scenarios"]]
    clean[1] = {**clean[1], "chain_ok": None}
    (tmp_path / "faults.json").write_text(json.dumps({**FAULTS, "scenarios": clean}))
    (tmp_path / "doc.md").write_text(doc)
    assert render(tmp_path).returncode == 0
    assert (
        "| fault tier, 2 cases | all converge, 0 rows stuck, 0 audit events lost, "
        "**audit chain not verified in 1** | each scenario's limit | **MISSED** |"
    ) in (tmp_path / "doc.md").read_text()
    clean[1] = {**clean[1], "chain_ok": True}
    (tmp_path / "faults.json").write_text(json.dumps({**FAULTS, "scenarios": clean}))
    (tmp_path / "doc.md").write_text(doc)
    assert render(tmp_path).returncode == 0
    assert (
        "| fault tier, 2 cases | all converge, 0 rows stuck, 0 audit events lost, "
        "audit chain verified in every case | each scenario's limit | met |"
    ) in (tmp_path / "doc.md").read_text()

    (tmp_path / "results" / f"{SUMMARY[0]}.json").unlink()
    (tmp_path / "doc.md").write_text(doc)
    assert render(tmp_path).returncode == 1  # a summary with a bench missing is not rendered
    assert (tmp_path / "doc.md").read_text() == doc


def test_make_figures_runs_the_benches_and_renders_their_blocks(tmp_path):
    """scripts/figures.sh end to end, on one quick bench in smoke mode, into a
    file of the test's own (a full `make figures` takes most of an hour)."""
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- figures:tensor_values:start -->\n<!-- figures:tensor_values:end -->\n")
    env = {
        **{k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "VAR_DIR"}},
        "FIGURES_BENCHES": "tensor_values",
        "FIGURES_SKIP_FAULTS": "1",
        "FIGURES_OUT": str(tmp_path / "out"),
        "FIGURES_FILES": str(doc),
        "FIGURES_BENCH_ARGS": "--smoke",
    }
    result = subprocess.run(
        ["bash", "scripts/figures.sh"], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert json.loads((tmp_path / "out" / "tensor_values.json").read_text())["smoke"] is True
    text = doc.read_text()
    assert "| sha256 (baseline), staging, 1 MiB chunks |" in text
    assert "SMOKE mode" in text
