"""No import cycle anywhere in the project: every module's imports, those inside
functions included (grimp reads every import statement), form a graph without a
circle. A cycle closed by an import inside a function still means two modules
that each need the other; the fix is a shared piece moved down, a signal, or a
public function, never a later import."""

from __future__ import annotations

import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "core",
    "registry",
    "serving",
    "mlflow_bridge",
    "observability",
    "sso",
    "notifications",
    "config",
)


def import_cycles(*packages: str) -> list[list[str]]:
    """Every set of modules that import each other round in a circle (the
    strongly connected components of the import graph larger than one module),
    each sorted, with the modules' own imports of themselves left out."""
    graph = grimp.build_graph(*packages, cache_dir=None)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    # Iterative Tarjan: the graph is deep enough to exhaust recursion.
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            module, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[module] = min(low[module], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_no_import_cycle_in_the_project(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    assert import_cycles(*PACKAGES) == []


def test_a_cycle_closed_inside_a_function_is_found(tmp_path, monkeypatch):
    # Proves the check can fail, and sees the import a function makes late.
    package = tmp_path / "circle"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "engine.py").write_text("from circle import canary\n")
    (package / "canary.py").write_text("def run():\n    from circle.engine import step\n")
    (package / "alone.py").write_text("from circle import canary\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "circle", raising=False)
    assert import_cycles("circle") == [["circle.canary", "circle.engine"]]
