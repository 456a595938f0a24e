"""Smoke test against ONE real vLLM server (CPU, tiny model).

Slow tier: needs the vLLM venv (installed on first use by
scripts/vllm/install.sh, ~2 min); the server is the session's shared one
(tests/support/vllm_pool.py), ~35 s to boot if no test before booted it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.vllm_client import (
    VLLMClient,
    is_already_loaded_error,
    is_not_found_error,
    model_cards,
    server_version,
    supports_load_inplace,
)
from tests.support.adapters import AdapterSpec, write_adapter_dir
from tests.support.vllm_servers import (
    VLLMServer,
)

pytestmark = pytest.mark.vllm

MAX_LORA_RANK = 16


@pytest.fixture
def server(vllm_pool) -> VLLMServer:
    """The session's first shared server (tests/support/vllm_pool.py), without
    runtime adapters: its configuration (max_lora_rank 16) is this module's."""
    srv = vllm_pool.servers(1)[0]
    assert srv.max_lora_rank == MAX_LORA_RANK
    return srv


@pytest.fixture
def client(server: VLLMServer) -> Iterator[VLLMClient]:
    with server.client(timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("adapters")


def chat_one_token(server: VLLMServer, model: str) -> str | None:
    """One chat completion through the `openai` package (falls back to requests)."""
    try:
        import openai
    except ImportError:
        result = server.client(timeout=60).complete_one_token(model)
        assert result.status_code == 200, result.error
        return result.body["choices"][0]["message"]["content"]
    api = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    response = api.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=1,
        temperature=0,
    )
    assert response.model == model
    return response.choices[0].message.content


def test_version_and_health(client: VLLMClient) -> None:
    assert client.health().status_code == 200
    version = server_version(client.version())
    assert version and version.startswith("0.")
    assert supports_load_inplace(version) == (version >= "0.33")


def test_load_list_chat_unload(server: VLLMServer, client: VLLMClient, adapters: Path) -> None:
    path = str(write_adapter_dir(adapters / "smoke-a" / "v1", AdapterSpec(seed=1)))

    loaded = client.load_adapter("smoke-a", path)
    assert loaded.status_code == 200, loaded.error
    assert isinstance(loaded.body, str) and "smoke-a" in loaded.body

    cards = {card.id: card for card in model_cards(client.list_models())}
    assert cards[server.served_name].parent is None
    assert cards["smoke-a"].root == path
    assert cards["smoke-a"].parent == server.served_name

    chat_one_token(server, "smoke-a")

    again = client.load_adapter("smoke-a", path)
    assert is_already_loaded_error(again), again

    unloaded = client.unload_adapter("smoke-a")
    assert unloaded.status_code == 200, unloaded.error
    assert "smoke-a" not in {card.id for card in model_cards(client.list_models())}

    assert is_not_found_error(client.unload_adapter("smoke-a"))


def test_rank_above_max_is_permanent_500(client: VLLMClient, adapters: Path) -> None:
    path = write_adapter_dir(adapters / "too-big" / "v1", AdapterSpec(r=MAX_LORA_RANK * 2))
    result = client.load_adapter("too-big", str(path))
    assert result.status_code == 500
    assert f"greater than max_lora_rank {MAX_LORA_RANK}" in result.error
    assert not result.transient


def test_missing_adapter_dir_is_404(client: VLLMClient, adapters: Path) -> None:
    result = client.load_adapter("ghost", str(adapters / "does-not-exist"))
    assert result.status_code == 404
    assert "No adapter found" in result.error
    assert not result.transient
