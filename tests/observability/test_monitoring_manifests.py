"""deploy/monitoring/: the PrometheusRule's group passes `promtool check rules`,
its alerts fire on the series they are about (`promtool test rules`), and every
control-plane metric that the rules and the Grafana dashboard query is one this
product exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from observability.collector import ControlPlaneCollector

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool missing (Debian package prometheus; scripts/test.sh installs it)",
)
SUFFIXES = ("_bucket", "_count", "_sum", "_total")
ROLLED_BACK = 'lora_rollouts_total{deployment="prod",kind="promote",outcome="rolled_back"}'
LAST_RECONCILE = 'lora_reconcile_last_success_timestamp_seconds{deployment="prod"}'


def rule_groups() -> dict:
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert rule["kind"] == "PrometheusRule"
    return {"groups": rule["spec"]["groups"]}


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


@needs_promtool
def test_the_rules_pass_promtool(tmp_path):
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups()))
    checked = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 7 rules found" in checked.stdout


def _annotations(alert: str, **values: str) -> dict:
    rule = next(r for g in rule_groups()["groups"] for r in g["rules"] if r.get("alert") == alert)
    rendered = {}
    for key, template in rule["annotations"].items():
        text = template
        for name, value in values.items():
            text = text.replace("{{ " + name + " }}", value)
        rendered[key] = text
    return rendered


def assert_rule_tests_pass(tmp_path, test: dict) -> None:
    """`promtool test rules` of the PrometheusRule's groups on one test case."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups()))
    cases = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [test]}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(cases))
    tested = promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr


@needs_promtool
def test_the_alerts_fire_on_their_series(tmp_path):
    assert_rule_tests_pass(
        tmp_path,
        {
            "interval": "1m",
            "input_series": [
                {
                    "series": 'lora_replicas{deployment="prod",state="down"}',
                    "values": "0 1 1 1 1",
                },
                {
                    "series": 'lora_adapters_missing{deployment="prod",replica="http://a:8000"}',
                    "values": "1x15",
                },
                {
                    "series": ROLLED_BACK,
                    "values": "0 0 1 1",
                },
                {
                    "series": LAST_RECONCILE,
                    "values": "0x15",
                },
            ],
            "alert_rule_test": [
                {"eval_time": "1m", "alertname": "LoraReplicaDown", "exp_alerts": []},
                {
                    "eval_time": "4m",
                    "alertname": "LoraReplicaDown",
                    "exp_alerts": [
                        {
                            "exp_labels": {"severity": "critical", "deployment": "prod"},
                            "exp_annotations": _annotations(
                                "LoraReplicaDown",
                                **{"$value": "1", "$labels.deployment": "prod"},
                            ),
                        }
                    ],
                },
                {"eval_time": "5m", "alertname": "LoraDriftNotRepaired", "exp_alerts": []},
                {
                    "eval_time": "12m",
                    "alertname": "LoraDriftNotRepaired",
                    "exp_alerts": [
                        {
                            "exp_labels": {
                                "severity": "warning",
                                "deployment": "prod",
                                "replica": "http://a:8000",
                            },
                            "exp_annotations": _annotations(
                                "LoraDriftNotRepaired",
                                **{
                                    "$value": "1",
                                    "$labels.deployment": "prod",
                                    "$labels.replica": "http://a:8000",
                                },
                            ),
                        }
                    ],
                },
                {
                    "eval_time": "3m",
                    "alertname": "LoraRolloutFailed",
                    "exp_alerts": [
                        {
                            "exp_labels": {
                                "severity": "warning",
                                "deployment": "prod",
                                "kind": "promote",
                            },
                            "exp_annotations": _annotations(
                                "LoraRolloutFailed",
                                **{"$labels.kind": "promote", "$labels.deployment": "prod"},
                            ),
                        }
                    ],
                },
                {"eval_time": "4m", "alertname": "LoraReconcileStale", "exp_alerts": []},
                {
                    "eval_time": "10m",
                    "alertname": "LoraReconcileStale",
                    "exp_alerts": [
                        {
                            "exp_labels": {"severity": "critical", "deployment": "prod"},
                            "exp_annotations": _annotations(
                                "LoraReconcileStale",
                                **{
                                    "$labels.deployment": "prod",
                                    "$value | humanizeDuration": "10m 0s",
                                },
                            ),
                        }
                    ],
                },
            ],
        },
    )


def exported_names() -> set[str]:
    return {family.name for family in ControlPlaneCollector().collect()}


def queried_names(text: str, exported: set[str]) -> set[str]:
    """Control-plane metric families named in PromQL (histogram and counter
    series carry a suffix the family name does not)."""
    names = set()
    for name in re.findall(r"\blora_[a-z_]+\b", text):
        base = next(
            (name.removesuffix(s) for s in SUFFIXES if name.removesuffix(s) in exported), name
        )
        names.add(base)
    return names


@pytest.mark.django_db
def test_every_metric_in_the_rules_and_the_dashboard_is_exported():
    exported = exported_names()
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = "\n".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    rules = "\n".join(r["expr"] for g in rule_groups()["groups"] for r in g["rules"])
    assert len(dashboard["panels"]) >= 12
    in_dashboard = queried_names(exprs, exported)
    in_rules = queried_names(rules, exported)
    assert in_rules <= exported, sorted(in_rules - exported)
    assert in_dashboard <= exported, sorted(in_dashboard - exported)
    # And the dashboard shows every family the product exports.
    assert in_dashboard == exported, sorted(exported - in_dashboard)


@needs_promtool
def test_a_flood_of_refused_keys_at_the_door_fires_its_alert_and_a_trickle_does_not(tmp_path):
    refused = 'haproxy_backend_http_responses_total{{instance="door:8201",proxy="{}",code="4xx"}}'
    assert_rule_tests_pass(
        tmp_path,
        {
            "interval": "1m",
            # 480 a minute (8/s) of unknown keys, 60 a minute of expired ones.
            "input_series": [
                {"series": refused.format("door_401_key"), "values": "0+480x20"},
                {"series": refused.format("door_401_expired"), "values": "0+60x20"},
                {
                    "series": refused.format("door_404_path").replace("door:8201", "quiet"),
                    "values": "0+6000x20",
                },
            ],
            "alert_rule_test": [
                {"eval_time": "3m", "alertname": "LoraDoorRefusedKeysFlood", "exp_alerts": []},
                {
                    "eval_time": "15m",
                    "alertname": "LoraDoorRefusedKeysFlood",
                    "exp_alerts": [
                        {
                            "exp_labels": {"severity": "warning", "instance": "door:8201"},
                            "exp_annotations": _annotations(
                                "LoraDoorRefusedKeysFlood",
                                **{
                                    "$labels.instance": "door:8201",
                                    "$value | humanize": "9",
                                },
                            ),
                        }
                    ],
                },
            ],
        },
    )
