"""The kopf handlers: one startup configuration, one timer that reconciles each experiment, and a
watch on the load Jobs that wakes an experiment's tick when its Job ends (`controller/ticks.py`).

The timer is the only writer of `status.phase` (style.md §3): observe the children -> call the pure
`reconcile.decide` -> apply its actions -> patch the changed status fields -> post Events for phase
changes and the verdict. It stores no kopf progress: all state is `.status` and the children, so a
restarted operator resumes, and creating children is idempotent (deterministic names).

Spec changes: a new `metadata.generation` restarts the experiment (children of the old generation are
deleted, status is reset). Outcomes go to status. A tick that raises (the API server refusing a
child, an answer of an unexpected shape) is not left to kopf's retries, which would skip every
deadline: `reconcile.decide_after_fault` keeps the phase and retries on the next tick until the
phase's deadline, then fails with a reason (a child refused as invalid, HTTP 422, at once).
The actions are carried out by `controller/actions.py` (its exceptions name the action and the child).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import kopf

from specdecode import results
from specdecode.controller import actions, collect, kube, lease, observe, ticks
from specdecode.controller.metrics import OperatorMetrics
from specdecode.controller.settings import OperatorSettings
from specdecode.experiment import (
    degradations,
    keys,
    kvcache,
    manifests,
    reconcile,
    round_phases,
    rounds,
    secretrefs,
    spec,
    status,
    validation,
)

SETTINGS = OperatorSettings.from_env()


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """All kopf settings, each non-default with its reason."""
    # Our own finalizer and annotation names, so nothing collides with other kopf operators.
    settings.persistence.finalizer = keys.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=keys.API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=keys.API_GROUP, key="last-handled-configuration"
    )
    # Events only for what we post explicitly (phase changes, verdicts), not for every log line.
    settings.posting.level = logging.WARNING
    # Re-establish watches well before intermediaries cut idle connections.
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.networking.request_timeout = 60
    memo.settings = SETTINGS
    memo.ticks = ticks.Ticks(SETTINGS.interval)
    memo.kube = kube.Kube.from_environment()
    memo.metrics = OperatorMetrics()
    if memo.get("metrics_port"):
        memo.metrics.serve(int(memo.metrics_port))
    election = SETTINGS.election
    if election is not None:  # replicas: only the Lease's holder reconciles (controller/lease.py)
        memo.elector = lease.Elector(memo.kube, election)
        memo.election = asyncio.create_task(memo.elector.run(logging.getLogger("specdecode.lease")))


@kopf.on.cleanup()
async def close_clients(memo: kopf.Memo, **_: Any) -> None:
    """Hand the Lease over and release the API client's connections."""
    if memo.get("election") is not None:
        memo.election.cancel()
        try:
            await memo.elector.release()
        except Exception as exc:  # the next leader then waits out the lease duration
            logging.getLogger("specdecode.lease").warning(f"could not release the Lease: {exc}")
    if memo.get("kube") is not None:
        memo.kube.close()


def _leading(memo: kopf.Memo) -> bool:
    """Whether this replica may act: always without leader election, else while it holds the Lease.
    Checked at each tick, not as the timer's `when` filter: kopf evaluates that only on the
    experiment's watch events, and after a leader dies there may be none to wake the standby."""
    elector: lease.Elector | None = memo.get("elector")
    return elector is None or elector.leading()


def _needs_reconcile(body: kopf.Body, **_: Any) -> bool:
    current = status.ExperimentStatus.model_validate(dict(body.get("status") or {}))
    return reconcile.needs_reconcile(current, int(body.metadata.get("generation") or 1))


# The timer's own interval is `ticks.POLL`: the handler waits for the experiment's interval or a
# wake-up itself (`ticks.Ticks.due`). A failing tick (API error, ...) is retried after a few
# intervals, not kopf's default minute.
@kopf.timer(
    keys.API_GROUP,
    keys.API_VERSION,
    keys.PLURAL,
    interval=ticks.POLL,
    backoff=max(5.0, 3 * SETTINGS.interval),
    when=_needs_reconcile,
)
async def reconcile_experiment(
    body: kopf.Body,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **kwargs: Any,
) -> None:
    """Wait for the tick to be due, then observe, decide, act, persist (a failing tick is counted,
    then retried by kopf)."""
    stopped: kopf.DaemonStopped = kwargs["stopped"]  # kopf passes it to timers (its TimerFn omits it)
    schedule: ticks.Ticks = memo.ticks
    key = (str(body.metadata.namespace), str(body.metadata.name))
    if not await schedule.due(key, stopped, lambda: (body.get("status") or {}).get("phase")):
        return  # deleted, no longer in need of a tick, or the operator exits
    wrote = None
    try:
        if not _leading(memo):  # a standby: the Lease's holder reconciles, this replica only waits
            return
        wrote = await _reconcile(body, patch, memo, logger)
    except Exception:
        memo.metrics.reconcile_errors.inc()
        raise
    finally:
        schedule.ticked(key, wrote)


