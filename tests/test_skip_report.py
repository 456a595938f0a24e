"""The skip report (tests/support/skip_report.py), run on small suites of its
own through pytester: what it lists, and when CI=true makes a skip fail the run."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

SUITE = """
import pytest

def test_runs():
    pass

def test_skipped():
    pytest.skip("no widget here")

@pytest.mark.xfail(reason="known widget bug")
def test_xfails():
    assert False

@pytest.mark.xfail(reason="fixed widget bug")
def test_xpasses():
    pass

@pytest.fixture
def needs_widget():
    pytest.skip("widget fixture missing")

def test_skipped_in_setup(needs_widget):
    pass
"""

ALLOW_SKIPPED = """
[[allow]]
tests = "test_suite.py::test_skipped"
backend = "any"
why = "the widget exists only on other machines"
"""


@pytest.fixture
def run(pytester, monkeypatch):
    monkeypatch.delenv("DATABASE_URL", raising=False)

    def run(*, ci: bool, allowlist: str = "", suite: str = SUITE, extra: tuple[str, ...] = ()):
        monkeypatch.setenv("CI", "true" if ci else "")
        pytester.makepyfile(test_suite=suite)
        pytester.path.joinpath("allow.toml").write_text(allowlist)
        return pytester.runpytest_inprocess(
            "-p", "no:django", "-p", "tests.support.skip_report",
            "--skip-allowlist", "allow.toml", "-p", "no:cacheprovider", *extra,
        )  # fmt: skip

    return run


def test_the_report_lists_every_test_that_did_not_run_with_its_reason(run):
    result = run(ci=False)
    result.stdout.fnmatch_lines(
        [
            "*skip report*",
            "NOT ALLOWED skipped  test_suite.py::test_skipped: no widget here",
            "NOT ALLOWED skipped  test_suite.py::test_skipped_in_setup: widget fixture missing",
            "NOT ALLOWED xfailed  test_suite.py::test_xfails: known widget bug",
            "NOT ALLOWED xpassed  test_suite.py::test_xpasses: fixed widget bug",
            "4 test(s) skipped or xfail on sqlite: 0 allowed by allow.toml, 4 not",
            "*local run: not failing*",
        ]
    )
    assert result.ret == pytest.ExitCode.OK


def test_under_ci_a_skip_outside_the_allow_list_fails_the_run_and_is_named(run):
    result = run(ci=True, allowlist=ALLOW_SKIPPED)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "allowed     skipped  test_suite.py::test_skipped: no widget here",
            "CI=true: 3 test(s) skipped or xfail and not in the allow-list*the run FAILS: "
            "test_suite.py::test_skipped_in_setup, test_suite.py::test_xfails, "
            "test_suite.py::test_xpasses",
        ]
    )


def test_on_two_xdist_workers_the_report_still_lists_every_skip_and_fails_under_ci(run):
    """make test's light run is on two pytest-xdist workers (scripts/test_runs.sh):
    the skips happen in the workers and must still reach the report."""
    result = run(ci=True, allowlist=ALLOW_SKIPPED, extra=("-n", "2"))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "allowed     skipped  test_suite.py::test_skipped: no widget here",
            "NOT ALLOWED skipped  test_suite.py::test_skipped_in_setup: widget fixture missing",
            "4 test(s) skipped or xfail on sqlite: 1 allowed by allow.toml, 3 not",
            "CI=true: 3 test(s) skipped or xfail and not in the allow-list*",
        ]
    )


def test_on_two_xdist_workers_a_module_skipped_at_collection_is_reported(run, pytester):
    pytester.makepyfile(test_other="def test_runs():\n    pass\n")
    suite = "import pytest\npytest.skip('no widget module', allow_module_level=True)\n"
    result = run(ci=True, suite=suite, extra=("-n", "2"))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["NOT ALLOWED skipped  test_suite.py: no widget module"])


def test_under_ci_a_run_whose_skips_are_all_allowed_passes(run):
    allowlist = """
[[allow]]
tests = "test_suite.py::test_*"
backend = "any"
why = "every widget test is optional in this toy suite"
"""
    result = run(ci=True, allowlist=allowlist)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["4 test(s) skipped or xfail on sqlite: 4 allowed*, 0 not"])


def test_an_entry_for_one_backend_does_not_cover_the_other(run, monkeypatch):
    allowlist = """
[[allow]]
tests = "test_suite.py::*"
backend = "sqlite"
why = "exists only for the embedded database"
"""
    suite = "import pytest\ndef test_skipped():\n    pytest.skip('needs sqlite')\n"
    assert run(ci=True, allowlist=allowlist, suite=suite).ret == pytest.ExitCode.OK
    monkeypatch.setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/x")
    result = run(ci=True, allowlist=allowlist, suite=suite)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*skipped or xfail on postgresql: 0 allowed*, 1 not"])


def test_an_entry_with_reason_contains_covers_only_that_reason(run):
    allowlist = """
[[allow]]
tests = "test_suite.py::*"
backend = "any"
reason_contains = "widget fixture"
why = "the widget fixture is optional in this toy suite"
"""
    result = run(ci=True, allowlist=allowlist)
    result.stdout.fnmatch_lines(
        [
            "NOT ALLOWED skipped  test_suite.py::test_skipped: no widget here",
            "allowed     skipped  test_suite.py::test_skipped_in_setup: widget fixture missing",
        ]
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_a_failing_run_keeps_its_own_exit_status(run):
    suite = (
        "import pytest\ndef test_fails():\n    assert False\ndef test_s():\n    pytest.skip('x')\n"
    )
    assert run(ci=True, suite=suite).ret == pytest.ExitCode.TESTS_FAILED


def test_an_entry_without_a_written_reason_is_refused(run):
    result = run(ci=True, allowlist='[[allow]]\ntests = "*"\nbackend = "any"\n')
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*entry 1: `why` must say why the skip is legitimate*"])


def test_the_repository_allow_list_is_valid_and_holds_only_for_sqlite():
    """CI runs on PostgreSQL: nothing may be allowed to skip there (the fault tier
    and the race tests exist for PostgreSQL)."""
    from pathlib import Path

    from tests.support.skip_report import DEFAULT_ALLOWLIST, load_allowlist

    entries = load_allowlist(Path(__file__).resolve().parents[1] / DEFAULT_ALLOWLIST)
    assert entries
    assert {entry.backend for entry in entries} == {"sqlite"}
