"""Tokens metered per caller, adapter and version from REAL vLLM 0.32 behind a
REAL door (Debian's HAProxy 2.6): the door writes the caller's key and the
version into each request id, vLLM exports one span per request over OTLP/HTTP
to the product's receiver (a live server here), and the ledger holds exactly
vLLM's own counts: what each client was told in `usage`, streams included, and
vLLM's Prometheus totals. A client's own X-Request-Id changes nothing. Then
real Chromium (tests/browser/conftest.py) shows a department's member those
same counts on the usage page and the adapter page, on this test's vLLM (no
server of its own: the suite's time is short).

The faults (a door reload, a receiver that dies mid-write, a replica restart)
are tests/faults/test_metering_faults.py; 10,000 requests are bench/metering.py."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

import pytest
import requests
from django.db.models import Sum
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from observability.models import DailyTokens, MeteredRequest
from observability.otlp import metering_token
from serving.door.haproxy import HAProxyFrontDoor
from serving.door.routing import ReplicaView, ServedView, routing_table
from serving.door.selectors import door_access
from serving.models import AdapterGrant, GrantStatus, ServedAdapter
from serving.services.inference_keys import inference_key_issue
from tests.browser.conftest import browser, new_page  # noqa: F401 (fixtures, asked for below)
from tests.browser.test_story import sign_in
from tests.conftest import actor
from tests.factories import make_approved_version
from tests.serving.conftest import make_deployment
from tests.support.adapters import AdapterSpec, write_adapter_dir
from tests.support.haproxy import needs_haproxy, running_haproxy
from tests.support.vllm_pool import SERVED_BASE
from tests.support.vllm_servers import VLLMServer, free_port

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.django_db(transaction=True),
    needs_haproxy,
]

ADAPTER = "legal-contracts"
DEPLOYMENT = "metered-cpu"


@dataclass
class Metered:
    url: str
    server: VLLMServer
    door: HAProxyFrontDoor
    keys: dict  # department slug -> (InferenceKey, secret)
    version_id: int


def vllm_totals(server: VLLMServer) -> tuple[int, int]:
    """vLLM's own prompt and generation token counters (since it started)."""
    text = requests.get(server.base_url + "/metrics", timeout=10).text
    totals = {"vllm:prompt_tokens": 0.0, "vllm:generation_tokens": 0.0}
    for family in text_string_to_metric_families(text):
        if family.name in totals:
            totals[family.name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return int(totals["vllm:prompt_tokens"]), int(totals["vllm:generation_tokens"])


def call(url, secret, model, *, stream, forged="") -> tuple[int, int]:
    """One chat completion through the door; the usage vLLM told the client."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Clause {uuid.uuid4().hex[:6]} says"}],
        "max_tokens": 2,
        "temperature": 0,
        "stream": stream,
    }
    headers = {"Authorization": f"Bearer {secret}"}
    if forged:
        headers["X-Request-Id"] = forged
    response = requests.post(
        url + "/v1/chat/completions", json=body, headers=headers, timeout=60, stream=stream
    )
    assert response.status_code == 200, response.text
    if not stream:
        usage = response.json()["usage"]
    else:
        usage = None
        for line in response.iter_lines():
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
        # --enable-force-include-usage: the client did not ask for it.
        assert usage is not None, "the stream ended without a usage chunk"
    return usage["prompt_tokens"], usage["completion_tokens"]


def wait_recorded(count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while MeteredRequest.objects.count() < count:
        assert time.monotonic() < deadline, (
            f"{MeteredRequest.objects.count()} of {count} spans recorded"
        )
        time.sleep(0.2)


@pytest.fixture
def metered(live_server, root, lena, alex, fred, legal, finance, contracts, tiny_model, tmp_path):
    server = VLLMServer(
        name="metered",
        model_dir=tiny_model,
        log_dir=tmp_path,
        served_name=SERVED_BASE,
        env={
            "SERVE_OTLP_TRACES_ENDPOINT": f"{live_server.url}/otlp/{DEPLOYMENT}/v1/traces",
            "SERVE_OTLP_TOKEN": metering_token(DEPLOYMENT),
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        },
    )
    deployment = make_deployment(root, [server.base_url], tmp_path / "volume", name=DEPLOYMENT)
    version = make_approved_version(lena, alex, contracts, AdapterSpec(seed=1))
    path = str(write_adapter_dir(tmp_path / "contracts-v1", AdapterSpec(seed=1)))
    ServedAdapter.objects.create(
        deployment=deployment, adapter=contracts, version=version, served_path=path
    )
    # Finance calls Legal's adapter through an approved grant: Finance is charged.
    AdapterGrant.objects.create(
        adapter=contracts,
        department=finance,
        status=GrantStatus.APPROVED,
        expires_at=timezone.now() + timedelta(days=1),
        requested_by=fred,
        decided_by=alex,
        decided_at=timezone.now(),
    )
    keys = {
        slug: inference_key_issue(
            actor=actor(root), department=department, name="meter", expires_in_days=3
        )
        for slug, department in (("legal", legal), ("finance", finance))
    }
    server.start_and_wait(300)
    try:
        with server.client(timeout=60) as client:
            assert client.load_adapter(ADAPTER, path).ok
        table = routing_table(
            deployment=DEPLOYMENT,
            base_model=SERVED_BASE,
            replicas=[ReplicaView(1, server.base_url, down=False, loaded={ADAPTER: path})],
            served=[ServedView(ADAPTER, path, held=False)],
        )
        door = HAProxyFrontDoor(tmp_path / "gw", listen=f"127.0.0.1:{free_port()}")
        door.write(table)
        with running_haproxy(door, log=tmp_path / "haproxy.log", access=door_access(deployment)):
            yield Metered(f"http://{door.listen}", server, door, keys, version.pk)
    finally:
        server.stop()


def test_tokens_are_vllm_s_own_count_per_caller_adapter_and_version(metered, request, contracts):
    told: Counter = Counter()  # (department, model) -> prompt, completion as clients saw them
    before = vllm_totals(metered.server)
    calls = 0
    for index in range(24):
        slug = ("legal", "finance")[index % 2]
        model = (ADAPTER, SERVED_BASE)[(index // 2) % 2]
        other = metered.keys["legal" if slug == "finance" else "finance"][0].pk
        # Every third call streams; every fourth claims to be the other department.
        forged = f"u1.k{other}.v{metered.version_id}.{uuid.uuid4()}" if index % 4 == 0 else ""
        prompt, completion = call(
            metered.url, metered.keys[slug][1], model, stream=index % 3 == 0, forged=forged
        )
        told[(slug, model, "prompt")] += prompt
        told[(slug, model, "completion")] += completion
        calls += 1
    wait_recorded(calls)

    after = vllm_totals(metered.server)
    ledger = MeteredRequest.objects.aggregate(p=Sum("prompt_tokens"), c=Sum("completion_tokens"))
    assert (ledger["p"], ledger["c"]) == (after[0] - before[0], after[1] - before[1])
    assert all(
        rid.startswith("chatcmpl-u1.k")
        for rid in MeteredRequest.objects.values_list("request_id", flat=True)
    )

    rows = {
        (row.department.slug, row.served_name): row
        for row in DailyTokens.objects.select_related("department", "owner")
    }
    assert set(rows) == {(s, m) for s in ("legal", "finance") for m in (ADAPTER, SERVED_BASE)}
    for (slug, model), row in rows.items():
        assert row.key == metered.keys[slug][0]  # the forged ids changed nothing
        assert row.requests == 6
        assert row.prompt_tokens == told[(slug, model, "prompt")]
        assert row.completion_tokens == told[(slug, model, "completion")]
        if model == ADAPTER:
            assert row.owner.slug == "legal" and row.version_id == metered.version_id
        else:
            assert row.owner is None and row.version is None

    # What a member of Legal reads in a browser: the same counts, not requests only.
    page_shows_vllm_s_tokens(request, told, rows, contracts.pk)


def page_shows_vllm_s_tokens(request, told: Counter, rows: dict, adapter_pk: int) -> None:
    """Lena (Legal) in real Chromium. The usage page's calls table: vLLM's
    prompt and completion counts of Legal's calls and of Finance's calls of
    Legal's adapter (Legal owns it: it sees who used it), never Finance's calls
    of the base model; the cost table: Legal's own sums; the adapter page's
    usage card: every caller's tokens of the adapter. Asked for here, after the
    metering's assertions, so that Chromium starts only when there is
    something to show (tests/browser/conftest.py's fixtures)."""
    page = request.getfixturevalue("new_page")()
    sign_in(page, "lena")
    page.goto("/usage/")
    calls = page.get_by_test_id("usage-calls")

    def line(slug, model):
        return calls.get_by_test_id(f"calls-{slug}-{model}-v{rows[(slug, model)].version_number}")

    for slug, model in (("legal", ADAPTER), ("legal", SERVED_BASE), ("finance", ADAPTER)):
        shown = [line(slug, model).get_by_test_id(f"{kind}-tokens").inner_text()
                 for kind in ("prompt", "completion")]  # fmt: skip
        assert shown == [str(told[(slug, model, "prompt")]), str(told[(slug, model, "completion")])]
    assert line("finance", SERVED_BASE).count() == 0
    legal = [told[("legal", model, kind)] for kind in ("prompt", "completion")
             for model in (ADAPTER, SERVED_BASE)]  # fmt: skip
    called = page.get_by_test_id("cost-legal").get_by_test_id("called-tokens").inner_text()
    assert called == f"{legal[0] + legal[1]} + {legal[2] + legal[3]}"

    page.goto(f"/adapters/{adapter_pk}/")
    adapter_tokens = sum(told[(slug, ADAPTER, kind)] for slug in ("legal", "finance")
                         for kind in ("prompt", "completion"))  # fmt: skip
    card = page.get_by_test_id("adapter-usage")
    assert card.get_by_test_id(f"tokens-{DEPLOYMENT}").inner_text() == str(adapter_tokens)
