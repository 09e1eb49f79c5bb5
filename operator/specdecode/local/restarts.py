"""The arms a round of `run --local` starts again (`rounds.started`): the crossover's on each
other's GPUs, the confirmation's treatment with its schedule (after a crossover, both back on their
GPUs of the stages; one GPU: the treatment alone)."""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from specdecode.experiment import rounds, spec, status
from specdecode.local import arms as arm_facts
from specdecode.local import engines, gpus, view


def restart(
    arms: engines.Engines,
    round_: status.Round,
    s: spec.ExperimentSpec,
    *,
    placed: Mapping[spec.Arm, str],
    one_gpu: bool,
    round_of: dict[spec.Arm, str],
    show: view.View,
) -> status.CrossoverPlacement | None:
    """The round's arms stopped, started again (each noted in `round_of`) and healthy; `placed`: each
    arm's GPUs in the stages. The crossover's swapped placement, as the arms report it (else None)."""
    started = rounds.started(round_)
    if round_.name == rounds.CROSSOVER:
        where = {spec.Arm.CONTROL: placed[spec.Arm.TREATMENT], spec.Arm.TREATMENT: placed[spec.Arm.CONTROL]}
        log = "swapped"
    else:
        arms.spec = rounds.arm_spec(s, round_)  # the control's command line is the same
        per_arm = ",".join(str(i) for i in range(gpus.per_arm(s)))
        where = {spec.Arm.TREATMENT: per_arm} if one_gpu else dict(placed)
        log = "confirmation"
        show.message(
            f"confirmation: restarting the treatment with num_speculative_tokens_per_batch_size={round_.schedule}"
        )
    for arm in started:
        left = arms.stop(arm)
        if left:
            raise engines.EngineError(
                f"the {arm.value} arm's processes {left} survived SIGKILL; the GPU may still be in use"
            )
    for arm in started:
        arm_gpus = where.get(arm)
        process = arms.start(arm, gpus=arm_gpus, log_name=f"{arm.value}-{log}")
        round_of[arm] = round_.name
        if round_.name == rounds.CROSSOVER:
            show.message(f"crossover: started the {arm.value} arm on GPUs {arm_gpus}")
        else:
            show.message(f"confirmation: started the {arm.value} arm: {' '.join(process.argv)}")
    arms.wait_healthy(s.deadlines.deploy_seconds, started)
    if round_.name != rounds.CROSSOVER:
        return None
    with httpx.Client(timeout=2.0) as client:
        control, treatment = (
            arm_facts.placement_of(arm_facts.arm_host(client, arms.arms[arm], where[arm]), where[arm])
            for arm in spec.Arm
        )
    return status.CrossoverPlacement(control=control, treatment=treatment)
