import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from core.models import AuditEvent
from registry.models import AdapterVersion, VersionStatus
from tests.factories import archive_upload, make_adapter, make_version
from tests.support.adapters import AdapterSpec, adapter_zip

pytestmark = pytest.mark.django_db


@pytest.fixture
def contracts(lena, legal):
    return make_adapter(lena, legal, name="contracts")


def register(client, adapter, upload=None, **headers):
    return client.post(
        f"/api/v1/adapters/{adapter.pk}/versions/",
        {"files": [upload or archive_upload()]},
        format="multipart",
        **headers,
    )


def test_member_registers_version_one_with_parsed_metadata(as_lena, contracts):
    response = register(as_lena, contracts, archive_upload(AdapterSpec(r=4, lora_alpha=8)))

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["number"] == 1
    assert body["status"] == "registered"
    assert body["r"] == 4
    assert body["lora_alpha"] == 8
    assert body["target_modules"] == ["q_proj", "v_proj"]
    assert body["tensor_count"] == 8
    # 2 layers x 2 modules x (A: 4x128 + B: 128x4)
    assert body["parameter_count"] == 2 * 2 * (4 * 128 + 128 * 4)
    assert body["estimated_memory_bytes"] == body["parameter_count"] * 2
    assert {f["path"] for f in body["files"]} == {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    assert body["registered_by"] == "lena"
    assert AuditEvent.objects.filter(
        action="version.registered", object_id=str(body["id"])
    ).exists()


def test_numbers_increase_without_gaps_after_a_rejected_upload(as_lena, contracts):
    assert register(as_lena, contracts).json()["number"] == 1
    bad = archive_upload(AdapterSpec(extra_config={"use_dora": True}))
    assert register(as_lena, contracts, bad).status_code == 400
    assert register(as_lena, contracts).json()["number"] == 2


def test_zip_and_loose_files_are_accepted(as_lena, contracts):
    from django.core.files.uploadedfile import SimpleUploadedFile

    zipped = SimpleUploadedFile("a.zip", adapter_zip(AdapterSpec(seed=5)))
    assert register(as_lena, contracts, zipped).status_code == 201
    files = AdapterSpec(seed=6).files()
    loose = [SimpleUploadedFile(name, data) for name, data in files.items()]
    response = as_lena.post(
        f"/api/v1/adapters/{contracts.pk}/versions/", {"files": loose}, format="multipart"
    )
    assert response.status_code == 201, response.json()


def test_duplicate_content_is_refused_naming_the_version(as_lena, contracts):
    spec = AdapterSpec(seed=42)
    assert register(as_lena, contracts, archive_upload(spec)).status_code == 201

    response = register(as_lena, contracts, archive_upload(spec))

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "duplicate_artifact"
    assert "version 1" in response.json()["error"]["message"]
    assert AdapterVersion.objects.count() == 1


def test_idempotency_key_returns_the_first_result(as_token, contracts):
    spec = AdapterSpec(seed=70)
    first = register(as_token, contracts, archive_upload(spec), HTTP_IDEMPOTENCY_KEY="run-7")
    again = register(as_token, contracts, archive_upload(spec), HTTP_IDEMPOTENCY_KEY="run-7")

    assert first.status_code == 201
    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert AdapterVersion.objects.count() == 1


def test_the_same_key_with_another_body_is_409_key_reused(as_token, contracts):
    first = register(
        as_token, contracts, archive_upload(AdapterSpec(seed=71)), HTTP_IDEMPOTENCY_KEY="run-8"
    )
    other = register(
        as_token, contracts, archive_upload(AdapterSpec(seed=72)), HTTP_IDEMPOTENCY_KEY="run-8"
    )

    assert first.status_code == 201
    assert other.status_code == 409
    error = other.json()["error"]
    assert error["code"] == "idempotency_key_reused" and "different request" in error["message"]
    assert AdapterVersion.objects.count() == 1


def test_the_same_key_on_an_s3_registration_binds_the_json_payload(as_token, contracts):
    from registry.models import IdempotencyClaim

    url = f"/api/v1/adapters/{contracts.pk}/versions/"
    first = as_token.post(
        url, {"files": [archive_upload(AdapterSpec(seed=73))]}, HTTP_IDEMPOTENCY_KEY="k"
    )
    json_body = as_token.post(
        url, {"s3_uri": "s3://elsewhere/x/"}, format="json", HTTP_IDEMPOTENCY_KEY="k"
    )
    assert first.status_code == 201
    assert json_body.status_code == 409
    assert json_body.json()["error"]["code"] == "idempotency_key_reused"
    assert IdempotencyClaim.objects.get(key="k").version_id == first.json()["id"]


def test_a_failed_request_frees_its_key(as_token, contracts):
    from registry.models import IdempotencyClaim

    bad = SimpleUploadedFile("adapter.tar.gz", b"not an archive")
    refused = register(as_token, contracts, bad, HTTP_IDEMPOTENCY_KEY="run-9")
    assert refused.status_code in (400, 415)
    assert not IdempotencyClaim.objects.exists()
    retried = register(
        as_token, contracts, archive_upload(AdapterSpec(seed=74)), HTTP_IDEMPOTENCY_KEY="run-9"
    )
    assert retried.status_code == 201


def test_a_key_held_too_long_is_409_in_progress(as_token, contracts, settings):
    from registry.models import IdempotencyClaim

    settings.IDEMPOTENCY_WAIT_SECONDS = 0.2
    IdempotencyClaim.objects.create(adapter=contracts, key="run-10")
    response = register(as_token, contracts, HTTP_IDEMPOTENCY_KEY="run-10")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_key_in_progress"
    assert AdapterVersion.objects.count() == 0


def test_same_mlflow_run_returns_the_existing_version(as_lena, contracts):
    url = f"/api/v1/adapters/{contracts.pk}/versions/"
    first = as_lena.post(
        url, {"files": [archive_upload()], "mlflow_run_id": "abc"}, format="multipart"
    )
    again = as_lena.post(
        url, {"files": [archive_upload()], "mlflow_run_id": "abc"}, format="multipart"
    )
    assert first.status_code == 201
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]


