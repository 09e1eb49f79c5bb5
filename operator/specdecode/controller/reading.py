"""Reading what a round measured: the load Job's results bundle(s) from their ConfigMaps, each
window's server metrics from Prometheus (`measured`), or why they cannot be read."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from specdecode import results
from specdecode.controller.kube import Kube
from specdecode.controller.lane import in_analysis_lane
from specdecode.controller.settings import OperatorSettings
from specdecode.experiment import keys, loadpods, reconcile, records, spec
from specdecode.experiment.validity import Validity
from specdecode.sources import prometheus


def prometheus_url(experiment: spec.ExperimentSpec, settings: OperatorSettings) -> str | None:
    """The experiment's Prometheus (`spec.prometheus.url`), else the operator's default (None: neither)."""
    return experiment.prometheus.url if experiment.prometheus else settings.prometheus_url


Measured = tuple[list[records.Request], records.RunAnchor, list[records.StageWindow], Validity | None]
"""A round's records, clock anchor, stage windows and validity block."""


async def read_results(
    kube: Kube,
    metadata: Mapping[str, Any],
    settings: OperatorSettings,
    *,
    job_uid: str | None,
    round_name: str | None = None,
    pods: int = 1,
) -> Measured:
    """The results that this generation's load Job (`job_uid`) of a round (None: the stages) stored,
    parsed off the event loop (the summary's validity block, None when it has none); raises
    `results.ResultsError` (a ValueError of parsing becomes `ResultsCorrupt`). A Job of `pods` > 1
    load pods: every pod's bundle, each read and trusted as one Job's, merged into one
    (`loadpods.merge`); a pod's missing bundle is ResultsMissing."""
    shards = [
        await _shard(kube, metadata, settings, pod, job_uid=job_uid, round_name=round_name)
        for pod in ([None] if pods == 1 else [(k, pods) for k in range(pods)])
    ]
    recs, anchor, windows, summary = (
        shards[0] if pods == 1 else await in_analysis_lane(loadpods.merge, shards)
    )
    return recs, anchor, windows, Validity.of_summary(summary)


async def read_finished(
    kube: Kube,
    metadata: Mapping[str, Any],
    settings: OperatorSettings,
    *,
    job_uid: str | None,
    pods: int,
    stages: Sequence[str],
) -> tuple[Measured | None, list[str]]:
    """What a load that failed finished (the stages' Job, `job_uid`): `read_results`, but a Job of
    `pods` > 1 load pods keeps only the `stages` that every pod finished (`loadpods.finished_by_all`),
    a pod that stored nothing finishing none; with why each stage only some pods finished is left
    out. None: no stage finished by every pod. Raises `results.ResultsError` as `read_results` does,
    except for a pod's missing bundle."""
    if pods == 1:
        return await read_results(kube, metadata, settings, job_uid=job_uid), []
    shards: list[loadpods.Measured | None] = []
    for k in range(pods):
        try:
            shards.append(await _shard(kube, metadata, settings, (k, pods), job_uid=job_uid))
        except results.ResultsMissing:
            shards.append(None)
    kept, unkept = loadpods.finished_by_all(shards, stages)
    if not kept:
        return None, unkept
    recs, anchor, windows, summary = await in_analysis_lane(loadpods.merge, kept)
    return (recs, anchor, windows, Validity.of_summary(summary)), unkept


async def _shard(
    kube: Kube,
    metadata: Mapping[str, Any],
    settings: OperatorSettings,
    pod: tuple[int, int] | None,
    *,
    job_uid: str | None,
    round_name: str | None = None,
) -> loadpods.Measured:
    """One load pod's bundle (`pod`: (k, N); None: the Job's one pod), read and parsed."""
    bundle = await results.download(
        kube,
        namespace=str(metadata["namespace"]),
        experiment=str(metadata["name"]),
        generation=int(metadata.get("generation") or 1),
        job_uid=job_uid,
        limits=settings.results_limits,
        round_name=round_name,
        pod=pod,
        store=settings.results_s3,
    )
    try:
        return await in_analysis_lane(results.parse, bundle)
    except ValueError as exc:
        raise results.ResultsCorrupt(f"the load Job's results do not parse: {exc}") from None


async def with_prometheus(
    source: prometheus.PrometheusSource,
    windows: list[records.StageWindow],
    anchor: records.RunAnchor,
    *,
    namespace: str,
    name: str,
    settings: OperatorSettings,
) -> list[records.StageWindow]:
    """`prometheus.with_prometheus` off the event loop (both arms' queries of a window in one request)."""
    return await asyncio.to_thread(
        prometheus.with_prometheus,
        source,
        windows,
        anchor,
        namespace=namespace,
        name=name,
        names=settings.label_names,
    )


async def measured(
    kube: Kube,
    metadata: Mapping[str, Any],
    experiment: spec.ExperimentSpec,
    settings: OperatorSettings,
    *,
    job_uid: str | None,
    round_name: str | None = None,
) -> Measured | reconcile.CollectFailure:
    """One round's results (None: the stages) with each window's server metrics from Prometheus."""
    name, namespace = metadata["name"], metadata["namespace"]
    try:
        recs, anchor, windows, block = await read_results(
            kube,
            metadata,
            settings,
            job_uid=job_uid,
            round_name=round_name,
            pods=experiment.workload.load_pods,
        )
    except results.ResultsError as exc:
        return reconcile.CollectFailure(
            exc.reason, f"{exc}; read the load Job's log", transient=exc.transient
        )
    url = prometheus_url(experiment, settings)
    if url is None:
        return reconcile.CollectFailure(
            "PrometheusNotConfigured", "set spec.prometheus.url, or the operator's default Prometheus URL"
        )
    source = prometheus.PrometheusSource(url)
    try:
        windows = await with_prometheus(
            source, windows, anchor, namespace=namespace, name=name, settings=settings
        )
    except prometheus.PrometheusBadResponse as exc:
        return reconcile.CollectFailure(
            "PrometheusBadResponse", f"Prometheus answered nonsense: {exc}", transient=True
        )
    except prometheus.PrometheusUnavailable as exc:
        return reconcile.CollectFailure(
            "PrometheusUnavailable", f"Prometheus did not answer: {exc}", transient=True
        )
    except prometheus.PrometheusNoData as exc:
        return reconcile.CollectFailure(
            "PrometheusNoData",
            f"Prometheus has no data for the arms ({exc}); check that it scrapes pods labelled "
            f"{keys.LABEL_EXPERIMENT}={name} and keeps that label as {settings.label_names.experiment}",
        )
    return recs, anchor, windows, block
