"""Every benchmark runs on every change: each `bench/*.py` with a `__main__`
runs in its `--smoke` mode (tiny sizes, the same real parts: real vLLM where
the bench uses it) in a subprocess, and must exit 0 and write figures
(`--json`: at least one table with rows). A bench that no longer runs fails
here, so nothing the README quotes can rot unnoticed.

The smoke runs start at once in lanes, so the tier takes about as long as
its slowest lane: benches on the real vLLM servers shared by them (the
session's shared servers, tests/support/vllm_pool.py), lora_pool_memory
(which must start servers of its own, each with another pool), and the
benches without vLLM in two lanes. Every bench on
the embedded SQLite starts from one migrated database made once for the tier
(BENCH_SQLITE_TEMPLATE, bench/results.seed_sqlite).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.bench_figures import check_figures
from tests.support.haproxy import haproxy_runs

pytestmark = pytest.mark.bench

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 420  # seconds per bench: generous, the machine is shared and loaded

# Which lane each bench runs in. A bench with a __main__ that is in none fails
# test_every_bench_has_a_smoke_run (so a new bench cannot be left out).
# A real vLLM start is about 30 s of a core, and the suite is CPU-bound on two
# cores: every bench that can run on the shared servers does, one after another
# (each hand-out of the pool unloads what the bench before left loaded).
SHARED_VLLM = [
    "promote_to_served", "many_adapters", "swap_under_traffic", "fingerprint_spread",
    "door_overhead", "swap_through_gateway",
]  # fmt: skip
# The shared lane's benches that need both shared servers and read their logs.
SHARED_PAIR = {"swap_through_gateway"}
OWN_VLLM = ["lora_pool_memory"]
NO_VLLM = ["tensor_values", "scale", "scale_promotions"]
NO_VLLM_2 = ["new_pod_to_served", "upload_throughput"]
# Behind a real HAProxy, on stand-in replicas.
GATEWAY = ["placement", "door_limits", "door_memory", "door_tls", "door_agents"]
EVERY = SHARED_VLLM + OWN_VLLM + NO_VLLM + NO_VLLM_2 + GATEWAY
# Run on every change by another test, at a larger size, instead of here:
# bench.metering (a vLLM exporting spans, the product's receiver, a real door)
# at 300 requests through faults, with the same checks of its figures.
RUN_ELSEWHERE = {"metering": "tests/serving/vllm/test_metering_faults.py"}
# Behind a real HAProxy too, on the shared servers: promotion through the door,
# the door's overhead, and swaps through it (whose vLLM access logs it reads).
NEEDS_HAPROXY = {*GATEWAY, "promote_to_served", "door_overhead", "swap_through_gateway"}


def benches_with_main() -> set[str]:
    return {
        path.stem
        for path in (REPO / "bench").glob("*.py")
        if 'if __name__ == "__main__":' in path.read_text()
    }


@dataclass
class SmokeRun:
    returncode: int
    output: str
    figures: dict | None
    seconds: float


def bench_env(**extra: str) -> dict[str, str]:
    # The benches make their own throwaway databases (SQLite in their VAR_DIR)
    # and queues; they must not meet the suite's test database.
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "VAR_DIR"}}
    return {**env, **extra}


def migrated_template(folder: Path) -> Path:
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=REPO, env=bench_env(VAR_DIR=str(folder)), check=True, timeout=TIMEOUT,
    )  # fmt: skip
    return folder / "db.sqlite3"


def run_smoke(name: str, out_dir: Path, *extra: str) -> SmokeRun:
    json_path = out_dir / f"{name}.json"
    env = bench_env(BENCH_SQLITE_TEMPLATE=str(out_dir / "template" / "db.sqlite3"))
    started = time.monotonic()
    try:
        result = subprocess.run(
            [sys.executable, "-m", f"bench.{name}", "--smoke", "--json", str(json_path), *extra],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT,
        )  # fmt: skip
        returncode, output = result.returncode, result.stdout + result.stderr
    except subprocess.TimeoutExpired as exc:
        output = f"timed out after {TIMEOUT} s\n{exc.stdout or ''}{exc.stderr or ''}"
        returncode = -1
    figures = json.loads(json_path.read_text()) if json_path.exists() else None
    return SmokeRun(returncode, output, figures, time.monotonic() - started)


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory, vllm_pool) -> dict[str, Future]:
    out_dir = tmp_path_factory.mktemp("bench-smoke")
    runs: dict[str, Future] = {name: Future() for name in EVERY}
    migrated_template(out_dir / "template")

    def lane(names: list[str], before=None) -> None:
        for name in names:
            try:
                extra = before(name) if before is not None else ()
                runs[name].set_result(run_smoke(name, out_dir, *extra))
            except BaseException as exc:
                runs[name].set_exception(exc)

    def shared_servers_ready(name: str) -> tuple[str, ...]:
        # The session's shared servers (tests/support/vllm_pool.py): the
        # configuration these benches expect (see each one's --replica-urls),
        # up and without runtime adapters; booted here if no test before did.
        if name not in SHARED_PAIR:
            return ("--replica-urls", vllm_pool.servers(1)[0].base_url)
        servers = vllm_pool.servers(2)
        return (
            "--replica-urls", ",".join(server.base_url for server in servers),
            "--replica-logs", ",".join(str(server.log_path) for server in servers),
        )  # fmt: skip

    shared = [name for name in SHARED_VLLM if haproxy_runs() or name not in NEEDS_HAPROXY]
    lanes = [
        threading.Thread(target=lane, args=(shared, shared_servers_ready), daemon=True),
        threading.Thread(target=lane, args=(OWN_VLLM,), daemon=True),
        threading.Thread(target=lane, args=(NO_VLLM,), daemon=True),
        threading.Thread(target=lane, args=(NO_VLLM_2,), daemon=True),
    ]
    if haproxy_runs():
        lanes.append(threading.Thread(target=lane, args=(GATEWAY,), daemon=True))
    for thread in lanes:
        thread.start()
    yield runs
    for thread in lanes:
        thread.join(TIMEOUT * len(SHARED_VLLM))


def test_every_bench_has_a_smoke_run():
    assert benches_with_main() == set(EVERY) | set(RUN_ELSEWHERE)
    assert len(EVERY) == len(set(EVERY)), "a bench is in two lanes"
    assert not set(EVERY) & set(RUN_ELSEWHERE), "a bench runs here and elsewhere"
    for name, test in RUN_ELSEWHERE.items():
        assert f"bench.{name}" in (REPO / test).read_text(), f"{test} does not run bench.{name}"


@pytest.mark.parametrize("name", sorted(benches_with_main()))
def test_bench_says_how_to_run_it(name):
    result = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", "--help"],
        cwd=REPO, env=bench_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    for option in ("--smoke", "--json"):
        assert option in result.stdout, f"bench.{name} --help does not name {option}"


@pytest.mark.parametrize("name", EVERY)
def test_bench_runs_in_smoke_mode_and_prints_figures(name, smoke_runs):
    if name in NEEDS_HAPROXY and not haproxy_runs():
        pytest.skip("haproxy is not installed (scripts/test.sh installs Debian's haproxy)")
    run = smoke_runs[name].result(timeout=TIMEOUT * len(SHARED_VLLM))
    assert run.returncode == 0, f"bench.{name} --smoke failed:\n{run.output[-4000:]}"
    check_figures(name, run.figures, run.output)
    assert run.figures["smoke"] is True
    print(f"bench.{name} --smoke: {run.seconds:.0f} s")
