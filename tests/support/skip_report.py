"""A pytest plugin: every run ends with a list of the tests that did not run
(skipped, xfailed, xpassed), each with its reason. With CI=true, any of them
that the reviewed allow-list (tests/skip_allowlist.toml) does not name fails
the run, so green in CI means "ran", not "was skipped quietly".

An allow-list entry names test ids (fnmatch pattern), the database backend it
holds for ("sqlite", "postgresql" or "any": CI runs on PostgreSQL, `make test`
locally on SQLite), optionally a text the skip's reason must contain, and why:

    [[allow]]
    tests = "tests/faults/*"
    backend = "sqlite"
    reason_contains = "needs PostgreSQL"
    why = "the fault tier's workers share the test database"

Loaded from pyproject's addopts (`-p tests.support.skip_report`).
"""

from __future__ import annotations

import fnmatch
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

DEFAULT_ALLOWLIST = "tests/skip_allowlist.toml"
BACKENDS = ("sqlite", "postgresql", "any")


@dataclass(frozen=True)
class Allowed:
    tests: str
    backend: str
    why: str
    reason_contains: str = ""

    def covers(self, outcome: NotRun, backend: str) -> bool:
        return (
            self.backend in ("any", backend)
            and fnmatch.fnmatchcase(outcome.nodeid, self.tests)
            and self.reason_contains in outcome.reason
        )


@dataclass(frozen=True)
class NotRun:
    nodeid: str
    kind: str  # skipped, xfailed, xpassed
    reason: str


def load_allowlist(path: Path) -> list[Allowed]:
    """The entries, each checked: a pattern, a known backend and a written reason."""
    if not path.exists():
        return []
    entries = tomllib.loads(path.read_text()).get("allow", [])
    allowed = []
    for number, entry in enumerate(entries, start=1):
        where = f"{path}: entry {number}"
        unknown = set(entry) - {"tests", "backend", "why", "reason_contains"}
        if unknown:
            raise pytest.UsageError(f"{where}: unknown keys {sorted(unknown)}")
        if not str(entry.get("tests", "")).strip():
            raise pytest.UsageError(f"{where}: `tests` (a test id pattern) is required")
        if entry.get("backend", "any") not in BACKENDS:
            raise pytest.UsageError(f"{where}: `backend` must be one of {', '.join(BACKENDS)}")
        if len(str(entry.get("why", "")).strip()) < 10:
            raise pytest.UsageError(f"{where}: `why` must say why the skip is legitimate")
        allowed.append(
            Allowed(
                tests=entry["tests"],
                backend=entry.get("backend", "any"),
                why=entry["why"].strip(),
                reason_contains=entry.get("reason_contains", ""),
            )
        )
    return allowed


def database_backend() -> str:
    """The backend this run's tests use: config/settings reads DATABASE_URL,
    and anything but PostgreSQL there means the embedded SQLite."""
    url = os.environ.get("DATABASE_URL", "")
    return "postgresql" if url.startswith(("postgres://", "postgresql://")) else "sqlite"


def strict() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_addoption(parser):
    parser.addoption(
        "--skip-allowlist",
        default=None,
        help=f"the reviewed list of tests allowed not to run (default: {DEFAULT_ALLOWLIST})",
    )


def pytest_configure(config):
    config.pluginmanager.register(SkipReport(config), "skip-report")


class SkipReport:
    def __init__(self, config) -> None:
        path = config.getoption("--skip-allowlist") or DEFAULT_ALLOWLIST
        self.path = Path(config.rootpath, path)
        self.allowed = load_allowlist(self.path)
        self.backend = database_backend()
        self.not_run: dict[str, NotRun] = {}

    def pytest_runtest_logreport(self, report) -> None:
        if hasattr(report, "wasxfail"):
            kind = "xfailed" if report.skipped else "xpassed"
            reason = report.wasxfail or "(no reason given)"
        elif report.skipped:
            kind = "skipped"
            reason = _skip_reason(report)
        else:
            return
        # One entry per test: a skip in setup and a report of teardown name one test.
        self.not_run.setdefault(report.nodeid, NotRun(report.nodeid, kind, reason))

    def pytest_collectreport(self, report) -> None:
        # A module-level pytest.skip() skips the whole file at collection.
        if report.skipped:
            self.not_run.setdefault(
                report.nodeid, NotRun(report.nodeid, "skipped", _skip_reason(report))
            )

    def unallowed(self) -> list[NotRun]:
        return sorted(
            (
                outcome
                for outcome in self.not_run.values()
                if not any(entry.covers(outcome, self.backend) for entry in self.allowed)
            ),
            key=lambda outcome: outcome.nodeid,
        )

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        if strict() and self.unallowed() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        write = terminalreporter.write_line
        outside = self.unallowed()
        terminalreporter.section("skip report")
        if not self.not_run:
            write("no test was skipped, xfailed or xpassed")
            return
        for outcome in sorted(self.not_run.values(), key=lambda o: o.nodeid):
            mark = "NOT ALLOWED" if outcome in outside else "allowed"
            write(f"{mark:<12}{outcome.kind:<9}{outcome.nodeid}: {outcome.reason}")
        allowed = len(self.not_run) - len(outside)
        write(
            f"{len(self.not_run)} test(s) skipped or xfail on {self.backend}: {allowed} allowed by "
            f"{self.path.name}, {len(outside)} not"
        )
        if outside and strict():
            terminalreporter.write_line(
                f"CI=true: {len(outside)} test(s) skipped or xfail and not in the allow-list "
                f"({self.path}); the run FAILS: "
                + ", ".join(outcome.nodeid for outcome in outside),
                red=True,
                bold=True,
            )
        elif outside:
            write("(local run: not failing; with CI=true these would fail the run)")


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
        return reason.removeprefix("Skipped: ")
    return str(longrepr)
