"""The confirmation round (`analysis.confirm`): the recommended batch-size schedule, measured.

Pure. The recommendation (`recommendation.recommend`) is a prediction from stages run with speculation
always on. With `analysis.confirm`, the runner restarts the treatment with the recommended
`num_speculative_tokens_per_batch_size` (`treatment_spec`) and runs the same stages (same prompts,
same schedule) against the control again; this module plans and judges that round and folds it into
`status.recommendation` (`confirmed`, `confirmationReason`, `confirmation`).

Per stage (`plan`): k is the schedule's k at the stage's batch size from the first round
(`speculative_rules.batch_schedule_k`, vLLM's lookup). Where k > 0 the schedule claims speculation pays:
the stage is judged by the experiment's own rule against minSpeedup. Where k = 0 it claims the
treatment is the control: the stage is judged as non-inferior, against `NON_INFERIORITY` (Pass when
the lower bound of the speed-up is at least 0.98, Fail when its upper bound is below). Guardrails
apply as in the first round.
The round runs each stage to its request bound and judges it on every pair with the fixed-horizon
interval (`sequential` off): it checks a prediction rather than searching for one, and in a closed
loop the first pairs come in cohorts that started together, so an early look can see a few
correlated cohorts as a narrow interval (on the simulator, k = 0 at c64 once stopped at 20 pairs as
0.93x [0.90, 0.95] where all 128 pairs gave 0.99x [0.97, 1.01]).
Stages without a batch-size estimate are left out (the schedule cannot be mapped onto them).

Confirmed (`fold`): true when no stage of the round Fails (Inconclusive stages do not refute; their
verdicts are listed), false when one does, null when no stage measured anything (NotMeasured).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from specdecode.experiment import speculative_rules, verdict
from specdecode.experiment.records import Request, StageWindow
from specdecode.experiment.spec import ExperimentSpec
from specdecode.experiment.status import ConfirmationStage, Recommendation, StageResult, StageVerdict
from specdecode.experiment.validity import Validity

#: where the schedule turns speculation off, the treatment passes when its speed-up is surely >= this
NON_INFERIORITY = 0.98
#: the vLLM key the schedule is rendered as
SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"


class Reason(StrEnum):
    """`status.recommendation.confirmationReason`."""

    CONFIRMED = "Confirmed"
    """The round ran and no stage of it Failed."""
    REFUTED = "Refuted"
    """A stage of the round Failed."""
    NOT_MEASURED = "NotMeasured"
    """The round ran but no stage of it measured anything."""
    ROUND_FAILED = "RoundFailed"
    """The round could not start or finish (an arm failed, or the run was interrupted); the status
    message says why."""
    NO_SCHEDULE = "NoSchedule"
    """The recommendation has no schedule to confirm."""
    ARMS_NOT_STARTED_HERE = "ArmsNotStartedHere"
    """The arms were given as URLs: the treatment cannot be restarted with the schedule."""


def treatment_spec(spec: ExperimentSpec, schedule: Sequence[Sequence[int]]) -> ExperimentSpec:
    """The experiment with the treatment rendered with `schedule` (in `speculative.extra`)."""
    extra = {**spec.speculative.extra, SCHEDULE_KEY: [list(entry) for entry in schedule]}
    speculative = spec.speculative.model_copy(update={"extra": extra})
    return spec.model_copy(update={"speculative": speculative})


@dataclass(frozen=True)
class Planned:
    """One stage of the confirmation round: the schedule's k there and the threshold it is judged by."""

    stage: str
    k: int
    threshold: float


def plan(
    spec: ExperimentSpec, stages: Sequence[StageResult], schedule: Sequence[Sequence[int]]
) -> list[Planned]:
    """The stages of the round, in the workload's order (those of the first round with a batch size)."""
    k = spec.speculative.num_speculative_tokens or 0
    by_name = {s.name: s for s in stages}
    out = []
    for stage in spec.workload.stages:
        first = by_name.get(stage.name)
        if first is None or first.batch_size is None:
            continue
        at = speculative_rules.batch_schedule_k(schedule, max(1, math.floor(first.batch_size)), k=k)
        out.append(Planned(stage.name, at, spec.analysis.min_speedup if at > 0 else NON_INFERIORITY))
    return out


def judged_spec(spec: ExperimentSpec, planned: Planned) -> ExperimentSpec:
    """`spec` whose minSpeedup is the stage's threshold, judged at a fixed horizon (module docstring)."""
    analysis = spec.analysis.model_copy(update={"min_speedup": planned.threshold, "sequential": False})
    return spec.model_copy(update={"analysis": analysis})


def judge(
    spec: ExperimentSpec,
    planned: Sequence[Planned],
    records: Sequence[Request],
    windows: Sequence[StageWindow],
    *,
    validity: Validity | None = None,
) -> list[ConfirmationStage]:
    """Each planned stage of the round, judged against its threshold.

    `spec` is the confirmation's (`treatment_spec`); `records` and `windows` are the round's own.
    """
    measured = [r for r in records if not r.warmup]
    win = {w.stage: w for w in windows}
    stages = {s.name: (i, s) for i, s in enumerate(spec.workload.stages)}
    out = []
    for p in planned:
        i, stage = stages[p.stage]
        result = verdict.analyse_stage(
            judged_spec(spec, p),
            stage,
            measured,
            win.get(p.stage),
            validity=validity,
            seed=spec.engine.seed + i,
        )
        out.append(
            ConfirmationStage(
                name=p.stage,
                k=p.k,
                threshold=p.threshold,
                speedup=result.speedup,
                verdict=result.verdict,
                reasons=result.reasons,
                code=result.code,
            )
        )
    return out


def fold(recommendation: Recommendation, confirmation: Sequence[ConfirmationStage]) -> Recommendation:
    """The recommendation with its confirmation round (the rule in the module docstring)."""
    measured = [c for c in confirmation if c.speedup is not None and c.speedup.n > 0]
    if any(c.verdict is StageVerdict.FAIL for c in confirmation):
        confirmed, reason = False, Reason.REFUTED
    elif not measured:
        confirmed, reason = None, Reason.NOT_MEASURED
    else:
        confirmed, reason = True, Reason.CONFIRMED
    return recommendation.model_copy(
        update={
            "confirmed": confirmed,
            "confirmation_reason": str(reason),
            "confirmation": list(confirmation),
        }
    )


def not_run(recommendation: Recommendation | None, reason: Reason) -> Recommendation:
    """The recommendation, saying that its confirmation round was not run and why."""
    base = recommendation or Recommendation()
    return base.model_copy(update={"confirmed": None, "confirmation_reason": str(reason), "confirmation": []})


def summary(recommendation: Recommendation) -> str:
    """One line: the round per stage and the outcome (`c1 1.12x Pass (k=4), c16 1.00x Pass (k=0, >= 0.98)`)."""
    if recommendation.confirmation_reason is None:
        return ""
    parts = []
    for c in recommendation.confirmation:
        est = c.speedup.estimate if c.speedup is not None else None
        speed = f"{est:.2f}x" if est is not None else "-"
        rule = f"k={c.k}" if c.k > 0 else f"k=0, >= {c.threshold:g}"
        parts.append(f"{c.name} {speed} {c.verdict} ({rule})")
    stages = f": {', '.join(parts)}" if parts else ""
    return f"confirmation {recommendation.confirmation_reason}{stages}"
