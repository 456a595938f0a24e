"""The canary's health gates (serving/rules/canary_gates.py): pure functions."""

from __future__ import annotations

import pytest

from serving.rules import canary_gates as g

LIMITS = g.Thresholds(min_requests=20, max_error_rate_increase=0.02, max_latency_ratio=1.5)


def side(requests, errors=0, latency=100.0):
    return g.Side(requests, errors, latency)


def test_a_canary_with_too_few_requests_waits_while_it_bakes():
    verdict = g.judge(side(19, errors=19), side(500), LIMITS, bake_over=False)
    assert verdict.outcome == g.WAIT
    errors = verdict.gates[0]
    assert errors.verdict == g.WAIT
    assert errors.message == "19 of the 20 requests needed to judge"


def test_a_canary_with_too_few_requests_when_the_bake_ends_is_not_proven():
    verdict = g.judge(side(5), side(500), LIMITS, bake_over=True)
    assert verdict.outcome == g.FAIL
    assert verdict.reason.startswith("not proven: the canary had 5 requests")


def test_errors_fail_the_canary_as_soon_as_it_has_enough_requests():
    verdict = g.judge(side(20, errors=2), side(180, errors=0), LIMITS, bake_over=False)
    assert verdict.outcome == g.FAIL
    assert verdict.gates[0].verdict == g.FAIL
    assert "error rate 10.0% (2 of 20) against 0.0% on the old version; at most 2.0%" in (
        verdict.reason
    )


def test_errors_are_compared_with_the_old_version_not_with_zero():
    # The old version fails 10 % too: the same rate on the canary is no worse.
    verdict = g.judge(side(100, errors=10), side(900, errors=90), LIMITS, bake_over=True)
    assert verdict.gates[0].verdict == g.PASS
    assert verdict.outcome == g.PASS


def test_an_error_rate_just_within_the_allowed_increase_passes():
    verdict = g.judge(side(100, errors=2), side(900, errors=0), LIMITS, bake_over=True)
    assert verdict.outcome == g.PASS
    verdict = g.judge(side(100, errors=3), side(900, errors=0), LIMITS, bake_over=True)
    assert verdict.outcome == g.FAIL


def test_latency_is_judged_when_the_bake_is_over():
    slow = side(100, latency=400.0)
    old = side(900, latency=200.0)  # limit 200 * 1.5 + 50 = 350 ms
    assert g.judge(slow, old, LIMITS, bake_over=False).outcome == g.WAIT
    verdict = g.judge(slow, old, LIMITS, bake_over=True)
    assert verdict.outcome == g.FAIL
    latency = verdict.gates[1]
    assert (latency.verdict, latency.limit) == (g.FAIL, 350.0)
    assert "400 ms against 200 ms; at most 350 ms" in verdict.reason
    assert g.judge(side(100, latency=349.0), old, LIMITS, bake_over=True).outcome == g.PASS


def test_without_requests_on_the_old_version_the_canary_is_judged_alone():
    verdict = g.judge(side(30, latency=900.0), g.Side(0, 0, None), LIMITS, bake_over=True)
    assert verdict.outcome == g.PASS
    assert verdict.gates[1].message == "no old version to compare"
    assert g.judge(side(30, errors=1), g.Side(0, 0, None), LIMITS, bake_over=True).outcome == (
        g.FAIL
    )


def test_a_split_gives_the_canary_its_share_and_the_others_the_rest_evenly():
    assert g.split_weights(10, "r1", ["r2"]) == {"r1": 10, "r2": 90}
    assert g.split_weights(10, "r1", ["r2", "r3"]) == {"r1": 10, "r2": 45, "r3": 45}
    assert g.split_weights(50, "r1", ["r2", "r3", "r4"]) == {
        "r1": 50,
        "r2": 17,
        "r3": 17,
        "r4": 17,
    }
    with pytest.raises(ValueError):
        g.split_weights(0, "r1", ["r2"])
    with pytest.raises(ValueError):
        g.split_weights(10, "r1", [])


def sample(requests, errors=0, latency=10.0):
    return g.ServerSample(requests, errors, latency)


def test_counts_start_at_the_bake_and_survive_a_gateway_reload():
    state = g.start({"1": sample(1000, 7), "2": sample(50, 1)}, epoch="100")
    state = g.advance(state, {"1": sample(1090, 7), "2": sample(60, 3)}, epoch="100")
    assert g.totals(state) == {"1": (90, 0), "2": (10, 2)}
    # A reload: a new worker counts from zero; what the old one counted is kept.
    state = g.advance(state, {"1": sample(9, 0), "2": sample(1, 1)}, epoch="200")
    assert g.totals(state) == {"1": (99, 0), "2": (11, 3)}
    state = g.advance(state, {"1": sample(18, 1), "2": sample(2, 1)}, epoch="200")
    assert g.totals(state) == {"1": (108, 1), "2": (12, 3)}
    canary, old = g.sides(state, {"1": sample(18, 1, 5.0), "2": sample(2, 1, 9.0)}, "2")
    assert (canary.requests, canary.errors, canary.latency_ms) == (12, 3, 9.0)
    assert (old.requests, old.errors, old.latency_ms) == (108, 1, 5.0)


def test_the_old_version_s_latency_is_weighted_by_its_servers_requests():
    state = g.start({"1": sample(0), "2": sample(0), "3": sample(0)}, epoch="1")
    now = {"1": sample(10, latency=50.0), "2": sample(30, latency=100.0), "3": sample(90)}
    state = g.advance(state, now, epoch="1")
    canary, old = g.sides(state, now, "1")
    assert canary.latency_ms == 50.0
    assert old.requests == 120
    assert old.latency_ms == pytest.approx((30 * 100.0 + 90 * 10.0) / 120)
