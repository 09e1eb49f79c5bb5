"""Carrying out a decision's actions on the experiment's children, in order (`carry_out`): create
them if absent once adopted (`kopf.adopt`: deleting the experiment deletes them), re-render a
round's arms, delete what the decision says; read what a failed load finished for the core to keep,
and store the report it decides on (`collect.py` renders and stores it).

Exceptions: `ActionFailed` (an action raised; the cause is chained, the handler makes it a
`reconcile.Fault` naming the action), `ChildFailed` (an API call on one child raised) and its kind
`ChildNotOwned` (the child's name is taken by an object the experiment does not own).
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any

import kopf

from specdecode.controller import collect, kube, observe
from specdecode.controller.settings import OperatorSettings
from specdecode.experiment import keys, manifests, reconcile, rounds, spec, status


async def carry_out(
    decision: reconcile.Decision,
    body: kopf.Body,
    document: dict[str, Any],
    subject: reconcile.Subject,
    memo: kopf.Memo,
    stale: list[tuple[kube.KindRef, str]],
    job_uid: str | None = None,
) -> reconcile.Decision:
    """The decision's actions, in order; returns it as carried out: what the load finished, once
    read (KEEP_FINISHED_STAGES, from load Job `job_uid`), is folded in by the core, with the report
    to store. An action that raises is reraised as `ActionFailed`, naming it."""
    done: list[reconcile.Action] = []
    pending = list(decision.actions)
    while pending:
        action = pending.pop(0)
        try:
            if action is reconcile.Action.KEEP_FINISHED_STAGES and subject.spec is not None:
                found = await collect.finished_stages(
                    memo.kube, body, subject.spec, decision.status, memo.settings, job_uid=job_uid
                )
                total = len(subject.spec.workload.stages)
                decision = reconcile.keep_finished(decision, found, total=total)
                pending = [a for a in decision.actions if a not in done]
            elif action is reconcile.Action.STORE_REPORT and decision.report is not None:
                await collect.put_report(memo.kube, decision.report, body["metadata"])
            else:
                await apply(
                    action, memo.kube, body, document, subject, memo.settings, stale, decision.status.rounds
                )
        except Exception as exc:
            raise ActionFailed(action, decision) from exc
        done.append(action)
    return decision


class ActionFailed(Exception):
    """A decision's action raised (the cause); names it, with the decision as carried out so far."""

    def __init__(self, action: reconcile.Action, decision: reconcile.Decision) -> None:
        super().__init__(action.value)
        self.action = action
        self.decision = decision


class ChildFailed(Exception):
    """Creating or deleting one child raised (the cause); names the child for the status message."""

    def __init__(self, child: str) -> None:
        super().__init__(child)
        self.child = child


class ChildNotOwned(ChildFailed):
    """A child's name is taken by an object this experiment does not own."""


async def apply(
    action: reconcile.Action,
    client: kube.Kube,
    body: kopf.Body,
    document: dict[str, Any],
    subject: reconcile.Subject,
    settings: OperatorSettings,
    stale: list[tuple[kube.KindRef, str]],
    rounds_run: Sequence[status.Round] = (),
) -> None:
    """One action on the children (`rounds_run`: the new status's `rounds`, which a round's children
    are built from); `carry_out` takes KEEP_FINISHED_STAGES and STORE_REPORT itself."""
    namespace = str(body.metadata.namespace)
    name = subject.name
    in_progress = rounds.in_progress(rounds_run)
    if await _remove(action, client, namespace, name, stale, rounds_run[-1] if rounds_run else None):
        return
    if subject.spec is None:  # decide() asks for children only of a spec that validated
        raise kopf.PermanentError(f"{action.value}: the experiment has no valid spec to render")
    if action is reconcile.Action.CREATE_ARMS and in_progress is not None:
        await _round_arms(client, body, subject, subject.spec, settings, in_progress)
        return
    if action is reconcile.Action.CREATE_ARMS:
        children = manifests.build_all(
            name, document, subject.spec, settings.render, generation=subject.generation
        )
    else:
        round_name = in_progress.name if in_progress is not None else None
        children = [
            manifests.build_load_job(
                name,
                subject.spec,
                settings.render,
                owner_uid=str(body.metadata.uid),
                generation=subject.generation,
                round_name=round_name,
                salt=manifests.load_salt(
                    subject.spec.engine.seed, str(body.metadata.uid), subject.generation
                ),
            )
        ]
        if in_progress is not None:  # the round's own spec: its requests, its schedule
            round_spec = rounds.load_spec(subject.spec, in_progress)
            round_document = {
                **document,
                "spec": round_spec.model_dump(mode="json", by_alias=True, exclude_none=True),
            }
            children.insert(
                0,
                manifests.build_spec_config_map(
                    name, round_document, subject.generation, round_name=round_name
                ),
            )
    for child in children:
        built_for = {keys.GENERATION_ANNOTATION: str(subject.generation)}
        child["metadata"].setdefault("annotations", {}).update(built_for)
        if child["kind"] == "Deployment":  # and its pods: the old generation's may still be terminating
            child["spec"]["template"]["metadata"].setdefault("annotations", {}).update(built_for)
        kopf.adopt(child, owner=body)
        what = f"{child['kind']} {child['metadata']['name']}"
        existing = await _child(client.create_if_absent(child, namespace), what)
        if not observe.owned_by(existing, str(body.metadata.uid)):
            # Not adopted: a foreign Service, Role or spec ConfigMap would be used as ours.
            raise ChildNotOwned(what)


