"""A pytest plugin: the time each tier of the suite took, at the end of a run.

A test's tier is the first of TIERS among its markers, else "light". Its time
is the sum of its setup, call and teardown durations, so a tier's figure is
the time its tests kept a worker busy: under pytest-xdist the tiers of one run
add up to more than the run's wall clock (two workers).

With $SUITE_TIER_TIMES set (scripts/test.sh sets it), each tier's figure is
also appended there as a JSON line, for scripts/suite_clock.py to add up
across the runs of `make test` and to guard the total.

Loaded from pyproject's addopts (`-p tests.support.tier_clock`).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

# Order matters for a test with two markers: the more specific tier first.
TIERS = ("compose", "conformance", "contract", "faults", "bench", "browser", "stress", "vllm")
LIGHT = "light"
SLOWEST_FILES = 20


def tier_of(markers) -> str:
    return next((tier for tier in TIERS if tier in markers), LIGHT)


def pytest_collection_modifyitems(items):
    # Read from the markers (a report's keywords also hold the names of the
    # folders above the test: tests/contract/test_schemathesis_config.py is no
    # contract test) and carried in user_properties, which pytest-xdist brings
    # from the worker to the controller with each report.
    for item in items:
        tier = tier_of({mark.name for mark in item.iter_markers()})
        item.user_properties.append(("tier", tier))


def pytest_configure(config):
    # Under xdist only the controller adds up (it sees every worker's reports).
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(TierClock(), "tier-clock")


class TierClock:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.tests: dict[str, set[str]] = defaultdict(set)
        self.files: dict[str, float] = defaultdict(float)
        self.heavy_files: set[str] = set()

    def pytest_runtest_logreport(self, report) -> None:
        tier = dict(report.user_properties).get("tier", LIGHT)
        self.seconds[tier] += report.duration
        self.tests[tier].add(report.nodeid)
        path = report.nodeid.split("::", 1)[0]
        self.files[path] += report.duration
        if tier != LIGHT:
            self.heavy_files.add(path)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.seconds:
            return
        terminalreporter.section("tier times")
        for tier, seconds in sorted(self.seconds.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(
                f"{tier:<12}{seconds / 60:6.1f} min  ({len(self.tests[tier])} tests)"
            )
        # Where a tier's time goes, a file at a time: --durations names single
        # tests, but a slow file is usually many middling tests (or a fixture).
        terminalreporter.write_line(f"slowest {SLOWEST_FILES} files:")
        slowest = sorted(self.files.items(), key=lambda item: -item[1])[:SLOWEST_FILES]
        for path, seconds in slowest:
            terminalreporter.write_line(f"  {seconds:7.1f} s  {path}")
        path = os.environ.get("SUITE_TIER_TIMES")
        if path:
            with open(path, "a") as out:
                for tier, seconds in self.seconds.items():
                    line = {"tier": tier, "seconds": round(seconds, 1)}
                    out.write(json.dumps({**line, "tests": len(self.tests[tier])}) + "\n")
                # The heavy files' times: scripts/suite_clock.py --file-seconds
                # writes them where tests/support/file_order.py reads them.
                for path in sorted(self.heavy_files):
                    line = {"file": path, "seconds": round(self.files[path])}
                    out.write(json.dumps(line) + "\n")
