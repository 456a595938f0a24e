"""Apps depend one way: core <- registry <- serving <- mlflow_bridge. The
registry knows nothing of serving or the MLflow app; core knows no app.
Cross-app events travel as signals instead."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FORBIDDEN = {
    "core": {"registry", "serving", "mlflow_bridge"},
    "registry": {"serving", "mlflow_bridge"},
    "serving": {"mlflow_bridge"},
}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("app", sorted(FORBIDDEN))
def test_an_app_never_imports_the_apps_built_on_it(app):
    sources = [p for p in (ROOT / app).rglob("*.py") if "migrations" not in p.parts]
    assert sources, f"no Python files under {app}/"
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_packages(path) & FORBIDDEN[app])
        for path in sources
        if imported_packages(path) & FORBIDDEN[app]
    }
    assert offenders == {}
