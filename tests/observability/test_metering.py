"""Tokens metered from vLLM's spans: the request id the door sets, the OTLP
receiver's checks, and the ledger that counts a resent batch once. The spans
here are built as vLLM 0.32 builds them (tests/support/otlp.py);
tests/serving/vllm/test_metering_real.py has a real vLLM and a real door."""

from __future__ import annotations

import gzip
import uuid
from datetime import UTC, datetime

import pytest
from django.db import DatabaseError
from django.db.models import Sum
from django.test import Client
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from observability.metering import Attribution, SpansRefused, attribution, read_spans
from observability.models import DailyTokens, MeteredRequest
from observability.otlp import metering_token
from observability.tokens import metered_spans_record
from serving.models import ServedAdapter
from serving.services.inference_keys import inference_key_issue
from tests.conftest import actor
from tests.support.otlp import llm_span, otlp_body


def door_id(key="", version=0) -> str:
    return f"u1.k{key}.v{version}.{uuid.uuid4()}"


def test_a_chat_id_names_the_key_and_the_version():
    rid = f"chatcmpl-{door_id(12, 34)}"
    assert attribution(rid) == Attribution(key_id=12, version_id=34)


def test_each_prompt_of_a_completions_request_names_them_too():
    rid = f"cmpl-{door_id(5, 6)}-1"
    assert attribution(rid) == Attribution(key_id=5, version_id=6)


def test_an_open_door_and_the_base_model_name_neither():
    assert attribution(f"chatcmpl-{door_id('', 0)}") == Attribution(key_id=None, version_id=None)


def test_an_id_the_door_did_not_set_names_nobody():
    assert attribution(f"chatcmpl-{uuid.uuid4().hex}") is None
    assert attribution("chatcmpl-xu1.k1.v2.0123456789abcdef0123456789abcdef") is None


def test_only_llm_request_spans_with_an_id_and_counts_are_read():
    body = otlp_body(
        llm_span("chatcmpl-a", 11, 4),
        llm_span("other", name="http.request"),
        llm_span(None),
        llm_span("chatcmpl-b", None, 2),
        llm_span("chatcmpl-c", 2**40, 2),
    )
    spans, refused = read_spans(body)
    assert [(s.request_id, s.prompt_tokens, s.completion_tokens) for s in spans] == [
        ("chatcmpl-a", 11, 4)
    ]
    assert refused == 3


def test_a_body_that_is_not_protobuf_is_refused():
    with pytest.raises(SpansRefused, match="protobuf"):
        read_spans(b"\xff\xff\xff not protobuf")


@pytest.fixture
def served(deployment, approved_v1):
    return ServedAdapter.objects.create(
        deployment=deployment, adapter=approved_v1.adapter, version=approved_v1, served_path="/v/1"
    )


@pytest.fixture
def finance_key(alex, fred, finance, root):
    key, _ = inference_key_issue(
        actor=actor(root), department=finance, name="batch", expires_in_days=3
    )
    return key


@pytest.mark.django_db
def test_spans_become_a_day_row_per_key_and_version_and_a_resend_counts_once(
    deployment, served, finance_key
):
    calls = [
        llm_span(f"chatcmpl-{door_id(finance_key.pk, served.version_id)}", 10, 2),
        llm_span(f"chatcmpl-{door_id(finance_key.pk, served.version_id)}", 20, 3),
        llm_span(f"chatcmpl-{door_id(finance_key.pk, 0)}", 5, 1),  # the base model
    ]
    spans, _ = read_spans(otlp_body(*calls))
    assert metered_spans_record(deployment, spans) == 3
    assert metered_spans_record(deployment, spans) == 0  # the exporter sent it again
    row = DailyTokens.objects.get(version=served.version)
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (2, 30, 5)
    assert row.department == finance_key.department  # who called
    assert row.owner_id == served.adapter.department_id  # whose adapter
    assert row.key == finance_key and row.served_name == "legal-contracts"
    assert row.version_number == served.version.number
    base = DailyTokens.objects.get(version__isnull=True)
    assert (base.served_name, base.owner, base.requests, base.prompt_tokens) == (
        "tiny-llama",
        None,
        1,
        5,
    )
    assert MeteredRequest.objects.count() == 3


@pytest.mark.django_db
def test_a_key_or_version_that_does_not_exist_is_recorded_as_none(deployment, served):
    spans, _ = read_spans(otlp_body(llm_span(f"chatcmpl-{door_id(999999, 888888)}", 4, 4)))
    metered_spans_record(deployment, spans)
    row = DailyTokens.objects.get()
    assert (row.key, row.department, row.version, row.owner) == (None, None, None, None)
    assert (row.key_ref, row.version_ref, row.served_name) == (0, 0, "tiny-llama")


