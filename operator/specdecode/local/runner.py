"""`specdecode run FILE --local`: the whole experiment on one machine, with the operator's pipeline.

validate -> start both arms (simulator, local vLLM, or given URLs) -> wait for /health -> load (the
load generator, with sequential stopping) -> server-side metrics (each arm's /metrics at stage
boundaries, or Prometheus when `spec.prometheus.url` is set) -> verdict -> `DIR/result.json`,
`DIR/requests.jsonl`, `DIR/report.html`.

Whatever happens, every process started here is stopped, and what was measured stays in DIR:
a crash, an arm that answers only errors, or Ctrl-C writes `result.json` with phase Failed and the
cause (exit 3; 130 on Ctrl-C).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import yaml
from rich.console import Console

from specdecode import exit_status
from specdecode.controller import collect, prometheus
from specdecode.controller.settings import OperatorSettings
from specdecode.experiment import documents, placement, records, releases, spec, status, validation, verdict
from specdecode.experiment.status import ExperimentStatus, Phase
from specdecode.loadgen import plan as plan_mod
from specdecode.loadgen import runner
from specdecode.local import engines, hosts, view
from specdecode.report import results, terminal

EXPERIMENT_FILE = "experiment.yaml"
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


class ArmFailure(Exception):
    """An arm stopped serving during the run."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def run(path: Path, options: Options) -> int:
    """Run one experiment file; returns the exit status of design.md §4."""
    console = terminal.console(stderr=True)
    try:
        experiment = documents.load_experiment(path)
    except (validation.InvalidSpecError, documents.UnreadableFileError) as exc:
        problems = exc.problems if isinstance(exc, validation.InvalidSpecError) else [exc]
        for problem in problems:
            console.print(str(problem).removeprefix(": "), markup=False, highlight=False)
        return exit_status.INVALID
    if (options.control_url is None) != (options.treatment_url is None):
        console.print("give both --control-url and --treatment-url, or neither", markup=False)
        return exit_status.INVALID
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    (out / EXPERIMENT_FILE).write_text(yaml.safe_dump(experiment.document, sort_keys=False))
    show = view.make_view(options.mode)
    run_ = _Run(experiment, options, show)
    try:
        final = run_.execute()
    except KeyboardInterrupt:
        final = run_.failed("Interrupted", "interrupted by the user (Ctrl-C); the results so far are kept")
        _finish(console, options, final, out)
        return exit_status.INTERRUPTED
    finally:
        show.stop()
    return _finish(console, options, final, out)


