"""A fleet for reconcile tests and bench/scale.py: the vLLM stand-in serving
many ports from one background event loop, and a deployment given hundreds of
served adapters without hundreds of rollouts (rows cloned from one real,
approved version; folders staged through serving.volume like a rollout would).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.support.vllm_standin import StandinReplica
from tests.support.vllm_standin import running_fleet as standin_fleet

__all__ = ["standin_fleet"]  # `count` stand-in replicas on loopback ports


def served_adapters_clone(deployment, template, count: int, prefix: str = "fleet") -> list:
    """`count` adapters in the template version's department, each with one
    approved version that has the template's files (the same stored artifact),
    served by `deployment` from its own staged folder."""
    from registry.models import Adapter, AdapterVersion
    from serving.models import ServedAdapter
    from serving.volume import serve_path_for, stage_versions

    department = template.adapter.department
    adapters = Adapter.objects.bulk_create(
        [
            Adapter(
                department=department,
                name=f"{prefix}-{i:04d}",
                base_model=template.adapter.base_model,
                served_name=f"{prefix}-{i:04d}",
                last_version_number=1,
            )
            for i in range(count)
        ]
    )
    fields = {
        f.attname: getattr(template, f.attname)
        for f in AdapterVersion._meta.concrete_fields
        if f.attname not in ("id", "adapter_id", "number", "idempotency_key")
    }
    versions = AdapterVersion.objects.bulk_create(
        [AdapterVersion(**fields, adapter=a, number=1) for a in adapters]
    )
    for version, adapter in zip(versions, adapters, strict=True):
        version.adapter = adapter
    staged = stage_versions(deployment, versions)
    failed = [str(v) for v in staged.values() if isinstance(v, Exception)]
    assert not failed, failed
    return ServedAdapter.objects.bulk_create(
        [
            ServedAdapter(
                deployment=deployment,
                adapter=v.adapter,
                version=v,
                served_path=serve_path_for(deployment, v),
            )
            for v in versions
        ]
    )


def standin_load(replica: StandinReplica, served: list) -> None:
    """What the replica would hold after rollouts: each adapter at its path."""
    for s in served:
        replica.adapters[s.adapter.served_name] = s.served_path


@dataclass
class Measured:
    seconds: float
    statements: int
    sql: list[str]
    result: object = None


def measure(function: Callable[[], object], *, savepoints: bool = False) -> Measured:
    """Wall time and SQL statements of one call. SAVEPOINT/RELEASE statements
    exist only inside a test's transaction (an atomic block nested in it) and
    are not counted unless asked."""
    # The log keeps the last 9000 queries only; a full one would count nothing.
    connection.queries_log.clear()
    with CaptureQueriesContext(connection) as captured:
        started = time.perf_counter()
        result = function()
        seconds = time.perf_counter() - started
    sql = [q["sql"] for q in captured.captured_queries]
    if not savepoints:
        sql = [s for s in sql if not s.upper().startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]
    return Measured(seconds, len(sql), sql, result)


def fingerprints_record(deployment, served: list) -> None:
    """What the rollouts that put these adapters in place would have recorded:
    each version's probe as the deployment's first replica answers it
    (serving/records/fingerprints.py), so the reconcile's sampled re-check finds
    a fingerprint to compare with instead of recording one."""
    from serving.fanout import client_for
    from serving.models import VersionFingerprint
    from serving.replica_rows import replicas_sync
    from serving.rules.probe import PROBE_PROMPT, PROBE_TOKENS, Probe

    replica = replicas_sync(deployment)[0]
    rows = []
    with client_for(replica, deployment) as client:
        for s in served:
            answer = client.probe(
                s.adapter.served_name, prompt=PROBE_PROMPT, max_tokens=PROBE_TOKENS
            )
            probe = Probe.from_body(answer.body)
            assert probe is not None, (s.adapter.served_name, answer.status_code, answer.error)
            rows.append(
                VersionFingerprint(
                    deployment=deployment,
                    version_id=s.version_id,
                    probe=probe.as_dict(),
                    recorded_from=replica,
                    recorded_from_url=replica.base_url,
                )
            )
    VersionFingerprint.objects.bulk_create(rows, ignore_conflicts=True)
