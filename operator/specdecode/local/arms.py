"""What `run --local` knows of an arm: its state as the core sees a Deployment, its host (this machine's facts, or its URL's host,
with the engine's version, a simulator's speed factor and the KV-cache capacity it reports), its
placement in words for the crossover, and what its vLLM logged when it weakened speculation."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from urllib.parse import urlsplit

import httpx

from specdecode.experiment import degradations, kvcache, placement, reconcile, releases, spec, status
from specdecode.local import engines, hosts

_LOOPBACK = {"localhost", "127.0.0.1", "::1"}


def arm_host(
    client: httpx.Client, arm: engines.Arm, gpus: str | None, *, request_tokens: int | None = None
) -> status.Host:
    """An arm's host: this machine when it runs here (started here, or on loopback), else its URL's host.

    The engine's version comes from `/version`; a simulator's speed factor from `/sim/host`; the KV-cache
    capacity from `/metrics` (`vllm:cache_config_info`), with the requests of `request_tokens` it holds.
    """
    here = arm.process is not None or (urlsplit(arm.url).hostname or "") in _LOOPBACK
    host = hosts.this_host(gpus) if here else status.Host(node=urlsplit(arm.url).hostname)
    facts: dict[str, object] = {}
    version = _json(client, f"{arm.url}/version")
    if isinstance(version, dict) and isinstance(version.get("version"), str):
        facts["vllm_version"] = version["version"]
    sim = _json(client, f"{arm.url}/sim/host")
    speed = sim.get("speedFactor") if isinstance(sim, dict) else None
    if isinstance(speed, int | float) and not isinstance(speed, bool) and math.isfinite(speed) and speed > 0:
        facts["speed_factor"] = float(speed)
    with contextlib.suppress(httpx.HTTPError):
        answer = client.get(f"{arm.url}/metrics")
        capacity = kvcache.from_metrics(answer.text) if answer.status_code == 200 else None
        host = kvcache.with_capacity(host, capacity, request_tokens)
    return host.model_copy(update=facts)


def _json(client: httpx.Client, url: str) -> object:
    """The JSON of a 200 answer at `url`; None for any other answer, none, or one that is not JSON:
    these facts are best-effort (a server given by URL need not be vLLM's, nor answer them)."""
    try:
        answer = client.get(url)
        return answer.json() if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def placement_of(host: status.Host | None, gpus: str) -> str:
    """One arm's placement in words: its host, its GPUs and (simulated) the host's speed factor."""
    where = f"{host.node} " if host is not None and host.node else ""
    speed = (
        f" (speedFactor {host.speed_factor:g})" if host is not None and host.speed_factor is not None else ""
    )
    return f"{where}GPUs {gpus}{speed}"


def weakened(arms: engines.Engines) -> list[status.Degradation]:
    """What the treatment's vLLM logged when it weakened speculation (its log file; none for given URLs)."""
    treatment = arms.arms.get(spec.Arm.TREATMENT)
    if treatment is None or treatment.log is None or not treatment.log.exists():
        return []
    with treatment.log.open(errors="replace") as lines:
        return degradations.scan(lines)


def environment_of(
    arms: engines.Engines,
    known: dict[spec.Arm, status.Host],
    gpus: Mapping[spec.Arm, str],
    s: spec.ExperimentSpec,
    release: releases.Release,
) -> status.Environment:
    """What was measured and where: the serving arms' hosts (each asked once, into `known`)."""
    with httpx.Client(timeout=2.0) as client:
        for arm, state in arms.arms.items():
            if arm not in known and state.exit_code() is None:
                known[arm] = arm_host(
                    client, state, gpus.get(arm), request_tokens=kvcache.request_tokens(s.workload)
                )
    # No image runs here: the engine is the command that started the arm (none for --control-url).
    control = arms.arms.get(spec.Arm.CONTROL)
    environment = placement.environment(
        s,
        release,
        image=None,
        engine_command=" ".join(control.argv) if control is not None and control.argv else None,
    )
    both = status.ArmHosts(control=known.get(spec.Arm.CONTROL), treatment=known.get(spec.Arm.TREATMENT))
    return placement.with_hosts(environment, both)


def arm_state(
    arm: spec.Arm, state: engines.Arm | None, *, in_turn: bool, round_name: str | None
) -> reconcile.ArmState:
    """An arm as the core sees a Deployment: one pod, Ready once it answered `/health`; `round_name`:
    the round its process was started again for."""
    if state is None or state.stopped:
        if not in_turn:
            return reconcile.ArmState()
        # Each arm starts in its turn during the load: nothing to wait for before it.
        return reconcile.ArmState(
            exists=True, ready_replicas=1, pods=(reconcile.PodState(arm.value, "Running", ready=True),)
        )
    name = f"{arm.value}-{state.process.pid}" if state.process is not None else state.url
    code = state.exit_code()
    if code is not None:
        died = reconcile.PodState(name, "Failed", last_terminated_reason=f"exit {code}", last_exit_code=code)
        return reconcile.ArmState(exists=True, pods=(died,))
    serving = reconcile.PodState(name, "Running", ready=True, round=round_name)
    return reconcile.ArmState(exists=True, ready_replicas=1, pods=(serving,))
