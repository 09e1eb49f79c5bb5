"""The recommendation over the judged stages: the highest load at which speculation still passes
and a vLLM `num_speculative_tokens_per_batch_size` schedule beyond it (or advice where the release has
no schedule), also per input length where more than one was measured. Pure; owns
`status.recommendation`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from specdecode.experiment import releases
from specdecode.experiment.spec import (
    ExperimentSpec,
    SyntheticDataset,
)
from specdecode.experiment.status import (
    LengthRecommendation,
    Recommendation,
    StageResult,
    StageVerdict,
)

#: the upper end of the last range of a batch-size schedule
SCHEDULE_MAX_BATCH = 4096


def recommend(spec: ExperimentSpec, stages: Sequence[StageResult]) -> Recommendation:
    """The recommendation over all stages (`_recommend`); where they measured more than one prompt
    length, also one per length (`byInputLength`), and the note says for which lengths the overall
    schedule holds: those whose own stages pass at every measured batch size up to its cut-off
    (issue 17)."""
    overall = _recommend(spec, stages)
    lengths = _input_lengths(spec, stages)
    if len(set(lengths.values())) < 2:
        return overall
    table: list[LengthRecommendation] = []
    for tokens in sorted(set(lengths.values())):
        own = _recommend(spec, [s for s in stages if lengths.get(s.name) == tokens])
        table.append(
            LengthRecommendation(
                input_tokens=tokens,
                beneficial_up_to=own.beneficial_up_to,
                num_speculative_tokens_per_batch_size=own.num_speculative_tokens_per_batch_size,
                note=own.note,
            )
        )
    cutoff = _passes_up_to(stages)
    same = [
        str(tokens)
        for tokens in sorted(set(lengths.values()))
        if _passes_up_to([s for s in stages if lengths.get(s.name) == tokens]) >= cutoff
    ]
    if cutoff == 0:  # no schedule to qualify: the table says where each length passes
        return overall.model_copy(update={"by_input_length": table})
    holds = f"holds for inputTokens {', '.join(same)} of {', '.join(str(r.input_tokens) for r in table)}"
    return overall.model_copy(update={"by_input_length": table, "note": f"{overall.note}; {holds}"})


def _passing(stages: Sequence[StageResult]) -> list[StageResult]:
    """The passing run from the lowest load: stages with a batch-size estimate, by batch size, up to
    the first that does not pass."""
    ordered = sorted((s for s in stages if s.batch_size is not None), key=lambda s: s.batch_size or 0.0)
    passing: list[StageResult] = []
    for s in ordered:
        if s.verdict is not StageVerdict.PASS:
            break
        passing.append(s)
    return passing


def _passes_up_to(stages: Sequence[StageResult]) -> float:
    """The batch size up to which the passing run reaches; 0 when speculation does not pass at the lowest load."""
    passing = _passing(stages)
    return passing[-1].batch_size or 0.0 if passing else 0.0


def _input_lengths(spec: ExperimentSpec, stages: Sequence[StageResult]) -> dict[str, int]:
    """Each stage's prompt length, by name, with a synthetic dataset (a search probe, not a listed
    stage, has the dataset's); empty with any other dataset."""
    dataset = spec.workload.dataset
    if not isinstance(dataset, SyntheticDataset):
        return {}
    listed = {stage.name: spec.stage_dataset(stage).input_tokens for stage in spec.workload.stages}
    return {s.name: listed.get(s.name, dataset.input_tokens) for s in stages}


def _recommend(spec: ExperimentSpec, stages: Sequence[StageResult]) -> Recommendation:
    """The highest load at which speculation still passes, and a vLLM batch-size schedule beyond it.

    Stages are ordered by their estimated batch size; the passing run is the one that starts at the
    lowest load (a pass above a non-passing stage is not trusted for the schedule). The schedule is
    `[[1, B, k], [B + 1, 4096, 0]]` with B the passing stage's batch size rounded down (we have no
    evidence beyond it), `[[1, 4096, k]]` when every stage passes.
    """
    k = spec.speculative.num_speculative_tokens
    ordered = sorted((s for s in stages if s.batch_size is not None), key=lambda s: s.batch_size or 0.0)
    if not ordered:
        return Recommendation(note="no stage has a batch-size estimate; no schedule suggested")
    passing = _passing(ordered)
    if not passing:
        return Recommendation(
            note=f"speculation did not pass at the lowest load ({ordered[0].name}); leave it off"
        )
    best = passing[-1]
    upto = max(1, math.floor(best.batch_size or 1.0))
    later_pass = [s.name for s in ordered[len(passing) :] if s.verdict is StageVerdict.PASS]
    extra = f"; also passes at {', '.join(later_pass)} (not monotone in load)" if later_pass else ""
    if k is None:
        return Recommendation(
            beneficial_up_to=best.name,
            note=f"passes up to ~{upto} running requests{extra}; numSpeculativeTokens unset, so no schedule",
        )
    release = releases.resolve(spec.engine)
    if len(passing) == len(ordered):
        return Recommendation(
            beneficial_up_to=best.name,
            num_speculative_tokens_per_batch_size=[[1, max(SCHEDULE_MAX_BATCH, upto), k]]
            if release.batch_schedule
            else None,
            note=f"passes at every measured load (up to ~{upto} running requests)",
        )
    schedule = [[1, upto, k], [upto + 1, max(SCHEDULE_MAX_BATCH, upto + 1), 0]]
    note = f"passes up to {best.name} (~{upto} running requests), not at {ordered[len(passing)].name}{extra}"
    if not release.batch_schedule:
        # Older releases cannot switch speculation off by batch size: say what they can do instead.
        return Recommendation(
            beneficial_up_to=best.name,
            note=(
                f"{note}; {release.short} has no num_speculative_tokens_per_batch_size (vLLM >= "
                f"{releases.minor(releases.BATCH_SCHEDULE_SINCE)} has it: {schedule}), so enable speculation only "
                f"where the load stays at or below ~{upto} running requests (e.g. a low-latency pool with "
                f"--max-num-seqs {upto}), or upgrade"
            ),
        )
    return Recommendation(
        beneficial_up_to=best.name, num_speculative_tokens_per_batch_size=schedule, note=note
    )
