"""Where the arms run is part of the measurement (issue 22). Pure.

On real H200 machines the same control measured 4.63, 4.66 and 4.65 ms TPOT on three hosts, and the
same treatment (a 2-layer draft) 4.08, 3.50 and 2.92 ms: small drafts make many short, launch-bound
passes, so the host weighs on the treatment far more than on the control. Every pair of requests
shares the arms' placement, so the paired interval cannot see a placement effect: when the arms run
on different hosts, a faster or slower host is measured as a speed-up or a slow-down.

This module compares the arms' hosts (`status.Host`) and words the warning. The host facts come
from the Kubernetes Nodes (`controller/observe.host`) or from this machine (`local/hosts.py`).

Compared: every field of `status.Host` but the GPU UUIDs (each arm has its own GPUs, so they always
differ). A fact known for one arm only is not a difference: it is unknown, not different.
"""

from __future__ import annotations

from typing import Any

from pydantic.alias_generators import to_camel

from specdecode.experiment import releases, spec, status

#: The `status.Host` fields compared between the arms: facts of the host, not of the arm's engine (GPU
#: UUIDs differ whenever the arms have their own GPUs; the KV-cache capacity differs by design: the draft
#: takes a share of the treatment's).
NOT_COMPARED = frozenset({"gpu_uuids", "kv_cache_tokens", "max_concurrency"})
COMPARED: tuple[str, ...] = tuple(name for name in status.Host.model_fields if name not in NOT_COMPARED)


def differences(hosts: status.ArmHosts) -> list[str]:
    """The camelCase names of the host facts in which the arms differ (both known and unequal)."""
    control, treatment = hosts.control, hosts.treatment
    if control is None or treatment is None:
        return []
    return [
        to_camel(name)
        for name in COMPARED
        if (a := getattr(control, name)) is not None
        and (b := getattr(treatment, name)) is not None
        and a != b
    ]


def environment(s: spec.ExperimentSpec, release: releases.Release, **observed: Any) -> status.Environment:
    """What the spec says was measured (image, draft, simulator, the release's rules), plus `observed`
    fields (e.g. `image_digest`, `nodes`); the one builder for the cluster and `run --local`."""
    sim = s.engine.simulator
    fields: dict[str, Any] = {
        "image": None if sim else s.engine.image,
        "model_revision": s.model_revision or None,
        "draft_model": s.speculative.model or s.speculative.method.value,
        "simulator": {"profile": sim.profile, **sim.overrides()} if sim else None,
        "vllm_rules": release.describe(),
        "prefix_caching": s.prefix_caching or None,
    }
    return status.Environment(**{**fields, **observed})


def with_hosts(environment: status.Environment, hosts: status.ArmHosts) -> status.Environment:
    """The environment with each arm's host, the differences, and the nodes and GPU product they share."""
    known = [h for h in (hosts.control, hosts.treatment) if h is not None]
    products = {h.gpu_product for h in known if h.gpu_product}
    return environment.model_copy(
        update={
            "arms": hosts,
            "host_differences": differences(hosts),
            "nodes": sorted({*environment.nodes, *(h.node for h in known if h.node)}),
            "gpu_product": environment.gpu_product or (products.pop() if len(products) == 1 else None),
            "vllm_version": environment.vllm_version
            or next((h.vllm_version for h in known if h.vllm_version), None),
        }
    )


def described(environment: status.Environment) -> str | None:
    """How the arms' hosts differ, fact by fact ("node: a (control) vs b (treatment)"), or None."""
    hosts = environment.arms
    if not environment.host_differences or hosts is None or hosts.control is None or hosts.treatment is None:
        return None
    control, treatment = hosts.control.wire(), hosts.treatment.wire()
    return "; ".join(
        f"{key}: {control.get(key)} (control) vs {treatment.get(key)} (treatment)"
        for key in environment.host_differences
    )


def warning(environment: status.Environment) -> str | None:
    """One line saying how the arms' hosts differ and what it means, or None when they do not."""
    facts = described(environment)
    if facts is None:
        return None
    return (
        f"the arms ran on different hosts ({facts}): a faster or slower host is measured as a speed-up "
        "or a slow-down, which the paired interval cannot see; without a crossover that separates it "
        f"no pass is promoted ({status.ReasonCode.PLACEMENT_UNSEPARATED}): co-locate the arms "
        "(spec.placement.colocate: Required) or run the crossover (spec.analysis.crossover: IfApart)"
    )


def qualify(message: str, environment: status.Environment | None) -> str:
    """A verdict's message, with a note when the arms ran on different hosts (so the flag stays in
    `status.message`, the line pipelines print)."""
    if environment is None or not environment.host_differences:
        return message
    differ = ", ".join(environment.host_differences)
    return f"{message}; the arms ran on different hosts (they differ in {differ}): the speed-up may partly be the placement"
