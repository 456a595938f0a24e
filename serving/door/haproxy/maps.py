"""The door's map files: what HAProxy looks up per request, changed at runtime
(`set map`, `add map`, `del map`) without a reload, and written to disk so that
a restarted HAProxy starts where the running one was.

- models.map: served name -> backend (its own, the base model's, or a slot);
- the access maps (keys, grants, catalog, upstream, versions, rpm, limited,
  door): an access table (serving/door/callers.py) as the door reads it;
- held.map: the models whose new requests wait (docs/door.md#holding);
- lease.map: when a door that pulls its state stops routing.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
from pathlib import Path

from serving.door.callers import DoorAccess
from serving.door.routing import Route, RoutingTable

BASE_BACKEND = "base"
ADAPTER_BACKEND_PREFIX = "m_"
# Free backends rendered at every reload, one server line per replica, each in
# maint: a NEW adapter takes one at runtime (servers ready, then its map entry),
# so a promotion routes at once instead of after a reload (docs/door.md).
# The next reload renders it as m_<model> and the pool is whole again.
SLOT_PREFIX = "slot_"
SLOTS = 16


# The files of a door's access table (serving/door/callers.py), each a map the
# runtime API changes in place: key hash -> "department,key id,expiry";
# "department:model" -> 1; department -> its /v1/models body (base64); and the
# door's own flags ("open", and the fingerprint of the table last pushed); and
# UPSTREAM_ENTRY -> the replicas' vLLM API key (base64), sent upstream as
# `Authorization: Bearer`. A map rather than the configuration or HAProxy's
# environment: haproxy.cfg is rendered and read by more than the control plane
# and the process starts with an empty environment (`env -i`, command_line);
# a map file is 0600, changes at runtime (`set map`, no reload: a rotated key
# is in effect for the next request) and `show env` never prints it.
# versions.map: served name -> the version id it serves (for the request id).
# The door's flags (with the fingerprint) last: see apply_access.
ACCESS_MAPS = ("keys", "grants", "catalog", "upstream", "versions", "rpm", "limited", "door")
UPSTREAM_ENTRY = "replicas"
# The caller of an open door (no keys): its /v1/models lists every route.
OPEN_CALLER = "*"
# Models whose new requests the door holds (door.lua `hold_model`): served name ->
# "<deadline, epoch ms>-<owner>", changed at runtime only by the control plane.
# A request waits while its model has an entry and the deadline is ahead, at
# most HOLD_SECONDS from its arrival, then is routed as the map says then.
HELD_MAP = "held.map"
# A door that pulls its state (serving/door/agent.py): when its lease ends.
LEASE_MAP = "lease.map"


def backend_for(route: Route) -> str:
    # Served names are [A-Za-z0-9._-] (registry.models.SERVED_NAME_PATTERN), all
    # legal in a backend name; the prefix keeps them apart from the fixed ones.
    return BASE_BACKEND if route.base else f"{ADAPTER_BACKEND_PREFIX}{route.model}"


def render_map(table: RoutingTable) -> str:
    lines = [f"{model} {backend_for(route)}" for model, route in sorted(table.routes.items())]
    return "\n".join(lines) + "\n"


def _write_if_changed(path: Path, text: str, *, mode: int | None = None) -> bool:
    """Writes `text` to `path` (atomically) unless it holds it already; with
    `mode`, the file has it (from its creation on: never readable by others)."""
    with contextlib.suppress(FileNotFoundError):
        if path.read_text() == text:
            if mode is not None:
                path.chmod(mode)
            return False
    temporary = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    if mode is None:
        temporary.write_text(text)
    else:
        with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "w") as f:
            f.write(text)
    os.replace(temporary, path)
    return True


def access_maps(access: DoorAccess) -> dict[str, dict[str, str]]:
    """The door's maps for an access table (module docstring of access.py):
    what `apply_access` pushes and writes. Department slugs and served names
    hold no space, `:` or `,` (their patterns), so the keys below are unambiguous."""
    keys = {
        digest.lower(): f"{key.department}|{key.key_id}|{key.expires_at}"
        for digest, key in access.keys.items()
    }
    # A grant's end (epoch seconds), or 0: the pair needs no grant.
    grants = {
        f"{department}:{model}": str(access.grant_ends.get((department, model), 0))
        for department, model in access.allowed
    }
    departments = {department for department, _ in access.allowed}
    catalog = {
        department: _catalog_body(access.deployment, access.models_for(department))
        for department in departments
    }
    if access.open:
        everything = sorted({model for _, model in access.allowed})
        catalog[OPEN_CALLER] = _catalog_body(access.deployment, everything)
    limited = {
        entry: f"{block.until}|{block.limit}|{block.value}"
        for entry, block in access.limited.items()
    }
    rpm = {entry: str(value) for entry, value in access.rpm.items()}
    upstream = {}
    if access.upstream_key:
        upstream[UPSTREAM_ENTRY] = base64.b64encode(access.upstream_key.encode()).decode()
    flags = {"open": "1"} if access.open else {}
    versions = {name: str(version) for name, version in access.versions.items()}
    digest = hashlib.sha256()
    for name, entries in (
        ("keys", keys),
        ("grants", grants),
        ("catalog", catalog),
        ("upstream", upstream),
        ("rpm", rpm),
        ("limited", limited),
        ("door", flags),
        ("versions", versions),
    ):
        for key, value in sorted(entries.items()):
            digest.update(f"{name} {key} {value}\n".encode())
    flags["fingerprint"] = digest.hexdigest()
    return {
        "keys": keys,
        "grants": grants,
        "catalog": catalog,
        "upstream": upstream,
        "rpm": rpm,
        "limited": limited,
        "door": flags,
        "versions": versions,
    }


def _catalog_body(deployment: str, models: list[str]) -> str:
    """`GET /v1/models` for one caller, in OpenAI's list shape: the same bytes
    on every call (a fixed `created`), no paths. Base64: a map value is one word."""
    body = {
        "object": "list",
        "data": [
            {"id": model, "object": "model", "created": 0, "owned_by": deployment}
            for model in models
        ],
    }
    return base64.b64encode(json.dumps(body, separators=(",", ":")).encode()).decode()


def _map_changes(path: Path, current: dict[str, str], wanted: dict[str, str]) -> list[str]:
    lines = [f"del map {path} {key}" for key in sorted(set(current) - set(wanted))]
    for key, value in sorted(wanted.items()):
        if current.get(key) != value:
            verb = "set" if key in current else "add"
            lines.append(f"{verb} map {path} {key} {value}")
    return lines
