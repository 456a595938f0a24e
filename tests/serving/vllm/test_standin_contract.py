"""The vLLM stand-in (tests/support/vllm_standin.py, used by bench/scale.py
beyond the few real servers this machine carries) answers like real vLLM: the
same calls go to both, and status, body kind and error type must agree."""

from __future__ import annotations

import asyncio
import threading

import pytest
import requests

from tests.support.adapters import AdapterSpec, write_adapter_dir
from tests.support.vllm_standin import StandinFleet

from .conftest import MAX_LORA_RANK, SERVED_BASE

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def standin_url():
    loop = asyncio.new_event_loop()
    fleet = StandinFleet(1, base_model=SERVED_BASE, max_lora_rank=MAX_LORA_RANK)
    urls = loop.run_until_complete(fleet.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield urls[0]
    asyncio.run_coroutine_threadsafe(fleet.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def _shape(response: requests.Response) -> tuple:
    """What a client may rely on: status, plain text or JSON, the error type."""
    kind = (
        "json"
        if response.headers.get("content-type", "").startswith("application/json")
        else "text"
    )
    error_type = response.json().get("error", {}).get("type") if kind == "json" else None
    return response.status_code, kind, error_type


def _conversation(base_url: str, adapters: dict[str, str]) -> list[tuple]:
    post = lambda path, body: requests.post(base_url + path, json=body, timeout=60)  # noqa: E731
    seen = [
        (
            "load",
            _shape(
                post("/v1/load_lora_adapter", {"lora_name": "c", "lora_path": adapters["good"]})
            ),
        ),
        (
            "load again",
            _shape(
                post("/v1/load_lora_adapter", {"lora_name": "c", "lora_path": adapters["good"]})
            ),
        ),
        (
            "load missing path",
            _shape(
                post("/v1/load_lora_adapter", {"lora_name": "m", "lora_path": adapters["missing"]})
            ),
        ),
        (
            "load rank too high",
            _shape(
                post("/v1/load_lora_adapter", {"lora_name": "r", "lora_path": adapters["rank64"]})
            ),
        ),
        (
            "complete unknown",
            _shape(post("/v1/completions", {"model": "nope", "prompt": "hi", "max_tokens": 1})),
        ),
        (
            "complete adapter",
            _shape(post("/v1/completions", {"model": "c", "prompt": "hi", "max_tokens": 1})),
        ),
        ("unload", _shape(post("/v1/unload_lora_adapter", {"lora_name": "c"}))),
        ("unload unknown", _shape(post("/v1/unload_lora_adapter", {"lora_name": "c"}))),
    ]
    listing = requests.get(base_url + "/v1/models", timeout=30).json()["data"]
    seen.append(("models", [(card["id"], card.get("parent")) for card in listing]))
    return seen


def test_the_standin_answers_the_runtime_lora_api_like_real_vllm(
    vllm_servers, standin_url, tmp_path
):
    adapters = {
        "good": str(write_adapter_dir(tmp_path / "good", AdapterSpec(seed=3))),
        "rank64": str(write_adapter_dir(tmp_path / "rank64", AdapterSpec(r=64))),
        "missing": str(tmp_path / "missing"),
    }
    real = _conversation(vllm_servers[0].base_url, adapters)
    standin = _conversation(standin_url, adapters)
    assert standin == real


def test_its_models_list_has_the_real_card_shape(vllm_servers, standin_url, tmp_path):
    path = str(write_adapter_dir(tmp_path / "shape", AdapterSpec(seed=4)))
    cards = {}
    for label, url in (("real", vllm_servers[0].base_url), ("standin", standin_url)):
        requests.post(
            url + "/v1/load_lora_adapter", json={"lora_name": "s", "lora_path": path}, timeout=60
        )
        listing = requests.get(url + "/v1/models", timeout=30).json()["data"]
        card = next(c for c in listing if c["id"] == "s")
        cards[label] = (card["root"], card["parent"])
        requests.post(url + "/v1/unload_lora_adapter", json={"lora_name": "s"}, timeout=60)
    assert cards["standin"] == cards["real"] == (path, SERVED_BASE)
