"""The Secrets an experiment's pods will read, and what to say when one is not there. Pure.

A Secret (or a key of it) that a pod reads but that does not exist leaves the pod in
CreateContainerConfigError (`failures.py`): for the arms, only once both were scheduled on GPUs; for
the load pod, only once both arms were deployed and warmed up. So before the arms are created (the
step out of Pending) the shell reads each Secret that `needed` names in the experiment's namespace
(the names of its keys, never their values) and `problem` decides: one missing fails the experiment
at once, reason `SecretMissing`, with nothing deployed (issue 16). Where the operator may not read
Secrets (the chart's `rbac.readSecrets: false`, or a cluster policy) nothing is checked here and the
pods' CreateContainerConfigError remains the detection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specdecode.experiment import children, spec

REASON = "SecretMissing"
"""status.reason of an experiment failed by a missing Secret or key."""

#: the keys the load Job reads from the S3 results store's Secret (`load_manifests.py`)
S3_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


@dataclass(frozen=True)
class Need:
    """A Secret the experiment's pods read, and the field it comes from."""

    field: str
    """Where it is named (a spec field, or the operator's chart value), for the message."""
    secret: str
    keys: tuple[str, ...]
    readers: str
    """Which pods read it."""


@dataclass(frozen=True)
class Seen:
    """A `Need` as the shell found it in the experiment's namespace."""

    need: Need
    namespace: str
    keys: frozenset[str] | None
    """The names of the Secret's keys (`data` and `stringData`); None: there is no such Secret."""


def needed(s: spec.ExperimentSpec, settings: children.Settings) -> list[Need]:
    """The Secrets the arms and the load Job will read, as the manifest builders reference them."""
    engine = s.engine
    found = []
    if engine.api_key_secret is not None:
        ref = engine.api_key_secret
        found.append(Need("spec.engine.apiKeySecret", ref.name, (ref.key,), "both arms and the load Job"))
    if engine.hf_token_secret is not None:
        ref = engine.hf_token_secret
        found.append(Need("spec.engine.hfTokenSecret", ref.name, (ref.key,), "both arms"))
    if settings.results_env and settings.results_secret:
        found.append(
            Need(
                "the operator's S3 results store (chart value resultsStore.s3.credentialsSecret)",
                settings.results_secret,
                S3_KEYS,
                "every load Job in the experiment's namespace",
            )
        )
    return found


def problem(seen: Sequence[Seen]) -> str | None:
    """Why the experiment cannot start, naming each Secret or key missing and how to add it; None:
    every Secret needed is there with its keys (or none was checked)."""
    problems = [p for p in (_problem(s) for s in seen) if p is not None]
    return "; ".join(problems) or None


def _problem(seen: Seen) -> str | None:
    need, namespace = seen.need, seen.namespace
    literals = " ".join(f"--from-literal={key}=..." for key in need.keys)
    # A spec field may name another Secret or key; the results store's are the chart's to change.
    named = need.field.startswith("spec.")
    if seen.keys is None:
        return (
            f"{need.field} names Secret {need.secret}, which does not exist in namespace {namespace} "
            f"({need.readers} read it): create it with `kubectl create secret generic {need.secret} "
            f"-n {namespace} {literals}`" + (", or name an existing Secret" if named else "")
        )
    absent = [key for key in need.keys if key not in seen.keys]
    if not absent:
        return None
    has = ", ".join(sorted(seen.keys)) or "none"
    return (
        f"{need.field}: Secret {need.secret} in namespace {namespace} has no key {', '.join(absent)} "
        f"({need.readers} read it; its keys: {has}): add it with `kubectl edit secret {need.secret} "
        f"-n {namespace}`" + (", or name a key it has" if named else "")
    )
