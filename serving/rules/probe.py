"""What an adapter does to the base model's output, measured.

Listing the right root and answering one completion does not prove a replica
serves the right weights: an untrained adapter (every lora_B zero) answers
exactly like the base model, and a replica can serve other weights under the
same name. So verification sends a fixed prompt at temperature 0 with
logprobs through the adapter and through the base model:

- identical output means the adapter has no effect: verification fails;
- the first verified replica's output becomes the version's fingerprint on
  that deployment, and every other replica (and every later re-check by the
  reconcile) must match it within a tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PROBE_PROMPT = "The parties agree that the contract"
PROBE_TOKENS = 4
# Below this, two outputs are "the same": float32 greedy decoding on one
# machine repeats bit for bit, so only a real change in weights moves the numbers.
NO_EFFECT_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Probe:
    tokens: tuple[str, ...]
    logprobs: tuple[float, ...]

    @classmethod
    def from_body(cls, body) -> Probe | None:
        """The probe in a /v1/completions answer, or None if it has none."""
        try:
            logprobs = body["choices"][0]["logprobs"]
            tokens = tuple(str(t) for t in logprobs["tokens"])
            values = tuple(float(v) for v in logprobs["token_logprobs"])
        except (KeyError, IndexError, TypeError, ValueError):
            return None
        if not tokens or len(tokens) != len(values):
            return None
        return cls(tokens, values)

    @classmethod
    def from_dict(cls, data: dict) -> Probe:
        return cls(
            tuple(_unescape(t) for t in data["tokens"]),
            tuple(float(v) for v in data["logprobs"]),
        )

    def as_dict(self) -> dict:
        """For a JSON column. The tokens are backslash-escaped: a model may emit any
        character, and PostgreSQL's jsonb refuses \\u0000 (the tiny test model
        emits it), which would fail the write of a fingerprint."""
        return {"tokens": [_escape(t) for t in self.tokens], "logprobs": list(self.logprobs)}

    def distance(self, other: Probe) -> float:
        """The largest logprob difference; infinite when the tokens differ."""
        if self.tokens != other.tokens:
            return float("inf")
        return max(
            (abs(a - b) for a, b in zip(self.logprobs, other.logprobs, strict=True)), default=0.0
        )


def _escape(token: str) -> str:
    return token.encode("unicode_escape").decode("ascii")


def _unescape(text: str) -> str:
    return text.encode("ascii").decode("unicode_escape")


def describe_distance(distance: float) -> str:
    if math.isinf(distance):
        return "distance inf: the greedy tokens differ"
    return f"distance {distance:.3g}"


def has_no_effect(adapter: Probe, base: Probe) -> bool:
    return adapter.distance(base) <= NO_EFFECT_TOLERANCE


def matches(fingerprint: Probe, probe: Probe, tolerance: float) -> bool:
    return fingerprint.distance(probe) <= tolerance
