"""The kopf handlers: one startup configuration and one timer that reconciles each experiment.

The timer is the only writer of `status.phase` (style.md §3): observe the children -> call the pure
`reconcile.decide` -> apply its actions -> patch the changed status fields -> post Events for phase
changes and the verdict. It stores no kopf progress: all state is `.status` and the children, so a
restarted operator resumes, and creating children is idempotent (deterministic names).

Spec changes: a new `metadata.generation` restarts the experiment (children of the old generation are
deleted, status is reset). Outcomes go to status; faults (API errors, Prometheus down beyond what the
decision function tolerates) propagate so kopf retries the tick.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import kopf

from specdecode.controller import collect, kube, observe
from specdecode.controller.metrics import OperatorMetrics
from specdecode.controller.settings import OperatorSettings
from specdecode.experiment import manifests, reconcile, spec, status, validation

SETTINGS = OperatorSettings.from_env()


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """All kopf settings, each non-default with its reason."""
    # Our own finalizer and annotation names, so nothing collides with other kopf operators.
    settings.persistence.finalizer = f"{spec.API_GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=spec.API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=spec.API_GROUP, key="last-handled-configuration"
    )
    # Events only for what we post explicitly (phase changes, verdicts), not for every log line.
    settings.posting.level = logging.WARNING
    # Re-establish watches well before intermediaries cut idle connections.
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.networking.request_timeout = 60
    memo.settings = SETTINGS
    memo.kube = kube.Kube.from_environment()
    memo.metrics = OperatorMetrics()
    if memo.get("metrics_port"):
        memo.metrics.serve(int(memo.metrics_port))


@kopf.on.cleanup()
async def close_clients(memo: kopf.Memo, **_: Any) -> None:
    """Release the API client's connections."""
    if memo.get("kube") is not None:
        memo.kube.close()


def _needs_reconcile(body: kopf.Body, **_: Any) -> bool:
    current = status.ExperimentStatus.model_validate(dict(body.get("status") or {}))
    return reconcile.needs_reconcile(current, int(body.metadata.get("generation") or 1))


# A failing tick (API error, ...) is retried after a few intervals, not kopf's default minute.
@kopf.timer(
    spec.API_GROUP,
    spec.API_VERSION,
    spec.PLURAL,
    interval=SETTINGS.interval,
    backoff=max(5.0, 3 * SETTINGS.interval),
    when=_needs_reconcile,
)
async def reconcile_experiment(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Observe, decide, act, persist (a failing tick is counted, then retried by kopf)."""
    try:
        await _reconcile(body, patch, memo, logger)
    except Exception:
        memo.metrics.reconcile_errors.inc()
        raise


async def _reconcile(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger, *, now: datetime | None = None
) -> None:
    settings: OperatorSettings = memo.settings
    client: kube.Kube = memo.kube
    name, namespace = str(body.metadata.name), str(body.metadata.namespace)
    generation = int(body.metadata.get("generation") or 1)
    document = _document(body)
    current = status.ExperimentStatus.model_validate(dict(body.get("status") or {}))
    subject = _subject(name, generation, document)

    selector = {manifests.LABEL_EXPERIMENT: name}
    deployments, pods, jobs, config_maps = await asyncio.gather(
        client.select(kube.DEPLOYMENT, namespace, selector),
        client.select(kube.POD, namespace, selector),
        client.select(kube.JOB, namespace, selector),
        client.select_metadata(kube.CONFIG_MAP, namespace, selector),
    )
    observed = observe.observe(
        name, generation, deployments=deployments, pods=pods, jobs=jobs, config_maps=config_maps
    )
    deploying = current.phase is status.Phase.DEPLOYING and current.observed_generation == generation
    if deploying and subject.spec is not None and all(a.ready for a in observed.arms.values()):
        observed = replace(
            observed, scraped=await collect.arms_scraped(subject.spec, namespace, name, settings)
        )
    analyzing = current.phase is status.Phase.ANALYZING and current.observed_generation == generation
    if analyzing and subject.spec is not None:
        observed = replace(
            observed,
            analysis=await collect.collect(
                client, body, subject.spec, current, settings, job_uid=observed.job.uid
            ),
        )

    now = now or datetime.now(UTC)
    decision = reconcile.decide(subject, current, observed, now, settings.timing)
    running = current.phase is status.Phase.RUNNING and current.observed_generation == generation
    if running and decision.status.phase is status.Phase.FAILED and subject.spec is not None:
        # Measurements already taken are never lost: the stages finished before the failure.
        kept = await collect.salvage(
            client, body, subject.spec, decision.status, settings, job_uid=observed.job.uid
        )
        decision = replace(decision, status=kept)
    # List items carry no apiVersion/kind: remember which list each came from.
    listed = [(kube.DEPLOYMENT, deployments), (kube.JOB, jobs), (kube.CONFIG_MAP, config_maps)]
    stale = [
        (kind, str(o["metadata"]["name"]))
        for kind, items in listed
        for o in items
        if o["metadata"]["name"] in observed.stale_children
    ]
    for action in decision.actions:
        await _apply(action, client, body, document, subject, settings, stale)
    _patch_status(patch, current, decision.status)
    for event in decision.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
        logger.info(f"{event.reason}: {event.message}")
    memo.metrics.observe(namespace, name, decision.status)


@kopf.on.delete(spec.API_GROUP, spec.API_VERSION, spec.PLURAL, optional=True)
async def forget_experiment(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Drop the deleted experiment from the operator's metrics (children go by garbage collection)."""
    memo.metrics.forget(str(body.metadata.namespace), str(body.metadata.name))


async def _apply(
    action: reconcile.Action,
    client: kube.Kube,
    body: kopf.Body,
    document: dict[str, Any],
    subject: reconcile.Subject,
    settings: OperatorSettings,
    stale: list[tuple[kube.KindRef, str]],
) -> None:
    namespace = str(body.metadata.namespace)
    name = subject.name
    if action is reconcile.Action.DELETE_STALE:
        for kind, stale_name in stale:
            await client.delete(kind, namespace, stale_name)
        return
    if action is reconcile.Action.CLEANUP_ARMS:
        for arm in spec.Arm:
            await client.delete(kube.DEPLOYMENT, namespace, manifests.Names(name).arm(arm))
        return
    assert subject.spec is not None
    if action is reconcile.Action.CREATE_ARMS:
        children = manifests.build_all(
            name, document, subject.spec, settings.render, generation=subject.generation
        )
    else:
        children = [
            manifests.build_load_job(
                name,
                subject.spec,
                settings.render,
                owner_uid=str(body.metadata.uid),
                generation=subject.generation,
            )
        ]
    for child in children:
        child["metadata"].setdefault("annotations", {})[observe.GENERATION_ANNOTATION] = str(
            subject.generation
        )
        kopf.adopt(child, owner=body)
        await client.create_if_absent(child, namespace)


def _subject(name: str, generation: int, document: dict[str, Any]) -> reconcile.Subject:
    problems = [*validation.check_name(name), *validation.check_spec(document.get("spec"))]
    if problems:
        return reconcile.Subject(name, generation, None, [str(p) for p in problems])
    return reconcile.Subject(name, generation, spec.ExperimentSpec.model_validate(document["spec"]))


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


def _patch_status(patch: kopf.Patch, old: status.ExperimentStatus, new: status.ExperimentStatus) -> None:
    """Write only the fields that changed; a removed field is patched to null (merge-patch delete)."""
    before, after = old.wire(), new.wire()
    for key in before.keys() | after.keys():
        if before.get(key) != after.get(key):
            patch.status[key] = after.get(key)