def test_base_model_mismatch_is_a_warning(as_lena, contracts):
    response = register(as_lena, contracts, archive_upload(AdapterSpec(base_model="other/model")))
    assert response.status_code == 201
    assert "other/model" in response.json()["warnings"][0]


def test_full_review_cycle(as_lena, as_alex, contracts):
    version_id = register(as_lena, contracts).json()["id"]
    url = f"/api/v1/versions/{version_id}"

    assert as_lena.post(f"{url}/submit/").json()["status"] == "pending_review"
    assert as_alex.post(f"{url}/approve/", {"comment": "ok"}).json()["status"] == "approved"
    assert as_alex.post(f"{url}/deprecate/").json()["status"] == "deprecated"
    assert as_alex.post(f"{url}/archive/").json()["status"] == "archived"
    actions = list(
        AuditEvent.objects.filter(object_id=str(version_id), object_type="registry.adapterversion")
        .order_by("id")
        .values_list("action", "from_state", "to_state")
    )
    assert actions == [
        ("version.registered", "", "registered"),
        ("version.submit", "registered", "pending_review"),
        ("version.approve", "pending_review", "approved"),
        ("version.deprecate", "approved", "deprecated"),
        ("version.archive", "deprecated", "archived"),
    ]


def test_invalid_transition_is_409_naming_the_state(as_alex, lena, contracts):
    version = make_version(lena, contracts)
    response = as_alex.post(f"/api/v1/versions/{version.pk}/approve/")
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "invalid_transition"
    assert "registered" in error["message"]
    assert error["details"]["current_status"] == "registered"


