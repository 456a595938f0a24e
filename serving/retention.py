"""The copies of an adapter's previous version that a swap behind a front door
leaves loaded, drained, on some replicas for SERVING_ROLLBACK_RETAIN_SECONDS
(ServedAdapter.retained): a rollback meanwhile sends the traffic back to them
instead of reloading the old version. Pure: no Django models here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Retained:
    path: str = ""
    replicas: frozenset[int] = frozenset()
    until: float = 0.0  # epoch seconds

    def as_dict(self) -> dict:
        return {"path": self.path, "replicas": sorted(self.replicas), "until": self.until}

    @classmethod
    def from_dict(cls, data: Mapping | None) -> Retained:
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


def retained_for(path: str | None, replicas: Iterable[int], *, now: float, seconds: float) -> dict:
    """What a swap stores for the copies it leaves (empty where it leaves none)."""
    kept = frozenset(replicas)
    if not path or not kept or seconds <= 0:
        return {}
    return Retained(path=path, replicas=kept, until=now + seconds).as_dict()