async def _remove(
    action: reconcile.Action,
    client: kube.Kube,
    namespace: str,
    name: str,
    stale: list[tuple[kube.KindRef, str]],
    last: status.Round | None,
) -> bool:
    """The actions that delete or scale down children (`last`: the last round run, whose load Job
    DELETE_LOAD deletes); False: `action` is not one of them."""
    names = manifests.Names(name)
    if action is reconcile.Action.DELETE_STALE:
        for kind, stale_name in stale:
            await _child(client.delete(kind, namespace, stale_name), f"{kind[1]} {stale_name}")
    elif action is reconcile.Action.RELEASE_ARMS:
        budget = names.disruption_budget
        await _child(
            client.delete(kube.DISRUPTION_BUDGET, namespace, budget), f"PodDisruptionBudget {budget}"
        )
    elif action is reconcile.Action.CLEANUP_ARMS:
        for arm in spec.Arm:
            deployment = names.arm(arm)
            await _child(client.delete(kube.DEPLOYMENT, namespace, deployment), f"Deployment {deployment}")
    elif action is reconcile.Action.SCALE_DOWN_ARMS:
        for arm in spec.Arm:
            await _scale_to_zero(client, namespace, names.arm(arm))
    elif action is reconcile.Action.DELETE_LOAD:
        job = names.load_job_of(last.name if last is not None else None)
        await _child(client.delete(kube.JOB, namespace, job), f"Job {job}")
    else:
        return False
    return True


async def _round_arms(
    client: kube.Kube,
    body: kopf.Body,
    subject: reconcile.Subject,
    experiment: spec.ExperimentSpec,
    settings: OperatorSettings,
    round_: status.Round,
) -> None:
    """The arms the round starts again, re-rendered for it (`rounds.arm_spec`, pinned to its nodes):
    each Deployment's pod template is replaced once (Recreate: the old pod goes, then the new one
    comes); a Deployment already rendered for the round is left alone."""
    namespace = str(body.metadata.namespace)
    rendered = rounds.arm_spec(experiment, round_)
    for arm in rounds.started(round_):
        wanted = manifests.build_deployment(
            subject.name,
            rendered,
            arm,
            settings.render,
            round_name=round_.name,
            node=rounds.node(round_, arm),
        )
        what = f"Deployment {wanted['metadata']['name']}"
        existing = await _child(client.get(kube.DEPLOYMENT, namespace, wanted["metadata"]["name"]), what)
        if existing is None:
            raise ChildFailed(what) from RuntimeError("the arm's Deployment is gone")
        template = existing["spec"]["template"]
        if (template.get("metadata", {}).get("annotations") or {}).get(keys.ROUND_ANNOTATION) == round_.name:
            continue
        built_for = {keys.GENERATION_ANNOTATION: str(subject.generation)}
        wanted["spec"]["template"]["metadata"].setdefault("annotations", {}).update(built_for)
        replaced = {
            **existing,
            "metadata": {
                **existing["metadata"],
                "annotations": {
                    **(existing["metadata"].get("annotations") or {}),
                    **wanted["metadata"]["annotations"],
                },
            },
            "spec": {**existing["spec"], "template": wanted["spec"]["template"]},
        }
        # A conflict (someone wrote it since it was read) is retried on the next tick.
        await _child(client.replace(replaced, namespace), what)


async def _scale_to_zero(client: kube.Kube, namespace: str, deployment: str, attempts: int = 3) -> None:
    """The Deployment at 0 replicas (its pods go, their GPUs with them); absent or already there: as
    is. A write conflict (its controller updated it since it was read) is read and written again;
    one that persists raises (the cleanup is then retried on the next tick)."""
    what = f"Deployment {deployment}"
    for _ in range(attempts):
        existing = await _child(client.get(kube.DEPLOYMENT, namespace, deployment), what)
        if existing is None or existing["spec"].get("replicas") == 0:
            return
        scaled = {**existing, "spec": {**existing["spec"], "replicas": 0}}
        if await _child(client.replace(scaled, namespace), what) is not None:
            return
    raise ChildFailed(what) from RuntimeError(f"still written by others after {attempts} attempts")


async def _child(call: Awaitable[Any], child: str) -> Any:
    """Await an API call on one child; its failure names the child (`ChildFailed`)."""
    try:
        return await call
    except Exception as exc:
        raise ChildFailed(child) from exc
