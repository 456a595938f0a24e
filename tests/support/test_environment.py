"""Environment for the test run, set before Django reads its settings."""

import os
import re
import shutil
import tempfile

import pytest

_SHORT_BASETEMP = pytest.StashKey[str]()


def _broker_of_this_worker(url: str, worker: str) -> str:
    """A pytest-xdist worker's own Redis database: the run's number plus the
    worker's (gw0 +0, gw1 +1), so one worker's queue purges and consumers never
    meet another's tasks. scripts/test_runs.sh spaces the runs' numbers apart."""
    found = re.fullmatch(r"(rediss?://[^/]+)/(\d+)", url)
    index = re.fullmatch(r"gw(\d+)", worker)
    if not found or not index:
        return url
    return f"{found[1]}/{int(found[2]) + int(index[1])}"


if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("CELERY_BROKER_URL"):
    os.environ["CELERY_BROKER_URL"] = _broker_of_this_worker(
        os.environ["CELERY_BROKER_URL"], os.environ["PYTEST_XDIST_WORKER"]
    )
os.environ.setdefault("DJANGO_SECRET_KEY", "test-only-secret-key-not-for-production")
os.environ.setdefault("VAR_DIR", tempfile.mkdtemp(prefix="registry-test-var-"))
# The test client and the browser tier speak plain http to the test server.
os.environ.setdefault("DJANGO_SECURE_SSL_REDIRECT", "false")
os.environ.setdefault("DJANGO_SECURE_COOKIES", "false")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """Under pytest-xdist (-n) each worker's tmp_path is a folder deeper
    (popen-gwN), and HAProxy refuses a stats socket path over 97 characters: a
    front door's admin.sock lives in its gateway folder under tmp_path, and
    /tmp/pytest-of-root/pytest-123/popen-gw0/<test name>/gateways/<name>/admin.sock
    passed it. The controller takes a shorter base folder (before the tmp_path
    factory reads it; the workers get theirs under it), removed after a green run
    (a failed run keeps it, named in the summary, for its logs)."""
    controller = not hasattr(config, "workerinput")
    if controller and getattr(config.option, "numprocesses", None) and not config.option.basetemp:
        config.option.basetemp = tempfile.mkdtemp(prefix="pt")
        config.stash[_SHORT_BASETEMP] = config.option.basetemp


def pytest_sessionfinish(session, exitstatus):
    short = session.config.stash.get(_SHORT_BASETEMP, None)
    if short and exitstatus == pytest.ExitCode.OK:
        shutil.rmtree(short, ignore_errors=True)


def pytest_terminal_summary(terminalreporter, exitstatus):
    short = terminalreporter.config.stash.get(_SHORT_BASETEMP, None)
    if short and exitstatus != pytest.ExitCode.OK:
        terminalreporter.write_line(f"the tests' temporary folders are kept in {short}")
