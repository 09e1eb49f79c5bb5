"""The operator's rounds after the stages: the break-even search's probes, the crossover's swapped
round and the confirmation round. Pure.

Both lifecycles run each as a round (`reconcile.py`; `specdecode run --local` in its own process,
`local/runner.py`): once the stages are judged (Analyzing), the fold (`judgement.py`, called by the
operator's collector `controller/collect.py` and by `local/judging.py`) says whether a round is owed;
the decision function appends it to `status.rounds` and goes through the phases again:

- **Deploying**: the arms the round starts again (`started`) are re-rendered (`arm_spec`) and
  pinned to the round's nodes (`status.rounds[].nodes`); the round waits for their new pods
  (annotated `keys.ROUND_ANNOTATION`) to be Ready.
- **Running**: the round's own load Job `<exp>-load-<round>` reads the round's spec (`load_spec`)
  and plans with the first Job's salt, so every round sends the same prompts on the same schedule.
- **Analyzing**: everything is judged again from the stored results, with every round measured so
  far folded in (`judgement.fold`: `search.progress`, `crossover.apply`, `confirm.fold`), and the
  next round, if any, is asked for.

A search probe (`probe_round`: one paired stage at the load `search.step` chose from the probes
judged so far) starts no arm again: it goes from Analyzing straight to Running.

A round that fails (an arm that cannot start on its node, a load Job that fails, a deadline) does not
fail the experiment: the stages' verdict stands, and the check the round was for is marked as not done
(the crossover's `SwappedRoundFailed`: no pass stands; the confirmation's `RoundFailed`; the
search stops with `ProbeFailed`, keeping the probes measured before).

Order, as in `run --local`: the search's probes first (its break-even feeds the recommendation), then
the crossover (it may withhold a Promote), then the confirmation (it checks the
recommendation of the verdict that stands). After a crossover both arms go back to the nodes they
had in the stages for the confirmation, which compares with the stages' recommendation.
"""

from __future__ import annotations

from collections.abc import Sequence

from specdecode.experiment import confirm, crossover, search, spec
from specdecode.experiment.status import CrossoverPlacement, Environment, ExperimentStatus, Round

CROSSOVER = "Crossover"
"""The crossover's swapped round (`analysis.crossover`): both arms on each other's node."""
CONFIRMATION = "Confirmation"
"""The confirmation round (`analysis.confirm`): the treatment with the recommended schedule."""
MEASURED = "Measured"
"""`status.rounds[].outcome`: the round's load Job finished."""
FAILED = "Failed"
"""`status.rounds[].outcome`: the round could not be measured (`message` says why)."""


def current(st: ExperimentStatus) -> Round | None:
    """The round in progress of a status (`in_progress` of its rounds)."""
    return in_progress(st.rounds)


def in_progress(run: Sequence[Round]) -> Round | None:
    """The round in progress: the last one, while it has no outcome."""
    last = run[-1] if run else None
    return last if last is not None and last.outcome is None else None


def find(st: ExperimentStatus, name: str) -> Round | None:
    """The round `name`, if it was started."""
    return next((r for r in st.rounds if r.name == name), None)


def probes(st: ExperimentStatus) -> list[Round]:
    """The search's probe rounds started so far, in the order run."""
    return [r for r in st.rounds if r.probe is not None]


def probe_round(wanted: spec.Search, index: int, load: float) -> Round:
    """Probe `index` (1-based) of the search at `load`, named after its stage."""
    return Round(name=wanted.probe_stage(index, load).name, probe=index, load=load)


def probe_stage(s: spec.ExperimentSpec, round_: Round) -> spec.Stage | None:
    """The paired stage a probe round measures (None: not a probe)."""
    wanted = s.workload.search
    if wanted is None or round_.probe is None or round_.load is None:
        return None
    return wanted.probe_stage(round_.probe, round_.load)


