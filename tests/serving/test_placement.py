"""serving.rules.placement_plan, the pure function: bounds, demand and its smoothing, the
quiet period, rendezvous hashing's stability, room, and the churn budget."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from serving.rules.placement_plan import (
    Reason,
    ReplicaSlot,
    Settings,
    State,
    Wish,
    bounds,
    place,
    placements_needed,
    ranked,
    smooth,
)

NOW = 1_000_000.0
QUIET = Settings(window_seconds=0, quiet_seconds=300, churn_budget=0)


UNLIMITED = Settings(churn_budget=0)


def slots(count: int, capacity: int = 64, down: tuple[int, ...] = ()) -> list[ReplicaSlot]:
    return [ReplicaSlot(key=k, capacity=capacity, up=k not in down) for k in range(1, count + 1)]


def again(result, wishes: list[Wish], **changes) -> list[Wish]:
    """The wishes of the next tick: each with this tick's state as its previous one."""
    return [replace(w, previous=result.states[w.name], **changes) for w in wishes]


def test_an_adapter_without_bounds_is_on_every_replica_whatever_its_demand():
    result = place([Wish("a", demand=0), Wish("b", demand=9)], slots(3), now=NOW, elapsed=10)
    assert result.states["a"].replicas == (1, 2, 3)
    assert result.states["b"].replicas == (1, 2, 3)
    assert result.states["a"].reason == Reason.EVERYWHERE


def test_an_unset_min_is_the_max_and_the_max_is_at_most_the_replicas_up():
    assert bounds(Wish("a", max_replicas=2), 5) == (2, 2)
    assert bounds(Wish("a", min_replicas=1), 5) == (1, 5)
    assert bounds(Wish("a", min_replicas=3, max_replicas=9), 2) == (2, 2)


def test_idle_adapters_are_held_at_min():
    result = place([Wish("a", min_replicas=1, max_replicas=4)], slots(4), now=NOW, elapsed=10)
    state = result.states["a"]
    assert len(state.replicas) == 1
    assert state.reason == Reason.MIN


def test_demand_between_the_bounds_places_one_replica_per_unit():
    wish = Wish("a", min_replicas=1, max_replicas=4, demand=3)
    state = place([wish], slots(4), settings=QUIET, now=NOW, elapsed=10).states["a"]
    assert len(state.replicas) == 3
    assert state.reason == Reason.DEMAND


def test_demand_above_the_max_is_capped_and_says_so():
    wish = Wish("a", min_replicas=1, max_replicas=2, demand=7)
    state = place([wish], slots(4), settings=QUIET, now=NOW, elapsed=10).states["a"]
    assert len(state.replicas) == 2
    assert state.reason == Reason.MAX


def test_demand_is_smoothed_over_the_window():
    # One tick of 10 s into a 60 s window moves a sixth of the way (1 - e^-1/6).
    assert smooth(0.0, 6.0, 10, 60) == pytest.approx(6 * 0.1535, abs=1e-3)
    assert smooth(4.0, 4.0, 10, 60) == 4.0
    assert smooth(0.005, 0.0, 10, 60) == 0.0  # the decay ends instead of writing forever
    settings = Settings(window_seconds=60, quiet_seconds=0, churn_budget=0)
    wishes = [Wish("a", min_replicas=1, max_replicas=4, demand=4)]
    first = place(wishes, slots(4), settings=settings, now=NOW, elapsed=10)
    # A burst of one reading does not take all four replicas at once.
    assert len(first.states["a"].replicas) == 1
    result = first
    for tick in range(1, 30):
        result = place(
            again(result, wishes), slots(4), settings=settings, now=NOW + tick * 10, elapsed=10
        )
    assert len(result.states["a"].replicas) == 4


