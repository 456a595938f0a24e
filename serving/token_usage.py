"""Tokens each caller used since a moment: what limits at the door (tokens
per minute, budgets per day and month) are checked against.

Serving does not read vLLM's counts itself: observability does (its OTLP
receiver, observability/metering.py) and registers its reader here in
ready(), as it registers its residency provider with serving.capacity.
Without one (the app not installed), nobody has used anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

Per = Literal["key", "department"]


@dataclass(frozen=True)
class TokensUsed:
    requests: int
    prompt_tokens: int
    completion_tokens: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class MeteringStatus:
    """Whether a deployment's tokens are metered: only once its replicas' spans
    arrive. `detail` is one sentence, fit for /readyz (public) and its page."""

    metered: bool
    detail: str


# reader(per, since, ids) -> {key or department id: TokensUsed}; ids None: all.
TokensReader = Callable[[Per, datetime, Iterable[int] | None], dict[int, TokensUsed]]
# status(deployment ids) -> {deployment id: MeteringStatus}; ids None: every deployment.
StatusReader = Callable[[Iterable[int] | None], dict[int, MeteringStatus]]
_readers: list[TokensReader] = []
_status_readers: list[StatusReader] = []

NOT_METERED = MeteringStatus(False, "nothing meters tokens (no metering app installed)")


def metering_status(deployment_ids: Iterable[int] | None = None) -> dict[int, MeteringStatus]:
    """Per deployment id, whether its tokens are metered; without a status reader
    (no metering app) none is."""
    if not _status_readers or not _readers:
        if deployment_ids is None:
            return {}
        return dict.fromkeys(deployment_ids, NOT_METERED)
    found: dict[int, MeteringStatus] = {}
    for reader in _status_readers:
        found.update(reader(deployment_ids))
    return found


def metering_available(deployment_id: int | None = None) -> bool:
    """Whether tokens are metered: on that deployment (its replicas' spans
    arrive), or, without one, on any. A deployment whose replicas send no spans
    is not metered, whatever is installed: "used nothing" there would be a
    guess, and limits on tokens refuse nobody for its calls."""
    if deployment_id is not None:
        return metering_status([deployment_id]).get(deployment_id, NOT_METERED).metered
    return any(status.metered for status in metering_status().values())


def tokens_reader_register(reader: TokensReader) -> None:
    if reader not in _readers:
        _readers.append(reader)


def metering_status_register(reader: StatusReader) -> None:
    if reader not in _status_readers:
        _status_readers.append(reader)


def tokens_used(
    per: Per, since: datetime, ids: Iterable[int] | None = None
) -> dict[int, TokensUsed]:
    """{key id or department id: what it used since `since`}, on every
    deployment; callers without a request are left out."""
    found: dict[int, TokensUsed] = {}
    for reader in _readers:
        for owner, used in reader(per, since, ids).items():
            seen = found.get(owner, TokensUsed(0, 0, 0))
            found[owner] = TokensUsed(
                seen.requests + used.requests,
                seen.prompt_tokens + used.prompt_tokens,
                seen.completion_tokens + used.completion_tokens,
            )
    return found
