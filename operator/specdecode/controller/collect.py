"""Analyzing: gather the load Job's results and Prometheus' view of both arms, then judge.

Returns what the decision function needs: a `Judgement`, or a `CollectFailure` with a reason
(transient ones — Prometheus unreachable — are retried by the decision function's grace period).
The full report is stored in a ConfigMap `<exp>-report` named by `status.resultsRef`.

The CPU-heavy steps (parsing the records, the statistics, rendering the report) run in one analysis
thread of their own (`in_analysis_lane`), one experiment's step at a time: kopf's event loop keeps
ticking the other experiments, the default thread pool stays free for their API calls. However
many experiments finish together, at most `COLLECTIONS` are collected at once (`one_collection`,
from reading the results to storing the report): only their results are held in memory, not every
waiting experiment's parsed records at once, while one collection's waits (the API server,
Prometheus) overlap another's analysis (benchmarks/README.md, "Many experiments").
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import functools
import gzip
import json
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, ParamSpec, TypeVar

from specdecode import results
from specdecode.controller import observe
from specdecode.controller.kube import CONFIG_MAP, Kube
from specdecode.controller.settings import OperatorSettings
from specdecode.experiment import (
    confirm,
    crossover,
    keys,
    kvcache,
    loadpods,
    manifests,
    promql,
    recommendation,
    reconcile,
    records,
    rounds,
    search,
    spec,
    status,
    telemetry,
    verdict,
)
from specdecode.experiment.validity import Validity
from specdecode.report import page
from specdecode.sources import prometheus

_P = ParamSpec("_P")
_T = TypeVar("_T")
_lane: ThreadPoolExecutor | None = None
_lane_lock = threading.Lock()
_collections: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)
# Collections at once. Each holds one experiment's results (at the default results limit up to
# ~300 MiB parsed, benchmarks/README.md "Results size"): two stay within the operator's 1 GiB limit;
# one at a time left the analysis thread idle while a collection waited on the API server and
# Prometheus ("Many experiments").
COLLECTIONS = 2


def one_collection() -> asyncio.Semaphore:
    """The slot that one experiment's collection holds (`COLLECTIONS` per event loop)."""
    loop = asyncio.get_running_loop()
    slots = _collections.get(loop)
    if slots is None:
        slots = _collections[loop] = asyncio.Semaphore(COLLECTIONS)
    return slots


