"""The tier clock (tests/support/tier_clock.py), run on a small suite of its own
through pytester: each test's time lands in its tier, alone and on two workers."""

from __future__ import annotations

import json

import pytest

from tests.support.tier_clock import LIGHT, tier_of

pytest_plugins = ["pytester"]

SUITE = """
import time
import pytest

@pytest.mark.vllm
def test_on_a_real_server():
    time.sleep(2.5)

@pytest.mark.conformance
@pytest.mark.vllm
def test_a_conformance_case():
    time.sleep(0.3)

def test_light():
    pass
"""


@pytest.fixture
def run(pytester, monkeypatch, tmp_path):
    times = tmp_path / "times.jsonl"
    monkeypatch.setenv("SUITE_TIER_TIMES", str(times))

    def run(*extra: str):
        pytester.makepyfile(test_suite=SUITE)
        pytester.makeini("[pytest]\nmarkers =\n    vllm: x\n    conformance: x\n")
        result = pytester.runpytest_inprocess(
            "-p", "no:django", "-p", "tests.support.tier_clock", "-p", "no:cacheprovider", *extra
        )  # fmt: skip
        lines = [json.loads(line) for line in times.read_text().splitlines()]
        files = [line for line in lines if "file" in line]
        return result, {line["tier"]: line for line in lines if "tier" in line}, files

    return run


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["alone", "two-workers"])
def test_each_tests_time_lands_in_its_tier(run, workers):
    result, tiers, files = run(*workers)
    assert result.ret == pytest.ExitCode.OK
    # The file of the heavy tests, with its three tests' time, for file_order.
    assert [line["file"] for line in files] == ["test_suite.py"]
    assert files[0]["seconds"] >= 1
    assert set(tiers) == {"vllm", "conformance", LIGHT}
    assert {tier: line["tests"] for tier, line in tiers.items()} == {
        "vllm": 1, "conformance": 1, LIGHT: 1,
    }  # fmt: skip
    # Not the vllm test's 2.5 s too: the gap leaves room for the light run's
    # stalls (niced beside vLLM) in a 0.3 s test's own time.
    assert tiers["vllm"]["seconds"] >= 2.5
    assert 0.3 <= tiers["conformance"]["seconds"] < 2.5
    result.stdout.fnmatch_lines(["*tier times*", "vllm*min  (1 tests)"])
    # The slowest files, with the time of all three tests in the one file.
    result.stdout.fnmatch_lines(["slowest 20 files:", "  *s  test_suite.py"])


def test_a_test_with_two_tier_markers_counts_in_the_more_specific_one():
    assert tier_of({"vllm", "bench"}) == "bench"
    assert tier_of({"s3"}) == LIGHT


def test_a_test_in_a_folder_named_like_a_tier_is_light_without_the_marker(pytester, monkeypatch):
    monkeypatch.delenv("SUITE_TIER_TIMES", raising=False)  # make test's own
    pytester.mkpydir("contract").joinpath("test_config.py").write_text("def test_a():\n    pass\n")
    result = pytester.runpytest_inprocess(
        "-p", "no:django", "-p", "tests.support.tier_clock", "-p", "no:cacheprovider",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["light*min  (1 tests)"])