def first_nodes(environment: Environment | None) -> CrossoverPlacement:
    """Where each arm ran in the stages (a node name each, when known)."""
    arms = environment.arms if environment is not None else None
    return CrossoverPlacement(
        control=arms.control.node if arms is not None and arms.control is not None else None,
        treatment=arms.treatment.node if arms is not None and arms.treatment is not None else None,
    )


def crossover_round(environment: Environment | None) -> Round:
    """The swapped round: the control pinned to the treatment's node and back."""
    first = first_nodes(environment)
    swapped = CrossoverPlacement(control=first.treatment, treatment=first.control)
    return Round(name=CROSSOVER, nodes=swapped)


def confirmation_round(
    schedule: Sequence[Sequence[int]], environment: Environment | None, *, crossed: bool
) -> Round:
    """The confirmation round: the treatment on its node of the stages with `schedule`; the control
    as it is, unless a crossover moved it (then back to its node of the stages too)."""
    first = first_nodes(environment)
    nodes = CrossoverPlacement(control=first.control if crossed else None, treatment=first.treatment)
    return Round(name=CONFIRMATION, nodes=nodes, schedule=[list(entry) for entry in schedule])


def started(round_: Round) -> tuple[spec.Arm, ...]:
    """The arms the round starts again (the others keep serving as they are)."""
    if round_.probe is not None:
        return ()
    if round_.name == CROSSOVER:
        return tuple(spec.Arm)
    moved = round_.nodes is not None and round_.nodes.control is not None
    return tuple(spec.Arm) if moved else (spec.Arm.TREATMENT,)


def node(round_: Round, arm: spec.Arm) -> str | None:
    """The node `arm` is pinned to in the round (None: not pinned)."""
    return getattr(round_.nodes, arm.value) if round_.nodes is not None else None


def arm_spec(s: spec.ExperimentSpec, round_: Round) -> spec.ExperimentSpec:
    """The spec the round's arms are rendered from (the confirmation's treatment runs the schedule)."""
    if round_.name == CONFIRMATION and round_.schedule is not None:
        return confirm.treatment_spec(s, round_.schedule)
    return s


def load_spec(s: spec.ExperimentSpec, round_: Round) -> spec.ExperimentSpec:
    """The spec the round's load Job plans from and the round is judged by: a probe's one stage
    (`search.probe_spec`, with the stages' sequential stopping, as any stage); the crossover's
    fraction of each stage; the confirmation's schedule. Those two at a fixed horizon (no early stop:
    they check a result rather than search for one)."""
    # A round is not a new experiment: no round of its own (the confirmation's schedule is the
    # treatment's, which validation refuses beside `confirm`).
    off: dict[str, object] = {"crossover": spec.Crossover.OFF, "confirm": False}
    stage = probe_stage(s, round_)
    if stage is not None:
        checked = search.probe_spec(s, stage)
    else:
        checked = crossover.swapped_spec(s) if round_.name == CROSSOVER else arm_spec(s, round_)
        off["sequential"] = False
    return checked.model_copy(update={"analysis": checked.analysis.model_copy(update=off)})


def placements(environment: Environment | None, round_: Round) -> list[CrossoverPlacement]:
    """`status.crossover.rounds`: the stages' placement, then the swapped one."""
    return [first_nodes(environment), round_.nodes or CrossoverPlacement()]


def describe(s: spec.ExperimentSpec, round_: Round) -> str:
    """One line for status.message while the round deploys (a probe: while it runs)."""
    stage = probe_stage(s, round_)
    if stage is not None:
        return f"search: probe {round_.probe} at {stage.load_label}"
    if round_.name == CROSSOVER and round_.nodes is not None:
        return (
            f"crossover: the arms swap nodes (control on {round_.nodes.control}, treatment on "
            f"{round_.nodes.treatment}) for a shorter repeat of the stages"
        )
    return (
        f"confirmation: the treatment restarts with num_speculative_tokens_per_batch_size="
        f"{round_.schedule} for the stages again"
    )
