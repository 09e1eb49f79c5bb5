"""`run --local`'s side of the rounds' fold: what its rounds measured (kept in memory as each load
ended, and the first round's control for one GPU) and where its arms ran (their GPUs), read into the
core's fold (`experiment/judgement.py`), as the operator reads its ConfigMaps and Prometheus; and
what the view is told of the folded result."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from specdecode.experiment import confirm, crossover, judgement, rounds, search, spec, status, validity
from specdecode.local import arms, files, view

ONE_AFTER_THE_OTHER = (
    "the arms ran one after the other (too few GPUs for both) on the same prompts and schedule, "
    "so pairs were not simultaneous"
)


def rounds_read(
    current: status.ExperimentStatus,
    measured: Mapping[str, judgement.Measurement],
    *,
    swapped: status.CrossoverPlacement | None,
    first_control: judgement.Measurement | None,
    interruption: str | None,
) -> dict[str, judgement.Measurement | judgement.Unmeasured]:
    """Each ended round's measurement (`measured`, by round name), or why it has none.

    The crossover's round is unmeasured when its arms did not report their swapped placement, and
    says the first line of why (an arm's crash carries its log's tail). A confirmation round the run
    was interrupted in says how. One GPU (`first_control`: the stages' control load): the
    confirmation's treatment is paired with the control measured in the first round."""
    read: dict[str, judgement.Measurement | judgement.Unmeasured] = {}
    for round_ in current.rounds:
        got = measured.get(round_.name)
        failed = round_.outcome == rounds.FAILED
        if round_.name == rounds.CROSSOVER and (failed or swapped is None):
            read[round_.name] = judgement.Unmeasured((round_.message or "failed").splitlines()[0])
        elif round_.name == rounds.CONFIRMATION and interruption is not None:
            read[round_.name] = judgement.Unmeasured(interruption, interrupted=True)
        elif got is not None and not failed:
            if round_.name == rounds.CONFIRMATION and first_control is not None:
                got = judgement.Measurement(
                    [*first_control.records, *got.records],
                    files.merged_windows(first_control.windows, got.windows),
                    validity.merged(first_control.validity, got.validity),
                )
            read[round_.name] = got
    return read


def placement(
    current: status.ExperimentStatus,
    *,
    servers_given: bool,
    one_gpu: bool,
    gpus: Mapping[spec.Arm, str],
    hosts: Mapping[spec.Arm, status.Host],
    swapped: status.CrossoverPlacement | None,
) -> judgement.Placement:
    """Where the arms ran, by GPUs (and host): whether they can swap, and the swapped round's
    placement once it measured."""
    if servers_given:
        why = (
            "the arms are the servers given by --control-url and --treatment-url, which run --local "
            "cannot move: nothing to swap"
        )
        return judgement.Placement(status.CrossoverPlacement(), unswappable=(crossover.SERVERS_GIVEN, why))
    if one_gpu or len(set(gpus.values())) < 2:
        why = (
            "both arms had the same placement (one after the other on the same GPUs, or simulator "
            "processes without GPUs): nothing to swap"
        )
        return judgement.Placement(status.CrossoverPlacement(), unswappable=(crossover.SAME_PLACEMENT, why))
    control, treatment = (arms.placement_of(hosts.get(arm), gpus[arm]) for arm in spec.Arm)
    round_ = rounds.find(current, rounds.CROSSOVER)
    measured = round_ is not None and round_.outcome != rounds.FAILED
    return judgement.Placement(
        status.CrossoverPlacement(control=control, treatment=treatment), swapped=swapped if measured else None
    )


@dataclass
class Told:
    """What the view was told of the rounds, so that each line is said once."""

    probes: set[str] = field(default_factory=set)
    """The probes whose verdict the view was told."""
    search: bool = False
    """The view was told where the search ended."""

    def tell(self, show: view.View, folded: judgement.Folded) -> None:
        """Each probe's verdict once, where the search ended (once), the confirmation's outcome."""
        found = folded.search
        if found is not None:
            for probe in found.probes:
                if probe.name not in self.probes:
                    self.probes.add(probe.name)
                    show.message(f"search: {probe.name} {probe.verdict.value}")
            probing = folded.next_round is not None and folded.next_round.probe is not None
            stopped = found.reason in (search.PROBE_FAILED, judgement.ONE_AFTER_THE_OTHER)
            if not probing and not stopped and not self.search:
                self.search = True
                show.message(search.describe(found))
        if folded.confirmed and folded.recommendation is not None:
            show.message(confirm.summary(folded.recommendation))