@pytest.mark.django_db
def test_a_request_is_counted_on_the_day_it_finished(deployment, served, finance_key):
    late = datetime(2026, 11, 30, 23, 59, 59, tzinfo=UTC).timestamp()
    early = datetime(2026, 12, 1, 0, 0, 1, tzinfo=UTC).timestamp()
    rid = door_id(finance_key.pk, served.version_id)
    spans, _ = read_spans(
        otlp_body(llm_span(f"a-{rid}", 1, 1, ended=late), llm_span(f"b-{rid}", 2, 2, ended=early))
    )
    metered_spans_record(deployment, spans)
    days = dict(DailyTokens.objects.values_list("day", "prompt_tokens"))
    assert {str(day): n for day, n in days.items()} == {"2026-11-30": 1, "2026-12-01": 2}


# -- the receiver ------------------------------------------------------------------


def post(deployment_name, body, *, token=None, content_type="application/x-protobuf", **headers):
    if token is None:
        token = metering_token(deployment_name)
    if token:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return Client().post(
        f"/otlp/{deployment_name}/v1/traces", body, content_type=content_type, **headers
    )


@pytest.mark.django_db
def test_the_receiver_records_spans_and_answers_otlp(deployment, served, finance_key):
    body = otlp_body(
        llm_span(f"chatcmpl-{door_id(finance_key.pk, served.version_id)}", 9, 1), llm_span(None)
    )
    response = post(deployment.name, body)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/x-protobuf"
    answer = ExportTraceServiceResponse.FromString(response.content)
    assert answer.partial_success.rejected_spans == 1
    assert DailyTokens.objects.get().prompt_tokens == 9


@pytest.mark.django_db
def test_the_receiver_takes_gzip(deployment, served):
    response = post(
        deployment.name, gzip.compress(otlp_body(llm_span("x", 3, 3))), HTTP_CONTENT_ENCODING="gzip"
    )
    assert response.status_code == 200, response.content
    assert MeteredRequest.objects.get().prompt_tokens == 3


@pytest.mark.django_db
@pytest.mark.parametrize("token", ["", "not-the-token"])
def test_without_the_deployments_token_nothing_is_recorded(deployment, token):
    response = post(deployment.name, otlp_body(llm_span("x")), token=token)
    assert response.status_code == 401
    assert not MeteredRequest.objects.exists()


@pytest.mark.django_db
def test_another_deployments_token_is_refused(deployment, root, tmp_path):
    response = post(deployment.name, otlp_body(llm_span("x")), token=metering_token("other"))
    assert response.status_code == 401
    assert not MeteredRequest.objects.exists()


@pytest.mark.django_db
def test_a_json_body_is_refused_as_such(deployment):
    response = post(deployment.name, b"{}", content_type="application/json")
    assert response.status_code == 415
    assert b"application/x-protobuf" in response.content


@pytest.mark.django_db
def test_a_body_past_the_limit_is_refused_before_it_is_read(deployment, settings):
    settings.OBSERVABILITY_OTLP_MAX_BODY_BYTES = 64 * 1024
    response = post(deployment.name, b"\x00" * (64 * 1024 + 1))
    assert response.status_code == 413


@pytest.mark.django_db
def test_a_gzip_body_that_inflates_past_the_limit_is_refused(deployment, settings):
    settings.OBSERVABILITY_OTLP_MAX_BODY_BYTES = 64 * 1024
    bomb = gzip.compress(b"\x00" * (10 * 1024 * 1024))
    assert len(bomb) < 64 * 1024
    response = post(deployment.name, bomb, HTTP_CONTENT_ENCODING="gzip")
    assert response.status_code == 413


@pytest.mark.django_db
def test_garbage_is_a_400_naming_the_format(deployment):
    response = post(deployment.name, b"\xff\xff\xff garbage")
    assert response.status_code == 400
    assert b"ExportTraceServiceRequest" in response.content


@pytest.mark.django_db
def test_a_database_that_fails_asks_the_exporter_to_send_again(deployment, monkeypatch):
    def failing(deployment, spans):
        raise DatabaseError("connection lost")

    monkeypatch.setattr("observability.otlp.metered_spans_record", failing)
    response = post(deployment.name, otlp_body(llm_span("x")))
    assert response.status_code == 503


@pytest.mark.django_db
def test_limits_read_tokens_per_key_and_department_over_a_window(
    deployment, served, finance_key, settings
):
    from serving.token_usage import TokensUsed, tokens_used

    now = datetime.now(tz=UTC).timestamp()
    rid = door_id(finance_key.pk, served.version_id)
    spans, _ = read_spans(
        otlp_body(
            llm_span(f"a-{rid}", 10, 5, ended=now - 30),
            llm_span(f"b-{rid}", 20, 5, ended=now - 300),
            llm_span(f"c-{door_id('', 0)}", 99, 99, ended=now - 30),  # no key: nobody's
        )
    )
    metered_spans_record(deployment, spans)
    minute = datetime.fromtimestamp(now - 60, tz=UTC)
    assert tokens_used("key", minute) == {finance_key.pk: TokensUsed(1, 10, 5)}
    hour = datetime.fromtimestamp(now - 3600, tz=UTC)
    department = finance_key.department_id
    assert tokens_used("department", hour, [department]) == {department: TokensUsed(2, 30, 10)}
    assert tokens_used("department", hour, [department + 1]) == {}