@kopf.on.event(
    "batch", "v1", "jobs", labels={keys.LABEL_COMPONENT: "load", keys.LABEL_EXPERIMENT: kopf.PRESENT}
)
async def wake_on_load_job(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A load Job that ended (Complete or Failed) wakes its experiment's tick: the results are
    judged now, not up to an interval later (benchmarks/README.md, "Many experiments")."""
    state = observe.job_state(body, [])
    if state.succeeded or state.failed:
        experiment = str(body.metadata.labels[keys.LABEL_EXPERIMENT])
        memo.ticks.wake((str(body.metadata.namespace), experiment))


async def _reconcile(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger, *, now: datetime | None = None
) -> str:
    """One tick; returns the phase it leaves the experiment in (for `ticks.Ticks.ticked`)."""
    settings: OperatorSettings = memo.settings
    name, namespace = str(body.metadata.name), str(body.metadata.namespace)
    generation = int(body.metadata.get("generation") or 1)
    document = _document(body)
    before = status.ExperimentStatus.model_validate(dict(body.get("status") or {}))
    subject = _subject(name, generation, document, settings)
    annotations = body.metadata.get("annotations") or {}
    if annotations.get(keys.ABORT_ANNOTATION) == str(generation):
        subject = replace(subject, aborted=True)
    now = now or datetime.now(UTC)
    current, events, written = before, [], before
    listed: Children | None = None
    for _ in range(PASSES):
        decision, listed = await _pass(body, document, subject, current, memo, now, logger, listed)
        events.extend(decision.events)
        if not _goes_straight_on(current, decision.status, generation):
            break
        # Analyzing is written before the judging: `kubectl get -w` and `kubectl specdecode watch` show
        # it while the results are judged (seconds for a big run), not Running. (A new experiment's
        # Pending is not: its arms follow at once.)
        fields = _status_fields(body, written, decision.status)
        if fields and decision.status.phase is status.Phase.ANALYZING:
            await memo.kube.patch_status(kube.EXPERIMENT, namespace, name, fields)
            written = decision.status
        current = decision.status
    for key, value in _status_fields(body, written, decision.status).items():
        patch.status[key] = value
    for event in events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
        logger.info(f"{event.reason}: {event.message}")
    memo.metrics.observe(namespace, name, decision.status)
    return decision.status.phase.value


# At most this many observe -> decide -> act passes in one tick (`_goes_straight_on`).
PASSES = 3


def _goes_straight_on(
    before: status.ExperimentStatus, after: status.ExperimentStatus, generation: int
) -> bool:
    """Whether the tick observes and decides again at once instead of an interval later: a new
    experiment was just accepted (Pending: its arms are created now), or the load just finished
    (Analyzing: it is judged now). Waiting a tick there only adds latency (benchmarks/README.md,
    "Many experiments"). A spec edit's Pending keeps its tick (the old generation's children are
    deleted first), and a pass that met a fault (`retrying: ...`) waits for the next tick."""
    if (after.message or "").startswith(reconcile.RETRYING) or after.observed_generation != generation:
        return False
    accepted = before.observed_generation is None and after.phase is status.Phase.PENDING
    finished = before.phase is status.Phase.RUNNING and after.phase is status.Phase.ANALYZING
    return accepted or finished


async def _pass(
    body: kopf.Body,
    document: dict[str, Any],
    subject: reconcile.Subject,
    current: status.ExperimentStatus,
    memo: kopf.Memo,
    now: datetime,
    logger: kopf.Logger,
    listed: Children | None = None,
) -> tuple[reconcile.Decision, Children | None]:
    """Observe, decide and carry out once, from `current`; with the children listed, for the next
    pass to reuse when this one changed nothing (no action, no fault): a second pass then costs no
    LISTs (`listed`: the previous pass's)."""
    observed: reconcile.Observed | None = None
    decision: reconcile.Decision | None = None
    try:
        listed = listed or await _children(body, subject, memo)
        observed, stale = await _observe(body, subject, current, memo, logger, listed)
        decision = reconcile.decide(subject, current, observed, now, memo.settings.timing)
        decision = await actions.carry_out(decision, body, document, subject, memo, stale, observed.job.uid)
    except Exception as exc:
        # Retried every tick, but the phase's deadline still applies (style.md §9 would have kopf
        # retry: a fault that never goes away would then hold the arms' GPUs forever).
        if isinstance(exc, actions.ActionFailed):  # the fault of that action, of the decision so far
            fault, decision = replace(_fault(exc.__cause__ or exc), action=exc.action), exc.decision
        else:
            fault = _fault(exc)
        decision = await _after_fault(
            fault, body, document, subject, current, observed, decision, memo, now, logger
        )
        return decision, None
    return decision, None if decision.actions else listed


# The experiment's Deployments, pods, Jobs and ConfigMaps (metadata only), as listed.
Children = tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]


