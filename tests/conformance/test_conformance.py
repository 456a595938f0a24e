"""Differential conformance: for every case, real vLLM's verdict against PEFT's
ground truth decides whether the adapter must be served or refused, and the
product must agree.

- serve: vLLM loads the adapter and decodes PEFT's greedy tokens, with logprobs
  within vllm_side.LOGPROB_TOLERANCE. The product must accept the upload, pass
  the gate (shapes derived from the base model's config.json), roll it out to
  the same real vLLM and answer with PEFT's tokens under the adapter's name.
- refuse: vLLM refuses it, fails on it or decodes something else than PEFT
  (or the product's policy refuses it, named in matrix.Case.policy). The
  product must refuse it at upload or at the gate with a message and a reason
  code, and start no rollout (so vLLM never sees it).
"""

from __future__ import annotations

import io
import json
import tarfile
import time

import pytest
import requests
from django.core.files.uploadedfile import SimpleUploadedFile

from serving.models import Rollout
from tests.conformance import cases as generated_cases
from tests.conformance import matrix, report
from tests.conformance.conftest import RESULTS
from tests.conformance.vllm_side import compare, run_case
from tests.serving.vllm.conftest import api_for, ok

pytestmark = [pytest.mark.conformance, pytest.mark.django_db(transaction=True)]

ROLLOUT_TIMEOUT = 120.0


def vllm_verdict(item: generated_cases.Generated, base_url: str) -> dict:
    """vLLM's verdict on one case, cached by the case's content hash."""
    path = item.verdict_path
    if path.is_file():
        return json.loads(path.read_text())
    truth = item.truth
    if truth["peft"] is None:
        verdict = {"serve": False, "why": f"PEFT cannot load it: {truth['peft_error']}"}
    else:
        name = f"truth-{item.folder.name}"[:60]
        outcome = run_case(base_url, name, str(item.adapter), matrix.PROMPT, matrix.STEPS)
        comparison = compare(truth["peft"], outcome)
        verdict = {
            "serve": comparison.matches,
            "why": comparison.reason,
            "max_logprob_error": comparison.max_logprob_error,
            "vllm": outcome.as_dict(),
        }
    verdict["base_logprob_error"] = None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(verdict, indent=1))
    return verdict


def _archive(folder) -> SimpleUploadedFile:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for child in sorted(folder.iterdir()):
            archive.add(child, arcname=child.name)
    return SimpleUploadedFile("adapter.tar.gz", buffer.getvalue(), content_type="application/gzip")


def _served_name(case: matrix.Case) -> str:
    return f"c-{case.id}".replace("_", "-")[:60]


def _wait_rollout(admin, rollout_id: int) -> dict:
    deadline = time.monotonic() + ROLLOUT_TIMEOUT
    while True:
        body = ok(admin.get(f"/api/v1/rollouts/{rollout_id}/"))
        if body["status"] in {"succeeded", "failed", "rolled_back"}:
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"rollout {rollout_id} still {body['status']}")
        time.sleep(0.25)


def _message(response) -> tuple[str, str]:
    body = response.json()
    error = body.get("error", body)
    code = error.get("code") or body.get("code") or ""
    message = error.get("message") or json.dumps(body)[:600]
    details = error.get("details") or {}
    failures = details.get("failures") or details.get("checks") or []
    if failures:
        message += " " + " ".join(
            f.get("message", "") for f in failures if isinstance(f, dict) and not f.get("ok")
        )
    return str(code), message


