"""The resource's conditions (kstatus Ready/Reconciling/Stalled, plus Completed, Promoted and the
warnings SpeculationDegraded and ArmsDiffer), derived from the status alone. Pure.

`with_conditions` writes them on every status the core decides, and `run --local` writes the same
into result.json, so a pipeline gates on the same conditions locally as in a cluster.
"""

from __future__ import annotations

from datetime import datetime

from specdecode.experiment import degradations, fairness
from specdecode.experiment.status import Condition, ExperimentStatus, Phase, Verdict


def conditions_for(st: ExperimentStatus) -> dict[str, tuple[str, str, str]]:
    """type -> (status, reason, message) of the kstatus conditions plus Completed and Promoted (and
    SpeculationDegraded while the treatment logged a degradation, ArmsDiffer while the arms' pods
    differed beyond speculation)."""
    reason = st.reason or st.phase.value
    message = st.message or ""
    active = st.phase.is_active
    failed = st.phase is Phase.FAILED
    completed = st.phase is Phase.COMPLETED
    promoted = completed and st.verdict is Verdict.PROMOTE
    verdict_reason = st.verdict.value if st.verdict is not None else reason
    # Only while vLLM said so (a warning, abnormal-true): absent, not False, on every other experiment.
    degraded = (
        {"SpeculationDegraded": ("True", st.degradations[0].kind, degradations.summary(st.degradations))}
        if st.degradations
        else {}
    )
    # Likewise only while the arms' pods differed beyond speculation (analysis.fairness).
    differ = (
        {"ArmsDiffer": ("True", "ArmsDiffer", fairness.summary(st.arm_differences))}
        if st.arm_differences
        else {}
    )
    return (
        {
            "Ready": ("True" if completed else "False", verdict_reason if completed else reason, message),
            "Reconciling": (
                "True" if active else "False",
                reason if active else "Finished",
                message if active else "",
            ),
            "Stalled": (
                "True" if failed else "False",
                reason if failed else "NotStalled",
                message if failed else "",
            ),
            "Completed": ("True" if completed else "False", verdict_reason, message),
            "Promoted": ("True" if promoted else "False", verdict_reason, message),
        }
        | degraded
        | differ
    )


def with_conditions(
    st: ExperimentStatus, generation: int, now: datetime, *, previous: ExperimentStatus | None = None
) -> ExperimentStatus:
    """The status with its conditions (`conditions_for`) as the resource carries them: a condition's
    transition time moves only when its status changes from `previous`. Also writes `run --local`'s
    result.json, so a pipeline gates on the same conditions locally."""
    before = {c.type: c for c in (previous.conditions if previous else [])}
    conditions = []
    for kind, (value, reason, message) in conditions_for(st).items():
        old = before.get(kind)
        changed = old is None or old.status != value
        conditions.append(
            Condition(
                type=kind,
                status=value,
                reason=reason,
                message=message,
                observed_generation=generation,
                last_transition_time=ts(now) if changed or old is None else old.last_transition_time,
            )
        )
    return st.model_copy(update={"conditions": conditions, "observed_generation": generation})


def ts(now: datetime) -> str:
    """`now` as the status' timestamps are written (RFC 3339, seconds, Z)."""
    return now.isoformat(timespec="seconds").replace("+00:00", "Z")
