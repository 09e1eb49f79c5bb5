"""`specdecode run FILE --local`: the whole experiment on one machine, with the operator's pipeline.

validate -> start both arms (simulator, local vLLM, or given URLs) -> wait for /health -> load (the
load generator, with sequential stopping) -> server-side metrics (each arm's /metrics at stage
boundaries, or Prometheus when `spec.prometheus.url` is set) -> verdict -> `DIR/result.json`,
`DIR/requests.jsonl`, `DIR/report.html`.

`analysis.confirm` (arms started here): after the verdict, the treatment is restarted with the
recommended `num_speculative_tokens_per_batch_size` and the stages run against the control again
(same plan and salt, so the same prompts and schedule; no early stop) into `DIR/confirmation/`; one
GPU: the treatment alone, paired with the control's first-round requests; `confirm.py`
judges that round into `status.recommendation` (`confirmed`, `confirmationReason`, `confirmation`).
The first round's verdict and files are written before it and stand whatever the round does.

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
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml
from rich.console import Console

from specdecode import exit_status
from specdecode.experiment import (
    advice,
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
    search,
    spec,
    status,
    validation,
    validity,
    verdict,
)
from specdecode.experiment.status import ExperimentStatus, Phase
from specdecode.loadgen import plan as plan_mod
from specdecode.loadgen import runner, workload
from specdecode.local import engines, hosts, view
from specdecode.report import results, terminal
from specdecode.sources import prometheus

EXPERIMENT_FILE = "experiment.yaml"
#: The swapped round's load (`analysis.crossover`): DIR/crossover/requests.jsonl, windows.json, ...
CROSSOVER_DIR = "crossover"
#: `analysis.confirm`: the confirmation round's load (requests.jsonl, windows.json) under DIR
CONFIRMATION_DIR = "confirmation"
_LOOPBACK = {"localhost", "127.0.0.1", "::1"}


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


class ArmFailure(Exception):
    """An arm stopped serving during the run."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


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
    def __init__(self, experiment: documents.Experiment, options: Options, show: view.View) -> None:
        self.experiment = experiment
        self.spec = experiment.spec
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
        self.judged: ExperimentStatus | None = None
        """The verdict, once reached (`analysis.confirm`: before the confirmation round)."""
        self.gpus: dict[spec.Arm, str] = {}
        self.search: status.SearchResult | None = None
        """`workload.search`: the break-even probes, run after the stages."""
        self.finished: dict[spec.Arm, set[str]] = {}
        """Per arm: the stages its load finished (an interruption keeps those both arms finished)."""
        """Side by side on GPUs: each arm's GPUs (its placement, which the crossover swaps)."""
        self.written: ExperimentStatus | None = None
        """The status last written to result.json (its conditions' transition times carry over)."""
        self.status = ExperimentStatus(
            observed_generation=1,
            phase=Phase.DEPLOYING,
            started_at=_now(),
            results_ref=status.ResultsRef(directory=str(options.out)),
        )

    # ------------------------------------------------------------------------------------- phases

    def execute(self) -> ExperimentStatus:
        for weak in advice.advice(self.spec):
            self.view.message(f"warning: {weak}")
        with engines.Engines(self.spec, self.out / "logs") as arms:
            try:
                return self._execute(arms)
            except engines.EngineError as exc:
                return self.failed("EngineUnavailable", str(exc))
            except ArmFailure as exc:
                return self.failed(exc.reason, str(exc))

    def _execute(self, arms: engines.Engines) -> ExperimentStatus:
        if self.options.control_url and self.options.treatment_url:
            arms.attach(
                {spec.Arm.CONTROL: self.options.control_url, spec.Arm.TREATMENT: self.options.treatment_url}
            )
            self._load_together(arms, {})
        elif (kind := engines.engine_kind(self.spec)) == "vllm" and (
            problems := self._use_local_release(arms)
        ):
            return self.failed("InvalidSpec", "; ".join(problems))
        elif kind == "simulator" or engines.gpu_count() >= 2 * self._gpus_per_arm():
            gpus = self._gpu_split()
            for arm in spec.Arm:
                arms.start(arm, gpus=gpus.get(arm))
                self.view.message(f"started the {arm.value} arm: {' '.join(arms.arms[arm].argv)}")
            arms.wait_healthy(self.spec.deadlines.deploy_seconds)
            self.gpus = dict(gpus)
            self._load_together(arms, gpus)
        else:
            self._load_one_after_the_other(arms)
        return self._judge(arms)

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
        problems = validation.check_speculative(
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

    def _load_together(self, arms: engines.Engines, gpus: Mapping[spec.Arm, str]) -> None:
        self._record_hosts(arms, gpus)
        self.status = self.status.model_copy(update={"phase": Phase.RUNNING})
        endpoints = {arm: runner.Endpoint(state.url) for arm, state in arms.arms.items()}
        self._load(arms, endpoints)
        self._search(arms, endpoints)

    def _search(self, arms: engines.Engines, endpoints: dict[spec.Arm, runner.Endpoint]) -> None:
        """`workload.search`: probes, one paired stage after another, until `search.step` stops (issue 17)."""
        wanted = self.spec.workload.search
        if wanted is None:
            return
        main_spec, main_validity = self.spec, self.validity
        judged: list[tuple[float, status.StageResult]] = []
        try:
            while True:
                step, self.search = search.progress(wanted, judged)
                if step.next_load is None:
                    self.view.message(search.describe(self.search))
                    return
                stage = wanted.probe_stage(len(judged) + 1, step.next_load)
                self.spec = search.probe_spec(main_spec, stage)
                self.view.message(f"search: probe {len(judged) + 1} at {stage.load_label}")
                before = len(self.records)
                result = self._load(arms, endpoints, suffix=f"-{stage.name}")
                outcome = search.judge_probe(
                    main_spec,
                    stage,
                    self.records[before:],
                    result.windows,
                    validity=result.validity,
                    index=len(judged) + 1,
                )
                judged.append((step.next_load, outcome))
                self.view.message(f"search: {stage.name} {outcome.verdict.value}")
        finally:
            self.spec, self.validity = main_spec, main_validity

    def _load_one_after_the_other(self, arms: engines.Engines) -> None:
        """One GPU (or GPUs for one arm only): each arm alone, on the same prompts and the same schedule."""
        per_arm, count = self._gpus_per_arm(), engines.gpu_count()
        if count < per_arm:
            raise engines.EngineError(
                f"each arm needs {per_arm} GPUs (--tensor-parallel-size {per_arm} in spec.engine.args) "
                f"but nvidia-smi lists {count}; lower the tensor-parallel size or run where {per_arm} GPUs are"
            )
        gpus = ",".join(str(i) for i in range(per_arm))
        self.view.message(
            f"{count} GPU(s) for arms of {per_arm}: the arms run one after the other on the same prompts and schedule"
        )
        (self.out / "requests.jsonl").unlink(missing_ok=True)
        for arm in spec.Arm:
            started = arms.start(arm, gpus=gpus)
            self.view.message(f"started the {arm.value} arm: {' '.join(started.argv)}")
            arms.wait_healthy(self.spec.deadlines.deploy_seconds, [arm])
            self._record_hosts(arms, {arm: gpus})
            self.status = self.status.model_copy(update={"phase": Phase.RUNNING})
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

    def _judge(self, arms: engines.Engines) -> ExperimentStatus:
        windows = self.windows
        if self.spec.prometheus is not None:
            windows = self._prometheus_windows()
        analysis = verdict.analyse(self.spec, self.records, windows, validity=self.validity)
        analysis, checked = self._crossover(arms, analysis)
        judged = analysis.apply(self.status.model_copy(update={"phase": Phase.ANALYZING}))
        judged = judged.model_copy(
            update={
                "completed_at": _now(),
                "validity": self.validity,
                "message": placement.qualify(judged.message or "", judged.environment),
                "crossover": checked,
                "degradations": _degradations(arms),
            }
        )
        if self.spec.workload.search is not None:
            judged = self._with_search(judged)
        if self.loads:
            judged = self._one_after_the_other(judged)
        self.windows = windows
        judged = self._write(judged)
        if self.spec.analysis.confirm and judged.phase is Phase.COMPLETED:
            self.judged = judged
            update: dict[str, Any] = {}
            try:
                update["recommendation"] = self._confirmation(arms, judged)
            except (engines.EngineError, ArmFailure) as exc:  # the first round's verdict stands
                update["recommendation"] = confirm.not_run(judged.recommendation, confirm.Reason.ROUND_FAILED)
                update["message"] = f"{judged.message}; the confirmation round failed: {exc}"
            judged = self._write(judged.model_copy(update=update))
        return judged

    def _with_search(self, judged: ExperimentStatus) -> ExperimentStatus:
        """The search's result in status; the recommendation rests on the probes as well as the stages."""
        wanted = self.spec.workload.search
        assert wanted is not None
        found = self.search
        if found is None:  # one after the other: both arms are never up together to probe
            found = status.SearchResult(
                axis=wanted.axis,
                reason="OneAfterTheOther",
                message="the arms ran one after the other (GPUs for one arm only): no paired probe can be run",
            )
        update: dict[str, Any] = {"search": found}
        if found.probes and judged.verdict is not None:
            update["recommendation"] = recommendation.recommend(self.spec, [*judged.stages, *found.probes])
        return judged.model_copy(update=update)

    def _crossover(
        self, arms: engines.Engines, analysis: verdict.Analysis
    ) -> tuple[verdict.Analysis, status.CrossoverResult | None]:
        """`analysis.crossover`: the stages again with the arms' GPUs swapped, folded in by `crossover.apply`."""
        a = self.spec.analysis
        if a.crossover is spec.Crossover.OFF:
            return analysis, None
        if not analysis.measured:
            return analysis, crossover.skipped(a, crossover.NOT_MEASURED, "no verdict to check")
        if not crossover.wanted(a, self.status.environment):
            return analysis, crossover.not_apart(a)
        if self.options.control_url is not None:
            return analysis, crossover.skipped(
                a,
                crossover.SERVERS_GIVEN,
                "the arms are the servers given by --control-url and --treatment-url, which run --local "
                "cannot move: nothing to swap",
            )
        if self.loads or len(set(self.gpus.values())) < 2:
            return analysis, crossover.skipped(
                a,
                crossover.SAME_PLACEMENT,
                "both arms had the same placement (one after the other on the same GPUs, or simulator "
                "processes without GPUs): nothing to swap",
            )
        first = {arm: _placement_of(self.hosts.get(arm), self.gpus[arm]) for arm in spec.Arm}
        swapped_gpus = {
            spec.Arm.CONTROL: self.gpus[spec.Arm.TREATMENT],
            spec.Arm.TREATMENT: self.gpus[spec.Arm.CONTROL],
        }
        for arm in spec.Arm:
            left = arms.stop(arm)
            if left:
                raise engines.EngineError(
                    f"the {arm.value} arm's processes {left} survived SIGKILL; the GPU may still be in use"
                )
        rounds = [
            status.CrossoverPlacement(control=first[spec.Arm.CONTROL], treatment=first[spec.Arm.TREATMENT])
        ]
        try:
            swapped_spec, recs, result = self._swapped_round(arms, swapped_gpus, rounds)
        except (engines.EngineError, ArmFailure) as exc:
            # Round 1 stands as measured; the check it asked for did not happen, so no pass stands.
            self.view.message(f"crossover: the swapped round failed: {exc}")
            failure = str(exc).splitlines()[0]
            return crossover.apply(self.spec, analysis, [], rounds, failure=failure)
        invalid = crossover.invalid(result.validity)
        if invalid is not None:
            return crossover.apply(self.spec, analysis, [], rounds, failure=invalid)
        stages = verdict.analyse(swapped_spec, recs, result.windows, validity=result.validity).stages
        return crossover.apply(self.spec, analysis, stages, rounds)

    def _swapped_round(
        self,
        arms: engines.Engines,
        swapped_gpus: Mapping[spec.Arm, str],
        rounds: list[status.CrossoverPlacement],
    ) -> tuple[spec.ExperimentSpec, list[records.RequestRecord], runner.RunResult]:
        """Both arms started again on each other's GPUs, then the swapped round's load; appends its placement to `rounds`."""
        for arm in spec.Arm:
            arms.start(arm, gpus=swapped_gpus[arm], log_name=f"{arm.value}-swapped")
            self.view.message(f"crossover: started the {arm.value} arm on GPUs {swapped_gpus[arm]}")
        arms.wait_healthy(self.spec.deadlines.deploy_seconds)
        with httpx.Client(timeout=2.0) as client:
            second = {
                arm: _placement_of(_arm_host(client, arms.arms[arm], swapped_gpus[arm]), swapped_gpus[arm])
                for arm in spec.Arm
            }
        rounds.append(
            status.CrossoverPlacement(control=second[spec.Arm.CONTROL], treatment=second[spec.Arm.TREATMENT])
        )
        swapped_spec = crossover.swapped_spec(self.spec)
        recs, result = self._load_swapped(arms, swapped_spec)
        return swapped_spec, recs, result

    def _load_swapped(
        self, arms: engines.Engines, swapped_spec: spec.ExperimentSpec
    ) -> tuple[list[records.RequestRecord], runner.RunResult]:
        """The swapped round's load (fixed horizon) into DIR/crossover/; round 1's records stay apart."""
        out = self.out / CROSSOVER_DIR
        endpoints = {arm: runner.Endpoint(state.url) for arm, state in arms.arms.items()}
        result = self._run_round(swapped_spec, endpoints, out, arms, lambda _stage, _recs: False)
        return [r for r in _read_records(out) if not r.warmup], result

    # ------------------------------------------------------------------------------- confirmation

    def _confirmation(self, arms: engines.Engines, judged: ExperimentStatus) -> status.Recommendation:
        """`analysis.confirm`: the treatment restarted with the recommended schedule, the stages again
        against the control (same prompts and schedule), judged by `confirm`; or why it was not run.

        Arms one after the other (too few GPUs for both): only the treatment runs again, paired with
        the control measured in the first round, as the first round pairs them.
        """
        rec = judged.recommendation
        schedule = rec.num_speculative_tokens_per_batch_size if rec is not None else None
        if self.options.control_url is not None:
            return confirm.not_run(rec, confirm.Reason.ARMS_NOT_STARTED_HERE)
        if rec is None or schedule is None:
            return confirm.not_run(rec, confirm.Reason.NO_SCHEDULE)
        planned = confirm.plan(self.spec, judged.stages, schedule)
        second = confirm.treatment_spec(self.spec, schedule)
        self.view.message(
            f"confirmation: restarting the treatment with num_speculative_tokens_per_batch_size={schedule}"
        )
        arms.spec = second  # the control's command line is the same under either spec
        out = self.out / CONFIRMATION_DIR
        treatment = spec.Arm.TREATMENT
        if not self.loads:  # side by side: the control keeps serving where it served the first round
            # ... unless the crossover moved both arms: then both go back to their first placements
            moved = judged.crossover is not None and len(judged.crossover.rounds) > 1
            restart = list(spec.Arm) if moved else [treatment]
            for arm in restart:
                left = arms.stop(arm)
                if left:
                    raise engines.EngineError(f"the {arm.value} arm's processes {left} survived SIGKILL")
            for arm in restart:
                started = arms.start(arm, gpus=self.gpus.get(arm), log_name=f"{arm.value}-confirmation")
                self.view.message(f"confirmation: started the {arm.value} arm: {' '.join(started.argv)}")
        else:
            restart = [treatment]
            gpus = ",".join(str(i) for i in range(self._gpus_per_arm()))
            started = arms.start(treatment, gpus=gpus, log_name=f"{treatment.value}-confirmation")
            self.view.message(f"confirmation: started the treatment arm: {' '.join(started.argv)}")
        arms.wait_healthy(self.spec.deadlines.deploy_seconds, restart)
        endpoints = {arm: runner.Endpoint(state.url) for arm, state in arms.arms.items() if not state.stopped}
        result = self._round_load(second, arms, endpoints, out)
        found = _read_records(out)
        windows, block = result.windows, result.validity
        if self.loads:
            control = self.loads[spec.Arm.CONTROL]
            found = [r for r in self.records if r.arm == spec.Arm.CONTROL] + found
            windows = _merged_windows(control.windows, result.windows)
            block = validity.merged(control.validity, block)
            arms.stop(treatment)
        folded = confirm.fold(rec, confirm.judge(second, planned, found, windows, validity=block))
        self.view.message(confirm.summary(folded))
        return folded

    def _round_load(
        self,
        second: spec.ExperimentSpec,
        arms: engines.Engines,
        endpoints: dict[spec.Arm, runner.Endpoint],
        out: Path,
    ) -> runner.RunResult:
        """The confirmation round's load: the first round's plan and salt, no early stop (`confirm`)."""

        def decided(stage: str, recs: Sequence[records.RequestRecord]) -> bool:
            self.view.note_speedup(stage, list(recs))
            return False

        return self._run_round(second, endpoints, out, arms, decided)

    def _one_after_the_other(self, judged: ExperimentStatus) -> ExperimentStatus:
        """Arms one after the other: the message says that pairs were not simultaneous."""
        note = "the arms ran one after the other (too few GPUs for both) on the same prompts and schedule, so pairs were not simultaneous"
        message = f"{judged.message}; {note}" if judged.message else note
        return judged.model_copy(update={"message": message})

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
        round, the verdict already reached with the round not run (RoundFailed)."""
        if self.judged is None:
            return self._interrupted_in_stages(how)
        final = self.judged.model_copy(
            update={
                "recommendation": confirm.not_run(self.judged.recommendation, confirm.Reason.ROUND_FAILED),
                "message": f"{self.judged.message}; the confirmation round was {how}",
            }
        )
        return self._write(final)

    def failed(self, reason: str, message: str) -> ExperimentStatus:
        """Failed (could not measure), with what was measured kept in DIR."""
        if not self.records:
            self.records = _read_records(self.out)
        final = self.status.model_copy(
            update={
                "phase": Phase.FAILED,
                "verdict": None,
                "reason": reason,
                "message": message,
                "completed_at": _now(),
            }
        )
        return self._write(final)

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
        self.status = self.status.model_copy(update={"stages": kept})
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
        """result.json and the report of `final`, with the conditions the resource would carry."""
        final = reconcile.with_conditions(final, 1, datetime.now(UTC), previous=self.written)
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
        environment = placement.with_hosts(environment, hosts)
        self.status = self.status.model_copy(update={"environment": environment})
        warning = placement.warning(environment)
        if warning is not None:
            self.view.message(f"warning: {warning}")


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


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