def product_outcome(
    item: generated_cases.Generated, deployment: str, people, base_url: str
) -> dict:
    """What the product does with the case, driven as its users drive it."""
    admin, member, approver = people
    case = item.case
    adapter = ok(
        member.post(
            "/api/v1/adapters/",
            {
                "department": "legal",
                "name": f"{case.architecture}-{case.id}".replace("_", "-"),
                "base_model": f"conformance/{case.architecture}",
                "served_name": _served_name(case),
            },
            format="json",
        ),
        201,
    )
    upload = member.post(
        f"/api/v1/adapters/{adapter['id']}/versions/",
        {"files": [_archive(item.adapter)]},
        format="multipart",
    )
    if upload.status_code != 201:
        assert 400 <= upload.status_code < 500, upload.content[:600]
        code, message = _message(upload)
        return {"stage": "upload", "served": False, "code": code, "message": message}
    version = upload.json()
    url = f"/api/v1/versions/{version['id']}"
    ok(member.post(f"{url}/submit/"))
    ok(approver.post(f"{url}/approve/", {"comment": "ok"}, format="json"))
    promotion = member.post(
        "/api/v1/promotions/", {"deployment": deployment, "version": version["id"]}, format="json"
    )
    if promotion.status_code != 201:
        assert 400 <= promotion.status_code < 500, promotion.content[:600]
        code, message = _message(promotion)
        rollouts = Rollout.objects.filter(target_version_id=version["id"]).count()
        return {
            "stage": "gate",
            "served": False,
            "code": code,
            "message": message,
            "rollouts": rollouts,
        }
    rollout = _wait_rollout(admin, promotion.json()["rollout"])
    if rollout["status"] != "succeeded":
        return {
            "stage": "rollout",
            "served": False,
            "code": rollout["status"],
            "message": json.dumps(rollout)[:600],
            "rollouts": 1,
        }
    answer = requests.post(
        f"{base_url}/v1/completions",
        json={
            "model": _served_name(case),
            "prompt": matrix.PROMPT,
            "max_tokens": matrix.STEPS,
            "temperature": 0,
            "ignore_eos": True,
            "return_tokens_as_token_ids": True,
            "logprobs": 1,
        },
        timeout=120,
    )
    tokens = None
    if answer.status_code == 200:
        choice = answer.json()["choices"][0]
        tokens = [int(t.split(":", 1)[1]) for t in choice["logprobs"]["tokens"]]
    return {
        "stage": "served",
        "served": True,
        "tokens": tokens,
        "answer_status": answer.status_code,
        "code": "",
        "message": "",
    }


def disagreement(item: generated_cases.Generated, verdict: dict, product: dict) -> str | None:
    case = item.case
    must_serve = verdict["serve"] and not case.policy
    if must_serve:
        if not product["served"]:
            return f"false refusal at {product['stage']}: {product['code']} {product['message']}"
        if product["tokens"] != item.truth["peft"]["tokens"]:
            return f"served through the product, but answered {product['tokens']}"
        return None
    if product["served"] or product["stage"] == "rollout":
        return f"false acceptance: reached vLLM ({product['stage']}); vLLM: {verdict['why']}"
    if not product["code"] or len(product["message"]) < 20:
        return f"refused without a reason: {product}"
    if product.get("rollouts"):
        return "refused, but a rollout was started"
    return None


@pytest.mark.parametrize("architecture", list(matrix.ARCHITECTURES))
def test_the_product_agrees_with_vllm_and_peft(
    architecture, generated, server_for, celery_worker, fast_retries, root, lena, alex, tmp_path
):
    models, cases = generated
    mine = [c for c in cases.values() if c.case.architecture == architecture]
    assert mine, f"no case on {architecture}"
    server = server_for(architecture)
    people = (api_for(root), api_for(lena), api_for(alex))
    volume = tmp_path / "volume"
    deployment = ok(
        people[0].post(
            "/api/v1/deployments/",
            {
                "name": f"conformance-{architecture}",
                "environment": "staging",
                "base_model_name": f"conformance/{architecture}",
                "base_model_path": str(models[architecture]),
                "replica_urls": [server.base_url],
                "volume_write_path": str(volume),
                "volume_serve_path": str(volume),
                "max_loras": 2,
                "max_cpu_loras": server.max_cpu_loras,
                "max_lora_rank": 16,
            },
            format="json",
        ),
        201,
    )
    rows, problems = [], []
    started = time.monotonic()
    for item in mine:
        verdict = vllm_verdict(item, server.base_url)
        product = product_outcome(item, deployment["name"], people, server.base_url)
        problem = disagreement(item, verdict, product)
        rows.append(report.row(item, verdict, product, problem))
        if problem:
            problems.append(f"{item.case.id}: {problem}")
    print(f"[conformance] {architecture}: {len(mine)} cases in {time.monotonic() - started:.0f} s")
    RESULTS[architecture] = rows
    report.write(RESULTS)
    assert not problems, "\n".join(problems)
    if architecture == matrix.QUICK_ARCHITECTURE:
        the_record_is_checked_against_the_replica(deployment, cases, people, server, models)


