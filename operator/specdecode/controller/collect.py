"""Analyzing: gather the load Job's results and Prometheus' view of both arms, then judge.

Returns what the decision function needs: a `Judgement`, or a `CollectFailure` with a reason
(transient ones — Prometheus unreachable — are retried by the decision function's grace period).
The full report is rendered here, while the records are at hand; the tick stores it in ConfigMap
`<exp>-report`, named by `status.resultsRef`, when its decision says so (`Action.STORE_REPORT`:
`put_report`).

Its one job is the collection's order: read the stages and every round measured so far
(`reading.py`), judge the stages and fold the rounds in (`experiment/judgement.py`, in the analysis
lane of `lane.py`), add the GPU telemetry and stage times (`gpu.py`), and render the report. The
experiments collected at once are bounded by their planned results (`lane.one_at_a_time`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import gzip
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from specdecode import results
from specdecode.controller import observe
from specdecode.controller.gpu import gpu_telemetry, with_times
from specdecode.controller.kube import CONFIG_MAP, Kube
from specdecode.controller.lane import COLLECTIONS as COLLECTIONS
from specdecode.controller.lane import in_analysis_lane, one_at_a_time
from specdecode.controller.reading import measured, prometheus_url, read_finished, with_prometheus
from specdecode.controller.settings import OperatorSettings
from specdecode.experiment import (
    crossover,
    judgement,
    keys,
    kvcache,
    manifests,
    promql,
    reconcile,
    records,
    rounds,
    spec,
    status,
    verdict,
)
from specdecode.report import page
from specdecode.sources import prometheus


async def arms_scraped(
    experiment: spec.ExperimentSpec,
    namespace: str,
    name: str,
    settings: OperatorSettings,
    *,
    pods: Mapping[spec.Arm, Sequence[str]] | None = None,
) -> bool | None:
    """Whether Prometheus scrapes both arms (None when no Prometheus is configured: collection will
    say so); with `pods`, whether it scrapes those pods of each arm (a round's restarted arm: its old
    pod's target may still be up while the new pod is not yet scraped)."""
    url = prometheus_url(experiment, settings)
    if url is None:
        return None
    source = prometheus.PrometheusSource(url, timeout=5.0)

    queries = {}
    for arm in spec.Arm:
        labels = prometheus.arm_labels(settings.label_names, namespace, name, arm)
        only = None if pods is None else (settings.label_names.pod, pods.get(arm, ()))
        if only is not None and not only[1]:
            return False
        queries[arm.value] = promql.targets_up(labels, pods=only)

    def check() -> bool:
        # both arms in one request
        up = promql.query_all(source, queries, time.time())
        return all(any(sample.value >= 1 for sample in up[arm]) for arm in queries)

    try:
        return await asyncio.to_thread(check)
    except prometheus.PrometheusUnavailable:
        return False


async def kv_capacities(
    experiment: spec.ExperimentSpec, namespace: str, name: str, settings: OperatorSettings
) -> dict[spec.Arm, kvcache.KVCapacity]:
    """Each arm's KV-cache capacity as Prometheus holds it (`vllm:cache_config_info`, issue #18); an arm
    without it, or a Prometheus that does not answer, is left out: the capacity explains a verdict,
    it does not decide one."""
    url = prometheus_url(experiment, settings)
    if url is None:
        return {}
    source = prometheus.PrometheusSource(url, timeout=5.0)

    def read() -> dict[spec.Arm, kvcache.KVCapacity]:
        labels = {
            arm.value: prometheus.arm_labels(settings.label_names, namespace, name, arm) for arm in spec.Arm
        }
        found = prometheus.kv_capacities(source, labels, at=time.time())
        return {arm: capacity for arm in spec.Arm if (capacity := found[arm.value]) is not None}

    try:
        return await asyncio.to_thread(read)
    except prometheus.PrometheusUnavailable:
        return {}


def report_config_map(name: str, html: str, result: dict[str, Any]) -> dict[str, Any]:
    """The report and result.json, gzip'd (a report with plots can pass ConfigMap size limits raw)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-report", "labels": manifests.labels(name, component="results")},
        "binaryData": {
            "report.html.gz": base64.b64encode(gzip.compress(html.encode(), mtime=0)).decode(),
            "result.json.gz": base64.b64encode(gzip.compress(json.dumps(result).encode(), mtime=0)).decode(),
        },
    }


class ReportNameTaken(Exception):
    """`<exp>-report` exists and is not the experiment's: it is never replaced."""


async def store_report(
    kube: Kube,
    judged: status.ExperimentStatus,
    recs: list[records.Request],
    windows: list[records.StageWindow],
    experiment: spec.ExperimentSpec,
    metadata: Mapping[str, Any],
) -> dict[str, Any]:
    """Render the report of `judged` and store it (with result.json) in ConfigMap `<name>-report`
    (`render_report`, then `put_report`)."""
    rendered = await render_report(judged, recs, windows, experiment, name=str(metadata["name"]))
    return await put_report(kube, rendered, metadata)


async def render_report(
    judged: status.ExperimentStatus,
    recs: list[records.Request],
    windows: list[records.StageWindow],
    experiment: spec.ExperimentSpec,
    *,
    name: str,
) -> reconcile.Report:
    """The report of `judged`, rendered in the analysis thread while the records are at hand (within
    the collection's slot): stored only if the tick's decision says so (`Action.STORE_REPORT`)."""
    html = await in_analysis_lane(page.render_html, judged, recs, windows, experiment, name=name)
    return reconcile.Report(html=html, result=judged.wire())


async def put_report(kube: Kube, rendered: reconcile.Report, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Store a rendered report in ConfigMap `<name>-report`, owned by the experiment; raises
    ReportNameTaken rather than replace a ConfigMap of that name that the experiment does not own."""
    name = str(metadata["name"])
    uid = str(metadata.get("uid") or "")
    existing = await kube.get(CONFIG_MAP, str(metadata["namespace"]), f"{name}-report")
    if existing is not None and uid and not observe.owned_by(existing, uid):
        raise ReportNameTaken(
            f"the report was not stored: ConfigMap {name}-report exists and is not this experiment's"
        )
    report = report_config_map(name, rendered.html or "", rendered.result or {})
    report["metadata"]["annotations"] = {
        keys.GENERATION_ANNOTATION: str(int(metadata.get("generation") or 1))
    }
    if metadata.get("uid"):
        # Deleting the experiment deletes its report too (as kopf.adopt does for the other children).
        report["metadata"]["ownerReferences"] = [
            {
                "apiVersion": keys.GROUP_VERSION,
                "kind": keys.KIND,
                "name": name,
                "uid": str(metadata["uid"]),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    await kube.put(report, str(metadata["namespace"]))
    return report


@one_at_a_time
async def collect(
    kube: Kube,
    body: Mapping[str, Any],
    experiment: spec.ExperimentSpec,
    current: status.ExperimentStatus,
    settings: OperatorSettings,
    *,
    job_uids: Mapping[str | None, str | None],
) -> reconcile.Judgement | reconcile.CollectFailure:
    """Results + Prometheus -> verdict, or why not; or the round owed before the verdict (`rounds.py`).

    `job_uids`: the uid of each load Job by round (None: the stages' Job). Every round measured so
    far is read first, then folded in by the core's fold that `run --local` calls too
    (`judgement.fold`): the search's probes, the crossover's swapped round, the confirmation round.
    The rounds' records are held together with the stages' while they are folded (each round is
    one probe stage, a fraction of the stages, or the stages once more), and the collection's weight counts them
    (`lane.one_at_a_time`).
    """
    metadata = body["metadata"]
    name = metadata["name"]
    first = await measured(kube, metadata, experiment, settings, job_uid=job_uids.get(None))
    if isinstance(first, reconcile.CollectFailure):
        return first
    recs, anchor, windows, block = first
    try:
        analysis = await in_analysis_lane(verdict.analyse, experiment, recs, windows, validity=block)
    except (ArithmeticError, ValueError, TypeError) as exc:
        return _analysis_failed(exc)
    # The rounds are read only for a verdict: without one, none is folded in nor owed.
    read = (
        await _rounds_read(kube, metadata, experiment, current, settings, job_uids)
        if analysis.measured
        else {}
    )
    if isinstance(read, reconcile.CollectFailure):
        return read
    inputs = judgement.Measured(rounds=read, environment=current.environment, placement=_placement(current))
    try:
        folded = await in_analysis_lane(judgement.fold, experiment, current, analysis, inputs)
    except (ArithmeticError, ValueError, TypeError) as exc:
        return _analysis_failed(exc)
    if isinstance(folded, reconcile.CollectFailure):
        return folded
    analysis, checked, found, owed = folded.analysis, folded.crossover, folded.search, folded.next_round
    try:
        gpu = await asyncio.to_thread(
            gpu_telemetry,
            prometheus.PrometheusSource(str(prometheus_url(experiment, settings))),
            analysis.stages,
            windows,
            anchor,
            namespace=metadata["namespace"],
            name=name,
            settings=settings,
        )
    except prometheus.PrometheusUnavailable as exc:  # it answered a moment ago: retried
        return reconcile.CollectFailure(
            "PrometheusUnavailable", f"Prometheus did not answer: {exc}", transient=True
        )
    analysis = dataclasses.replace(analysis, stages=gpu)
    if analysis.verdict is None:
        return reconcile.CollectFailure(str(analysis.reason), analysis.message)
    message, advised = folded.message, folded.recommendation
    stages = with_times(analysis.stages, windows, anchor)
    if owed is not None:
        return reconcile.Judgement(
            verdict=analysis.verdict,
            reason=str(analysis.reason),
            message=message,
            stages=stages,
            recommendation=advised,
            crossover=checked,
            search=found,
            speedup_summary=analysis.speedup_summary,
            validity=block,
            next_round=owed,
        )
    judged = analysis.apply(current).model_copy(
        update={"crossover": checked, "recommendation": advised, "message": message, "search": found}
    )
    # Rendered here, with the records at hand; stored if the decision ends the experiment with it.
    rendered = await render_report(judged, recs, windows, experiment, name=name)
    return reconcile.Judgement(
        verdict=analysis.verdict,
        reason=str(analysis.reason),
        message=message,
        stages=stages,
        recommendation=advised,
        noise_floor=analysis.noise_floor,
        crossover=checked,
        search=found,
        speedup_summary=analysis.speedup_summary,
        validity=block,
        results_ref=status.ResultsRef(
            config_map=f"{name}-report", objects=results.objects_url(settings.results_s3, metadata)
        ),
        report=rendered,
    )


def _analysis_failed(exc: Exception) -> reconcile.CollectFailure:
    """The same data fails the same way on every try: a reason, not an operator retrying forever."""
    return reconcile.CollectFailure(
        "AnalysisFailed", f"the results could not be analysed ({type(exc).__name__}: {exc})"
    )


async def _rounds_read(
    kube: Kube,
    metadata: Mapping[str, Any],
    experiment: spec.ExperimentSpec,
    current: status.ExperimentStatus,
    settings: OperatorSettings,
    job_uids: Mapping[str | None, str | None],
) -> dict[str, judgement.Measurement | judgement.Unmeasured] | reconcile.CollectFailure:
    """What each round of `current` that did not fail measured (its load Job's results, with
    Prometheus' figures), or why it cannot be read; a transient failure (Prometheus) is retried."""
    read: dict[str, judgement.Measurement | judgement.Unmeasured] = {}
    for round_ in current.rounds:
        if round_.outcome == rounds.FAILED:
            continue
        got = await measured(
            kube, metadata, experiment, settings, job_uid=job_uids.get(round_.name), round_name=round_.name
        )
        if isinstance(got, reconcile.CollectFailure):
            if got.transient:
                return got
            read[round_.name] = judgement.Unmeasured(f"{got.reason}: {got.message}")
            continue
        round_recs, _, round_windows, round_block = got
        read[round_.name] = judgement.Measurement(round_recs, round_windows, round_block)
    return read


def _placement(current: status.ExperimentStatus) -> judgement.Placement:
    """Where the arms ran, by node: the stages' nodes, the swapped round's, and whether they differ."""
    environment = current.environment
    first = rounds.first_nodes(environment)
    swapped = rounds.find(current, rounds.CROSSOVER)
    unswappable = None
    if environment is None or not environment.host_differences or first.control == first.treatment:
        why = "both arms ran on one node (each on its own GPUs): nothing to swap"
        unswappable = (crossover.SAME_PLACEMENT, why)
    return judgement.Placement(
        first=first,
        swapped=(swapped.nodes or status.CrossoverPlacement()) if swapped is not None else None,
        unswappable=unswappable,
    )


async def salvage(
    kube: Kube,
    body: Mapping[str, Any],
    experiment: spec.ExperimentSpec,
    failed: status.ExperimentStatus,
    settings: OperatorSettings,
    *,
    job_uid: str | None,
) -> status.ExperimentStatus:
    """`failed` with the stages the load finished kept, as a tick keeps them (`finished_stages`,
    then `reconcile.keep_finished`); `failed` unchanged when it finished none."""
    found = await finished_stages(kube, body, experiment, failed, settings, job_uid=job_uid)
    attempt = reconcile.Decision(failed, [reconcile.Action.KEEP_FINISHED_STAGES])
    return reconcile.keep_finished(attempt, found, total=len(experiment.workload.stages)).status


@one_at_a_time
async def finished_stages(
    kube: Kube,
    body: Mapping[str, Any],
    experiment: spec.ExperimentSpec,
    failed: status.ExperimentStatus,
    settings: OperatorSettings,
    *,
    job_uid: str | None,
) -> reconcile.Finished:
    """A run that failed during the load keeps the stages it finished (`Action.KEEP_FINISHED_STAGES`):
    their statistics, for `status.stages`, and the report of `failed` with them kept, for ConfigMap
    `<exp>-report`; the experiment stays Failed without a verdict.

    The load Job stores its results after every stage, so this finds whatever it finished even when
    it was killed. No results, or results that do not parse: nothing finished. Prometheus is
    asked as for a full run; if it cannot answer, the stages keep the load Job's own figures.
    Within the collections' budget (`lane.one_at_a_time`).
    """
    metadata = body["metadata"]
    name, namespace = metadata["name"], metadata["namespace"]
    planned = [s.name for s in experiment.workload.stages]
    try:
        read, unkept = await read_finished(
            kube, metadata, settings, job_uid=job_uid, pods=experiment.workload.load_pods, stages=planned
        )
    except results.ResultsError:
        return reconcile.Finished()
    note = _unkept(unkept)
    if read is None:
        return reconcile.Finished(unkept=note)
    recs, anchor, windows, block = read
    measured = [w.stage for w in windows if w.stage in planned]
    if not measured:
        return reconcile.Finished(unkept=note)
    url = prometheus_url(experiment, settings)
    if url is not None:
        source = prometheus.PrometheusSource(url)
        with contextlib.suppress(prometheus.PrometheusUnavailable, prometheus.PrometheusNoData):
            windows = await with_prometheus(
                source, windows, anchor, namespace=namespace, name=name, settings=settings
            )
    analysis = await in_analysis_lane(verdict.analyse, experiment, recs, windows, validity=block)
    kept = with_times([s for s in analysis.stages if s.name in measured], windows, anchor)
    ref = status.ResultsRef(config_map=f"{name}-report")
    shown = reconcile.with_finished_stages(failed, kept, ref, total=len(planned), unkept=note)
    rendered = await render_report(shown, recs, windows, experiment, name=name)
    return reconcile.Finished(stages=kept, results_ref=ref, report=rendered, unkept=note)


def _unkept(stages: list[str]) -> str | None:
    """What the failure says of the stages only some load pods finished (`loadpods.finished_by_all`)."""
    if not stages:
        return None
    return f"not kept, as only some load pods finished them (a partial schedule): {'; '.join(stages)}"