def test_scale_down_waits_for_the_quiet_period():
    wishes = [Wish("a", min_replicas=1, max_replicas=4, demand=3)]
    busy = place(wishes, slots(4), settings=QUIET, now=NOW, elapsed=10)
    assert len(busy.states["a"].replicas) == 3

    quiet = again(busy, wishes, demand=0)
    soon = place(quiet, slots(4), settings=QUIET, now=NOW + 10, elapsed=10)
    assert len(soon.states["a"].replicas) == 3
    assert soon.states["a"].low_since == NOW + 10
    assert "after 300 s quiet" in soon.states["a"].detail

    later = place(
        again(soon, wishes, demand=0), slots(4), settings=QUIET, now=NOW + 200, elapsed=10
    )
    assert len(later.states["a"].replicas) == 3
    done = place(
        again(later, wishes, demand=0), slots(4), settings=QUIET, now=NOW + 311, elapsed=10
    )
    assert len(done.states["a"].replicas) == 1
    # The one kept is one it was on: nothing new is loaded to scale down.
    assert set(done.states["a"].replicas) < set(busy.states["a"].replicas)


def test_demand_coming_back_during_the_quiet_period_keeps_the_replicas():
    wishes = [Wish("a", min_replicas=1, max_replicas=4, demand=3)]
    busy = place(wishes, slots(4), settings=QUIET, now=NOW, elapsed=10)
    lull = place(again(busy, wishes, demand=0), slots(4), settings=QUIET, now=NOW + 10, elapsed=10)
    back = place(again(lull, wishes, demand=3), slots(4), settings=QUIET, now=NOW + 20, elapsed=10)
    assert back.states["a"].low_since is None
    late = place(again(back, wishes, demand=0), slots(4), settings=QUIET, now=NOW + 320, elapsed=10)
    assert len(late.states["a"].replicas) == 3  # the quiet period started again at +320


def test_replicas_are_chosen_by_rendezvous_hashing():
    wish = Wish("adapter-x", max_replicas=2)
    state = place([wish], slots(8), now=NOW, elapsed=10).states["adapter-x"]
    assert set(state.replicas) == set(ranked("adapter-x", range(1, 9))[:2])


def _many(count: int = 200, per: int = 2) -> list[Wish]:
    return [Wish(f"adapter-{i:03d}", max_replicas=per) for i in range(count)]


def _moves(before, after) -> int:
    """Placements on a replica they were not on before."""
    return sum(
        len(set(after.states[n].replicas) - set(before.states[n].replicas)) for n in before.states
    )


def test_losing_a_replica_moves_only_the_adapters_it_held():
    wishes = _many()
    before = place(wishes, slots(16), settings=UNLIMITED, now=NOW, elapsed=10)
    held = {n for n, s in before.states.items() if 5 in s.replicas}
    after = place(
        again(before, wishes), slots(16, down=(5,)), settings=UNLIMITED, now=NOW + 10, elapsed=10
    )
    moved = {
        n for n in before.states if set(after.states[n].replicas) != set(before.states[n].replicas)
    }
    assert held and moved == held
    for name in held:  # each keeps the replica it had and gains one
        assert set(before.states[name].replicas) - {5} < set(after.states[name].replicas)
        assert 5 not in after.states[name].replicas


def test_adding_a_replica_moves_nothing():
    wishes = _many()
    before = place(wishes, slots(15), settings=UNLIMITED, now=NOW, elapsed=10)
    after = place(again(before, wishes), slots(16), settings=UNLIMITED, now=NOW + 10, elapsed=10)
    assert _moves(before, after) == 0


def test_no_replica_is_filled_past_its_capacity_and_the_rest_say_no_room():
    wishes = [Wish(f"a{i}", max_replicas=2) for i in range(5)]
    result = place(wishes, slots(2, capacity=3), now=NOW, elapsed=10)
    per_replica = {1: 0, 2: 0}
    for state in result.states.values():
        for key in state.replicas:
            per_replica[key] += 1
    assert per_replica == {1: 3, 2: 3}
    short = [s for s in result.states.values() if s.reason == Reason.NO_ROOM]
    assert short, result.states
    assert all("max_cpu_loras" in s.detail for s in short)
    # Every adapter gets its first replica before any gets a second.
    assert all(len(s.replicas) >= 1 for s in result.states.values())


