"""Kept copies: the version before a swap, left loaded and drained on some
replicas for SERVING_ROLLBACK_RETAIN_SECONDS (ServedAdapter.kept_copy), so
that a rollback meanwhile is a switch of traffic, not a reload. One record,
and one rule for which replicas a swap behind a front door gives the new
version and which keep the old one (swap_plan); the engine follows the plan,
the reconcile leaves the copies alone until their time is up. Pure: no Django
models here. docs/door.md#swaps-that-no-client-notices says the rest."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class KeptCopy:
    path: str = ""
    replicas: frozenset[int] = frozenset()
    until: float = 0.0  # epoch seconds

    def as_dict(self) -> dict:
        return {"path": self.path, "replicas": sorted(self.replicas), "until": self.until}

    @classmethod
    def from_dict(cls, data: Mapping | None) -> KeptCopy:
        data = data or {}
        try:
            return cls(
                path=str(data.get("path") or ""),
                replicas=frozenset(int(k) for k in data.get("replicas") or ()),
                until=float(data.get("until") or 0.0),
            )
        except (TypeError, ValueError):
            return cls()

    def keeps(self, replica_id: int, root: str | None, now: float) -> bool:
        """Whether `replica_id`'s copy, loaded from `root`, is kept at `now`."""
        return (
            bool(self.path)
            and root == self.path
            and replica_id in self.replicas
            and (now < self.until)
        )


def kept_copy_record(
    path: str | None, replicas: Iterable[int], *, now: float, seconds: float
) -> dict:
    """What a swap stores for the copies it leaves (empty where it leaves none)."""
    kept = frozenset(replicas)
    if not path or not kept or seconds <= 0:
        return {}
    return KeptCopy(path=path, replicas=kept, until=now + seconds).as_dict()


@dataclass(frozen=True)
class SwapPlan:
    """How a swap behind a front door goes (replica ids throughout)."""

    # The replicas given the new version, one at a time, in this order.
    order: tuple[int, ...] = ()
    # After this many (the first ones, which hold the new version already: kept
    # copies), the traffic leaves every other replica at once: a switch.
    switch_after: int | None = None
    # The replicas that keep the version before, drained once the new version
    # serves, for the retention (the record names them).
    keep: tuple[int, ...] = ()
    # {placed replica: the spare that takes its place}; the placement follows.
    moved: dict[int, int] = field(default_factory=dict)

    @property
    def spares(self) -> frozenset[int]:
        """The replicas that did not serve the adapter before (a rollback
        unloads it there instead of loading the version before)."""
        return frozenset(self.moved.values())


def swap_plan(
    placed: Sequence[int],
    everyone: Sequence[int],
    *,
    loaded: Mapping[int, Mapping[str, str]],
    name: str,
    path: str,
    before: str | None,
    room: Iterable[int],
    resumed: Iterable[int] = (),
    spares: bool = True,
    keep: bool = True,
    rollback: bool = False,
) -> SwapPlan:
    """The one rule. `placed`: where placement puts the adapter; `everyone`:
    the deployment's replicas that are up; `loaded`: what each lists;
    `path`: the version swapped in; `before`: the version served until now;
    `room`: the replicas up with a free slot in their host cache or a copy of
    the adapter already; `resumed`: the
    replicas a resumed rollout already pushed to. `spares`: the adapter may move
    to other replicas (not a canary); `keep`: a retention is set.

    1. Where the adapter is placed on fewer replicas than there are, it moves:
       one spare per placed replica (up, not placed, room or a copy of it
       already), those holding `path` first, then the emptiest. The placed
       replicas keep the version before. A resumed rollout takes the same
       spares again, or none.
    2. Otherwise it is swapped in place; with a retention, on a swap forward
       (not a rollback: a held-back replica serves nobody meanwhile), the last
       replica serving `before` is held back and keeps it.
    3. Either way, the replicas that hold `path` already (kept copies) go
       first, and once they serve, the others are drained at once."""
    placed = list(placed)
    resumed = set(resumed)
    targets, keepers, moved = placed, [], {}
    chosen = _spares(placed, everyone, loaded, name, path, set(room), resumed) if spares else None
    if chosen is not None:
        targets, keepers = chosen, placed
        moved = dict(zip(placed, chosen, strict=True))
    holding = [r for r in targets if loaded.get(r, {}).get(name) == path]
    others = [r for r in targets if r not in holding]
    if keep and not moved and not rollback and before and len(targets) >= 2:
        serving_before = [r for r in others if loaded.get(r, {}).get(name) == before]
        if serving_before and (holding or len(others) >= 2):
            keepers = [serving_before[-1]]
            others.remove(keepers[0])
    return SwapPlan(
        order=(*holding, *others),
        switch_after=len(holding) if holding and (others or keepers) else None,
        keep=tuple(keepers),
        moved=moved,
    )


def _spares(placed, everyone, loaded, name, path, room, resumed) -> list[int] | None:
    taken = set(placed)
    if not taken:
        return None
    if resumed:
        again = [r for r in everyone if r in resumed]
        return again if len(again) == len(placed) and not (resumed & taken) else None
    candidates = [r for r in everyone if r not in taken and r in room]
    if len(candidates) < len(placed):
        return None
    candidates.sort(key=lambda r: (loaded.get(r, {}).get(name) != path, len(loaded.get(r, {}))))
    return candidates[: len(placed)]
