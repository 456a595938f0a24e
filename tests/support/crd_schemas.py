"""Validate rendered Kubernetes resources against vendored CRD schemas with
jsonschema, strictly: Kubernetes prunes unknown fields and `kubectl apply
--validate=strict` refuses them, so every object schema here gets
additionalProperties false. CEL rules (x-kubernetes-validations) are not run."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import yaml


def strict(schema: dict) -> dict:
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                node.setdefault("additionalProperties", False)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def load(directory: Path) -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the strict schema of every served version."""
    found = {}
    for path in sorted(directory.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version["served"]:
                found[(f"{group}/{version['name']}", kind)] = strict(
                    version["schema"]["openAPIV3Schema"]
                )
    return found


def problems(schemas: dict, resource: dict) -> list[str]:
    schema = schemas.get((resource["apiVersion"], resource["kind"]))
    if schema is None:
        return [f"no CRD serves {resource['apiVersion']} {resource['kind']}"]
    body = {k: v for k, v in resource.items() if k not in ("apiVersion", "kind", "metadata")}
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(body)]
