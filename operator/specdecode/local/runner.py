"""`specdecode run FILE --local`'s run: the whole experiment on one machine, with the operator's pipeline.

validate -> start both arms (simulator, local vLLM, or given URLs) -> wait for /health -> load (the
load generator, with sequential stopping) -> server-side metrics (each arm's /metrics at stage
boundaries, or Prometheus when `spec.prometheus.url` is set) -> verdict -> `DIR/result.json`,
`DIR/requests.jsonl`, `DIR/report.html`.

The phases are the operator's: `local/lifecycle.py` drives `reconcile.decide` with this run as its
world (`_Run`), so phases, deadlines, failure reasons, conditions and events are the resource's, and
so are the rounds after the stages (`rounds.py`), each through Deploying, Running and Analyzing again
and listed in `status.rounds`: the search's probes (`workload.search`, arms side by side), the
crossover's swapped round (`analysis.crossover`: the arms' GPUs swapped, into `DIR/crossover/`) and
the confirmation round (`analysis.confirm`, arms started here: the treatment restarted with the
recommended `num_speculative_tokens_per_batch_size`, the stages again against the control, same plan
and salt, so the same prompts and schedule, no early stop, into `DIR/confirmation/`; one GPU: the
treatment alone, paired with the control's first-round requests; `confirm.py` judges it into
`status.recommendation`). A round that fails, or a confirmation round interrupted, ends the round,
not the run: the stages' verdict stands, the round's check marked as not done. The rounds are
folded into the verdict by the core's fold, as the operator folds them (`judging.py`).

`spec.deadlines.run` holds as in the cluster: a load still running when its phase's deadline passes
is stopped (`load.py`) and the core fails the run `RunDeadlineExceeded` (a round: the round), the
stages finished before it kept in `status.stages`, as the operator keeps them.

Whatever happens, every process started here is stopped (`engines.py`), and what was measured
stays in DIR: a crash, an arm that answers only errors, Ctrl-C, SIGTERM or SIGHUP writes `result.json` with
phase Failed and the cause (exit 3; 130 on Ctrl-C, SIGTERM or SIGHUP; `command.py`).

One GPU (vLLM with GPUs for one arm only): control alone, stopped, then treatment alone, on the same
prompts and schedule (same plan, same salt); each load writes `DIR/load-<arm>/`, and DIR gets the
same files as the paired run: `requests.jsonl` (both arms), `windows.json` (one window per stage with
each arm's own server metrics; each arm's own windows and clock anchor under `arms`). The treatment's
sequential stopping sees the control's records of the stage. Pairs were not simultaneous: the status
message says so and `status.validity.simultaneous` is false.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from specdecode import exit_status
from specdecode.experiment import (
    conditions,
    crossover,
    documents,
    judgement,
    placement,
    reconcile,
    records,
    releases,
    rounds,
    search,
    spec,
    status,
    validity,
    verdict,
)
from specdecode.experiment.status import ExperimentStatus, Phase
from specdecode.loadgen import plan as plan_mod
from specdecode.loadgen import runner
from specdecode.local import arms as arm_facts
from specdecode.local import engines, files, gpus, judging, lifecycle, restarts, view
from specdecode.local import load as watching
from specdecode.report import results

EXPERIMENT_FILE = "experiment.yaml"
#: The swapped round's load (`analysis.crossover`): DIR/crossover/requests.jsonl, windows.json, ...
CROSSOVER_DIR = "crossover"
#: `analysis.confirm`: the confirmation round's load (requests.jsonl, windows.json) under DIR
CONFIRMATION_DIR = "confirmation"
GENERATION = 1
"""A local run measures one spec: its status is generation 1's, as a new resource's."""
_arm_host = arm_facts.arm_host  # an arm's host, by the name it had here


@dataclass(frozen=True)
class Options:
    """How to run."""

    out: Path
    control_url: str | None = None
    treatment_url: str | None = None
    fail_on_reject: bool = False
    mode: str = "live"
    """live (rich), quiet (a line per stage) or json (JSON lines on stdout)."""


class _Run:
    """One local run: the world `lifecycle.drive` observes and acts on (`lifecycle.World`).

    The phases are the core's (`reconcile.decide`): CreateArms starts both arms and waits for their
    `/health` (given URLs: attaches to them; one GPU: nothing yet, the load starts each arm in its
    turn; a round: the arms it starts again), CreateLoad runs the load (the stages', or the round's),
    and the run is judged when the core is Analyzing. CleanupArms and ReleaseArms are carried out
    when the run ends: `engines.Engines` stops every arm then.
    """

    def __init__(self, experiment: documents.Experiment, options: Options, show: view.View) -> None:
        self.experiment = experiment
        self.spec = experiment.spec
        self.subject = reconcile.Subject(name=experiment.name, generation=GENERATION, spec=experiment.spec)
        self.options = options
        self.view = show
        self.out = options.out
        self.records: list[records.RequestRecord] = []
        self.windows: list[records.StageWindow] = []
        self.validity: validity.Validity | None = None
        self.loads: dict[spec.Arm, runner.RunResult] = {}
        """One GPU: each arm's own load (its windows and clock anchor)."""
        self.release: releases.Release | None = None
        self.hosts: dict[spec.Arm, status.Host] = {}
        self.environment: status.Environment | None = None
        """What was measured and where (the arms' hosts), once the arms serve."""
        self.gpus: dict[spec.Arm, str] = {}
        """Side by side on GPUs: each arm's GPUs (its placement, which the crossover swaps)."""
        self.finished: dict[spec.Arm, set[str]] = {}
        """Per arm: the stages its load finished (an interruption keeps those both arms finished)."""
        self.arms: engines.Engines | None = None
        self.in_turn = False
        """The arms run one after the other (GPUs for one arm only): the load starts each in its turn."""
        self.created: set[str | None] = set()
        """The stages (None) and rounds whose arms were started (once each: a failure is not retried)."""
        self.loaded: set[str | None] = set()
        """The stages (None) and rounds whose load ran to its end."""
        self.round_of: dict[spec.Arm, str] = {}
        """The round each arm's process was started again for (`rounds.started`)."""
        self.overrun: set[str | None] = set()
        """The stages (None) and rounds whose load ran past `spec.deadlines.run` and was stopped."""
        self.deadline: float | None = None
        """When the load in progress must end (`time.monotonic()`): its phase's `spec.deadlines.run`."""
        self.measured: dict[str, judgement.Measurement] = {}
        """What each round measured, by round name."""
        self.swapped: status.CrossoverPlacement | None = None
        """The crossover's swapped placement, as the arms reported it once started there."""
        self.first: verdict.Analysis | None = None
        """The stages judged (once: the rounds after them fold into it)."""
        self.told = judging.Told()
        """What the view was told of the rounds."""
        self.interruption: str | None = None
        """How the run was interrupted during the confirmation round (the round is then not run)."""
        self.analysis: reconcile.Judgement | reconcile.CollectFailure | None = None
        self.judged_for: tuple[tuple[str, str | None], ...] | None = None
        """The rounds (name, outcome) `analysis` was judged with: a round ended since is judged again."""
        self.current = ExperimentStatus()
        """The status the core decided last (an interruption ends the run from it)."""
        self.written: ExperimentStatus | None = None
        """The status last written to result.json (its conditions' transition times carry over)."""
        self.written_for: ExperimentStatus | None = None
        """The status `written` was written for."""

    # ------------------------------------------------------------------------------------- phases

    def execute(self) -> ExperimentStatus:
        with engines.Engines(self.spec, self.out / "logs") as arms:
            self.arms = arms
            return self._write(self._overrun(lifecycle.drive(self.subject, self)))

    # --------------------------------------------------------------------- lifecycle.World

    def observe(self, current: ExperimentStatus) -> reconcile.Observed:
        """The arms' processes (or given servers), the load, and in Analyzing the judged results."""
        judged = tuple((r.name, r.outcome) for r in current.rounds)
        if current.phase is Phase.ANALYZING and self.judged_for != judged and self.arms is not None:
            with _engine_failures():
                self.analysis = self._judgement(self.arms, current)
            self.judged_for = judged
        round_ = rounds.current(current)
        name = round_.name if round_ is not None else None
        loaded = name in self.loaded
        # A load stopped at its deadline is a Job still running: the core fails it, as the operator's.
        job = reconcile.JobState(exists=loaded or name in self.overrun, succeeded=loaded)
        return reconcile.Observed(
            arms={arm: self._arm_state(arm) for arm in spec.Arm},
            job=job,
            # its report: rendered when stored (STORE_REPORT), from the decided status
            analysis=_reported(self.analysis) if current.phase is Phase.ANALYZING else None,
            environment=self.environment,
        )

    def carry_out(self, action: reconcile.Action, decided: ExperimentStatus) -> None:
        """CreateArms and CreateLoad once each for the stages and for each round (they block until
        done); StoreReport writes result.json and the report of the decided status; DeleteLoad is
        done (a load has ended before the next tick); the rest at the run's end. (KeepFinishedStages
        is never asked: the load runs to its end inside CreateLoad, and an interrupted one keeps its
        stages itself, `interrupted`.)"""
        if action is reconcile.Action.STORE_REPORT:
            self._write(decided)
            return
        arms = self.arms
        round_ = rounds.current(decided)
        name = round_.name if round_ is not None else None
        if arms is None:
            return
        with _engine_failures():
            if action is reconcile.Action.CREATE_ARMS and name not in self.created:
                self.created.add(name)
                if round_ is None:
                    self._create_arms(arms)
                else:
                    self._round_arms(arms, round_)
            elif action is reconcile.Action.CREATE_LOAD and name not in self.loaded | self.overrun:
                self.deadline = watching.deadline_of(self.spec, decided)
                try:
                    if round_ is None:
                        self._run_load(arms)
                    else:
                        self._round_load(arms, round_)
                except watching.DeadlinePassed:
                    self.overrun.add(name)
                    return
                finally:
                    self.deadline = None
                self.loaded.add(name)

    def decided(self, decision: reconcile.Decision) -> None:
        """Keeps the status; shows the core's warnings on the way (a weak design, differing hosts)."""
        self.current = decision.status
        if not decision.status.phase.is_terminal:
            for event in decision.events:
                if event.type == "Warning":
                    self.view.message(f"warning: {event.message}")

    def _arm_state(self, arm: spec.Arm) -> reconcile.ArmState:
        """An arm as the core sees a Deployment (`arms.arm_state`)."""
        state = self.arms.arms.get(arm) if self.arms is not None else None
        return arm_facts.arm_state(arm, state, in_turn=self.in_turn, round_name=self.round_of.get(arm))

    def _create_arms(self, arms: engines.Engines) -> None:
        """Both arms started and healthy (given URLs: attached); one GPU: checked, started in turn later."""
        if self.options.control_url and self.options.treatment_url:
            arms.attach(
                {spec.Arm.CONTROL: self.options.control_url, spec.Arm.TREATMENT: self.options.treatment_url}
            )
        elif (kind := engines.engine_kind(self.spec)) == "vllm" and (
            problems := self._use_local_release(arms)
        ):
            raise lifecycle.Failure("InvalidSpec", "; ".join(problems))
        elif kind == "simulator" or engines.gpu_count() >= 2 * gpus.per_arm(self.spec):
            split = gpus.split(self.spec)
            for arm in spec.Arm:
                arms.start(arm, gpus=split.get(arm))
                self.view.message(f"started the {arm.value} arm: {' '.join(arms.arms[arm].argv)}")
            arms.wait_healthy(self.spec.deadlines.deploy_seconds)
            self.gpus = dict(split)
        else:
            self.view.message(gpus.one_arm_at_a_time(self.spec))
            self.in_turn = True
            return
        self._record_hosts(arms, self.gpus)

    def _run_load(self, arms: engines.Engines) -> None:
        """The stages' load (one GPU: each arm in its turn)."""
        if self.in_turn:
            self._load_one_after_the_other(arms)
            return
        endpoints = {arm: runner.Endpoint(state.url) for arm, state in arms.arms.items()}
        self._load(arms, endpoints)

    def _use_local_release(self, arms: engines.Engines) -> list[str]:
        """Render for the local vLLM's release unless the spec names one; its rules' problems."""
        self.release, self.spec, problems = gpus.local_release(self.spec)
        arms.release = self.release
        self.view.message(f"vLLM release: {self.release.describe()}")
        return problems

    def _load_one_after_the_other(self, arms: engines.Engines) -> None:
        """One GPU (or GPUs for one arm only): each arm alone, on the same prompts and the same schedule."""
        alone = ",".join(str(i) for i in range(gpus.per_arm(self.spec)))
        (self.out / "requests.jsonl").unlink(missing_ok=True)
        for arm in spec.Arm:
            started = arms.start(arm, gpus=alone)
            self.view.message(f"started the {arm.value} arm: {' '.join(started.argv)}")
            arms.wait_healthy(self.spec.deadlines.deploy_seconds, [arm])
            self._record_hosts(arms, {arm: alone})
            self.loads[arm] = self._load(arms, {arm: runner.Endpoint(started.url)}, suffix=f"-{arm.value}")
            # DIR/windows.json after each arm, so that a failure of the treatment keeps the control's
            control, treatment = self.loads[spec.Arm.CONTROL], self.loads.get(spec.Arm.TREATMENT)
            self.windows = files.merged_windows(control.windows, treatment.windows if treatment else [])
            files.write_windows(self.out, control.anchor, self.windows, self.loads)
            left = arms.stop(arm)
            if left:
                raise engines.EngineError(
                    f"the {arm.value} arm's processes {left} survived SIGKILL; the GPU may still be in use"
                )
        self.validity = validity.merged(
            *(self.loads[arm].validity for arm in (spec.Arm.CONTROL, spec.Arm.TREATMENT))
        )

    def _load(
        self, arms: engines.Engines, endpoints: dict[spec.Arm, runner.Endpoint], suffix: str = ""
    ) -> runner.RunResult:
        out = self.out if not suffix else self.out / f"load{suffix}"
        # One GPU: the treatment's sequential looks pair it with the control measured before it.
        earlier = [r for r in self.records if not r.warmup]
        try:
            result = self._run_round(self.spec, endpoints, out, arms, self._stop_rule(earlier))
        finally:
            # what was measured is kept, also when the load ended by a crash or Ctrl-C
            self.records.extend(files.read_records(out))
            if suffix and (out / "requests.jsonl").exists():  # one requests.jsonl in DIR, as when paired
                with exit_status.writing_results(self.out), (self.out / "requests.jsonl").open("a") as sink:
                    sink.write((out / "requests.jsonl").read_text())
        self.windows.extend(result.windows)
        self.validity = result.validity
        watching.errors_only(self.records, endpoints)
        return result

    def _run_round(
        self,
        round_spec: spec.ExperimentSpec,
        endpoints: dict[spec.Arm, runner.Endpoint],
        out: Path,
        arms: engines.Engines,
        decided: Callable[[str, Sequence[records.RequestRecord]], bool],
    ) -> runner.RunResult:
        """One load round of `round_spec`'s stages under the live view, into `out`. Every round (the stages,
        a search probe, the crossover's swapped round, the confirmation) is planned with the same salt, so
        the same stage gets the same prompts on the same schedule in each."""
        plan = plan_mod.plan_from_spec(
            round_spec,
            self.experiment.source.parent if self.experiment.source else Path.cwd(),
            scrape_metrics=True,
            salt=f"{self.spec.engine.seed}-local",
        )
        self.view.start()
        try:
            return asyncio.run(
                watching.watched(
                    plan,
                    endpoints,
                    out,
                    arms,
                    decided,
                    self._progress(endpoints),
                    urls_given=self.options.control_url is not None,
                    deadline=self.deadline,
                )
            )
        finally:
            self.view.stop()

    def _progress(self, endpoints: Mapping[spec.Arm, runner.Endpoint]) -> runner.Progress:
        """The load's progress to the view, noting the stages each arm finished."""

        def progress(event: runner.ProgressEvent) -> None:
            if isinstance(event, runner.StageFinished):
                for arm in endpoints:
                    self.finished.setdefault(arm, set()).add(event.stage)
            self.view(event)

        return progress

    def _stop_rule(
        self, earlier: Sequence[records.RequestRecord] = ()
    ) -> Callable[[str, Sequence[records.RequestRecord]], bool]:
        """The load generator's sequential stopping, feeding the live view (`load.stop_rule`)."""
        return watching.stop_rule(self.spec, self.view, earlier)

    def _judgement(
        self, arms: engines.Engines, current: ExperimentStatus
    ) -> reconcile.Judgement | reconcile.CollectFailure:
        """The run judged as the core's Analyzing takes it: every round measured so far folded in by
        the core's fold, as the operator folds them (`experiment/judgement.py`), and the next round
        if one is owed; or why no verdict (Failed)."""
        first = self._stages()
        notes = [judging.ONE_AFTER_THE_OTHER] if self.loads else []
        measured = first.verdict
        if measured is None:
            return reconcile.CollectFailure(
                str(first.reason),
                "; ".join([first.message, *notes]),
                stages=first.stages,
                speedup_summary=first.speedup_summary,
                validity=self.validity,
            )
        control = self.loads.get(spec.Arm.CONTROL)
        first_control = (
            judgement.Measurement(
                [r for r in self.records if r.arm == spec.Arm.CONTROL], control.windows, control.validity
            )
            if control is not None
            else None
        )
        inputs = judgement.Measured(
            rounds=judging.rounds_read(
                current,
                self.measured,
                swapped=self.swapped,
                first_control=first_control,
                interruption=self.interruption,
            ),
            environment=self.environment,
            placement=judging.placement(
                current,
                servers_given=self.options.control_url is not None,
                one_gpu=bool(self.loads),
                gpus=self.gpus,
                hosts=self.hosts,
                swapped=self.swapped,
            ),
            one_after_the_other=self.in_turn,
            arms_given=self.options.control_url is not None,
            notes=notes,
        )
        folded = judgement.fold(self.spec, current, first, inputs)
        if isinstance(folded, reconcile.CollectFailure):
            return folded
        self.told.tell(self.view, folded)
        analysis = folded.analysis
        return reconcile.Judgement(
            verdict=analysis.verdict or measured,
            reason=str(analysis.reason),
            message=folded.message,
            stages=analysis.stages,
            recommendation=folded.recommendation,
            noise_floor=analysis.noise_floor,
            crossover=folded.crossover,
            search=folded.search,
            speedup_summary=analysis.speedup_summary,
            validity=self.validity,
            environment=self.environment,
            results_ref=self._results_ref(),
            degradations=arm_facts.weakened(arms),
            next_round=folded.next_round,
        )

    def _search_result(self) -> status.SearchResult | None:
        """The search as the arms one after the other leave it (`judgement.unpaired`; None: no search)."""
        wanted = self.spec.workload.search
        return judgement.unpaired(wanted) if wanted is not None else None

    def _stages(self) -> verdict.Analysis:
        """The stages judged (once), their windows with Prometheus' figures when it is set."""
        if self.first is None:
            if self.spec.prometheus is not None:
                self.windows = files.prometheus_windows(
                    self.spec,
                    self.out,
                    self.windows,
                    self.loads,
                    namespace=self.experiment.namespace,
                    name=self.experiment.name,
                )
            self.first = verdict.analyse(self.spec, self.records, self.windows, validity=self.validity)
        return self.first

    # ------------------------------------------------------------------------------------- rounds

    def _round_arms(self, arms: engines.Engines, round_: status.Round) -> None:
        """The arms the round starts again, healthy (`restarts.py`)."""
        one_gpu = bool(self.loads)
        swapped = restarts.restart(
            arms, round_, self.spec, placed=self.gpus, one_gpu=one_gpu, round_of=self.round_of, show=self.view
        )
        if swapped is not None:
            self.swapped = swapped

    def _round_load(self, arms: engines.Engines, round_: status.Round) -> None:
        """The round's load, kept by its name for the judging: a probe's one paired stage (with the
        stages' sequential stopping) into DIR/load-<probe>/; the crossover's swapped round into
        DIR/crossover/ and the confirmation's into DIR/confirmation/, both without early stop."""
        endpoints = {arm: runner.Endpoint(s.url) for arm, s in arms.arms.items() if not s.stopped}
        stage = rounds.probe_stage(self.spec, round_)
        if stage is not None:
            self.view.message(rounds.describe(self.spec, round_))
            main_spec, main_validity, before = self.spec, self.validity, len(self.records)
            self.spec = search.probe_spec(main_spec, stage)
            try:
                result = self._load(arms, endpoints, suffix=f"-{stage.name}")
            finally:
                self.spec, self.validity = main_spec, main_validity
            self.measured[round_.name] = judgement.Measurement(
                self.records[before:], result.windows, result.validity
            )
            return
        if round_.name == rounds.CROSSOVER:
            second, out = crossover.swapped_spec(self.spec), self.out / CROSSOVER_DIR
        else:
            second, out = rounds.arm_spec(self.spec, round_), self.out / CONFIRMATION_DIR

        def decided(stage: str, recs: Sequence[records.RequestRecord]) -> bool:
            self.view.note_speedup(stage, list(recs))
            return False

        result = self._run_round(second, endpoints, out, arms, decided)
        found = files.read_records(out)  # the confirmation pairs its warm-up as the first round's
        self.measured[round_.name] = judgement.Measurement(
            [r for r in found if not r.warmup] if out.name == CROSSOVER_DIR else found,
            result.windows,
            result.validity,
        )

    # ------------------------------------------------------------------------------------ results

    def interrupted(self, how: str) -> ExperimentStatus:
        """Ctrl-C, SIGTERM or SIGHUP: Failed with what was measured kept, or, during the confirmation
        round, the verdict reached without it: the round ends (RoundFailed) as the core ends a round
        that fails, and the stages are judged without it."""
        round_ = rounds.current(self.current)
        if round_ is None or round_.name != rounds.CONFIRMATION:
            return self._interrupted_in_stages(how)
        self.interruption = how
        fault = reconcile.Fault("Interrupted", how, permanent=True)
        ended = reconcile.decide_after_fault(self.subject, self.current, fault, datetime.now(UTC))
        return self._write(lifecycle.drive(self.subject, self, current=ended.status))

    def failed(self, reason: str, message: str) -> ExperimentStatus:
        """Failed (could not measure) as the core ends a run on a fault it cannot retry, from the
        phase the run was in (a round in progress ends first); what was measured is kept in DIR."""
        if not self.records:
            self.records = files.read_records(self.out)
        now = datetime.now(UTC)
        current = self.current
        fault = reconcile.Fault(reason, message, permanent=True)
        if current.observed_generation != GENERATION:  # before the first tick: as the core starts it
            current = reconcile.decide(self.subject, current, reconcile.Observed(), now).status
        if rounds.current(current) is not None:  # the round ends, then the run
            current = reconcile.decide_after_fault(self.subject, current, fault, now).status
        return self._write(reconcile.decide_after_fault(self.subject, current, fault, now).status)

    def _interrupted_in_stages(self, how: str) -> ExperimentStatus:
        """Interrupted before a verdict: Failed, keeping the stages both arms finished before it (their
        statistics in `stages`, as a cluster run that fails during the load keeps them)."""
        kept = self._finished_stages()
        if not kept:
            return self.failed(
                "Interrupted", f"{how} before any stage finished; the requests so far are kept"
            )
        self.current = self.current.model_copy(update={"stages": kept})
        return self.failed(
            "Interrupted",
            f"{how}; the {len(kept)} of {len(self.spec.workload.stages)} stage(s) finished before that "
            f"({', '.join(s.name for s in kept)}) are kept in result.json and the report",
        )

    def _overrun(self, final: ExperimentStatus) -> ExperimentStatus:
        """A run whose stages' load failed keeps the stages measured before that, as the operator's
        does: past `spec.deadlines.run` (`RunDeadlineExceeded`, from the core), or an arm lost or
        crashed during it (`ArmLost`, `EngineCrashed`)."""
        overran = final.reason == "RunDeadlineExceeded" and None in self.overrun
        if not (overran or final.reason in LOAD_FAULTS) or final.stages:
            return final
        kept = self._finished_stages()
        if not kept:
            return final
        message = (
            f"{final.message}; the {len(kept)} of {len(self.spec.workload.stages)} stage(s) measured "
            f"before that ({', '.join(s.name for s in kept)}) are kept in result.json and the report"
        )
        return final.model_copy(update={"stages": kept, "message": message})

    def _finished_stages(self) -> list[status.StageResult]:
        """The stages both arms finished in a load cut short, judged from what it left in DIR (their
        windows become the run's); none when no stage finished."""
        done = {s.name for s in self.spec.workload.stages}
        for arm in spec.Arm:
            done &= self.finished.get(arm, set())
        if not done:
            return []
        if not self.records:
            self.records = files.read_records(self.out)
        windows, block = files.windows_so_far(self.out, self.loads)
        analysis = verdict.analyse(self.spec, self.records, windows, validity=block)
        self.windows = [w for w in windows if w.stage in done]
        return [s for s in analysis.stages if s.name in done]

    def _write(self, final: ExperimentStatus) -> ExperimentStatus:
        """result.json and the report of `final`, the status the core decided (or one changed after
        it: the confirmation round's outcome, an interruption), its conditions brought up to date;
        once per status (StoreReport wrote the one the run ends with)."""
        if self.written is not None and final == self.written_for:
            return self.written
        self.written_for = final
        if final.results_ref is None:
            final = final.model_copy(update={"results_ref": self._results_ref()})
        final = conditions.with_conditions(
            final, GENERATION, datetime.now(UTC), previous=self.written or final
        )
        self.written = final
        with exit_status.writing_results(self.out):
            results.write_results(
                self.out,
                final,
                self.records,
                self.windows,
                self.spec,
                name=self.experiment.name,
                write_inputs=False,
            )
        return final

    def _results_ref(self) -> status.ResultsRef:
        return status.ResultsRef(directory=str(self.out))

    def _record_hosts(self, arms: engines.Engines, gpus: Mapping[spec.Arm, str]) -> None:
        """Where the serving arms run (each recorded once), into the environment; says when the hosts differ."""
        self.environment = arm_facts.environment_of(
            arms, self.hosts, gpus, self.spec, self.release or releases.resolve(self.spec.engine)
        )
        warning = placement.warning(self.environment)
        if warning is not None and self.in_turn:  # side by side, the core warns as the load starts
            self.view.message(f"warning: {warning}")


#: failures of an arm during the stages' load, after which the stages it finished are kept
LOAD_FAULTS = frozenset({"ArmLost", "EngineCrashed"})


def _reported(
    analysis: reconcile.Judgement | reconcile.CollectFailure | None,
) -> reconcile.Judgement | reconcile.CollectFailure | None:
    """A judgement with its report to store: rendered by `_Run._write` from the decided status."""
    if isinstance(analysis, reconcile.Judgement):
        return dataclasses.replace(analysis, report=reconcile.Report())
    return analysis


@contextlib.contextmanager
def _engine_failures() -> Iterator[None]:
    """An arm that could not start or be stopped (`engines.EngineError`): the run's EngineUnavailable."""
    try:
        yield
    except engines.EngineError as exc:
        raise lifecycle.Failure("EngineUnavailable", str(exc)) from None