def one_at_a_time(fn: Callable[_P, Awaitable[_T]]) -> Callable[_P, Awaitable[_T]]:
    """`fn` holds a slot of `one_collection()` while it runs: at most `COLLECTIONS` experiments'
    parsed records in memory at a time."""

    @functools.wraps(fn)
    async def holding(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        async with one_collection():
            return await fn(*args, **kwargs)

    return holding


async def in_analysis_lane(fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """Run `fn` in the operator's single analysis thread (created on first use, shared by every
    experiment), off the event loop and out of the default pool that the API calls use."""
    global _lane
    with _lane_lock:
        if _lane is None:
            _lane = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdecode-analysis")
        lane = _lane
    return await asyncio.get_running_loop().run_in_executor(lane, functools.partial(fn, *args, **kwargs))


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
    # the arms' queries of a stage at once, on one pair of threads for every stage
    with ThreadPoolExecutor(max_workers=len(spec.Arm), thread_name_prefix="specdecode-gpu") as both:
        for stage in stages:
            window = by_stage.get(stage.name)
            if window is None:
                updated.append(stage)
                continue
            start, end = anchor.wall + window.start, anchor.wall + window.end
            arms = {
                arm: both.submit(prometheus.arm_gpu, source, selectors[arm], start=start, end=end)
                for arm in spec.Arm
            }
            gpu = telemetry.stage_gpu(arms[spec.Arm.CONTROL].result(), arms[spec.Arm.TREATMENT].result())
            updated.append(stage.model_copy(update={"gpu": gpu}))
    return updated


async def arms_scraped(
    experiment: spec.ExperimentSpec, namespace: str, name: str, settings: OperatorSettings
) -> bool | None:
    """Whether Prometheus scrapes both arms (None when no Prometheus is configured: collection will say so)."""
    url = prometheus_url(experiment, settings)
    if url is None:
        return None
    source = prometheus.PrometheusSource(url, timeout=5.0)

    def check() -> bool:
        for arm in spec.Arm:
            up = source.query(
                promql.targets_up(prometheus.arm_labels(settings.label_names, namespace, name, arm)),
                time.time(),
            )
            if not any(sample.value >= 1 for sample in up):
                return False
        return True

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
        found = {}
        for arm in spec.Arm:
            labels = prometheus.arm_labels(settings.label_names, namespace, name, arm)
            capacity = prometheus.kv_capacity(source, labels, at=time.time())
            if capacity is not None:
                found[arm] = capacity
        return found

    try:
        return await asyncio.to_thread(read)
    except prometheus.PrometheusUnavailable:
        return {}


def prometheus_url(experiment: spec.ExperimentSpec, settings: OperatorSettings) -> str | None:
    """The experiment's Prometheus (`spec.prometheus.url`), else the operator's default (None: neither)."""
    return experiment.prometheus.url if experiment.prometheus else settings.prometheus_url


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
    """Render the report of `judged` and store it (with result.json) in ConfigMap `<name>-report`;
    raises ReportNameTaken rather than replace a ConfigMap of that name that the experiment does not own."""
    name = str(metadata["name"])
    uid = str(metadata.get("uid") or "")
    existing = await kube.get(CONFIG_MAP, str(metadata["namespace"]), f"{name}-report")
    if existing is not None and uid and not observe.owned_by(existing, uid):
        raise ReportNameTaken(
            f"the report was not stored: ConfigMap {name}-report exists and is not this experiment's"
        )
    html = await in_analysis_lane(page.render_html, judged, recs, windows, experiment, name=name)
    report = report_config_map(name, html, judged.wire())
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
    shards = []
    for pod in [None] if pods == 1 else [(k, pods) for k in range(pods)]:
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
            shards.append(await in_analysis_lane(results.parse, bundle))
        except ValueError as exc:
            raise results.ResultsCorrupt(f"the load Job's results do not parse: {exc}") from None
        del bundle
    recs, anchor, windows, summary = (
        shards[0] if pods == 1 else await in_analysis_lane(loadpods.merge, shards)
    )
    return recs, anchor, windows, Validity.of_summary(summary)


async def with_prometheus(
    source: prometheus.PrometheusSource,
    windows: list[records.StageWindow],
    anchor: records.RunAnchor,
    *,
    namespace: str,
    name: str,
    settings: OperatorSettings,
) -> list[records.StageWindow]:
    """`prometheus.with_prometheus` with each arm's queries in a thread of its own, at once: a
    collection waits for the slower arm, not for both one after the other."""
    by_arm = await asyncio.gather(
        *(
            asyncio.to_thread(
                prometheus.with_prometheus,
                source,
                windows,
                anchor,
                namespace=namespace,
                name=name,
                names=settings.label_names,
                arms=(arm,),
            )
            for arm in spec.Arm
        )
    )
    return [
        window.model_copy(update={"server": {k: v for one in by_arm for k, v in one[i].server.items()}})
        for i, window in enumerate(windows)
    ]


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
    far is folded in, in `run --local`'s order: the search's probes (`search.progress`; the
    recommendation rests on them too), the crossover's (`crossover.apply`), then the confirmation's
    (`confirm.fold`). One experiment at a time (`one_collection`).
    """
    metadata = body["metadata"]
    name = metadata["name"]
    first = await measured(kube, metadata, experiment, settings, job_uid=job_uids.get(None))
    if isinstance(first, reconcile.CollectFailure):
        return first
    recs, anchor, windows, block = first
    checked: status.CrossoverResult | reconcile.CollectFailure | None = None
    try:
        analysis = await in_analysis_lane(verdict.analyse, experiment, recs, windows, validity=block)
        searched = (
            await _search(kube, metadata, experiment, current, settings, job_uids)
            if analysis.measured
            else (None, None)
        )
        if isinstance(searched, reconcile.CollectFailure):
            return searched
        found, owed = searched
        if owed is None:
            analysis, checked, owed = await _crossover(
                kube, metadata, experiment, current, settings, analysis, job_uids
            )
        if found is not None and found.probes and analysis.measured:
            probed = recommendation.recommend(experiment, [*analysis.stages, *found.probes])
            analysis = replace(analysis, recommendation=probed)
    except (ArithmeticError, ValueError, TypeError) as exc:
        # The same data fails the same way on every try: a reason, not an operator retrying forever.
        return reconcile.CollectFailure(
            "AnalysisFailed", f"the results could not be analysed ({type(exc).__name__}: {exc})"
        )
    if isinstance(checked, reconcile.CollectFailure):
        return checked
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
    message = analysis.message
    advised = analysis.recommendation
    if owed is None and experiment.analysis.confirm:
        confirmed = await _confirmation(kube, metadata, experiment, current, settings, analysis, job_uids)
        if isinstance(confirmed, reconcile.CollectFailure):
            return confirmed
        advised, owed, note = confirmed
        message = f"{message}; {note}" if note else message
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
    ref: status.ResultsRef | None = status.ResultsRef(
        config_map=f"{name}-report", objects=results.objects_url(settings.results_s3, metadata)
    )
    try:
        await store_report(kube, judged, recs, windows, experiment, metadata)
    except ReportNameTaken as exc:  # the verdict stands; only its report has nowhere to go
        message, ref = f"{message}; {exc}", None
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
        results_ref=ref,
    )


async def _search(
    kube: Kube,
    metadata: Mapping[str, Any],
    experiment: spec.ExperimentSpec,
    current: status.ExperimentStatus,
    settings: OperatorSettings,
    job_uids: Mapping[str | None, str | None],
) -> tuple[status.SearchResult | None, status.Round | None] | reconcile.CollectFailure:
    """`workload.search`: `status.search` from the probes measured so far (each judged as
    `run --local` judges it) and the next probe's round if one is owed; or a transient failure to
    retry. A probe that could not be measured stops the search (`ProbeFailed`)."""
    wanted = experiment.workload.search
    if wanted is None:
        return None, None
    judged: list[tuple[float, status.StageResult]] = []
    for round_ in rounds.probes(current):
        stage = rounds.probe_stage(experiment, round_)
        assert stage is not None and round_.load is not None and round_.probe is not None
        if round_.outcome == rounds.FAILED:
            return search.failed(wanted, judged, round_.name, round_.message or "failed"), None
        probe = await measured(
            kube, metadata, experiment, settings, job_uid=job_uids.get(round_.name), round_name=round_.name
        )
        if isinstance(probe, reconcile.CollectFailure):
            if probe.transient:
                return probe
            return search.failed(wanted, judged, round_.name, f"{probe.reason}: {probe.message}"), None
        recs, _, windows, block = probe
        result = await in_analysis_lane(
            search.judge_probe,
            experiment,
            stage,
            recs,
            windows,
            validity=block,
            index=round_.probe,
        )
        judged.append((round_.load, result))
    step, found = search.progress(wanted, judged)
    if step.next_load is None:
        return found, None
    owed = rounds.probe_round(wanted, len(judged) + 1, step.next_load)
    if rounds.find(current, owed.name) is not None:
        # The round kept its name but lost `probe` and `load`: the API server pruned the fields its
        # CRD does not know. Owing it again would run the same probe forever.
        return reconcile.CollectFailure(
            "CrdOutdated",
            f"status.rounds[] lost the probe fields of {owed.name}: the installed CRD is older than the "
            "operator; apply crds/specdecodeexperiments.specdecode.io.yaml of the operator's release",
        )
    return found, owed


async def _crossover(
    kube: Kube,
    metadata: Mapping[str, Any],
    experiment: spec.ExperimentSpec,
    current: status.ExperimentStatus,
    settings: OperatorSettings,
    analysis: verdict.Analysis,
    job_uids: Mapping[str | None, str | None],
) -> tuple[verdict.Analysis, status.CrossoverResult | reconcile.CollectFailure | None, status.Round | None]:
    """`analysis.crossover`: whether the swapped round is owed (the third item), or the stages'
    analysis with the swapped round folded in, and `status.crossover`."""
    a = experiment.analysis
    if a.crossover is spec.Crossover.OFF:
        return analysis, None, None
    environment = current.environment
    if analysis.verdict is None:
        return analysis, crossover.skipped(a, crossover.NOT_MEASURED, "no verdict to check"), None
    if not crossover.wanted(a, environment):
        return analysis, crossover.not_apart(a), None
    first = rounds.first_nodes(environment)
    if environment is None or not environment.host_differences or first.control == first.treatment:
        why = "both arms ran on one node (each on its own GPUs): nothing to swap"
        return analysis, crossover.skipped(a, crossover.SAME_PLACEMENT, why), None
    round_ = rounds.find(current, rounds.CROSSOVER)
    if round_ is None:
        if first.control is None or first.treatment is None:
            return (
                *crossover.apply(experiment, analysis, [], [first], failure="the arms' nodes are unknown"),
                None,
            )
        return analysis, None, rounds.crossover_round(environment)
    placements = rounds.placements(environment, round_)
    if round_.outcome == rounds.FAILED:
        return (
            *crossover.apply(experiment, analysis, [], placements, failure=round_.message or "failed"),
            None,
        )
    swapped = await measured(
        kube, metadata, experiment, settings, job_uid=job_uids.get(round_.name), round_name=round_.name
    )
    if isinstance(swapped, reconcile.CollectFailure):
        if swapped.transient:
            return analysis, swapped, None
        failure = f"{swapped.reason}: {swapped.message}"
        return (*crossover.apply(experiment, analysis, [], placements, failure=failure), None)
    recs, _, windows, block = swapped
    invalid = crossover.invalid(block)
    if invalid is not None:
        return (*crossover.apply(experiment, analysis, [], placements, failure=invalid), None)
    round_spec = rounds.load_spec(experiment, round_)
    judged = await in_analysis_lane(verdict.analyse, round_spec, recs, windows, validity=block)
    return (*crossover.apply(experiment, analysis, judged.stages, placements), None)


async def _confirmation(
    kube: Kube,
    metadata: Mapping[str, Any],
    experiment: spec.ExperimentSpec,
    current: status.ExperimentStatus,
    settings: OperatorSettings,
    analysis: verdict.Analysis,
    job_uids: Mapping[str | None, str | None],
) -> tuple[status.Recommendation | None, status.Round | None, str | None] | reconcile.CollectFailure:
    """`analysis.confirm`: (the recommendation with its confirmation, the round if it is owed, a note
    for the message), or a transient failure to retry."""
    rec = analysis.recommendation
    round_ = rounds.find(current, rounds.CONFIRMATION)
    if round_ is None:
        schedule = rec.num_speculative_tokens_per_batch_size if rec is not None else None
        if schedule is None:
            return confirm.not_run(rec, confirm.Reason.NO_SCHEDULE), None, None
        crossed = rounds.find(current, rounds.CROSSOVER) is not None
        return rec, rounds.confirmation_round(schedule, current.environment, crossed=crossed), None
    failed = confirm.not_run(rec, confirm.Reason.ROUND_FAILED)
    if round_.outcome == rounds.FAILED or round_.schedule is None:
        return failed, None, f"the confirmation round failed: {round_.message}"
    second = await measured(
        kube, metadata, experiment, settings, job_uid=job_uids.get(round_.name), round_name=round_.name
    )
    if isinstance(second, reconcile.CollectFailure):
        if second.transient:
            return second
        return failed, None, f"the confirmation round failed: {second.reason}: {second.message}"
    recs, _, windows, block = second
    planned = confirm.plan(experiment, analysis.stages, round_.schedule)
    judged = await in_analysis_lane(
        confirm.judge,
        rounds.arm_spec(experiment, round_),
        planned,
        recs,
        windows,
        validity=block,
    )
    folded = confirm.fold(rec or status.Recommendation(), judged)
    return folded, None, None


@one_at_a_time
async def salvage(
    kube: Kube,
    body: Mapping[str, Any],
    experiment: spec.ExperimentSpec,
    failed: status.ExperimentStatus,
    settings: OperatorSettings,
    *,
    job_uid: str | None,
) -> status.ExperimentStatus:
    """A run that failed during the load keeps the stages it finished: their statistics go into
    `status.stages` and the report ConfigMap, the experiment stays Failed without a verdict.

    The load Job stores its results after every stage, so this finds whatever it finished even when
    it was killed. No results, or results that do not parse: `failed` unchanged. Prometheus is
    asked as for a full run; if it cannot answer, the stages keep the load Job's own figures.
    One experiment at a time (`one_collection`).
    """
    metadata = body["metadata"]
    name, namespace = metadata["name"], metadata["namespace"]
    try:
        recs, anchor, windows, block = await read_results(
            kube, metadata, settings, job_uid=job_uid, pods=experiment.workload.load_pods
        )
    except results.ResultsError:
        return failed
    stages = {s.name for s in experiment.workload.stages}
    measured = [w.stage for w in windows if w.stage in stages]
    if not measured:
        return failed
    url = prometheus_url(experiment, settings)
    if url is not None:
        source = prometheus.PrometheusSource(url)
        with contextlib.suppress(prometheus.PrometheusUnavailable, prometheus.PrometheusNoData):
            windows = await with_prometheus(
                source, windows, anchor, namespace=namespace, name=name, settings=settings
            )
    analysis = await in_analysis_lane(verdict.analyse, experiment, recs, windows, validity=block)
    total = len(experiment.workload.stages)
    kept = failed.model_copy(
        update={
            "stages": with_times([s for s in analysis.stages if s.name in measured], windows, anchor),
            "results_ref": status.ResultsRef(config_map=f"{name}-report"),
            "message": (
                f"{failed.message}; the {len(measured)} of {total} stage(s) measured before that "
                f"({', '.join(measured)}) are kept in status.stages and ConfigMap {name}-report"
            ),
        }
    )
    await store_report(kube, kept, recs, windows, experiment, metadata)
    return kept
