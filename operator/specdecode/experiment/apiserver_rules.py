"""The API server's own rules for the fields the arms' objects are built from. Pure.

The CRD's schema lets through what the API server refuses only when it validates the child built
from it (a Deployment, the spec ConfigMap): a label value with a space, an environment variable
named `A=B`, a quantity `2 GB`. Found there, that is a `ChildRejected` after the first arm exists;
found here, it is exit 2 from `specdecode validate` and `InvalidSpec` from the operator before
anything is deployed. Both call `check` (through `validation.semantic_problems`), so each rule is
written once. The rules are Kubernetes' (apimachinery `validation.IsQualifiedName`,
`IsValidLabelValue`, `resource.ParseQuantity`, core `ValidateEnv`); the size limit is the
ConfigMap's 1 MiB.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

import yaml

from specdecode.experiment import spec
from specdecode.experiment.problems import Problem

_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(rf"^({_NAME})?$")
_NAME_PART = re.compile(rf"^{_NAME}$")
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")
_ENV_NAME = re.compile(r"^[ -<>-~]+$")  # printable ASCII but '=' (RelaxedEnvironmentVariableValidation)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_NATIVE = {"cpu", "memory", "ephemeral-storage", "storage"}

CONFIG_MAP_BYTES = 1024 * 1024
"""What a ConfigMap holds at most (its data, all keys); the spec ConfigMap holds the experiment."""
_MARGIN = 4096
"""Room for what the operator adds to the document in the spec ConfigMap (its name, the generation)."""


def check(s: spec.ExperimentSpec) -> list[Problem]:
    """What the API server would refuse of the children built from `s`."""
    engine = s.engine
    return [
        *_labels("spec.engine.nodeSelector", engine.node_selector),
        *_tolerations(engine.tolerations),
        *_env(engine.env),
        *_resources(engine.resources),
        *_spec_size(s.model_dump(mode="json", by_alias=True, exclude_unset=True)),
    ]


def qualified_name_problem(key: str) -> str | None:
    """Why `key` is not a Kubernetes qualified name (a label key, a resource name), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"the prefix {prefix!r} must be a DNS subdomain (lower-case letters, digits, '-' and '.')"
    if not name or len(name) > 63 or not _NAME_PART.match(name):
        return (
            f"{name!r} must be 1-63 characters of letters, digits, '-', '_' or '.', "
            "beginning and ending with a letter or digit"
        )
    return None


def label_value_problem(value: str) -> str | None:
    """Why `value` is not a valid label value, or None."""
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        return (
            f"label value {value!r} must be at most 63 characters of letters, digits, '-', '_' or '.', "
            "beginning and ending with a letter or digit (no spaces)"
        )
    return None


def _labels(path: str, labels: Mapping[str, str]) -> list[Problem]:
    problems = []
    for key, value in labels.items():
        wrong = qualified_name_problem(key)
        if wrong is not None:
            problems.append(Problem(f"{path}[{key!r}]", f"key: {wrong}"))
        wrong = label_value_problem(value)
        if wrong is not None:
            problems.append(Problem(f"{path}[{key!r}]", wrong))
    return problems


def _tolerations(tolerations: Iterable[spec.Toleration]) -> list[Problem]:
    problems = []
    for i, toleration in enumerate(tolerations):
        path = f"spec.engine.tolerations[{i}]"
        if toleration.key:
            wrong = qualified_name_problem(toleration.key)
            if wrong is not None:
                problems.append(Problem(f"{path}.key", wrong))
        if toleration.operator == "Exists" and toleration.value:
            problems.append(Problem(f"{path}.value", "must be empty with operator Exists"))
        if toleration.value:
            wrong = label_value_problem(toleration.value)
            if wrong is not None:
                problems.append(Problem(f"{path}.value", wrong))
        if not toleration.key and toleration.operator != "Exists":
            problems.append(Problem(f"{path}.operator", "must be Exists when the key is empty"))
        if toleration.toleration_seconds is not None and toleration.effect != "NoExecute":
            problems.append(Problem(f"{path}.tolerationSeconds", "is only allowed with effect NoExecute"))
    return problems