async def _children(body: kopf.Body, subject: reconcile.Subject, memo: kopf.Memo) -> Children:
    """The experiment's children, one LIST per kind (ConfigMaps without their data)."""
    client: kube.Kube = memo.kube
    namespace, selector = str(body.metadata.namespace), {keys.LABEL_EXPERIMENT: subject.name}
    deployments, pods, jobs, config_maps = await asyncio.gather(
        client.select(kube.DEPLOYMENT, namespace, selector),
        client.select(kube.POD, namespace, selector),
        client.select(kube.JOB, namespace, selector),
        client.select_metadata(kube.CONFIG_MAP, namespace, selector),
    )
    return deployments, pods, jobs, config_maps


async def _degradations(
    client: kube.Kube, namespace: str, pods: Sequence[Mapping[str, Any]]
) -> list[status.Degradation] | None:
    """What the treatment pod's log says vLLM weakened; None when the log cannot be read."""
    pod = observe.placed_pods(pods).get(spec.Arm.TREATMENT)
    if pod is None:
        return None
    text = await client.pod_log(namespace, str(pod["metadata"]["name"]))
    return None if text is None else degradations.scan(text.splitlines())


async def _secrets(
    client: kube.Kube,
    namespace: str,
    s: spec.ExperimentSpec,
    subject: reconcile.Subject,
    memo: kopf.Memo,
    logger: kopf.Logger,
) -> tuple[secretrefs.Seen, ...]:
    """The Secrets the experiment's pods will read, as found in its namespace (the names of their
    keys, never their values); none when the operator may not read Secrets (HTTP 403: the chart's
    `rbac.readSecrets: false`, or a cluster policy), which is said once per experiment generation:
    the pods' CreateContainerConfigError then remains the detection (`failures.py`)."""
    needs = secretrefs.needed(s, memo.settings.render)
    found: dict[str, frozenset[str] | None] = {}
    for need in needs:
        if need.secret in found:
            continue
        try:
            found[need.secret] = await client.secret_keys(namespace, need.secret)
        except Exception as exc:
            refused = kube.refusal(exc)
            if refused is None or refused[0] != 403:
                raise
            unchecked: set[tuple[str, str, int]] = memo.setdefault("secrets_unchecked", set())
            if (namespace, subject.name, subject.generation) not in unchecked:
                unchecked.add((namespace, subject.name, subject.generation))
                logger.info(
                    f"not checking that the Secrets the pods read exist (HTTP 403: {refused[1]}); "
                    "a missing one shows as a pod in CreateContainerConfigError (the chart's "
                    "rbac.readSecrets grants get on secrets)"
                )
            return ()
    return tuple(secretrefs.Seen(need, namespace, found[need.secret]) for need in needs)


