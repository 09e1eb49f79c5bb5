"""What `specdecode run --local` shows while it runs: a live rich view, plain lines, or JSON lines."""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from specdecode.experiment import records, spec
from specdecode.loadgen import runner
from specdecode.report import terminal


@dataclass
class StageTally:
    """Counts of one stage, per arm."""

    requests: int = 0
    load: str = ""
    done: dict[spec.Arm, int] = field(default_factory=lambda: defaultdict(int))
    failed: dict[spec.Arm, int] = field(default_factory=lambda: defaultdict(int))
    stopped_early: bool = False
    warmup: bool = False


class View:
    """Receives the load generator's progress events; subclasses decide how to show them."""

    def __init__(self) -> None:
        self.stages: dict[str, StageTally] = {}
        self.current: str | None = None
        self.speedups: dict[str, float] = {}

    def __call__(self, event: runner.ProgressEvent) -> None:
        if isinstance(event, runner.StageStarted):
            self.current = event.stage
            tally = self.stages.get(event.stage)
            if tally is None:
                self.stages[event.stage] = StageTally(event.requests, event.load, warmup=event.warmup)
            else:  # one GPU: the treatment's load of a stage the control ran before keeps its counts
                tally.requests, tally.load = event.requests, event.load
        elif isinstance(event, runner.RequestDone):
            tally = self.stages.setdefault(event.stage, StageTally())
            tally.done[event.arm] += 1
            if not event.ok:
                tally.failed[event.arm] += 1
        else:
            self.stages.setdefault(event.stage, StageTally()).stopped_early = event.stopped_early
        self.update(event)

    def note_speedup(self, stage: str, recs: list[records.RequestRecord]) -> None:
        """The running TPOT speed-up (geometric mean of paired ratios) of a stage."""
        by_index: dict[int, dict[spec.Arm, float]] = defaultdict(dict)
        for rec in recs:
            if rec.ok and rec.tpot_ms:
                by_index[rec.index][rec.arm] = rec.tpot_ms
        logs = [
            math.log(p[spec.Arm.CONTROL] / p[spec.Arm.TREATMENT]) for p in by_index.values() if len(p) == 2
        ]
        if logs:
            self.speedups[stage] = math.exp(sum(logs) / len(logs))

    def update(self, event: runner.ProgressEvent) -> None:
        """Show one event."""

    def message(self, text: str) -> None:
        """A line of its own (arm started, healthy, ...)."""

    def start(self) -> None:
        """Begin showing."""

    def stop(self) -> None:
        """Stop showing (idempotent)."""


class QuietView(View):
    """One line per stage, for pipelines."""

    def __init__(self, out: TextIO | None = None) -> None:
        super().__init__()
        self.out = out or sys.stderr  # the stream of now, not of import time (redirected in tests)

    def update(self, event: runner.ProgressEvent) -> None:
        if isinstance(event, runner.StageFinished):
            tally = self.stages[event.stage]
            note = " (stopped early)" if event.stopped_early else ""
            failures = ", ".join(f"{arm} {n} failed" for arm, n in tally.failed.items() if n)
            print(
                f"{event.stage}: done{note}{'; ' + failures if failures else ''}", file=self.out, flush=True
            )

    def message(self, text: str) -> None:
        print(text, file=self.out, flush=True)


class JsonView(View):
    """One JSON object per event on stdout."""

    def __init__(self, out: TextIO | None = None) -> None:
        super().__init__()
        self.out = out or sys.stdout  # the stream of now, not of import time

    def update(self, event: runner.ProgressEvent) -> None:
        payload: dict[str, Any] = {"event": type(event).__name__, "stage": event.stage}
        if isinstance(event, runner.RequestDone):
            payload.update(index=event.index, arm=event.arm, ok=event.ok, errorClass=event.error_class)
        elif isinstance(event, runner.StageStarted):
            payload.update(requests=event.requests, load=event.load, warmup=event.warmup)
        else:
            payload.update(stoppedEarly=event.stopped_early)
        print(json.dumps(payload), file=self.out, flush=True)

    def message(self, text: str) -> None:
        print(json.dumps({"event": "Message", "message": text}), file=self.out, flush=True)


class LiveView(View):
    """Progress bars per stage and arm, failures, and the running speed-up.

    An arm's bar and counts appear with its first request: one GPU runs the arms one after the other,
    and an arm that has not run a stage shows `–`, not `0/0`.
    """

    def __init__(self, console: Console | None = None) -> None:
        super().__init__()
        self.console = console or terminal.console(stderr=True)
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
        )
        self.tasks: dict[tuple[str, spec.Arm], TaskID] = {}
        self.live = Live(
            Group(self.progress, Table()), console=self.console, refresh_per_second=4, transient=False
        )
        self._started = False

    def start(self) -> None:
        self.live.start()
        self._started = True

    def stop(self) -> None:
        if self._started:
            self.live.update(self._render())
            self.live.stop()
            self._started = False

    def message(self, text: str) -> None:
        self.console.print(text)

    def update(self, event: runner.ProgressEvent) -> None:
        if isinstance(event, runner.RequestDone):
            task = self.tasks.get((event.stage, event.arm))
            if task is None:
                tally = self.stages[event.stage]
                label = f"{event.stage:<8} {event.arm:<9}" + (" (warm-up)" if tally.warmup else "")
                task = self.tasks[(event.stage, event.arm)] = self.progress.add_task(
                    label, total=tally.requests or None
                )
            self.progress.advance(task)
        elif isinstance(event, runner.StageFinished):
            for arm in spec.Arm:
                task = self.tasks.get((event.stage, arm))
                if task is not None:
                    done = self.stages[event.stage].done[arm]
                    self.progress.update(task, total=done, completed=done)
        if self._started:
            self.live.update(self._render())

    def _render(self) -> Group:
        table = Table(title="per stage", expand=False)
        for column in (
            "stage",
            "load",
            "control done/failed",
            "treatment done/failed",
            "running TPOT speed-up",
        ):
            table.add_column(column)
        for name, tally in self.stages.items():
            speedup = self.speedups.get(name)
            table.add_row(
                name + (" (early stop)" if tally.stopped_early else ""),
                tally.load,
                *(
                    f"{tally.done[arm]}/{tally.failed.get(arm, 0)}" if arm in tally.done else "–"
                    for arm in spec.Arm
                ),
                f"{speedup:.2f}x" if speedup else "-",
            )
        return Group(self.progress, table)


def make_view(mode: str) -> View:
    """`live` (a terminal), `quiet` or `json`."""
    if mode == "json":
        return JsonView()
    if mode == "quiet":
        return QuietView()
    return LiveView()
