"""POST /api/v1/planner/, the planner pages and `manage.py plan`."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from serving.rules.planner import ModelShape, lora_pool_bytes
from tests.observability.test_planner import LLAMA_3_8B, TINY

pytestmark = pytest.mark.django_db
GIB = 1024**3


def test_a_plan_from_a_config_json(as_token):
    body = {"config": LLAMA_3_8B, "gpu_type": "L40S", "use_cases": 10, "price_per_gpu_hour": 2}
    response = as_token.post("/api/v1/planner/", body, format="json")
    assert response.status_code == 200, response.content
    plan = response.json()
    assert plan["vram_bytes"] == 48 * GIB
    expected = lora_pool_bytes(ModelShape.from_config(LLAMA_3_8B), 4, 16)
    assert plan["lora_pool_bytes"] == expected
    assert plan["economics"]["dedicated_gpus"] == 10 and plan["economics"]["shared_gpus"] == 1
    assert plan["economics"]["saving_per_month"] == 9 * 2 * 730
    assert plan["lora_share_verdict"] == "below"


def test_bad_fields_are_named_in_a_400(as_lena):
    body = {
        "config": {"hidden_size": 0},
        "gpu_memory_bytes": 1,
        "max_lora_rank": 48,
        "gpu_memory_utilization": 2,
    }
    response = as_lena.post("/api/v1/planner/", body, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert {"max_lora_rank", "gpu_memory_utilization"} <= set(error["details"]["fields"])
    # The config's own problems come from the planner, once the fields are well-formed.
    body = {"config": {"hidden_size": 0, "vocab_size": 8}, "gpu_memory_bytes": GIB}
    details = as_lena.post("/api/v1/planner/", body, format="json").json()["error"]["details"][
        "fields"
    ]
    assert {"config.hidden_size", "config.num_hidden_layers"} <= set(details)


def test_max_cpu_loras_below_max_loras_is_refused(as_lena):
    body = {"config": TINY, "gpu_memory_bytes": GIB, "max_loras": 8, "max_cpu_loras": 2}
    response = as_lena.post("/api/v1/planner/", body, format="json")
    assert response.status_code == 400
    assert "max_cpu_loras" in response.json()["error"]["details"]["fields"]


def test_a_deployment_plans_from_its_own_configuration(as_lena, deployment):
    deployment.gpu_memory_bytes = 16 * GIB
    deployment.save()
    response = as_lena.post("/api/v1/planner/", {"deployment": deployment.name}, format="json")
    assert response.status_code == 200, response.content
    plan = response.json()
    # SERVING_DTYPE float16, 2 slots at rank 16 (tests/serving/test_gate.py).
    assert plan["lora_pool_bytes"] == 2 * 16 * 5632 * 2
    assert plan["vram_bytes"] == 16 * GIB
    overridden = as_lena.post(
        "/api/v1/planner/", {"deployment": deployment.name, "max_loras": 4}, format="json"
    ).json()
    assert overridden["lora_pool_bytes"] == 2 * plan["lora_pool_bytes"]


def test_a_deployment_without_gpu_memory_is_a_named_400(as_lena, deployment):
    response = as_lena.post("/api/v1/planner/", {"deployment": deployment.name}, format="json")
    assert response.status_code == 400
    assert "gpu_memory_bytes" in response.json()["error"]["details"]["fields"]


def test_an_unknown_deployment_is_404(as_lena):
    response = as_lena.post("/api/v1/planner/", {"deployment": "nowhere"}, format="json")
    assert response.status_code == 404


def test_anonymous_callers_get_401(anonymous):
    response = anonymous.post("/api/v1/planner/", {"config": TINY}, format="json")
    assert response.status_code == 401


def test_the_schema_documents_the_planner_exactly(anonymous):
    schema = anonymous.get("/api/schema/", {"format": "json"}).json()
    operation = schema["paths"]["/api/v1/planner/"]["post"]
    # The shared error statuses of every operation with a body (core.api.schema).
    assert set(operation["responses"]) == {"200", "400", "401", "403", "404", "409", "415"}
    request_ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    inputs = schema["components"]["schemas"][request_ref.rsplit("/", 1)[1]]["properties"]
    assert {
        "config",
        "deployment",
        "gpu_type",
        "max_loras",
        "max_lora_rank",
        "context_length",
    } <= set(inputs)
    rank = inputs["max_lora_rank"]
    rank = (
        schema["components"]["schemas"][rank["$ref"].rsplit("/", 1)[1]] if "$ref" in rank else rank
    )
    assert rank["enum"] == [1, 8, 16, 32, 64, 128, 256, 320, 512]
    plan_ref = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    plan = schema["components"]["schemas"][plan_ref.rsplit("/", 1)[1]]
    assert plan["properties"]["lora_pool_bytes"]["type"] == "integer"
    assert "economics" in plan["required"]


# -- pages --------------------------------------------------------------------------------


def test_the_planner_page_plans_a_pasted_config(web_lena):
    query = {"config": json.dumps(LLAMA_3_8B), "gpu_type": "L40S", "use_cases": "10"}
    page = web_lena.get("/planner/", query).content.decode()
    assert 'data-testid="plan-pool"' in page
    assert "One pod per use case" in page and "below the advised 10–15%" in page


def test_the_planner_page_shows_the_values_it_plans_with(web_lena, settings):
    """Left as they are, the inputs mean what they show: no placeholder that the
    plan then ignores ("1 use case", cost 0.00)."""
    settings.PLANNER_USE_CASES, settings.PLANNER_PRICE_PER_GPU_HOUR = 12, 3.5
    blank = web_lena.get("/planner/").content.decode()
    assert 'id="use_cases" name="use_cases" inputmode="numeric" value="12"' in blank
    assert 'id="price_per_gpu_hour" name="price_per_gpu_hour" value="3.50"' in blank
    assert 'placeholder="10"' not in blank and 'placeholder="2.00"' not in blank

    # Submitting the form as shown, and leaving the two fields out, plan the same.
    shown = {"config": json.dumps(LLAMA_3_8B), "gpu_type": "L40S"}
    for query in (shown, {**shown, "use_cases": "12", "price_per_gpu_hour": "3.50"}):
        page = web_lena.get("/planner/", query).content.decode()
        assert "<h3>12 use cases</h3>" in page, page
        # 12 dedicated GPUs at 3.50 an hour, 730 hours a month.
        assert f"{12 * 3.5 * 730:,.2f}" in page


def test_memory_is_labelled_in_the_binary_units_it_is_counted_in(web_lena):
    page = web_lena.get(
        "/planner/", {"config": json.dumps(LLAMA_3_8B), "gpu_type": "L40S"}
    ).content.decode()
    assert "48.0\xa0GiB (L40S)" in page and "\xa0GB" not in page


def test_the_planner_page_names_bad_fields(web_lena):
    page = web_lena.get("/planner/", {"config": "{not json", "gpu_type": "L40S"}).content.decode()
    assert "Not JSON" in page and 'data-testid="plan-pool"' not in page
    page = web_lena.get(
        "/planner/", {"config": json.dumps(TINY), "gpu_type": "Z80"}
    ).content.decode()
    assert "Unknown GPU" in page


def test_a_deployments_plan_page_is_filled_from_it(web_lena, deployment):
    deployment.gpu_memory_bytes = 16 * GIB
    deployment.save()
    page = web_lena.get(f"/deployments/{deployment.name}/plan/").content.decode()
    assert f"Capacity of {deployment.name}" in page and 'data-testid="plan-pool"' in page
    assert "no readings of vLLM" in page


def test_the_planner_pages_need_a_sign_in(client, deployment):
    assert client.get("/planner/").status_code == 302
    assert client.get(f"/deployments/{deployment.name}/plan/").status_code == 302


# -- manage.py plan ------------------------------------------------------------------------


def test_the_command_plans_a_config_file(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_3_8B))
    out = StringIO()
    call_command(
        "plan",
        "--config",
        str(config),
        "--gpu-type",
        "L40S",
        "--use-cases",
        "10",
        "--json",
        stdout=out,
    )
    plan = json.loads(out.getvalue())
    assert plan["economics"]["dedicated_gpus"] == 10
    out = StringIO()
    call_command("plan", "--config", str(config), "--gpu-type", "L40S", stdout=out)
    assert "LoRA pool" in out.getvalue() and "KV cache" in out.getvalue()


def test_the_command_names_bad_input(tmp_path, deployment):
    with pytest.raises(CommandError, match="max_lora_rank"):
        call_command("plan", "--deployment", deployment.name, "--max-lora-rank", "7")
    with pytest.raises(CommandError, match="No deployment"):
        call_command("plan", "--deployment", "nowhere")


def test_a_deployments_plan_recommends_max_loras_from_what_vllm_reported(as_lena, deployment):
    from django.utils import timezone

    from observability.models import ReplicaLoraState
    from serving.models import Replica

    deployment.gpu_memory_bytes = 16 * GIB
    deployment.save()
    for url, peak, waiting in (("http://a:8000", 1, 0), ("http://b:8000", 2, 3)):
        replica = Replica.objects.create(deployment=deployment, base_url=url, health="up")
        ReplicaLoraState.objects.create(
            replica=replica, observed_at=timezone.now(), ok=True, samples=40,
            peak_running=peak, waiting_samples=waiting,
        )  # fmt: skip
    plan = as_lena.post("/api/v1/planner/", {"deployment": deployment.name}, format="json").json()
    # Both slots were busy and requests waited: double max_loras (2 -> 4).
    assert plan["max_loras_recommended"] == 4
    assert "waited for a LoRA slot" in plan["recommendation"]
    ReplicaLoraState.objects.update(peak_running=1, waiting_samples=0)
    plan = as_lena.post("/api/v1/planner/", {"deployment": deployment.name}, format="json").json()
    assert plan["max_loras_recommended"] == 1