async def _observe(
    body: kopf.Body,
    subject: reconcile.Subject,
    current: status.ExperimentStatus,
    memo: kopf.Memo,
    logger: kopf.Logger,
    listed: Children,
) -> tuple[reconcile.Observed, list[tuple[kube.KindRef, str]]]:
    """What the decision needs (from the children `listed`), and the stale children (kind, name)
    to delete should it say so."""
    settings: OperatorSettings = memo.settings
    client: kube.Kube = memo.kube
    name, namespace, generation = subject.name, str(body.metadata.namespace), subject.generation
    deployments, pods, jobs, config_maps = listed
    in_progress = rounds.current(current) if current.observed_generation == generation else None
    observed = observe.observe(
        name,
        generation,
        deployments=deployments,
        pods=pods,
        jobs=jobs,
        config_maps=config_maps,
        round_name=in_progress.name if in_progress is not None else None,
    )
    pending = current.phase is status.Phase.PENDING and current.observed_generation == generation
    if pending and subject.spec is not None and not subject.aborted and not observed.stale_children:
        # Before the arms are created: a missing Secret fails now, not as a stuck pod on a GPU.
        observed = replace(
            observed, secrets=await _secrets(client, namespace, subject.spec, subject, memo, logger)
        )
    deploying = current.phase is status.Phase.DEPLOYING and current.observed_generation == generation
    ready = deploying and subject.spec is not None and all(a.ready for a in observed.arms.values())
    if ready and subject.spec is not None and in_progress is not None:
        # A round's Deploying reads only whether Prometheus scrapes the arms' Ready pods (a restarted
        # arm's new pod, not its old one): where they run, the treatment's log and the pods'
        # fairness were recorded before the stages.
        serving = round_phases.serving_pods(observed, in_progress)
        scraped = await collect.arms_scraped(subject.spec, namespace, name, settings, pods=serving)
        observed = replace(observed, scraped=scraped)
    elif ready and subject.spec is not None:
        hosts = observe.arm_hosts(
            pods,
            await _nodes(client, observe.placed_pods(pods).values(), logger),
            vllm_version=subject.spec.engine.vllm_version,
        )
        scraped = await collect.arms_scraped(subject.spec, namespace, name, settings)
        # Each arm's KV cache (the draft's memory cost), read once Prometheus scrapes them both.
        capacities = await collect.kv_capacities(subject.spec, namespace, name, settings) if scraped else {}
        tokens = kvcache.request_tokens(subject.spec.workload)
        hosts = {arm: kvcache.with_capacity(host, capacities.get(arm), tokens) for arm, host in hosts.items()}
        observed = replace(
            observed,
            scraped=scraped,
            hosts=hosts,
            degradations=await _degradations(client, namespace, pods) if subject.spec.speculates else [],
            arm_pods=observe.arm_pods(pods, hosts),
        )
    analyzing = current.phase is status.Phase.ANALYZING and current.observed_generation == generation
    if analyzing and subject.spec is not None:
        names = manifests.Names(name)
        uids = {str(j["metadata"]["name"]): j["metadata"].get("uid") for j in jobs}
        job_uids = {
            round_name: uids.get(names.load_job_of(round_name))
            for round_name in [None, *(r.name for r in current.rounds)]
        }
        observed = replace(
            observed,
            analysis=await collect.collect(client, body, subject.spec, current, settings, job_uids=job_uids),
        )
    # List items carry no apiVersion/kind: remember which list each came from.
    by_kind = [(kube.DEPLOYMENT, deployments), (kube.JOB, jobs), (kube.CONFIG_MAP, config_maps)]
    stale = [
        (kind, str(o["metadata"]["name"]))
        for kind, items in by_kind
        for o in items
        if o["metadata"]["name"] in observed.stale_children
    ]
    return observed, stale


async def _after_fault(
    fault: reconcile.Fault,
    body: kopf.Body,
    document: dict[str, Any],
    subject: reconcile.Subject,
    current: status.ExperimentStatus,
    observed: reconcile.Observed | None,
    attempted: reconcile.Decision | None,
    memo: kopf.Memo,
    now: datetime,
    logger: kopf.Logger,
) -> reconcile.Decision:
    """The decision after a tick that raised, with its own actions carried out (the cleanup of a
    failure) as far as the API lets them."""
    memo.metrics.reconcile_errors.inc()
    logger.warning(f"{fault.reason}: {fault.message}")
    timing = memo.settings.timing
    decision = reconcile.decide_after_fault(
        subject, current, fault, now, timing, attempted=attempted, observed=observed
    )
    try:
        decision = await actions.carry_out(decision, body, document, subject, memo, [])
    except actions.ActionFailed as again:
        decision = reconcile.decide_after_fault(
            subject, current, _fault(again.__cause__ or again), now, timing, attempted=decision
        )
    return decision