def test_reject_requires_a_comment(as_lena, as_alex, contracts):
    version_id = register(as_lena, contracts).json()["id"]
    as_lena.post(f"/api/v1/versions/{version_id}/submit/")

    response = as_alex.post(f"/api/v1/versions/{version_id}/reject/", {"comment": "  "})

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "comment_required"
    assert AdapterVersion.objects.get(pk=version_id).status == VersionStatus.PENDING_REVIEW
    ok = as_alex.post(f"/api/v1/versions/{version_id}/reject/", {"comment": "eval regressed"})
    assert ok.json()["status"] == "rejected"
    assert ok.json()["review_comment"] == "eval regressed"


def test_four_eyes_approver_cannot_approve_own_registration(as_alex, as_paula, contracts):
    version_id = register(as_alex, contracts).json()["id"]
    as_alex.post(f"/api/v1/versions/{version_id}/submit/")

    mine = as_alex.post(f"/api/v1/versions/{version_id}/approve/")
    assert mine.status_code == 403
    assert mine.json()["error"]["code"] == "four_eyes"
    assert as_paula.post(f"/api/v1/versions/{version_id}/approve/").status_code == 200


def test_four_eyes_submitter_cannot_approve(as_lena, as_alex, as_paula, contracts):
    version_id = register(as_lena, contracts).json()["id"]
    as_alex.post(f"/api/v1/versions/{version_id}/submit/")
    assert (
        as_alex.post(f"/api/v1/versions/{version_id}/approve/").json()["error"]["code"]
        == "four_eyes"
    )
    assert as_paula.post(f"/api/v1/versions/{version_id}/approve/").status_code == 200


def test_outsider_gets_404_for_everything_of_another_department(as_fred, lena, contracts):
    version = make_version(lena, contracts)
    assert as_fred.get(f"/api/v1/adapters/{contracts.pk}/").status_code == 404
    assert as_fred.get(f"/api/v1/versions/{version.pk}/").status_code == 404
    assert as_fred.get("/api/v1/versions/").json()["count"] == 0
    assert register(as_fred, contracts).status_code == 404
    assert as_fred.post(f"/api/v1/versions/{version.pk}/submit/").status_code == 404


def test_versions_filter_by_status(as_lena, lena, contracts):
    make_version(lena, contracts)
    submitted = make_version(lena, contracts)
    as_lena.post(f"/api/v1/versions/{submitted.pk}/submit/")
    body = as_lena.get("/api/v1/versions/?status=pending_review").json()
    assert [v["id"] for v in body["results"]] == [submitted.pk]


def test_register_from_s3_uri_copies_into_own_store(
    as_lena, root, contracts, s3_store, s3_endpoint
):
    import boto3

    from registry.services.artifact_sources import artifact_source_create
    from tests.conftest import actor
    from tests.support.s3_server import make_bucket

    make_bucket(s3_endpoint, "training-out")
    artifact_source_create(
        actor=actor(root), department=contracts.department, uri_prefix="s3://training-out/runs/"
    )
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    for name, data in AdapterSpec(seed=77).files().items():
        client.put_object(Bucket="training-out", Key=f"runs/77/adapter/{name}", Body=data)

    response = as_lena.post(
        f"/api/v1/adapters/{contracts.pk}/versions/",
        {"s3_uri": "s3://training-out/runs/77/adapter/"},
        format="json",
    )

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["source_uri"] == "s3://training-out/runs/77/adapter/"
    assert body["artifact_uri"].startswith("s3://")
    stored = {
        o.key.rsplit("/", 1)[-1]
        for o in s3_store.list_prefix(
            body["artifact_uri"].split("/", 3)[3].removeprefix("registry/")
        )
    }
    assert stored == {"adapter_config.json", "adapter_model.safetensors"}


def test_s3_uri_that_does_not_exist_is_400(as_lena, root, contracts, s3_store):
    from registry.services.artifact_sources import artifact_source_create
    from tests.conftest import actor

    artifact_source_create(
        actor=actor(root), department=contracts.department, uri_prefix="s3://no-such-bucket-here/"
    )
    response = as_lena.post(
        f"/api/v1/adapters/{contracts.pk}/versions/",
        {"s3_uri": "s3://no-such-bucket-here/x/"},
        format="json",
    )
    assert response.status_code in (400, 503)
    assert AdapterVersion.objects.count() == 0
