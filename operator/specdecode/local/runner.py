"""`specdecode run FILE --local`: the whole experiment on one machine, with the operator's pipeline.

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
not the run: the stages' verdict stands, the round's check marked as not done.

Whatever happens, every process started here is stopped (`engines.py`), and what was measured
stays in DIR: a crash, an arm that answers only errors, Ctrl-C, SIGTERM or SIGHUP writes `result.json` with
phase Failed and the cause (exit 3; 130 on Ctrl-C, SIGTERM or SIGHUP).

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
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import yaml
from rich.console import Console

from specdecode import exit_status
from specdecode.experiment import (
    conditions,
    confirm,
    crossover,
    degradations,
    documents,
    kvcache,
    placement,
    recommendation,
    reconcile,
    records,
    releases,
    rounds,
    search,
    spec,
    speculative_rules,
    status,
    validation,
    validity,
    verdict,
)
from specdecode.experiment.status import ExperimentStatus, Phase
from specdecode.loadgen import plan as plan_mod
from specdecode.loadgen import runner, workload
from specdecode.local import engines, hosts, lifecycle, view
from specdecode.report import results, terminal
from specdecode.sources import prometheus

EXPERIMENT_FILE = "experiment.yaml"
#: The swapped round's load (`analysis.crossover`): DIR/crossover/requests.jsonl, windows.json, ...
CROSSOVER_DIR = "crossover"
#: `analysis.confirm`: the confirmation round's load (requests.jsonl, windows.json) under DIR
CONFIRMATION_DIR = "confirmation"
_LOOPBACK = {"localhost", "127.0.0.1", "::1"}
GENERATION = 1
"""A local run measures one spec: its status is generation 1's, as a new resource's."""
ONE_AFTER_THE_OTHER = (
    "the arms ran one after the other (too few GPUs for both) on the same prompts and schedule, "
    "so pairs were not simultaneous"
)


@dataclass(frozen=True)
class Options:
    """How to run."""

    out: Path
    control_url: str | None = None
    treatment_url: str | None = None
    fail_on_reject: bool = False
    mode: str = "live"
    """live (rich), quiet (a line per stage) or json (JSON lines on stdout)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP to the runner: handled as Ctrl-C (the arms are stopped, the results so far kept)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signal = signal.Signals(signum).name


class ArmFailure(lifecycle.Failure):
    """An arm stopped serving during the run."""


