"""Which of the LoRA label sets a replica's /metrics showed (read once a
tick by serving's reconcile, parsed in serving.lora_metrics) are clients'
activity and demand. No Django here."""

from __future__ import annotations

from collections.abc import Mapping

from serving.lora_metrics import LoraSeries


def clients_only(
    series: tuple[LoraSeries, ...], marked: Mapping[str, float] | None
) -> tuple[LoraSeries, ...]:
    """The label sets among `series` that show clients' requests. `marked`:
    adapters the control plane itself probed on that replica (the tick's
    weight check, rollouts' and repairs' verification), each with the latest
    time its probes can have been current on vLLM's clock. vLLM lists a probe
    like a client's request, in one series per label set re-stamped each time
    it is current: a set stamped by then that lists marked adapters only is
    the probes'. Idle and mixed sets stay as they are; a client's request for
    a probed adapter alone before that time is missed (the same series)."""
    if not marked:
        return series
    return tuple(
        s
        for s in series
        if not (listed := {*s.running, *s.waiting})
        or any(marked.get(name, -1.0) < s.timestamp for name in listed)
    )


def demand_units(series: tuple[LoraSeries, ...]) -> dict[str, int]:
    """Per adapter, what placement counts as its demand on one replica over
    these label sets: 1 if one listed it running, 1 more if one listed it
    waiting (vLLM 0.32 lists names, not request counts)."""
    units: dict[str, int] = {}
    running = {name for s in series for name in s.running}
    waiting = {name for s in series for name in s.waiting}
    for name in running | waiting:
        units[name] = (name in running) + (name in waiting)
    return units