def _finish(console: Console, options: Options, final: ExperimentStatus, out: Path) -> int:
    if options.mode != "json":
        console.print(terminal.render_terminal(final))
        console.print(f"report: {out / results.REPORT}", markup=False, highlight=False)
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
        self.release: releases.Release | None = None
        self.hosts: dict[spec.Arm, status.Host] = {}
        self.status = ExperimentStatus(
            observed_generation=1,
            phase=Phase.DEPLOYING,
            started_at=_now(),
            results_ref=status.ResultsRef(directory=str(options.out)),
        )

    # ------------------------------------------------------------------------------------- phases

    def execute(self) -> ExperimentStatus:
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
        elif kind == "simulator" or engines.gpu_count() >= 2:
            gpus = self._gpu_split()
            for arm in spec.Arm:
                arms.start(arm, gpus=gpus.get(arm))
                self.view.message(f"started the {arm.value} arm: {' '.join(arms.arms[arm].argv)}")
            arms.wait_healthy(self.spec.deadlines.deploy_seconds)
            self._load_together(arms, gpus)
        else:
            self._load_one_after_the_other(arms)
        return self._judge(arms)

    def _use_local_release(self, arms: engines.Engines) -> list[str]:
        """Render for the local vLLM's release (`vllm --version`) unless the spec names one; its rules' problems."""
        self.release = releases.resolve(self.spec.engine, local=engines.local_vllm_version())
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
        per_arm = max(1, (validation.target_tensor_parallel(self.spec.engine.args) or 1))
        return {arm: ",".join(str(i + n * per_arm) for i in range(per_arm)) for n, arm in enumerate(spec.Arm)}

    def _load_together(self, arms: engines.Engines, gpus: Mapping[spec.Arm, str]) -> None:
        self._record_hosts(arms, gpus)
        self.status = self.status.model_copy(update={"phase": Phase.RUNNING})
        endpoints = {arm.value: runner.Endpoint(state.url) for arm, state in arms.arms.items()}
        self._load(arms, endpoints)

    def _load_one_after_the_other(self, arms: engines.Engines) -> None:
        """One GPU: each arm alone, on the same prompts and the same schedule (pairs are not simultaneous)."""
        self.view.message("one GPU: the arms run one after the other on the same prompts and schedule")
        for arm in spec.Arm:
            arms.start(arm, gpus="0")
            arms.wait_healthy(self.spec.deadlines.deploy_seconds)
            self._record_hosts(arms, {arm: "0"})
            self.status = self.status.model_copy(update={"phase": Phase.RUNNING})
            self._load(arms, {arm.value: runner.Endpoint(arms.arms[arm].url)}, suffix=f"-{arm.value}")
            arms.stop(arm)

    def _load(self, arms: engines.Engines, endpoints: dict[str, runner.Endpoint], suffix: str = "") -> None:
        plan = plan_mod.plan_from_spec(
            self.spec,
            self.experiment.source.parent if self.experiment.source else Path.cwd(),
            scrape_metrics=True,
            salt=f"{self.spec.engine.seed}-local",
        )
        out = self.out if not suffix else self.out / f"load{suffix}"
        self.view.start()
        result = asyncio.run(self._watched(plan, endpoints, out, arms))
        self.view.stop()
        self.records.extend(_read_records(out))
        self.windows.extend(result.windows)
        self.validity = result.summary.get("validity")
        if suffix:  # keep one requests.jsonl in DIR, as in the paired case
            with (self.out / "requests.jsonl").open("a") as sink:
                sink.write((out / "requests.jsonl").read_text())
        self._check_errors_only(endpoints)

    async def _watched(
        self, plan: plan_mod.Plan, endpoints: dict[str, runner.Endpoint], out: Path, arms: engines.Engines
    ) -> runner.RunResult:
        """The load, cancelled as soon as an arm's process dies."""
        load = asyncio.create_task(
            runner.run(plan, endpoints, out, stop_rule=self._stop_rule(), progress=self.view)
        )
        while not load.done():
            crashed = arms.crashed()
            if crashed is not None:
                load.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await load
                self.records = _read_records(out)
                raise ArmFailure(
                    "EngineCrashed",
                    f"the {crashed.arm.value} arm exited with status {crashed.exit_code()} during the load; "
                    f"its log ends with:\n{crashed.log_tail()}",
                )
            await asyncio.wait({load}, timeout=0.2)
        return load.result()

    def _stop_rule(self) -> Callable[[str, Sequence[records.RequestRecord]], bool]:
        """The load generator's sequential stopping, also feeding the live view's running speed-up."""
        sequential = plan_mod.stop_rule(self.spec)

        def decided(stage: str, recs: Sequence[records.RequestRecord]) -> bool:
            self.view.note_speedup(stage, list(recs))
            return sequential is not None and sequential(stage, recs)

        return decided

    def _check_errors_only(self, endpoints: dict[str, runner.Endpoint]) -> None:
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
        analysis = verdict.analyse(self.spec, self.records, windows, validity=getattr(self, "validity", None))
        judged = analysis.apply(self.status.model_copy(update={"phase": Phase.ANALYZING}))
        judged = judged.model_copy(
            update={
                "completed_at": _now(),
                "validity": getattr(self, "validity", None),
                "message": placement.qualify(judged.message or "", judged.environment),
            }
        )
        self.windows = windows
        self._write(judged)
        return judged

    def _prometheus_windows(self) -> list[records.StageWindow]:
        assert self.spec.prometheus is not None
        settings = OperatorSettings.from_env()
        anchor = _read_anchor(self.out)
        try:
            return collect.with_prometheus(
                prometheus.PrometheusSource(self.spec.prometheus.url),
                self.windows,
                anchor,
                namespace=self.experiment.namespace,
                name=self.experiment.name,
                settings=settings,
            )
        except (prometheus.PrometheusUnavailable, prometheus.PrometheusNoData) as exc:
            raise ArmFailure("PrometheusUnavailable", f"spec.prometheus.url: {exc}") from None

    # ------------------------------------------------------------------------------------ results

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
        self._write(final)
        return final

    def _write(self, final: ExperimentStatus) -> None:
        results.write_results(
            self.out,
            final,
            self.records,
            self.windows,
            self.spec,
            name=self.experiment.name,
            write_inputs=False,
        )

    def _record_hosts(self, arms: engines.Engines, gpus: Mapping[spec.Arm, str]) -> None:
        """Where the serving arms run (each recorded once), into the environment; says when the hosts differ."""
        with httpx.Client(timeout=2.0) as client:
            for arm, state in arms.arms.items():
                if arm not in self.hosts and state.exit_code() is None:
                    self.hosts[arm] = _arm_host(client, state, gpus.get(arm))
        sim = self.spec.engine.simulator
        environment = status.Environment(
            image=None if sim else self.spec.engine.image,
            model_revision=self.spec.model_revision or None,
            draft_model=self.spec.speculative.model or self.spec.speculative.method.value,
            simulator={"profile": sim.profile, **sim.overrides()} if sim else None,
            vllm_rules=(self.release or releases.resolve(self.spec.engine)).describe(),
        )
        hosts = status.ArmHosts(
            control=self.hosts.get(spec.Arm.CONTROL), treatment=self.hosts.get(spec.Arm.TREATMENT)
        )
        environment = placement.with_hosts(environment, hosts)
        self.status = self.status.model_copy(update={"environment": environment})
        warning = placement.warning(environment)
        if warning is not None:
            self.view.message(f"warning: {warning}")


def _arm_host(client: httpx.Client, arm: engines.Arm, gpus: str | None) -> status.Host:
    """An arm's host: this machine when it runs here (started here, or on loopback), else its URL's host.

    The engine's version comes from `/version`; a simulator's speed factor from `/sim/host`.
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
    return host.model_copy(update=facts)


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


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
