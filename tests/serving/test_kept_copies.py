"""The one rule for which replicas a swap behind a front door gives the new
version and which keep the old one (serving.rules.kept_copies.swap_plan), and the
record of kept copies. Pure: no database."""

from serving.rules.kept_copies import KeptCopy, SwapPlan, kept_copy_record, swap_plan

OLD, NEW = "/vol/a/v1", "/vol/a/v2"


def plan(placed, everyone, loaded, **kw) -> SwapPlan:
    defaults = dict(name="a", path=NEW, before=OLD, room=set(everyone))
    return swap_plan(placed, everyone, loaded=loaded, **{**defaults, **kw})


def test_an_adapter_on_fewer_replicas_moves_to_a_spare_and_the_old_replica_keeps_it():
    p = plan([1], [1, 2], {1: {"a": OLD}, 2: {}})
    assert p == SwapPlan(order=(2,), switch_after=None, keep=(1,), moved={1: 2})
    assert p.spares == {2}


def test_a_spare_that_holds_the_version_already_comes_first_and_is_a_switch():
    loaded = {1: {"a": NEW}, 2: {}, 3: {"a": OLD}}
    p = plan([3], [1, 2, 3], loaded, rollback=True)
    assert p.order == (1,) and p.keep == (3,) and p.moved == {3: 1}
    assert p.switch_after == 1  # ready there, the old replica drained at once


def test_without_a_spare_with_room_the_swap_goes_in_place():
    p = plan([1], [1, 2], {1: {"a": OLD}, 2: {"b": "x"}}, room=set())
    assert p == SwapPlan(order=(1,))


def test_a_canary_or_an_unbounded_adapter_takes_no_spare():
    p = plan([1], [1, 2], {1: {"a": OLD}, 2: {}}, spares=False)
    assert p == SwapPlan(order=(1,))


def test_a_resumed_swap_takes_the_same_spares_or_none():
    loaded = {1: {"a": OLD}, 2: {}, 3: {}}
    assert plan([1], [1, 2, 3], loaded, resumed={3}).order == (3,)
    assert plan([1], [1, 2, 3], loaded, resumed={1}).order == (1,)


def test_on_every_replica_the_last_serving_the_old_version_keeps_it():
    loaded = {1: {"a": OLD}, 2: {"a": OLD}, 3: {"a": OLD}}
    p = plan([1, 2, 3], [1, 2, 3], loaded)
    assert p == SwapPlan(order=(1, 2), keep=(3,))


def test_nothing_is_kept_without_a_retention_or_on_one_replica():
    loaded = {1: {"a": OLD}, 2: {"a": OLD}}
    assert plan([1, 2], [1, 2], loaded, keep=False) == SwapPlan(order=(1, 2))
    assert plan([1], [1], {1: {"a": OLD}}) == SwapPlan(order=(1,))


def test_a_rollback_on_every_replica_switches_to_the_kept_copy_and_swaps_the_rest():
    loaded = {1: {"a": NEW}, 2: {"a": OLD}}  # rolling back to NEW from OLD
    p = plan([1, 2], [1, 2], loaded, rollback=True)
    assert p == SwapPlan(order=(1, 2), switch_after=1)


def test_the_replica_kept_is_one_serving_the_version_before_not_an_older_copy():
    loaded = {1: {"a": OLD}, 2: {"a": "/vol/a/v0"}}  # 2 still on a copy kept earlier
    p = plan([1, 2], [1, 2], loaded)
    assert p.keep == (1,) and p.order == (2,)


def test_the_record_keeps_a_copy_only_from_its_path_on_its_replicas_until_its_time():
    record = KeptCopy.from_dict(kept_copy_record(OLD, [2], now=100.0, seconds=600))
    assert record.keeps(2, OLD, 200.0)
    assert not record.keeps(2, NEW, 200.0)
    assert not record.keeps(1, OLD, 200.0)
    assert not record.keeps(2, OLD, 700.0)
    assert kept_copy_record(OLD, [2], now=100.0, seconds=0) == {}
    assert KeptCopy.from_dict({"replicas": ["x"]}) == KeptCopy()