def run(path: Path, options: Options) -> int:
    """Run one experiment file; returns the exit status of design.md §4. Error lines are printed whole
    (soft-wrapped): a log keeps each on one line, a path and its line number together."""
    console = terminal.console(stderr=True)
    try:
        experiment = documents.load_experiment(path)
    except (validation.InvalidSpecError, documents.UnreadableFileError) as exc:
        problems = exc.problems if isinstance(exc, validation.InvalidSpecError) else [exc]
        for problem in problems:
            console.print(str(problem).removeprefix(": "), markup=False, highlight=False, soft_wrap=True)
        return exit_status.INVALID
    if (options.control_url is None) != (options.treatment_url is None):
        console.print("give both --control-url and --treatment-url, or neither", markup=False, soft_wrap=True)
        return exit_status.INVALID
    try:  # a bad prompt file or trace is invalid input: say so before any arm starts
        plan_mod.plan_from_spec(
            experiment.spec, experiment.source.parent if experiment.source else Path.cwd(), salt="check"
        )
    except workload.DatasetError as exc:
        console.print(str(exc), markup=False, highlight=False, soft_wrap=True)
        return exit_status.INVALID
    out = options.out
    exit_status.prepare_results_directory(out)  # before any arm starts (ResultsUnwritable: exit 3)
    with exit_status.writing_results(out):
        (out / EXPERIMENT_FILE).write_text(yaml.safe_dump(experiment.document, sort_keys=False))
    show = view.make_view(options.mode)
    run_ = _Run(experiment, options, show)
    try:
        with _sigterm_interrupts():
            final = run_.execute()
    except KeyboardInterrupt as exc:
        how = (
            f"stopped by {exc.signal}" if isinstance(exc, Terminated) else "interrupted by the user (Ctrl-C)"
        )
        final = run_.interrupted(how)
        _finish(console, options, final, out, run_.spec)
        return exit_status.INTERRUPTED
    finally:
        show.stop()
    return _finish(console, options, final, out, run_.spec)


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM and SIGHUP (the terminal closed) raise `Terminated`, so that the arms are stopped as on
    Ctrl-C: they run in sessions of their own, so nothing else would stop them (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, _frame: object) -> None:
        raise Terminated(signum)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _finish(
    console: Console, options: Options, final: ExperimentStatus, out: Path, experiment: spec.ExperimentSpec
) -> int:
    if options.mode != "json":
        console.print(terminal.render_terminal(final, require_stages=experiment.analysis.require_stages))
        console.print(f"report: {out / results.REPORT}", markup=False, highlight=False, soft_wrap=True)
    else:
        print(final.model_dump_json(by_alias=True, exclude_none=True))
    if final.phase is Phase.FAILED:
        return exit_status.FAILED
    if options.fail_on_reject and final.verdict is not status.Verdict.PROMOTE:
        return exit_status.REJECTED
    return exit_status.OK


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
        self.measured: dict[str, tuple[list[records.RequestRecord], runner.RunResult]] = {}
        """Each round's measured records and load result, by round name."""
        self.swapped: status.CrossoverPlacement | None = None
        """The crossover's swapped placement, as the arms reported it once started there."""
        self.first: verdict.Analysis | None = None
        """The stages judged (once: the rounds after them fold into it)."""
        self.shown: set[str] = set()
        """The probes whose verdict the view was told."""
        self.search_told = False
        """The view was told where the search ended."""
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
            return self._write(lifecycle.drive(self.subject, self))

    # --------------------------------------------------------------------- lifecycle.World

    def observe(self, current: ExperimentStatus) -> reconcile.Observed:
        """The arms' processes (or given servers), the load, and in Analyzing the judged results."""
        judged = tuple((r.name, r.outcome) for r in current.rounds)
        if current.phase is Phase.ANALYZING and self.judged_for != judged and self.arms is not None:
            with _engine_failures():
                self.analysis = self._judgement(self.arms, current)
            self.judged_for = judged
        round_ = rounds.current(current)
        loaded = (round_.name if round_ is not None else None) in self.loaded
        return reconcile.Observed(
            arms={arm: self._arm_state(arm) for arm in spec.Arm},
            job=reconcile.JobState(exists=loaded, succeeded=loaded),
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
            elif action is reconcile.Action.CREATE_LOAD and name not in self.loaded:
                if round_ is None:
                    self._run_load(arms)
                else:
                    self._round_load(arms, round_)
                self.loaded.add(name)

    def decided(self, decision: reconcile.Decision) -> None:
        """Keeps the status; shows the core's warnings on the way (a weak design, differing hosts)."""
        self.current = decision.status
        if not decision.status.phase.is_terminal:
            for event in decision.events:
                if event.type == "Warning":
                    self.view.message(f"warning: {event.message}")

    def _arm_state(self, arm: spec.Arm) -> reconcile.ArmState:
        """An arm as the core sees a Deployment: one pod, Ready once it answered `/health`."""
        state = self.arms.arms.get(arm) if self.arms is not None else None
        if state is None or state.stopped:
            if not self.in_turn:
                return reconcile.ArmState()
            # Each arm starts in its turn during the load: nothing to wait for before it.
            return reconcile.ArmState(
                exists=True, ready_replicas=1, pods=(reconcile.PodState(arm.value, "Running", ready=True),)
            )
        name = f"{arm.value}-{state.process.pid}" if state.process is not None else state.url
        code = state.exit_code()
        if code is not None:
            died = reconcile.PodState(
                name, "Failed", last_terminated_reason=f"exit {code}", last_exit_code=code
            )
            return reconcile.ArmState(exists=True, pods=(died,))
        serving = reconcile.PodState(name, "Running", ready=True, round=self.round_of.get(arm))
        return reconcile.ArmState(exists=True, ready_replicas=1, pods=(serving,))

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
        elif kind == "simulator" or engines.gpu_count() >= 2 * self._gpus_per_arm():
            gpus = self._gpu_split()
            for arm in spec.Arm:
                arms.start(arm, gpus=gpus.get(arm))
                self.view.message(f"started the {arm.value} arm: {' '.join(arms.arms[arm].argv)}")
            arms.wait_healthy(self.spec.deadlines.deploy_seconds)
            self.gpus = dict(gpus)
        else:
            self._check_gpus_for_one_arm()
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

    def _gpus_per_arm(self) -> int:
        """GPUs one vLLM arm uses: its tensor-parallel size."""
        return max(1, validation.target_tensor_parallel(self.spec.engine.args) or 1)

    def _use_local_release(self, arms: engines.Engines) -> list[str]:
        """Render for the local vLLM's release (`vllm --version`) unless the spec names one; its rules' problems."""
        self.release = releases.resolve(self.spec.engine, local=engines.local_vllm_version(), here=True)
        arms.release = self.release
        if self.spec.engine.vllm_version is None and self.release.known:
            # The analysis (e.g. the recommendation) reads the release from the spec.
            engine = self.spec.engine.model_copy(update={"vllm_version": releases.fmt(self.release.version)})
            self.spec = self.spec.model_copy(update={"engine": engine})
        self.view.message(f"vLLM release: {self.release.describe()}")
        problems = speculative_rules.check_speculative(
            self.spec.speculative,
            target_tp=validation.target_tensor_parallel(self.spec.engine.args),
            release=self.release,
        )
        return [str(problem) for problem in problems]

    def _gpu_split(self) -> dict[spec.Arm, str]:
        if self.spec.engine.simulator is not None:
            return {}
        per_arm = self._gpus_per_arm()
        return {arm: ",".join(str(i + n * per_arm) for i in range(per_arm)) for n, arm in enumerate(spec.Arm)}

    def _check_gpus_for_one_arm(self) -> None:
        """One GPU (or GPUs for one arm only): enough for one arm at least (EngineError otherwise)."""
        per_arm, count = self._gpus_per_arm(), engines.gpu_count()
        if count < per_arm:
            raise engines.EngineError(
                f"each arm needs {per_arm} GPUs (--tensor-parallel-size {per_arm} in spec.engine.args) "
                f"but nvidia-smi lists {count}; lower the tensor-parallel size or run where {per_arm} GPUs are"
            )
        self.view.message(
            f"{count} GPU(s) for arms of {per_arm}: the arms run one after the other on the same prompts and schedule"
        )

    def _load_one_after_the_other(self, arms: engines.Engines) -> None:
        """One GPU (or GPUs for one arm only): each arm alone, on the same prompts and the same schedule."""
        gpus = ",".join(str(i) for i in range(self._gpus_per_arm()))
        (self.out / "requests.jsonl").unlink(missing_ok=True)
        for arm in spec.Arm:
            started = arms.start(arm, gpus=gpus)
            self.view.message(f"started the {arm.value} arm: {' '.join(started.argv)}")
            arms.wait_healthy(self.spec.deadlines.deploy_seconds, [arm])
            self._record_hosts(arms, {arm: gpus})
            self.loads[arm] = self._load(arms, {arm: runner.Endpoint(started.url)}, suffix=f"-{arm.value}")
            # DIR/windows.json after each arm, so that a failure of the treatment keeps the control's
            control, treatment = self.loads[spec.Arm.CONTROL], self.loads.get(spec.Arm.TREATMENT)
            self.windows = _merged_windows(control.windows, treatment.windows if treatment else [])
            _write_windows(self.out, control.anchor, self.windows, self.loads)
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
            self.records.extend(_read_records(out))
            if suffix and (out / "requests.jsonl").exists():  # one requests.jsonl in DIR, as when paired
                with exit_status.writing_results(self.out), (self.out / "requests.jsonl").open("a") as sink:
                    sink.write((out / "requests.jsonl").read_text())
        self.windows.extend(result.windows)
        self.validity = result.validity
        self._check_errors_only(endpoints)
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
            return asyncio.run(self._watched(plan, endpoints, out, arms, decided))
        finally:
            self.view.stop()

    async def _watched(
        self,
        plan: plan_mod.Plan,
        endpoints: dict[spec.Arm, runner.Endpoint],
        out: Path,
        arms: engines.Engines,
        stop_rule: Callable[[str, Sequence[records.RequestRecord]], bool],
    ) -> runner.RunResult:
        """The load, cancelled as soon as an arm's process dies or an arm cannot be reached."""

        def progress(event: runner.ProgressEvent) -> None:
            if isinstance(event, runner.StageFinished):
                for arm in endpoints:
                    self.finished.setdefault(arm, set()).add(event.stage)
            self.view(event)

        reach = _Reachability(progress)
        load = asyncio.create_task(runner.run(plan, endpoints, out, stop_rule=stop_rule, progress=reach))
        reach.stop = load.cancel  # at once: refused connections fail hundreds of requests a second
        # After the load too: a dead arm fails its last requests at once, so the load may end first.
        settled: float | None = None
        while settled is None or time.monotonic() < settled:
            if reach.unreachable is not None:
                load.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await load
                arm = reach.unreachable
                flag = f" (--{arm}-url)" if self.options.control_url else ""
                raise ArmFailure(
                    "EngineUnreachable",
                    f"the {arm} arm at {endpoints[arm].url}{flag} cannot be reached: its first "
                    f"{_Reachability.FIRST} requests failed to connect; the load stopped there. Is the "
                    "server running, and is the URL right?",
                )
            crashed = arms.crashed()
            if crashed is not None:
                load.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await load
                raise ArmFailure(
                    "EngineCrashed",
                    f"the {crashed.arm.value} arm exited with status {crashed.exit_code()} during the load; "
                    f"its log ends with:\n{crashed.log_tail()}",
                )
            if load.done():
                settled = settled or time.monotonic() + 0.3
                await asyncio.sleep(0.05)
            else:
                await asyncio.wait({load}, timeout=0.2)
        return load.result()

    def _stop_rule(
        self, earlier: Sequence[records.RequestRecord] = ()
    ) -> Callable[[str, Sequence[records.RequestRecord]], bool]:
        """The load generator's sequential stopping, also feeding the live view's running speed-up.

        `earlier`: records of the other arm measured before this load (one GPU), joined by stage.
        """
        sequential = plan_mod.stop_rule(self.spec)

        def decided(stage: str, recs: Sequence[records.RequestRecord]) -> bool:
            both = [*(r for r in earlier if r.stage == stage), *recs] if earlier else list(recs)
            self.view.note_speedup(stage, both)
            return sequential is not None and sequential(stage, both)

        return decided

    def _check_errors_only(self, endpoints: dict[spec.Arm, runner.Endpoint]) -> None:
        for arm in endpoints:
            mine = [r for r in self.records if r.arm == arm and not r.warmup]
            if mine and not any(r.ok for r in mine):
                classes = sorted({r.error_class or "other" for r in mine})
                example = next((r.error for r in mine if r.error), "")
                raise ArmFailure(
                    "EngineErrors",
                    f"the {arm} arm answered every request with an error ({', '.join(classes)}): {example}",
                )

    def _judgement(
        self, arms: engines.Engines, current: ExperimentStatus
    ) -> reconcile.Judgement | reconcile.CollectFailure:
        """The run judged as the core's Analyzing takes it, every round measured so far folded in as
        the operator folds them (`controller/collect.py`): the search's probes, the crossover's
        swapped round, the confirmation round; and the next round if one is owed (`rounds.py`);
        or why no verdict (Failed)."""
        first = self._stages()
        notes = [ONE_AFTER_THE_OTHER] if self.loads else []
        measured = first.verdict
        if measured is None:
            return reconcile.CollectFailure(
                str(first.reason),
                "; ".join([first.message, *notes]),
                stages=first.stages,
                speedup_summary=first.speedup_summary,
                validity=self.validity,
            )
        found, owed = self._searched(current)
        analysis, checked = first, None
        if owed is None:
            analysis, checked, owed = self._crossed(current, first)
        if found is not None and found.probes:  # the recommendation rests on the probes as well
            probed = recommendation.recommend(self.spec, [*analysis.stages, *found.probes])
            analysis = dataclasses.replace(analysis, recommendation=probed)
        advised = analysis.recommendation
        if owed is None and self.spec.analysis.confirm:
            advised, owed, note = self._confirmed(current, analysis)
            notes += [note] if note else []
        return reconcile.Judgement(
            verdict=analysis.verdict or measured,
            reason=str(analysis.reason),
            message="; ".join([analysis.message, *notes]),
            stages=analysis.stages,
            recommendation=advised,
            noise_floor=analysis.noise_floor,
            crossover=checked,
            search=found,
            speedup_summary=analysis.speedup_summary,
            validity=self.validity,
            environment=self.environment,
            results_ref=self._results_ref(),
            degradations=_degradations(arms),
            next_round=owed,
        )

    def _stages(self) -> verdict.Analysis:
        """The stages judged (once), their windows with Prometheus' figures when it is set."""
        if self.first is None:
            if self.spec.prometheus is not None:
                self.windows = self._prometheus_windows()
            self.first = verdict.analyse(self.spec, self.records, self.windows, validity=self.validity)
        return self.first

    def _searched(self, current: ExperimentStatus) -> tuple[status.SearchResult | None, status.Round | None]:
        """`workload.search`: the probes measured so far judged (`search.judge_probe`), and the next
        probe's round while `search.step` asks for one; a probe that failed stops the search."""
        wanted = self.spec.workload.search
        if wanted is None:
            return None, None
        if self.in_turn:
            return self._search_result(), None
        judged: list[tuple[float, status.StageResult]] = []
        for round_ in rounds.probes(current):
            stage = rounds.probe_stage(self.spec, round_)
            if stage is None or round_.load is None or round_.outcome == rounds.FAILED:
                return search.failed(wanted, judged, round_.name, round_.message or "failed"), None
            recs, result = self.measured[round_.name]
            index = round_.probe or len(judged) + 1
            outcome = search.judge_probe(
                self.spec, stage, recs, result.windows, validity=result.validity, index=index
            )
            judged.append((round_.load, outcome))
            if round_.name not in self.shown:
                self.shown.add(round_.name)
                self.view.message(f"search: {stage.name} {outcome.verdict.value}")
        step, found = search.progress(wanted, judged)
        if step.next_load is None:
            if not self.search_told:
                self.search_told = True
                self.view.message(search.describe(found))
            return found, None
        return found, rounds.probe_round(wanted, len(judged) + 1, step.next_load)

    def _search_result(self) -> status.SearchResult | None:
        """One after the other: why the search could not run (both arms are never up together)."""
        wanted = self.spec.workload.search
        if wanted is None:
            return None
        return status.SearchResult(
            axis=wanted.axis,
            reason="OneAfterTheOther",
            message="the arms ran one after the other (GPUs for one arm only): no paired probe can be run",
        )

    def _crossed(
        self, current: ExperimentStatus, analysis: verdict.Analysis
    ) -> tuple[verdict.Analysis, status.CrossoverResult | None, status.Round | None]:
        """`analysis.crossover`: whether the swapped round (the arms' GPUs swapped) is owed (the third
        item), or the stages' analysis with it folded in by `crossover.apply`, and `status.crossover`."""
        a = self.spec.analysis
        if a.crossover is spec.Crossover.OFF:
            return analysis, None, None
        if not crossover.wanted(a, self.environment):
            return analysis, crossover.not_apart(a), None
        if self.options.control_url is not None:
            why = (
                "the arms are the servers given by --control-url and --treatment-url, which run --local "
                "cannot move: nothing to swap"
            )
            return analysis, crossover.skipped(a, crossover.SERVERS_GIVEN, why), None
        if self.loads or len(set(self.gpus.values())) < 2:
            why = (
                "both arms had the same placement (one after the other on the same GPUs, or simulator "
                "processes without GPUs): nothing to swap"
            )
            return analysis, crossover.skipped(a, crossover.SAME_PLACEMENT, why), None
        control, treatment = (_placement_of(self.hosts.get(arm), self.gpus[arm]) for arm in spec.Arm)
        first = status.CrossoverPlacement(control=control, treatment=treatment)
        round_ = rounds.find(current, rounds.CROSSOVER)
        if round_ is None:
            swapped = status.CrossoverPlacement(control=first.treatment, treatment=first.control)
            return analysis, None, status.Round(name=rounds.CROSSOVER, nodes=swapped)
        if round_.outcome == rounds.FAILED or self.swapped is None:
            # Round 1 stands as measured; the check it asked for did not happen, so no pass stands.
            failure = (round_.message or "failed").splitlines()[0]
            return (*crossover.apply(self.spec, analysis, [], [first], failure=failure), None)
        placements = [first, self.swapped]
        recs, result = self.measured[round_.name]
        invalid = crossover.invalid(result.validity)
        if invalid is not None:
            return (*crossover.apply(self.spec, analysis, [], placements, failure=invalid), None)
        swapped_spec = crossover.swapped_spec(self.spec)
        stages = verdict.analyse(swapped_spec, recs, result.windows, validity=result.validity).stages
        return (*crossover.apply(self.spec, analysis, stages, placements), None)

    def _confirmed(
        self, current: ExperimentStatus, analysis: verdict.Analysis
    ) -> tuple[status.Recommendation | None, status.Round | None, str | None]:
        """`analysis.confirm`: (the recommendation with its confirmation, the round if it is owed, a
        note for the message). The treatment restarted with the recommended schedule runs the stages
        again against the control (same prompts and schedule), judged by `confirm`.

        Arms one after the other (too few GPUs for both): only the treatment runs again, paired with
        the control measured in the first round, as the first round pairs them.
        """
        rec = analysis.recommendation
        round_ = rounds.find(current, rounds.CONFIRMATION)
        if round_ is None:
            schedule = rec.num_speculative_tokens_per_batch_size if rec is not None else None
            if self.options.control_url is not None:
                return confirm.not_run(rec, confirm.Reason.ARMS_NOT_STARTED_HERE), None, None
            if schedule is None:
                return confirm.not_run(rec, confirm.Reason.NO_SCHEDULE), None, None
            crossed = rounds.find(current, rounds.CROSSOVER) is not None
            return rec, rounds.confirmation_round(schedule, self.environment, crossed=crossed), None
        if round_.outcome == rounds.FAILED or round_.schedule is None:
            how = f"was {self.interruption}" if self.interruption else f"failed: {round_.message}"
            return confirm.not_run(rec, confirm.Reason.ROUND_FAILED), None, f"the confirmation round {how}"
        found, result = self.measured[round_.name]
        windows, block = result.windows, result.validity
        if self.loads:
            control = self.loads[spec.Arm.CONTROL]
            found = [r for r in self.records if r.arm == spec.Arm.CONTROL] + found
            windows = _merged_windows(control.windows, result.windows)
            block = validity.merged(control.validity, block)
        planned = confirm.plan(self.spec, analysis.stages, round_.schedule)
        second = rounds.arm_spec(self.spec, round_)
        judged = confirm.judge(second, planned, found, windows, validity=block)
        folded = confirm.fold(rec or status.Recommendation(), judged)
        self.view.message(confirm.summary(folded))
        return folded, None, None

    # ------------------------------------------------------------------------------------- rounds

    def _round_arms(self, arms: engines.Engines, round_: status.Round) -> None:
        """The arms the round starts again (`rounds.started`), healthy: the crossover's on each
        other's GPUs; the confirmation's treatment with its schedule (and, after a crossover, both
        back on their GPUs of the stages; one GPU: the treatment alone)."""
        started = rounds.started(round_)
        if round_.name == rounds.CROSSOVER:
            gpus = {
                spec.Arm.CONTROL: self.gpus[spec.Arm.TREATMENT],
                spec.Arm.TREATMENT: self.gpus[spec.Arm.CONTROL],
            }
            log = "swapped"
        else:
            arms.spec = rounds.arm_spec(self.spec, round_)  # the control's command line is the same
            per_arm = ",".join(str(i) for i in range(self._gpus_per_arm()))
            gpus = {spec.Arm.TREATMENT: per_arm} if self.loads else dict(self.gpus)
            log = "confirmation"
            self.view.message(
                "confirmation: restarting the treatment with num_speculative_tokens_per_batch_size="
                f"{round_.schedule}"
            )
        for arm in started:
            left = arms.stop(arm)
            if left:
                raise engines.EngineError(
                    f"the {arm.value} arm's processes {left} survived SIGKILL; the GPU may still be in use"
                )
        for arm in started:
            arm_gpus = gpus.get(arm)
            process = arms.start(arm, gpus=arm_gpus, log_name=f"{arm.value}-{log}")
            self.round_of[arm] = round_.name
            if round_.name == rounds.CROSSOVER:
                self.view.message(f"crossover: started the {arm.value} arm on GPUs {arm_gpus}")
            else:
                self.view.message(f"confirmation: started the {arm.value} arm: {' '.join(process.argv)}")
        arms.wait_healthy(self.spec.deadlines.deploy_seconds, started)
        if round_.name == rounds.CROSSOVER:
            with httpx.Client(timeout=2.0) as client:
                control, treatment = (
                    _placement_of(_arm_host(client, arms.arms[arm], gpus[arm]), gpus[arm]) for arm in spec.Arm
                )
            self.swapped = status.CrossoverPlacement(control=control, treatment=treatment)

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
            self.measured[round_.name] = (self.records[before:], result)
            return
        if round_.name == rounds.CROSSOVER:
            second, out = crossover.swapped_spec(self.spec), self.out / CROSSOVER_DIR
        else:
            second, out = rounds.arm_spec(self.spec, round_), self.out / CONFIRMATION_DIR

        def decided(stage: str, recs: Sequence[records.RequestRecord]) -> bool:
            self.view.note_speedup(stage, list(recs))
            return False

        result = self._run_round(second, endpoints, out, arms, decided)
        found = _read_records(out)  # the confirmation pairs its warm-up as the first round's
        self.measured[round_.name] = (
            [r for r in found if not r.warmup] if out.name == CROSSOVER_DIR else found,
            result,
        )

    def _prometheus_windows(self) -> list[records.StageWindow]:
        assert self.spec.prometheus is not None
        names = prometheus.LabelNames.from_env()
        source = prometheus.PrometheusSource(self.spec.prometheus.url)

        def query(
            windows: list[records.StageWindow], anchor: records.RunAnchor, arms: Sequence[spec.Arm]
        ) -> list[records.StageWindow]:
            return prometheus.with_prometheus(
                source,
                windows,
                anchor,
                namespace=self.experiment.namespace,
                name=self.experiment.name,
                names=names,
                arms=arms,
            )

        try:
            if not self.loads:
                return query(self.windows, _read_anchor(self.out), tuple(spec.Arm))
            # One GPU: each arm over its own windows and clock, then one window per stage again.
            control, treatment = (
                query(self.loads[arm].windows, self.loads[arm].anchor, (arm,)) for arm in spec.Arm
            )
            return _merged_windows(control, treatment)
        except (prometheus.PrometheusUnavailable, prometheus.PrometheusNoData) as exc:
            raise ArmFailure("PrometheusUnavailable", f"spec.prometheus.url: {exc}") from None

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
            self.records = _read_records(self.out)
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
        names = [s.name for s in self.spec.workload.stages]
        done = set(names)
        for arm in spec.Arm:
            done &= self.finished.get(arm, set())
        if not done:
            return self.failed(
                "Interrupted", f"{how} before any stage finished; the requests so far are kept"
            )
        if not self.records:
            self.records = _read_records(self.out)
        windows, block = self._windows_so_far()
        analysis = verdict.analyse(self.spec, self.records, windows, validity=block)
        kept = [s for s in analysis.stages if s.name in done]
        self.windows = [w for w in windows if w.stage in done]
        self.current = self.current.model_copy(update={"stages": kept})
        return self.failed(
            "Interrupted",
            f"{how}; the {len(kept)} of {len(names)} stage(s) finished before that "
            f"({', '.join(s.name for s in kept)}) are kept in result.json and the report",
        )

    def _windows_so_far(self) -> tuple[list[records.StageWindow], validity.Validity | None]:
        """The windows.json and validity the interrupted load(s) left in DIR (one GPU: each arm's, merged);
        the interruption itself does not invalidate the stages finished before it."""

        def load(directory: Path) -> tuple[list[records.StageWindow], validity.Validity | None]:
            try:
                doc = json.loads((directory / runner.WINDOWS_FILE).read_text())
                windows = [records.StageWindow.model_validate(w) for w in doc["windows"]]
            except (OSError, ValueError, KeyError, TypeError):
                return [], None
            try:
                block = validity.Validity.of_summary(
                    json.loads((directory / runner.SUMMARY_FILE).read_text())
                )
            except (OSError, ValueError, AttributeError):
                return windows, None
            return windows, block.forgiving(validity.INTERRUPTED) if block is not None else None

        if not self.loads and not (self.out / "load-control").exists():
            return load(self.out)
        (control, control_validity), (treatment, treatment_validity) = (
            load(self.out / f"load-{arm.value}") for arm in spec.Arm
        )
        return _merged_windows(control, treatment), validity.merged(control_validity, treatment_validity)

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
        with httpx.Client(timeout=2.0) as client:
            for arm, state in arms.arms.items():
                if arm not in self.hosts and state.exit_code() is None:
                    self.hosts[arm] = _arm_host(
                        client,
                        state,
                        gpus.get(arm),
                        request_tokens=kvcache.request_tokens(self.spec.workload),
                    )
        # No image runs here: the engine is the command that started the arm (none for --control-url).
        control = arms.arms.get(spec.Arm.CONTROL)
        environment = placement.environment(
            self.spec,
            self.release or releases.resolve(self.spec.engine),
            image=None,
            engine_command=" ".join(control.argv) if control is not None and control.argv else None,
        )
        hosts = status.ArmHosts(
            control=self.hosts.get(spec.Arm.CONTROL), treatment=self.hosts.get(spec.Arm.TREATMENT)
        )
        self.environment = placement.with_hosts(environment, hosts)
        warning = placement.warning(self.environment)
        if warning is not None and self.in_turn:  # side by side, the core warns as the load starts
            self.view.message(f"warning: {warning}")


def _reported(
    analysis: reconcile.Judgement | reconcile.CollectFailure | None,
) -> reconcile.Judgement | reconcile.CollectFailure | None:
    """A judgement with its report to store: rendered by `_Run._write` from the decided status."""
    if isinstance(analysis, reconcile.Judgement):
        return dataclasses.replace(analysis, report=reconcile.Report())
    return analysis


def _arm_host(
    client: httpx.Client, arm: engines.Arm, gpus: str | None, *, request_tokens: int | None = None
) -> status.Host:
    """An arm's host: this machine when it runs here (started here, or on loopback), else its URL's host.

    The engine's version comes from `/version`; a simulator's speed factor from `/sim/host`; the KV-cache
    capacity from `/metrics` (`vllm:cache_config_info`), with the requests of `request_tokens` it holds.
    """
    here = arm.process is not None or (urlsplit(arm.url).hostname or "") in _LOOPBACK
    host = hosts.this_host(gpus) if here else status.Host(node=urlsplit(arm.url).hostname)
    facts: dict[str, object] = {}
    with contextlib.suppress(httpx.HTTPError, ValueError, AttributeError):
        facts["vllm_version"] = str(client.get(f"{arm.url}/version").json()["version"])
    with contextlib.suppress(httpx.HTTPError, ValueError, AttributeError, KeyError):
        answer = client.get(f"{arm.url}/sim/host")
        if answer.status_code == 200:
            facts["speed_factor"] = float(answer.json()["speedFactor"])
    with contextlib.suppress(httpx.HTTPError):
        answer = client.get(f"{arm.url}/metrics")
        capacity = kvcache.from_metrics(answer.text) if answer.status_code == 200 else None
        host = kvcache.with_capacity(host, capacity, request_tokens)
    return host.model_copy(update=facts)


def _placement_of(host: status.Host | None, gpus: str) -> str:
    """One arm's placement in words: its host, its GPUs and (simulated) the host's speed factor."""
    where = f"{host.node} " if host is not None and host.node else ""
    speed = (
        f" (speedFactor {host.speed_factor:g})" if host is not None and host.speed_factor is not None else ""
    )
    return f"{where}GPUs {gpus}{speed}"


def _merged_windows(
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


class _Reachability:
    """Passes the load's progress on, and notes an arm whose first requests all failed to connect
    (a wrong `--control-url`, a server that is not running): the run stops at the start of the
    warm-up instead of sending every request of every stage into a refused connection."""

    FIRST = 3
    """Requests per arm that decide (all failed to connect, none answered)."""

    def __init__(self, progress: runner.Progress) -> None:
        self.progress = progress
        self.outcomes: dict[spec.Arm, list[bool]] = {}
        """Per arm: whether each of its first requests failed to connect."""
        self.unreachable: spec.Arm | None = None
        self.stop: Callable[[], object] = lambda: None
        """Stops the load (set once it runs)."""

    def __call__(self, event: runner.ProgressEvent) -> None:
        if isinstance(event, runner.RequestDone):
            seen = self.outcomes.setdefault(event.arm, [])
            if len(seen) < self.FIRST:
                seen.append(not event.ok and event.error_class == "connect")
                if len(seen) == self.FIRST and all(seen) and self.unreachable is None:
                    self.unreachable = event.arm
                    self.stop()
        self.progress(event)


def _write_windows(
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


def _read_records(directory: Path) -> list[records.RequestRecord]:
    path = directory / "requests.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(records.RequestRecord.model_validate_json(line))
    return out


def _read_anchor(directory: Path) -> records.RunAnchor:
    doc = json.loads((directory / "windows.json").read_text())
    return records.RunAnchor.model_validate(doc["anchor"])


def _degradations(arms: engines.Engines) -> list[status.Degradation]:
    """What the treatment's vLLM logged when it weakened speculation (its log file; none for given URLs)."""
    treatment = arms.arms.get(spec.Arm.TREATMENT)
    if treatment is None or treatment.log is None or not treatment.log.exists():
        return []
    with treatment.log.open(errors="replace") as lines:
        return degradations.scan(lines)


@contextlib.contextmanager
def _engine_failures() -> Iterator[None]:
    """An arm that could not start or be stopped (`engines.EngineError`): the run's EngineUnavailable."""
    try:
        yield
    except engines.EngineError as exc:
        raise lifecycle.Failure("EngineUnavailable", str(exc)) from None
