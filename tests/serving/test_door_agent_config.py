"""The door agent's environment (serving/door/agent.py, DOOR_*): what the
Kubernetes manifests set (deploy/kustomize/base/gateway.yaml) reaches the
HAProxy configuration the agent writes."""

from __future__ import annotations

from serving.door.agent import AgentConfig, DoorAgent
from serving.door.routing import RoutingTable


def _environment(tmp_path, **more) -> dict[str, str]:
    token = tmp_path / "token"
    token.write_text("a-token\n")
    return {
        "DOOR_DEPLOYMENT": "production",
        "DOOR_CONTROL_PLANE": "http://lora-registry-web:8000/",
        "DOOR_TOKEN_FILE": str(token),
        "DOOR_DIR": str(tmp_path / "door"),
        **more,
    }


def test_door_metrics_puts_haproxy_s_exporter_on_its_own_address(tmp_path):
    config = AgentConfig.from_environment(_environment(tmp_path, DOOR_METRICS="0.0.0.0:8404"))
    agent = DoorAgent(config)
    agent.door.write(RoutingTable("production", "base", (), {}))
    text = agent.door.config_path.read_text()
    assert "frontend metrics" in text
    assert "    bind 0.0.0.0:8404" in text


def test_without_door_metrics_there_is_no_exporter(tmp_path):
    agent = DoorAgent(AgentConfig.from_environment(_environment(tmp_path)))
    agent.door.write(RoutingTable("production", "base", (), {}))
    assert "frontend metrics" not in agent.door.config_path.read_text()
    assert agent.config.control_plane == "http://lora-registry-web:8000"
    assert agent.config.token == "a-token"