def _fault(exc: BaseException) -> reconcile.Fault:
    """What the status says of an exception: the API server's refusal of a child is the spec's
    (422 Invalid: it fails at once), other errors are retried until the phase's deadline."""
    if isinstance(exc, collect.ReportNameTaken):  # the verdict stands; only its report has nowhere to go
        return reconcile.Fault("ReportNameTaken", str(exc), permanent=True)
    if isinstance(exc, actions.ChildNotOwned):
        # Retried: the children of a deleted experiment of the same name may not be collected yet.
        return reconcile.Fault(
            "ChildConflict",
            f"{exc.child} exists and is not this experiment's (no owner reference to it); delete or "
            "rename it, or give the experiment another name",
        )
    child = exc.child if isinstance(exc, actions.ChildFailed) else None
    cause = exc.__cause__ if isinstance(exc, actions.ChildFailed) and exc.__cause__ is not None else exc
    refused = kube.refusal(cause)
    if refused is not None:
        code, message = refused
        if child is not None and 400 <= code < 500:
            return reconcile.Fault(
                "ChildRejected",
                _short(
                    f"the API server refused {child} (HTTP {code}): {message}; "
                    "fix the spec field it is built from"
                ),
                permanent=code == 422,
            )
        return reconcile.Fault(
            "KubernetesApiError", _short(f"HTTP {code} from the API server{_for(child)}: {message}")
        )
    return reconcile.Fault("ReconcileError", _short(f"{type(cause).__name__}: {cause}{_for(child)}"))


def _for(child: str | None) -> str:
    return f" (for {child})" if child else ""


def _short(message: str, limit: int = 400) -> str:
    """One line of at most `limit` characters (status messages are read in `kubectl get`)."""
    line = " ".join(message.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


async def _nodes(
    client: kube.Kube, pods: Iterable[Mapping[str, Any]], logger: kopf.Logger
) -> dict[str, dict[str, Any] | None]:
    """The Nodes the arms run on, by name; None for one that could not be read."""
    nodes: dict[str, dict[str, Any] | None] = {}
    for name in sorted({str(p["spec"]["nodeName"]) for p in pods}):
        nodes[name] = await client.node(name)
        if nodes[name] is None:
            logger.warning(
                f"cannot read node {name} (the operator needs get on nodes): its facts are not recorded"
            )
    return nodes


@kopf.on.delete(keys.API_GROUP, keys.API_VERSION, keys.PLURAL, optional=True)
async def forget_experiment(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Drop the deleted experiment from the operator's metrics and its tick schedule (children go
    by garbage collection)."""
    memo.metrics.forget(str(body.metadata.namespace), str(body.metadata.name))
    memo.ticks.forget((str(body.metadata.namespace), str(body.metadata.name)))
    unchecked: set[tuple[str, str, int]] = memo.get("secrets_unchecked") or set()
    for key in [k for k in unchecked if k[:2] == (str(body.metadata.namespace), str(body.metadata.name))]:
        unchecked.discard(key)


def _subject(
    name: str, generation: int, document: dict[str, Any], settings: OperatorSettings
) -> reconcile.Subject:
    problems = [*validation.check_name(name), *validation.check_spec(document.get("spec"))]
    if problems:
        return reconcile.Subject(name, generation, None, [str(p) for p in problems])
    parsed = spec.ExperimentSpec.model_validate(document["spec"])
    local_only = validation.check_operator_support(parsed)
    if local_only:  # a trace file path is never silently dropped: the run fails InvalidSpec, saying why
        return reconcile.Subject(name, generation, None, [str(p) for p in local_only])
    too_large = results.check_size(parsed, settings.results_limits)
    if too_large is not None:  # the operator's own limit: `specdecode validate` cannot know it
        return reconcile.Subject(name, generation, None, [too_large])
    return reconcile.Subject(name, generation, parsed)


def _document(body: kopf.Body) -> dict[str, Any]:
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {"name": body.metadata.name, "namespace": body.metadata.namespace},
        "spec": _plain(body.get("spec") or {}),
    }


def _plain(value: Any) -> Any:
    """kopf's read-only views -> plain dicts and lists."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _status_fields(
    body: kopf.Body, old: status.ExperimentStatus, new: status.ExperimentStatus
) -> dict[str, Any]:
    """The status merge patch from `old` to `new`: only the fields that changed (a removed one: None)."""
    before, after = old.wire(), new.wire()
    fields = {
        key: after.get(key) for key in before.keys() | after.keys() if before.get(key) != after.get(key)
    }
    if "phase" not in (body.get("status") or {}):
        # Pending is the default, so no field "changed": write it, or `kubectl get` shows no phase.
        fields["phase"] = new.phase.value
    return fields
