"""`specdecode run FILE --local` (and `specdecode demo`): the command around one local run
(`runner._Run`): the file read and validated (exit 2 before any arm starts), DIR prepared, the run
driven with SIGTERM and SIGHUP handled as Ctrl-C, the result printed, and the exit status of
design.md §4 (3 for Failed; 130 on Ctrl-C, SIGTERM or SIGHUP; 1 with --fail-on-reject and no
Promote)."""

from __future__ import annotations

import contextlib
import signal
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path

import yaml
from rich.console import Console

from specdecode import exit_status
from specdecode.experiment import documents, spec, status, validation
from specdecode.experiment.status import ExperimentStatus, Phase
from specdecode.loadgen import plan as plan_mod
from specdecode.loadgen import workload
from specdecode.local import view
from specdecode.local.runner import EXPERIMENT_FILE, Options, _Run
from specdecode.report import results, terminal

#: DIR/error.log: the traceback of an unexpected error (result.json's reason is then `InternalError`).
ERROR_LOG = "error.log"


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP to the runner: handled as Ctrl-C (the arms are stopped, the results so far kept)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signal = signal.Signals(signum).name


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
    except Exception as exc:  # a bug of ours, not the user's input: result.json still says what happened
        final = _internal_error(run_, exc, out)
    finally:
        show.stop()
    return _finish(console, options, final, out, run_.spec)


def _internal_error(run_: _Run, exc: Exception, out: Path) -> ExperimentStatus:
    """Failed (`InternalError`) with the traceback in DIR/error.log and the measurements kept: the
    run's own ending when it can still be written, else a result.json of the reason alone."""
    trace = out / ERROR_LOG
    with contextlib.suppress(OSError):
        trace.write_text(traceback.format_exc(), encoding="utf-8")
    message = (
        f"run --local stopped on an unexpected error ({type(exc).__name__}: {str(exc)[:300]}): a bug of "
        f"specdecode, please report it with {trace}; the requests measured so far are kept in {out}"
    )
    try:
        return run_.failed("InternalError", message)
    except Exception:  # the ending itself failed: the reason alone, so that result.json always exists
        final = ExperimentStatus(phase=Phase.FAILED, reason="InternalError", message=message)
        with exit_status.writing_results(out):
            results.write_result(out, final)
        return final


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