@pytest.mark.django_db
def test_per_request_rows_are_pruned_and_their_days_stay(deployment, served, settings):
    from observability.tasks import housekeeping

    settings.OBSERVABILITY_METERED_REQUEST_DAYS = 2
    old = datetime.now(tz=UTC).timestamp() - 3 * 86400
    spans, _ = read_spans(otlp_body(llm_span("old", 1, 1, ended=old), llm_span("new", 1, 1)))
    metered_spans_record(deployment, spans)
    assert housekeeping() == {"pruned_metered_requests": 1}
    assert list(MeteredRequest.objects.values_list("request_id", flat=True)) == ["new"]
    assert DailyTokens.objects.aggregate(n=Sum("requests"))["n"] == 2


# -- what a deployment's token may report (issue 43) ----------------------------


@pytest.mark.django_db
def test_each_of_n_choices_is_counted_and_a_resend_still_counts_once(
    deployment, served, finance_key
):
    """vLLM runs n > 1 as n engine requests with ONE request id and a span
    each: keyed by the request id alone, n - 1 of them went unbilled."""
    rid = f"chatcmpl-{door_id(finance_key.pk, served.version_id)}"
    choices = [llm_span(rid, 10, 4, span_id=bytes([i]) * 8) for i in range(1, 5)]
    spans, _ = read_spans(otlp_body(*choices))
    assert metered_spans_record(deployment, spans) == 4
    assert metered_spans_record(deployment, spans) == 0
    row = DailyTokens.objects.get()
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (4, 40, 16)


@pytest.mark.django_db
def test_a_key_whose_department_may_not_call_the_deployment_is_not_billed(
    root, deployment, served, finance_key, legal
):
    """A deployment's token proves a replica sent it, not which key called: a
    holder of the token may not bill a department that cannot call there."""
    from serving.services.deployments import deployment_update

    deployment_update(actor=actor(root), deployment=deployment, allowed_departments=[legal])
    body = otlp_body(
        llm_span(f"chatcmpl-{door_id(finance_key.pk, 0)}", 5, 5),
        llm_span(f"chatcmpl-{door_id(999999, 0)}", 5, 5),  # no such key
        llm_span(f"chatcmpl-{door_id('', 0)}", 1, 1, span_id=b"\x03" * 8),  # no key: kept
    )
    response = post(deployment.name, body)
    assert response.status_code == 200, response.content
    answer = ExportTraceServiceResponse.FromString(response.content)
    assert answer.partial_success.rejected_spans == 2
    assert "2 key not allowed here" in answer.partial_success.error_message
    assert list(MeteredRequest.objects.values_list("key_id", "prompt_tokens")) == [(None, 1)]


@pytest.mark.django_db
def test_a_grant_lets_its_department_be_billed_where_the_adapter_is_served(
    root, alex, fred, deployment, served, finance_key, legal
):
    from datetime import timedelta

    from django.utils import timezone

    from serving.models import AdapterGrant, GrantStatus
    from serving.services.deployments import deployment_update

    deployment_update(actor=actor(root), deployment=deployment, allowed_departments=[legal])
    AdapterGrant.objects.create(
        adapter=served.adapter,
        department=finance_key.department,
        status=GrantStatus.APPROVED,
        expires_at=timezone.now() + timedelta(days=1),
        requested_by=fred,
        decided_by=alex,
        decided_at=timezone.now(),
    )
    response = post(deployment.name, otlp_body(llm_span(f"c-{door_id(finance_key.pk, 0)}", 5, 5)))
    assert response.status_code == 200
    assert MeteredRequest.objects.get().key_id == finance_key.pk


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("prompt", "completion", "ended_ago"),
    [
        (200, 57, 1),  # past the deployment's context of 256
        (2**30, 0, 1),  # a count no request holds
        (5, 5, -3600),  # an hour in the future
        (5, 5, 2 * 3600),  # two hours ago: the exporter gave up long before
    ],
)
def test_counts_past_the_context_and_implausible_times_are_refused(
    deployment, served, finance_key, prompt, completion, ended_ago
):
    deployment.max_model_len = 256
    deployment.save(update_fields=["max_model_len"])
    ended = datetime.now(tz=UTC).timestamp() - ended_ago
    fine = llm_span(f"a-{door_id(finance_key.pk, 0)}", 200, 56)
    odd = llm_span(f"b-{door_id(finance_key.pk, 0)}", prompt, completion, ended=ended)
    response = post(deployment.name, otlp_body(fine, odd))
    assert response.status_code == 200
    answer = ExportTraceServiceResponse.FromString(response.content)
    assert answer.partial_success.rejected_spans == 1
    assert "1 implausible" in answer.partial_success.error_message
    assert list(MeteredRequest.objects.values_list("prompt_tokens", flat=True)) == [200]


@pytest.mark.django_db
def test_a_span_marks_its_deployment_metered(deployment, served):
    from observability.models import MeteringState

    assert not MeteringState.objects.filter(deployment=deployment, last_span_at__isnull=False)
    post(deployment.name, otlp_body(llm_span("x", 1, 1)))
    assert MeteringState.objects.get(deployment=deployment).last_span_at is not None
