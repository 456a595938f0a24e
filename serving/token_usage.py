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


# reader(per, since, ids) -> {key or department id: TokensUsed}; ids None: all.
TokensReader = Callable[[Per, datetime, Iterable[int] | None], dict[int, TokensUsed]]
_readers: list[TokensReader] = []


def metering_available() -> bool:
    """Whether anything meters tokens (a reader is registered): without one,
    "used nothing" would be a guess, and limits on tokens refuse nobody."""
    return bool(_readers)


def tokens_reader_register(reader: TokensReader) -> None:
    if reader not in _readers:
        _readers.append(reader)


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
