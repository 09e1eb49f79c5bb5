"""Whether the arms' live pods differ in anything but speculation (issue 18). Pure.

`manifests.serve_args` renders both arms from one spec, so their Deployments differ only in the
treatment's speculative flags. What runs may still differ: a mutating webhook or a LimitRange that
touched one pod, a `kubectl edit` of one Deployment, a tag that moved between the two pulls (another
`imageID`), nodes with another GPU product. Whatever differs is measured as part of the speed-up,
and the paired interval cannot see it. So once both arms are Ready, before the load, the operator
compares their live pods and warns (`analysis.fairness: Warn`) or fails (`Fail`), naming each
difference (`status.armDifferences`, condition `ArmsDiffer`).

Compared, for each arm's engine container (the container named `engine`, else the first): the
image digest the kubelet resolved (`imageID`), the node's GPU product label, resource requests and
limits, command and args (the treatment's without the speculative flags, `SPECULATIVE_FLAGS`: on
the control they are a difference), and env. A fact known for one arm only is not a difference: it
is unknown, not different (as in `placement.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from specdecode.experiment import status

#: The flags `manifests.serve_args` renders for the treatment only (each followed by its value, or
#: written `--flag=value`); removed from the treatment's argv before comparing.
SPECULATIVE_FLAGS: tuple[str, ...] = ("--speculative-config", "--per-request-spec-decode-metrics")

#: `ArmDifference.field` of each kind of difference (env and resources add the variable or the
#: resource after a dot: `env.HF_TOKEN`, `resources.limits.cpu`).
IMAGE_ID = "imageID"
GPU_PRODUCT = "gpuProduct"
ARGS = "args"


@dataclass(frozen=True)
class ArmPod:
    """What must be equal between the arms' live pods (`controller/observe.arm_pod` reads it)."""

    pod: str
    image_id: str | None = None
    """The engine container's `imageID` (None until the kubelet reports it)."""
    gpu_product: str | None = None
    """The node's `nvidia.com/gpu.product` label (None: the node is unknown or has none)."""
    resources: Mapping[str, str] = field(default_factory=dict)
    """`requests.<name>` and `limits.<name>` -> quantity, as the API server stored them."""
    argv: tuple[str, ...] = ()
    """command + args of the engine container."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variable name -> its value, or its source (`valueFrom ...`) written out."""


def without_speculation(argv: Sequence[str]) -> tuple[str, ...]:
    """`argv` without the speculative flags and their values."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in SPECULATIVE_FLAGS:
            skip = True
            continue
        if arg.split("=", 1)[0] in SPECULATIVE_FLAGS:
            continue
        kept.append(arg)
    return tuple(kept)


def differences(control: ArmPod, treatment: ArmPod) -> list[status.ArmDifference]:
    """Each fact in which the arms' pods differ, named, with both sides (None: absent on that side)."""
    found: list[status.ArmDifference] = []
    a, b = control.image_id, treatment.image_id
    if a is not None and b is not None and _digest(a) != _digest(b):
        found.append(status.ArmDifference(field=IMAGE_ID, control=a, treatment=b))
    a, b = control.gpu_product, treatment.gpu_product
    if a is not None and b is not None and a != b:
        found.append(status.ArmDifference(field=GPU_PRODUCT, control=a, treatment=b))
    found += _mapping("resources", control.resources, treatment.resources)
    # Only the treatment's: a speculative flag on the control is a difference (it speculates too).
    args = _args(control.argv, without_speculation(treatment.argv))
    if args is not None:
        found.append(args)
    found += _mapping("env", control.env, treatment.env)
    return found


def summary(found: Sequence[status.ArmDifference]) -> str:
    """One line naming every difference: `env.FOO: absent (control) vs 1 (treatment); ...`."""
    return "; ".join(
        f"{d.field}: {_shown(d.control)} (control) vs {_shown(d.treatment)} (treatment)" for d in found
    )


def message(found: Sequence[status.ArmDifference]) -> str:
    """The warning (or failure) line: what differs, and what it means for the measurement."""
    return (
        f"the arms' pods differ in more than speculation ({summary(found)}): the difference is measured "
        "as part of the speed-up; find what changed one arm (a webhook, a LimitRange, an edit of its "
        "Deployment, a moved image tag) and run the experiment again"
    )


def qualify(text: str, found: Sequence[status.ArmDifference]) -> str:
    """A verdict's message, with a note when the arms' pods differed (so the flag stays in
    `status.message`, the line pipelines print)."""
    if not found:
        return text
    fields = ", ".join(d.field for d in found)
    return (
        f"{text}; the arms' pods differed beyond speculation (in {fields}): the speed-up may partly be that"
    )


def _mapping(
    prefix: str, control: Mapping[str, str], treatment: Mapping[str, str]
) -> list[status.ArmDifference]:
    return [
        status.ArmDifference(field=f"{prefix}.{key}", control=control.get(key), treatment=treatment.get(key))
        for key in sorted(control.keys() | treatment.keys())
        if control.get(key) != treatment.get(key)
    ]


def _args(control: tuple[str, ...], treatment: tuple[str, ...]) -> status.ArmDifference | None:
    """The differing middle of the two argvs (their common start and end left out), or None."""
    if control == treatment:
        return None
    start = 0
    while start < min(len(control), len(treatment)) and control[start] == treatment[start]:
        start += 1
    end = 0
    while end < min(len(control), len(treatment)) - start and control[-1 - end] == treatment[-1 - end]:
        end += 1
    a, b = control[start : len(control) - end], treatment[start : len(treatment) - end]
    return status.ArmDifference(field=ARGS, control=" ".join(a) or None, treatment=" ".join(b) or None)


def _digest(image_id: str) -> str:
    """The content digest of an `imageID`: runtimes write it differently (`docker-pullable://repo@sha256:...`,
    `repo@sha256:...`, `sha256:...`), the same image has the same digest."""
    at = image_id.find("sha256:")
    return image_id[at:] if at >= 0 else image_id


def _shown(value: str | None) -> str:
    return "absent" if value is None else value
