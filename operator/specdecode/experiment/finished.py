"""What is kept of a run that fails during its load: the stages it finished, and their report. Pure.

The load Job stores its results after every stage, so a run that fails during the load (its Job
failed, an arm restarted or was evicted, the run deadline passed, an abort) still has the stages it
finished. `reconcile.decide` asks for them (`Action.KEEP_FINISHED_STAGES`) when the Job has stored
results; the shell reads and judges them (`Finished`) and `keep_finished` folds them into the
failure: `status.stages`, `status.resultsRef` and a note in the message, with their report to store
(`Action.STORE_REPORT`). The failure stands either way: never a verdict from part of a run.
"""

from __future__ import annotations

from collections.abc import Sequence

from specdecode.experiment import status
from specdecode.experiment.status import ExperimentStatus
from specdecode.experiment.world import Action, Decision, Finished


def with_finished_stages(
    failed: ExperimentStatus,
    stages: Sequence[status.StageResult],
    results_ref: status.ResultsRef | None,
    *,
    total: int,
    unkept: str | None = None,
) -> ExperimentStatus:
    """`failed` with the `stages` finished of `total` kept, and its message saying so (and, with
    `unkept`, which stages were measured only in part and why they are not kept)."""
    names = ", ".join(s.name for s in stages)
    where = f"ConfigMap {results_ref.config_map}" if results_ref and results_ref.config_map else "the report"
    return failed.model_copy(
        update={
            "stages": list(stages),
            "results_ref": results_ref,
            "message": (
                f"{failed.message}; the {len(stages)} of {total} stage(s) measured before that "
                f"({names}) are kept in status.stages and {where}" + (f"; {unkept}" if unkept else "")
            ),
        }
    )


def keep_finished(failed: Decision, finished: Finished, *, total: int) -> Decision:
    """The failure `failed` (whose actions include KEEP_FINISHED_STAGES) with what the load finished
    kept; nothing finished (or nothing could be read): the failure as it was. Its other actions follow."""
    rest: list[Action] = [a for a in failed.actions if a is not Action.KEEP_FINISHED_STAGES]
    if not finished.stages:
        if finished.unkept:  # stages measured in part only: the failure says so
            said = failed.status.model_copy(update={"message": f"{failed.status.message}; {finished.unkept}"})
            return Decision(said, rest, failed.events)
        return Decision(failed.status, rest, failed.events)
    kept = with_finished_stages(
        failed.status, finished.stages, finished.results_ref, total=total, unkept=finished.unkept
    )
    if finished.report is None:
        return Decision(kept, rest, failed.events)
    return Decision(kept, [Action.STORE_REPORT, *rest], failed.events, finished.report)