def test_unbounded_adapters_take_room_from_bounded_ones():
    wishes = [Wish("everywhere"), Wish("one", max_replicas=1)]
    state = place(wishes, slots(2, capacity=1), now=NOW, elapsed=10).states["one"]
    assert state.replicas == ()
    assert state.reason == Reason.NO_ROOM


def test_no_replica_up_is_no_room():
    state = place([Wish("a", max_replicas=1)], slots(2, down=(1, 2)), now=NOW, elapsed=10)
    assert state.states["a"].reason == Reason.NO_ROOM
    assert "no replica is up" in state.states["a"].detail


def test_the_churn_budget_bounds_loads_and_gives_first_replicas_first():
    settings = Settings(window_seconds=0, quiet_seconds=0, churn_budget=5)
    wishes = [Wish(f"a{i}", max_replicas=2) for i in range(4)]
    first = place(wishes, slots(4), settings=settings, now=NOW, elapsed=10)
    assert first.loads == 5 and first.deferred == 3
    # Every adapter has a replica; the budget left one adapter a second one.
    assert sorted(len(s.replicas) for s in first.states.values()) == [1, 1, 1, 2]
    assert any("wait for the churn budget" in s.detail for s in first.states.values())
    second = place(again(first, wishes), slots(4), settings=settings, now=NOW + 10, elapsed=10)
    assert second.loads == 3 and second.deferred == 0
    assert all(len(s.replicas) == 2 for s in second.states.values())


def test_the_churn_budget_bounds_unloads_too():
    settings = Settings(window_seconds=0, quiet_seconds=0, churn_budget=2)
    wishes = [
        Wish(f"a{i}", min_replicas=1, max_replicas=3, previous=State(replicas=(1, 2, 3), demand=3))
        for i in range(3)
    ]
    result = place(wishes, slots(3), settings=settings, now=NOW, elapsed=10)
    assert result.unloads == 2 and result.deferred == 4
    assert sum(len(s.replicas) for s in result.states.values()) == 9 - 2


def test_a_held_adapter_keeps_its_placement():
    wish = Wish("a", max_replicas=1, held=True, previous=State(replicas=(3,), reason="min"))
    state = place([wish], slots(3), now=NOW, elapsed=10).states["a"]
    assert state.replicas == (3,)


def test_a_stored_state_survives_its_dict_form_and_a_bad_one_starts_over():
    state = State(replicas=(1, 2), reason=Reason.DEMAND, wanted=2, demand=1.5, low_since=NOW)
    assert State.from_dict(state.as_dict()) == state
    assert State.from_dict({"replicas": ["x"]}) == State()
    assert State.from_dict(None) == State()


def test_placements_needed_counts_every_replica_for_an_unbounded_adapter():
    wishes = [Wish("all"), Wish("one", max_replicas=1), Wish("two", min_replicas=2)]
    assert placements_needed(wishes, 4) == 4 + 1 + 2


def test_500_adapters_on_16_replicas_are_each_placed_twice_and_spread_evenly():
    # How fast this is belongs to bench/placement.py (a timed unit test failed CI on a
    # loaded machine); here: the shape of the answer at that size.
    wishes = [Wish(f"adapter-{i:04d}", max_replicas=2) for i in range(500)]
    result = place(wishes, slots(16), settings=UNLIMITED, now=NOW, elapsed=10)
    assert all(len(set(state.replicas)) == 2 for state in result.states.values())
    per_replica = Counter(r for state in result.states.values() for r in state.replicas)
    assert len(per_replica) == 16
    assert max(per_replica.values()) - min(per_replica.values()) <= 0.5 * 1000 / 16