def the_record_is_checked_against_the_replica(deployment, cases, people, server, models):
    """Deployment facts read, not typed, against this real server: what it reports
    matches the record; a record typed wrong is a drift and blocks promotions."""
    from serving.models import Deployment, DriftEvent, DriftKind, Replica
    from serving.reconcile.tick import reconcile_deployment

    admin, member, approver = people
    record = Deployment.objects.get(name=deployment["name"])
    reconcile_deployment(record.pk, "conformance")  # its listing and /metrics
    replica = Replica.objects.get(deployment=record)
    assert replica.reported_facts == {
        "base_model": "conformance/llama",
        "root": str(models["llama"]),
        "max_lora": 2,  # the server's --max-loras, from vllm:lora_requests_info
    }
    assert ok(admin.get(f"/api/v1/deployments/{record.name}/"))["fact_disputes"] == []

    # An admin typed max_loras 1 for a server started with --max-loras 2.
    ok(admin.patch(f"/api/v1/deployments/{record.name}/", {"max_loras": 1}, format="json"))
    # Nothing re-read: the dispute is against the record.
    body = ok(admin.get(f"/api/v1/deployments/{record.name}/"))
    assert [(d["fact"], d["reported"]) for d in body["fact_disputes"]] == [("max_loras", 2)]
    page = admin.get(f"/deployments/{record.name}/").content.decode()
    assert 'data-testid="fact-dispute"' in page and "--max-loras 1" in page

    default = cases[f"{matrix.QUICK_ARCHITECTURE}-default"]
    version = _approved(member, approver, "facts-check", default.adapter)
    body = {"deployment": record.name, "version": version}
    refused = member.post("/api/v1/promotions/", body, format="json")
    assert refused.status_code == 409, refused.content
    assert refused.json()["error"]["code"] == "replica_facts_disputed"
    assert "max_loras" in refused.json()["error"]["message"]

    # The admin resolves it by correcting the record; the promotion goes through.
    ok(admin.patch(f"/api/v1/deployments/{record.name}/", {"max_loras": 2}, format="json"))
    promoted = member.post("/api/v1/promotions/", body, format="json")
    assert promoted.status_code == 201, promoted.content
    assert _wait_rollout(admin, promoted.json()["rollout"])["status"] == "succeeded"
    # A fact_disputed DriftEvent is written when a replica REPORTS a disputing fact
    # (tests/serving/test_replica_facts.py); a record edited into dispute shows in
    # fact_disputes and on the page, as above.
    assert not DriftEvent.objects.filter(deployment=record, kind=DriftKind.FACT_DISPUTED).exists()

    # max_lora_rank, which vLLM 0.32 shows only in a refused load: the record says
    # 32 for a server started with --max-lora-rank 16, so the gate lets a rank-32
    # adapter through, vLLM refuses it, and the refusal is the replica's report.
    ok(admin.patch(f"/api/v1/deployments/{record.name}/", {"max_lora_rank": 32}, format="json"))
    above = cases[f"{matrix.QUICK_ARCHITECTURE}-rank32"]
    rank32 = {
        "deployment": record.name,
        "version": _approved(member, approver, "rank-check", above.adapter),
    }
    promoted = member.post("/api/v1/promotions/", rank32, format="json")
    assert promoted.status_code == 201, promoted.content
    assert _wait_rollout(admin, promoted.json()["rollout"])["status"] == "rolled_back"
    assert Replica.objects.get(pk=replica.pk).reported_facts["max_lora_rank"] == 16
    event = DriftEvent.objects.get(deployment=record, kind=DriftKind.FACT_DISPUTED)
    assert "max_lora_rank 16" in event.detail and "records 32" in event.detail
    refused = member.post("/api/v1/promotions/", rank32, format="json")
    assert refused.status_code == 409 and "max_lora_rank" in refused.json()["error"]["message"]
    ok(admin.patch(f"/api/v1/deployments/{record.name}/", {"max_lora_rank": 16}, format="json"))
    assert ok(admin.get(f"/api/v1/deployments/{record.name}/"))["fact_disputes"] == []


def _approved(member, approver, name: str, folder) -> int:
    """A version of a new legal adapter `name` from `folder`, submitted and approved."""
    adapter = ok(
        member.post(
            "/api/v1/adapters/",
            {
                "department": "legal",
                "name": name,
                "base_model": "conformance/llama",
                "served_name": name,
            },
            format="json",
        ),
        201,
    )
    files = {"files": [_archive(folder)]}
    version = ok(
        member.post(f"/api/v1/adapters/{adapter['id']}/versions/", files, format="multipart"), 201
    )
    url = f"/api/v1/versions/{version['id']}"
    ok(member.post(f"{url}/submit/"))
    ok(approver.post(f"{url}/approve/", {"comment": "ok"}, format="json"))
    return version["id"]
