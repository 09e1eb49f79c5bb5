"""Stage times and GPU telemetry for the collected stages: each stage's window as wall-clock times,
and each arm's GPU figures over it from the DCGM exporter in Prometheus."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from specdecode.controller.settings import OperatorSettings
from specdecode.experiment import manifests, records, spec, status, telemetry
from specdecode.sources import prometheus


def with_times(
    stages: Sequence[status.StageResult], windows: Sequence[records.StageWindow], anchor: records.RunAnchor
) -> list[status.StageResult]:
    """Each stage with its window's wall-clock start and end (RFC 3339), for the dashboard's markers."""

    def rfc3339(monotonic: float) -> str:
        moment = datetime.fromtimestamp(anchor.wall + monotonic, UTC)
        return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")

    by_stage = {w.stage: w for w in windows}
    return [
        s.model_copy(update={"started_at": rfc3339(w.start), "finished_at": rfc3339(w.end)})
        if (w := by_stage.get(s.name)) is not None
        else s
        for s in stages
    ]


def gpu_telemetry(
    source: prometheus.PrometheusSource | Any,
    stages: Sequence[status.StageResult],
    windows: Sequence[records.StageWindow],
    anchor: records.RunAnchor,
    *,
    namespace: str,
    name: str,
    settings: OperatorSettings,
) -> list[status.StageResult]:
    """Each stage with its arms' GPU telemetry from the DCGM exporter (`telemetry.py`), over its window."""
    by_stage = {w.stage: w for w in windows}
    names = manifests.Names(name)
    selectors = {
        arm: telemetry.pod_selector(
            namespace_label=settings.label_names.dcgm_namespace,
            pod_label=settings.label_names.dcgm_pod,
            namespace=namespace,
            deployment=names.arm(arm),
        )
        for arm in spec.Arm
    }
    updated = []
    for stage in stages:
        window = by_stage.get(stage.name)
        if window is None:
            updated.append(stage)
            continue
        start, end = anchor.wall + window.start, anchor.wall + window.end
        # both arms' queries of a stage in one request
        arms = prometheus.arms_gpu(
            source, {arm.value: selectors[arm] for arm in spec.Arm}, start=start, end=end
        )
        gpu = telemetry.stage_gpu(arms[spec.Arm.CONTROL.value], arms[spec.Arm.TREATMENT.value])
        updated.append(stage.model_copy(update={"gpu": gpu}))
    return updated
