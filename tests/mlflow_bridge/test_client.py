"""How MLflow's errors map to the three kinds the services act on."""

from __future__ import annotations

import pytest
import requests

from mlflow_bridge.client import (
    MlflowNotFound,
    MlflowRejected,
    MlflowUnavailable,
    translate,
)


@pytest.fixture(autouse=True)
def tracking_uri(settings):
    settings.MLFLOW_TRACKING_URI = "http://mlflow.internal:5000"


def rest_error(code: str, message: str = "x"):
    from mlflow.exceptions import RestException

    return RestException({"error_code": code, "message": message})


def test_a_missing_resource_is_not_found():
    assert isinstance(translate(rest_error("RESOURCE_DOES_NOT_EXIST")), MlflowNotFound)


def test_a_refused_connection_is_transient_and_names_mlflow():
    from mlflow.exceptions import MlflowException

    try:
        try:
            raise requests.ConnectionError("Connection refused")
        except requests.ConnectionError as cause:
            raise MlflowException(
                "API request to http://mlflow.internal:5000/api/2.0/mlflow/runs/get "
                f"failed with exception {cause}"
            ) from None
    except MlflowException as error:
        mapped = translate(error)
    assert isinstance(mapped, MlflowUnavailable) and mapped.transient
    assert mapped.message.startswith("MLflow at http://mlflow.internal:5000 is unreachable")


def test_server_errors_and_throttling_are_transient():
    assert isinstance(translate(rest_error("INTERNAL_ERROR")), MlflowUnavailable)
    assert isinstance(translate(rest_error("TEMPORARILY_UNAVAILABLE")), MlflowUnavailable)
    assert isinstance(translate(rest_error("REQUEST_LIMIT_EXCEEDED")), MlflowUnavailable)


def test_a_refused_request_is_permanent():
    mapped = translate(rest_error("INVALID_PARAMETER_VALUE", "bad source"))
    assert isinstance(mapped, MlflowRejected) and not mapped.transient
    assert mapped.error_code == "INVALID_PARAMETER_VALUE"


def test_a_non_json_error_page_is_judged_by_its_status():
    from mlflow.exceptions import MlflowException

    not_found = MlflowException(
        "API request to endpoint /api/2.0/mlflow/runs/get failed with error code 404 != 200. "
        "Response body: '<html>'"
    )
    bad_gateway = MlflowException(
        "API request to endpoint /api/2.0/mlflow/runs/get failed with error code 502 != 200."
    )
    assert isinstance(translate(not_found), MlflowNotFound)
    assert isinstance(translate(bad_gateway), MlflowUnavailable)


def test_plain_network_errors_are_transient():
    assert isinstance(translate(requests.Timeout("read timed out")), MlflowUnavailable)
