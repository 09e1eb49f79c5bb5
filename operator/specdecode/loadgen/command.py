"""`specdecode loadgen`: the load Job's entry point (and a way to load any two endpoints by hand).

Exit statuses (`specdecode.exit_status`): 0 the run completed (read `validity` in the summary
before trusting it); 2 invalid input (experiment file, dataset, URL); 3 could not measure (no
request succeeded, or `--out` cannot be written: `exit_status.ResultsUnwritable`).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from specdecode import exit_status
from specdecode.experiment import documents, spec, validation
from specdecode.loadgen import eventloop, http, runner, workload
from specdecode.loadgen import plan as plan_mod


class ProgressPrinter:
    """One line per stage start and end, and a count every 10% of a stage."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.done = 0
        self.total = 0
        self.failed = 0

    def __call__(self, event: runner.ProgressEvent) -> None:
        if isinstance(event, runner.StageStarted):
            self.done, self.failed, self.total = 0, 0, event.requests * 2
            head = f"[{event.position + 1}/{event.total}] {event.stage}"
            print(f"{head}: {event.requests} requests, {event.load}", file=self.out, flush=True)
        elif isinstance(event, runner.RequestDone):
            self.done += 1
            self.failed += not event.ok
            step = max(1, self.total // 10)
            if self.done % step == 0:
                print(
                    f"  {event.stage}: {self.done}/{self.total} done, {self.failed} failed",
                    file=self.out,
                    flush=True,
                )
        else:
            w = event.window
            note = " (stopped early)" if event.stopped_early else ""
            print(f"  {event.stage}: finished in {w.end - w.start:.1f} s{note}", file=self.out, flush=True)


class _AfterStage:
    """Passes events on, and calls `hook(stage)` once a measured stage's files are complete."""

    def __init__(self, inner: runner.Progress | None, hook: Callable[[str], None]) -> None:
        self.inner = inner
        self.hook = hook
        self.warmups: set[str] = set()

    def __call__(self, event: runner.ProgressEvent) -> None:
        if self.inner is not None:
            self.inner(event)
        if isinstance(event, runner.StageStarted) and event.warmup:
            self.warmups.add(event.stage)
        elif isinstance(event, runner.StageFinished) and event.stage not in self.warmups:
            self.hook(event.stage)


def main(
    *,
    experiment: Path,
    control_url: str,
    treatment_url: str,
    out: Path,
    api_key_env: str | None,
    scrape_metrics: bool,
    quiet: bool,
    control_metrics_url: str | None = None,
    treatment_metrics_url: str | None = None,
    dataset_file: Path | None = None,
    salt: str | None = None,
    load_pod: tuple[int, int] | None = None,
    err: TextIO = sys.stderr,
    after_stage: Callable[[str], None] | None = None,
) -> int:
    """Load both arms as the experiment's workload says; write results under `out`.

    `after_stage(stage)` runs between stages, once the stage's records and window are on disk (the
    load Job stores them there, so a Job killed later keeps every stage it finished); the next
    stage starts when it returns. `load_pod` (pod, pods): send only that pod's shard of the plan
    (`plan.shard`), to every stage's bound (no sequential stop: `experiment/loadpods.py`).
    """
    try:
        exp = documents.load_experiment(experiment)
        plan = plan_mod.plan_from_spec(
            exp.spec,
            experiment.resolve().parent,
            dataset_file=dataset_file,
            salt=salt,
            scrape_metrics=scrape_metrics,
        )
        stop_rule = plan_mod.stop_rule(exp.spec)
        if load_pod is not None and load_pod[1] > 1:
            plan, stop_rule = plan_mod.shard(plan, *load_pod), None
        api_key = None
        if api_key_env:
            api_key = os.environ.get(api_key_env)
            if not api_key:
                raise ValueError(f"--api-key-env: environment variable {api_key_env} is not set")
        endpoints = {
            spec.Arm.CONTROL: runner.Endpoint(control_url, control_metrics_url, api_key),
            spec.Arm.TREATMENT: runner.Endpoint(treatment_url, treatment_metrics_url, api_key),
        }
        for ep in endpoints.values():
            http.Origin.parse(ep.url)
            if ep.metrics_url:
                http.Origin.parse(ep.metrics_url)
    except (
        validation.InvalidSpecError,
        documents.UnreadableFileError,
        workload.DatasetError,
        ValueError,
    ) as exc:
        for line in str(exc).splitlines() or [type(exc).__name__]:
            print(f"specdecode loadgen: {line}", file=err)
        return exit_status.INVALID
    exit_status.prepare_results_directory(out)  # before the first request (ResultsUnwritable: exit 3)
    progress: runner.Progress | None = None if quiet else ProgressPrinter(err)
    if after_stage is not None:
        progress = _AfterStage(progress, after_stage)
    with asyncio.Runner(loop_factory=eventloop.loop_factory()) as loop:
        result = loop.run(runner.run(plan, endpoints, out, progress=progress, stop_rule=stop_rule))
    measured = [s for s in result.summary["stages"] if not s["warmup"]]
    ok = sum(a["ok"] for s in measured for a in s["arms"].values())
    validity = result.validity
    if not quiet:
        state = "valid" if result.valid else "INVALID: " + "; ".join(validity.reasons if validity else [])
        print(f"wrote {result.records_written} records to {out} ({state})", file=err)
    if ok == 0:
        print("specdecode loadgen: no request succeeded; could not measure", file=err)
        return exit_status.FAILED
    return exit_status.OK
