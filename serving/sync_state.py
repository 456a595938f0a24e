"""The one answer to "is this adapter in sync on this replica?".

The reconcile (what to repair), the state API and the deployment page (what
to show), and the Prometheus collector (what to count) all ask it here, of the
same two facts: the root the database wants the adapter served from (None:
retired, it must not be loaded) and the root the replica listed (None: not
loaded), with the replica's health.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from serving.models import ReplicaHealth
from serving.rules.placement_plan import placed_keys


class SyncState(StrEnum):
    IN_SYNC = "in_sync"  # served from the desired root, or retired and gone
    MISSING = "missing"  # desired, not loaded
    WRONG_ROOT = "wrong_root"  # loaded from another root
    NOT_UNLOADED = "not_unloaded"  # retired, still loaded
    DOWN = "down"  # the replica is down: nothing it listed before counts
    # The previous version, kept loaded and drained after a swap for a fast
    # rollback until its time is up (serving.rules.kept_copies): not drift.
    KEPT = "kept"

    @property
    def drifted(self) -> bool:
        return self in (SyncState.MISSING, SyncState.WRONG_ROOT, SyncState.NOT_UNLOADED)


def classify(desired: str | None, actual: str | None, health: str = ReplicaHealth.UP) -> SyncState:
    """`desired`: the served path, or None for a retired adapter; `actual`: the
    root the replica lists it with ("" if it names none), or None if it does
    not list it; `health`: a ReplicaHealth (a replica that just answered is up)."""
    if health == ReplicaHealth.DOWN:
        return SyncState.DOWN
    if desired is None:
        return SyncState.IN_SYNC if actual is None else SyncState.NOT_UNLOADED
    if actual is None:
        return SyncState.MISSING
    return SyncState.IN_SYNC if actual == desired else SyncState.WRONG_ROOT


def classify_kept(desired: str | None, actual: str | None, health: str, *, kept: bool) -> SyncState:
    """classify, where `kept` says the replica's copy is one a swap keeps for a
    rollback (KeptCopy.keeps): KEPT instead of the drift it would look like."""
    state = classify(desired, actual, health)
    return SyncState.KEPT if kept and state.drifted else state


def desired_root(
    served, replica_id: int, placed: frozenset[int] | None | tuple[()] = ()
) -> str | None:
    """The root `served` (a ServedAdapter) is meant to be served from on replica
    `replica_id`: its path where placement puts it (serving.rules.placement_plan), None
    where it is retired or not placed there. `placed`: its placed replica keys
    if already known (None: every replica); left out, they are read from the row."""
    if served.version_id is None:
        return None
    if placed == ():
        placed = placed_keys(served)
    if placed is not None and replica_id not in placed:
        return None
    return served.served_path


def loaded_adapters(replica) -> dict[str, str]:
    """What the replica served at its last look (Replica.loaded_adapters, a JSON
    list of {"id", "root"}): served name -> root ("" where it named none)."""
    return loaded_from(replica.loaded_adapters or [])


def loaded_from(items: Iterable[dict]) -> dict[str, str]:
    return {str(item["id"]): item.get("root") or "" for item in items if item.get("id")}


def as_listing(loaded: dict[str, str]) -> list[dict]:
    """The JSON form of `loaded`, for Replica.loaded_adapters."""
    return [{"id": name, "root": root} for name, root in loaded.items()]
