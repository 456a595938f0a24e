"""SSO settings: off unless configured, half a configuration or a bad group map
stops start-up naming the variable, secrets may come from files."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

import config.settings
from sso.group_map import parse_group_map
from tests.registry.test_settings import start

SSO_ON = {
    "OIDC_ISSUER": "https://sso.example.com/realms/acme",
    "OIDC_RP_CLIENT_ID": "lora-registry",
    "OIDC_RP_CLIENT_SECRET": "s3cret",
}


def test_sso_is_off_without_configuration(tmp_path):
    result = start(tmp_path, "(settings.SSO_ENABLED, settings.AUTHENTICATION_BACKENDS)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "(False, ['axes.backends.AxesStandaloneBackend', "
        "'django.contrib.auth.backends.ModelBackend'])"
    )


def test_an_issuer_and_a_client_turn_it_on_without_contacting_the_provider(tmp_path):
    # sso.example.com does not resolve here: start-up must not fetch discovery.
    result = start(tmp_path, "(settings.SSO_ENABLED, settings.OIDC_GROUP_MAP)", **SSO_ON)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("(True, GroupMap(roles={}")


def test_the_client_secret_may_come_from_a_file(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("from-a-file\n")
    env = {**SSO_ON, "OIDC_RP_CLIENT_SECRET": None, "OIDC_RP_CLIENT_SECRET_FILE": str(secret)}
    result = start(tmp_path, "settings.OIDC_RP_CLIENT_SECRET", **env)
    assert result.stdout.strip() == "from-a-file", result.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({**SSO_ON, "OIDC_GROUP_MAP": "legal-approvers=legal"}, "OIDC_GROUP_MAP: 'legal-approvers"),
        ({**SSO_ON, "OIDC_GROUP_MAP": "g=legal:owner"}, "OIDC_GROUP_MAP: 'g=legal:owner' names"),
        ({**SSO_ON, "OIDC_RP_CLIENT_SECRET": None}, "OIDC_RP_CLIENT_SECRET"),
        ({**SSO_ON, "OIDC_RP_CLIENT_ID": None}, "OIDC_RP_CLIENT_ID must be set"),
        (
            {**SSO_ON, "OIDC_ISSUER": "http://sso.example.com/realms/acme"},
            "OIDC_ISSUER must be an https:// URL",
        ),
        (
            {"OIDC_RP_CLIENT_ID": "x", "OIDC_RP_CLIENT_SECRET": "y"},
            "Set OIDC_ISSUER, or all of OIDC_OP_AUTHORIZATION_ENDPOINT",
        ),
        ({"LOCAL_LOGIN": "false"}, "LOCAL_LOGIN=false needs single sign-on"),
        ({**SSO_ON, "LOCAL_LOGIN": "maybe"}, "LOCAL_LOGIN must be true or false"),
        ({**SSO_ON, "OIDC_VERIFY_TLS": "perhaps"}, "OIDC_VERIFY_TLS must be true or false"),
    ],
)
def test_a_bad_value_stops_start_up_naming_the_variable(tmp_path, env, message):
    result = start(tmp_path, **env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr, result.stderr


def test_explicit_endpoints_work_without_an_issuer(tmp_path):
    env = {
        "OIDC_RP_CLIENT_ID": "x",
        "OIDC_RP_CLIENT_SECRET": "y",
        "OIDC_OP_AUTHORIZATION_ENDPOINT": "https://idp.example.com/authorize",
        "OIDC_OP_TOKEN_ENDPOINT": "https://idp.example.com/token",
        "OIDC_OP_USER_ENDPOINT": "https://idp.example.com/userinfo",
        "OIDC_OP_JWKS_ENDPOINT": "https://idp.example.com/jwks",
    }
    result = start(tmp_path, "(settings.SSO_ENABLED, settings.OIDC_OP_TOKEN_ENDPOINT)", **env)
    assert result.stdout.strip() == "(True, 'https://idp.example.com/token')", result.stderr


def test_a_group_may_map_to_several_departments_and_to_admin():
    group_map = parse_group_map("leads=legal:approver, leads=finance:member,ops=admin,,")
    assert group_map.wanted_roles(["leads"]) == {"legal": "approver", "finance": "member"}
    assert group_map.is_admin(["ops"]) and not group_map.is_admin(["leads"])
    assert group_map.managed_departments == {"legal", "finance"}
    assert group_map.unmapped(["leads", "ops", "sales"]) == ["sales"]


def test_the_strongest_role_wins_whatever_the_order_of_groups():
    group_map = parse_group_map("a=legal:approver,b=legal:member")
    assert group_map.wanted_roles(["a", "b"]) == {"legal": "approver"}
    assert group_map.wanted_roles(["b", "a"]) == {"legal": "approver"}


def test_a_group_map_error_names_the_variable():
    with pytest.raises(ImproperlyConfigured, match="^OIDC_GROUP_MAP: 'nogroup' is not"):
        parse_group_map("nogroup")


def test_every_declared_sign_in_setting_is_set():
    # config/settings.py declares the names sso.conf sets, for mypy; a declared
    # name that from_env() stopped returning would be an AttributeError at run time.
    declared = [name for name in config.settings.__annotations__ if name.isupper()]
    assert "OIDC_GROUPS_CLAIM" in declared
    missing = [name for name in declared if not hasattr(settings, name)]
    assert missing == []
