"""A pytest plugin: under `--dist loadfile`, the slowest files start first.

pytest-xdist hands a run's files to its workers in collection order (or, by
default, most tests first), so a slow file collected late (the walkthrough,
the 300-adapter test) could start when the other worker has nothing left, and
the run ends with one worker idle for minutes. Handing out the longest files
first (longest-processing-time-first scheduling) keeps both workers busy to
the end. The weights are each file's seconds in a measured run
(heavy_file_seconds.json, written from the tier clock's per-file times by
scripts/suite_clock.py --file-seconds); a file that is not there yet counts
as DEFAULT_SECONDS. scripts/test_runs.sh passes --no-loadscope-reorder to
the heavy run so that xdist keeps this order.

Loaded from pyproject's addopts (`-p tests.support.file_order`); it changes
nothing outside `--dist loadfile`.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

WEIGHTS = Path(__file__).with_name("heavy_file_seconds.json")
DEFAULT_SECONDS = 30


@cache
def file_seconds() -> dict[str, int]:
    return json.loads(WEIGHTS.read_text())


def weight(nodeid: str) -> int:
    return file_seconds().get(nodeid.split("::", 1)[0], DEFAULT_SECONDS)


def pytest_collection_modifyitems(config, items):
    if getattr(config.option, "dist", "no") != "loadfile":
        return
    # sorted() is stable: a file's tests keep their order, and every worker
    # computes the same order (xdist requires identical collections).
    items[:] = sorted(items, key=lambda item: -weight(item.nodeid))
