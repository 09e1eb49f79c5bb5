"""GPU telemetry of the arms' pods from NVIDIA's DCGM exporter (issue #18). Pure.

Status fields owned: `stages[].gpu` (`StageGpu`: per arm mean utilisation, mean and highest memory
used, mean power, and the source). The operator asks Prometheus, over each stage's window, for the
exporter's series of the arm's pods; this module builds those queries, folds the answers into the
status model and words them for the report.

The series and labels are dcgm-exporter's own, not our relabelled `arm`/`experiment` labels:

- `DCGM_FI_DEV_GPU_UTIL` (%), `DCGM_FI_DEV_FB_USED` (MiB) and `DCGM_FI_DEV_POWER_USAGE` (W) are in its
  default counters (https://github.com/NVIDIA/dcgm-exporter/blob/main/etc/default-counters.csv);
- each series names its GPU (`gpu`, `UUID`, `modelName`, `Hostname`) and, with the Kubernetes pod
  mapping on (`DCGM_EXPORTER_KUBERNETES=true`, the default of its chart and of the GPU Operator), the
  pod holding the GPU as `pod`, `namespace` and `container`
  (`internal/pkg/transformation/const.go`: `podAttribute = "pod"`, `namespaceAttribute = "namespace"`).

So an arm's GPUs are joined on namespace + pod name. A Prometheus that scrapes the exporter without
`honor_labels` renames those two to `exported_pod` and `exported_namespace` (its own target labels
win): the operator's `SPECDECODE_DCGM_POD_LABEL` and `SPECDECODE_DCGM_NAMESPACE_LABEL` settings name
them then. The pods are matched by their Deployment's name (`<deployment>-<replicaset hash>-<suffix>`),
not by the pod recorded in `status.arms`, so a round that re-rendered the arms does not lose the
stages' pods.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from specdecode.experiment import promql, status

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
POWER = "DCGM_FI_DEV_POWER_USAGE"
SOURCE = "dcgm-exporter"
ABSENT = "absent"
NO_METRICS = "no DCGM metrics for the arms' pods"


def pod_selector(*, namespace_label: str, pod_label: str, namespace: str, deployment: str) -> str:
    """The exporter's series of the Deployment's pods: `{namespace="ns",pod=~"<deployment>-x-y"}`
    (a ReplicaSet's pods are `<deployment>-<hash>-<suffix>`; PromQL anchors the regex)."""
    namespace_part = promql.selector({namespace_label: namespace})[1:-1]
    # A Deployment's name is a DNS subdomain: of the regex's metacharacters only `.` can occur in it
    # (escaped once for the regex, once more for the PromQL string).
    pattern = deployment.replace(".", "\\\\.") + "-[a-z0-9]+-[a-z0-9]+"
    return "{" + f'{namespace_part},{pod_label}=~"{pattern}"' + "}"


def queries(selector: str, seconds: float) -> dict[str, str]:
    """`ArmGpu` field -> the instant query (evaluated at the stage's end) over the stage's window."""
    window = promql.window(seconds)

    def over(aggregate: str, fn: str, metric: str) -> str:
        return f"{aggregate}({fn}_over_time({metric}{selector}[{window}]))"

    return {
        "gpus": over("count", "last", GPU_UTIL),
        "utilization_mean": over("avg", "avg", GPU_UTIL),
        "memory_used_mean_mib": over("avg", "avg", FB_USED),
        "memory_used_max_mib": over("max", "max", FB_USED),
        "power_mean_watts": over("avg", "avg", POWER),
    }


def arm_gpu(values: Mapping[str, float | None]) -> status.ArmGpu | None:
    """One arm's figures from the queries' answers (None: the exporter had no series for its pods)."""
    gpus = values.get("gpus")
    if gpus is None or math.isnan(gpus) or gpus < 1:
        return None
    figures = {
        key: None if value is None or math.isnan(value) else round(value, 1)
        for key, value in values.items()
        if key != "gpus"
    }
    return status.ArmGpu(gpus=int(gpus), **figures)


def stage_gpu(control: status.ArmGpu | None, treatment: status.ArmGpu | None) -> status.StageGpu:
    """Both arms of one stage, with the source: the exporter if it reported either arm, else absent."""
    found = control is not None or treatment is not None
    return status.StageGpu(source=SOURCE if found else ABSENT, control=control, treatment=treatment)


def describe(arm: status.ArmGpu | None) -> str:
    """One arm in words: `util 63%, memory 129,394 MiB (max 129,400), 412 W` (per GPU)."""
    if arm is None:
        return "no series"

    def num(value: float | None, unit: str) -> str:
        return "–" if value is None else f"{value:,.0f}{unit}"

    gpus = f"{arm.gpus} GPUs: " if arm.gpus > 1 else ""
    return (
        f"{gpus}util {num(arm.utilization_mean, '%')}, memory {num(arm.memory_used_mean_mib, ' MiB')} "
        f"(max {num(arm.memory_used_max_mib, '')}), {num(arm.power_mean_watts, ' W')}"
    )


def summary(stages: Sequence[status.StageResult]) -> list[str]:
    """The stages' GPU telemetry in words: one line per stage with data, else the line of `absent`."""
    lines = [
        f"gpu {s.name}: control {describe(s.gpu.control)}; treatment {describe(s.gpu.treatment)}"
        for s in stages
        if s.gpu is not None and s.gpu.source == SOURCE
    ]
    missing = absent(stages)
    return lines or ([missing] if missing else [])


def absent(stages: Sequence[status.StageResult]) -> str | None:
    """One line saying that no stage has GPU telemetry, and why; None when some stage has (or none ran)."""
    if not stages or any(s.gpu is not None and s.gpu.source == SOURCE for s in stages):
        return None
    if all(s.gpu is None for s in stages):
        return f"gpu: {NO_METRICS} (none read for this run: run --local reads no DCGM exporter)"
    return f"gpu: {NO_METRICS} (Prometheus holds no dcgm-exporter series for them)"
