"""The heavy run's file order (tests/support/file_order.py): under
--dist loadfile the slowest files are handed out first; elsewhere nothing
moves; and the weights name files that exist."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tests.support import file_order

REPO = Path(__file__).resolve().parents[1]


def items(*nodeids: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(nodeid=nodeid) for nodeid in nodeids]


def config(dist: str) -> SimpleNamespace:
    return SimpleNamespace(option=SimpleNamespace(dist=dist))


def test_the_slowest_file_goes_first_and_a_files_tests_keep_their_order(monkeypatch):
    monkeypatch.setattr(
        file_order, "file_seconds", lambda: {"tests/slow.py": 300, "tests/middling.py": 60}
    )
    collected = items(
        "tests/fast.py::test_one",
        "tests/middling.py::test_one",
        "tests/slow.py::test_b",
        "tests/slow.py::test_a",
        "tests/unknown.py::test_one",
    )

    file_order.pytest_collection_modifyitems(config("loadfile"), collected)

    assert [item.nodeid for item in collected] == [
        "tests/slow.py::test_b",
        "tests/slow.py::test_a",
        "tests/middling.py::test_one",
        # Neither is in the weights: DEFAULT_SECONDS each, in collection order.
        "tests/fast.py::test_one",
        "tests/unknown.py::test_one",
    ]


def test_an_unknown_file_counts_as_the_default(monkeypatch):
    monkeypatch.setattr(file_order, "file_seconds", lambda: {"tests/quick.py": 1})
    collected = items("tests/quick.py::test", "tests/new.py::test")

    file_order.pytest_collection_modifyitems(config("loadfile"), collected)

    assert [item.nodeid for item in collected] == ["tests/new.py::test", "tests/quick.py::test"]


def test_nothing_moves_outside_loadfile(monkeypatch):
    monkeypatch.setattr(file_order, "file_seconds", lambda: {"tests/slow.py": 300})
    nodeids = ["tests/fast.py::test", "tests/slow.py::test"]
    for dist in ("no", "load", "loadscope"):
        collected = items(*nodeids)
        file_order.pytest_collection_modifyitems(config(dist), collected)
        assert [item.nodeid for item in collected] == nodeids, dist


def test_the_weights_name_test_files_that_exist():
    stale = [path for path in file_order.file_seconds() if not (REPO / path).is_file()]

    assert file_order.file_seconds(), "no weights"
    assert stale == [], f"refresh {file_order.WEIGHTS.name} (SUITE_FILE_SECONDS): {stale}"