def _env(env: Iterable[spec.EnvVar]) -> list[Problem]:
    problems = []
    for i, var in enumerate(env):
        if not _ENV_NAME.match(var.name):
            problems.append(
                Problem(
                    f"spec.engine.env[{i}].name",
                    f"{var.name!r} must be printable ASCII characters other than '=' (e.g. MY_VAR)",
                )
            )
        if var.value is not None and var.value_from is not None:
            problems.append(Problem(f"spec.engine.env[{i}]", "give value or valueFrom, not both"))
    return problems


def quantity(value: int | str) -> Decimal | None:
    """A Kubernetes quantity's value, or None when it is not one (`2 GB`, `1.5.0`, `-1`)."""
    if isinstance(value, int):
        return Decimal(value) if value >= 0 else None
    match = _QUANTITY.match(value)
    if match is None or value.startswith("-"):
        return None
    suffix = match.group(3) or ""
    number = Decimal(value[: len(value) - len(suffix)] or "0")
    try:
        if suffix in _BINARY:
            return number * _BINARY[suffix]
        if suffix in _DECIMAL:
            return number.scaleb(_DECIMAL[suffix])
        return number.scaleb(int(suffix[1:]))
    except (InvalidOperation, OverflowError):
        return None


def _resources(resources: spec.Resources) -> list[Problem]:
    problems: list[Problem] = []
    parsed: dict[str, dict[str, Decimal]] = {"limits": {}, "requests": {}}
    for kind, values in (("limits", resources.limits), ("requests", resources.requests)):
        for name, value in values.items():
            path = f"spec.engine.resources.{kind}[{name!r}]"
            wrong = qualified_name_problem(name)
            if wrong is not None:
                problems.append(Problem(path, f"resource name: {wrong}"))
                continue
            amount = quantity(value)
            if amount is None:
                problems.append(
                    Problem(path, f"{value!r} is not a quantity: a non-negative number, e.g. 2, 500m, 16Gi")
                )
                continue
            if _extended(name) and amount != amount.to_integral_value():
                problems.append(Problem(path, f"{value!r}: an extended resource takes whole numbers"))
                continue
            parsed[kind][name] = amount
    for name, request in parsed["requests"].items():
        limit = parsed["limits"].get(name)
        if limit is None and _extended(name) and name not in resources.limits:
            problems.append(
                Problem(
                    f"spec.engine.resources.requests[{name!r}]",
                    f"an extended resource needs a limit too: set spec.engine.resources.limits[{name!r}]",
                )
            )
        if limit is not None and request > limit:
            problems.append(
                Problem(
                    f"spec.engine.resources.requests[{name!r}]",
                    f"{resources.requests[name]!r} is more than its limit {resources.limits[name]!r}",
                )
            )
        if _extended(name) and limit is not None and request != limit:
            problems.append(
                Problem(
                    f"spec.engine.resources.requests[{name!r}]",
                    "an extended resource's request must equal its limit",
                )
            )
    return problems


def _extended(name: str) -> bool:
    """An extended resource (`nvidia.com/gpu`): whole numbers only, its request equal to its limit."""
    return name not in _NATIVE and "/" in name


def _spec_size(raw_spec: Mapping[str, Any]) -> list[Problem]:
    """The spec ConfigMap (`load_manifests.build_spec_config_map`) must fit in a ConfigMap."""
    size = len(yaml.safe_dump({"spec": dict(raw_spec)}, sort_keys=False).encode())
    if size + _MARGIN <= CONFIG_MAP_BYTES:
        return []
    return [
        Problem(
            "spec",
            f"{size} bytes as YAML: the load Job reads the experiment from a ConfigMap, which holds at most "
            f"{CONFIG_MAP_BYTES - _MARGIN} bytes of it; move large values (engine.env, engine.args) into a "
            "ConfigMap or Secret the arms read (engine.env valueFrom)",
        )
    ]
