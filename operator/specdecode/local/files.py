"""`run --local`'s measurement files in DIR: the load's records and stage windows read back (what an
interrupted load left), the one-GPU windows merged and written as a paired run's, and the stages'
windows with Prometheus' figures when `spec.prometheus.url` is set."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from specdecode import exit_status
from specdecode.experiment import records, spec, validity
from specdecode.loadgen import runner
from specdecode.local import lifecycle
from specdecode.sources import prometheus


def merged_windows(
    control: Sequence[records.StageWindow], treatment: Sequence[records.StageWindow]
) -> list[records.StageWindow]:
    """One GPU: one window per stage with each arm's own server metrics (times: the control's).

    A stage the treatment ended early by sequential stopping is marked stopped early.
    """
    theirs = {w.stage: w for w in treatment}
    merged = []
    for mine in control:
        other = theirs.get(mine.stage)
        server: dict[spec.Arm, records.ArmServerMetrics] = {
            k: v for k, v in mine.server.items() if k == spec.Arm.CONTROL
        }
        if other is not None:
            server.update({k: v for k, v in other.server.items() if k == spec.Arm.TREATMENT})
        stopped = mine.stopped_early or (other is not None and other.stopped_early)
        merged.append(mine.model_copy(update={"server": server, "stopped_early": stopped}))
    return merged


def write_windows(
    out: Path,
    anchor: records.RunAnchor,
    windows: Sequence[records.StageWindow],
    loads: dict[spec.Arm, runner.RunResult],
) -> None:
    """One GPU: DIR/windows.json as when paired (anchor, windows), plus each arm's own under `arms`."""
    doc = {
        "anchor": anchor.model_dump(),
        "windows": [w.model_dump(mode="json") for w in windows],
        "simultaneous": False,
        "arms": {
            arm.value: {
                "anchor": load.anchor.model_dump(),
                "windows": [w.model_dump(mode="json") for w in load.windows],
            }
            for arm, load in loads.items()
        },
    }
    with exit_status.writing_results(out):
        (out / runner.WINDOWS_FILE).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def read_records(directory: Path) -> list[records.RequestRecord]:
    path = directory / "requests.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(records.RequestRecord.model_validate_json(line))
    return out


def read_anchor(directory: Path) -> records.RunAnchor:
    doc = json.loads((directory / "windows.json").read_text())
    return records.RunAnchor.model_validate(doc["anchor"])


def windows_so_far(
    out: Path, loads: Mapping[spec.Arm, runner.RunResult]
) -> tuple[list[records.StageWindow], validity.Validity | None]:
    """The windows.json and validity the interrupted load(s) left in DIR (one GPU: each arm's, merged);
    the interruption itself does not invalidate the stages finished before it."""

    def load(directory: Path) -> tuple[list[records.StageWindow], validity.Validity | None]:
        try:
            doc = json.loads((directory / runner.WINDOWS_FILE).read_text())
            windows = [records.StageWindow.model_validate(w) for w in doc["windows"]]
        except (OSError, ValueError, KeyError, TypeError):
            return [], None
        try:
            block = validity.Validity.of_summary(json.loads((directory / runner.SUMMARY_FILE).read_text()))
        except (OSError, ValueError, AttributeError):
            return windows, None
        return windows, block.forgiving(validity.INTERRUPTED) if block is not None else None

    if not loads and not (out / "load-control").exists():
        return load(out)
    (control, control_validity), (treatment, treatment_validity) = (
        load(out / f"load-{arm.value}") for arm in spec.Arm
    )
    return merged_windows(control, treatment), validity.merged(control_validity, treatment_validity)


def prometheus_windows(
    s: spec.ExperimentSpec,
    out: Path,
    windows: list[records.StageWindow],
    loads: Mapping[spec.Arm, runner.RunResult],
    *,
    namespace: str,
    name: str,
) -> list[records.StageWindow]:
    """The stages' windows with each arm's server metrics from `spec.prometheus.url` (one GPU: each
    arm over its own windows and clock, merged); raises `lifecycle.Failure` when it cannot answer."""
    if s.prometheus is None:
        return windows
    names = prometheus.LabelNames.from_env()
    source = prometheus.PrometheusSource(s.prometheus.url)

    def query(
        windows: list[records.StageWindow], anchor: records.RunAnchor, arms: Sequence[spec.Arm]
    ) -> list[records.StageWindow]:
        return prometheus.with_prometheus(
            source, windows, anchor, namespace=namespace, name=name, names=names, arms=arms
        )

    try:
        if not loads:
            return query(windows, read_anchor(out), tuple(spec.Arm))
        # One GPU: each arm over its own windows and clock, then one window per stage again.
        control, treatment = (query(loads[arm].windows, loads[arm].anchor, (arm,)) for arm in spec.Arm)
        return merged_windows(control, treatment)
    except (prometheus.PrometheusUnavailable, prometheus.PrometheusNoData) as exc:
        raise lifecycle.Failure("PrometheusUnavailable", f"spec.prometheus.url: {exc}") from None
