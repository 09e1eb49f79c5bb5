"""Process lifecycle of `specdecode sim`: bind, "load", serve, stop on SIGTERM/SIGINT.

For a runner starting it as a subprocess: the socket is bound at once (as vLLM's); `/health`
answers 503 during `--startup-delay` and 200 after, when the line `Application startup complete.`
is also logged to stderr (vLLM's uvicorn prints the same). SIGTERM or SIGINT stops it with
exit status 0; `--crash-after S` ends it with status 1 (a crashing engine). Exit status 2: bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys

from specdecode.experiment import degradations
from specdecode.simulator import api, options
from specdecode.simulator.dcgm import DcgmGpu
from specdecode.simulator.engine import Engine
from specdecode.simulator.groundtruth import GroundTruth
from specdecode.simulator.http import Connection
from specdecode.simulator.metrics import EngineMetrics
from specdecode.simulator.scheduler import Scheduler

log = logging.getLogger("specdecode.sim")


def _loop_factory() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; asyncio still works
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


async def serve(opts: options.SimOptions, *, ready: asyncio.Event | None = None) -> int:
    """Run the server until SIGTERM/SIGINT (or `--crash-after`)."""
    loop = asyncio.get_running_loop()
    k = opts.spec.k if opts.spec else 0
    metrics = EngineMetrics(
        model_name=opts.served_model_name,
        num_spec_tokens=k,
        max_model_len=opts.max_model_len,
        kv_cache_tokens=opts.params.kv_capacity_tokens(speculative=opts.spec is not None),
        prefix_caching=opts.prefix_caching,
        dcgm=DcgmGpu() if opts.dcgm else None,
    )
    sched = Scheduler(
        opts.params, opts.spec, seed=opts.seed, metrics=metrics, prefix_caching=opts.prefix_caching
    )
    engine = Engine(sched, wake_margin_s=opts.wake_margin_s)
    truth = GroundTruth(opts.ground_truth)
    cfg = api.ApiConfig(
        model=opts.model,
        served_model_name=opts.served_model_name,
        seed=opts.seed,
        params=opts.params,
        num_spec_tokens=k,
        per_request_metrics=opts.per_request_metrics,
        api_keys=opts.api_keys,
        max_model_len=opts.max_model_len,
        disconnect_rate=opts.disconnect_rate,
        speed_factor=opts.speed_factor,
    )
    app = api.App(cfg, engine, metrics, truth)
    # Fewer young-generation collections: the hot path allocates small objects at 10^4/s.
    gc.set_threshold(20_000, 20, 20)
    gc.freeze()
    server = await loop.create_server(
        lambda: Connection(app), opts.host, opts.port, reuse_address=True, backlog=4096
    )
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    engine_task = asyncio.create_task(engine.run())
    log.info(
        "specdecode sim %s on http://%s:%d (profile %s, k=%d): loading",
        opts.model,
        opts.host,
        opts.port,
        opts.profile,
        k,
    )
    if opts.ignored:
        log.info("ignored vLLM flags: %s", " ".join(opts.ignored))
    log.info("%s", metrics.kv_cache_log_line(opts.max_model_len))
    for kind in opts.degradations:
        # The very line real vLLM logs (`experiment/degradations.py`), as a warning of ours.
        log.warning("%s", degradations.EXAMPLES[degradations.Kind(kind)])

    async def load() -> None:
        await asyncio.sleep(opts.startup_delay)
        app.ready = True
        log.info("Application startup complete.")
        if ready is not None:
            ready.set()
        if opts.crash_after is not None:
            await asyncio.sleep(opts.crash_after)
            log.error("EngineCore encountered a fatal error (simulated crash: --crash-after)")
            truth.close()
            os._exit(1)

    async def write_truth() -> None:
        while True:
            await asyncio.sleep(0.2)
            truth.write_file()

    loader = asyncio.create_task(load())
    writer = asyncio.create_task(write_truth())
    try:
        await stop.wait()
    finally:
        log.info("Shutting down")
        loader.cancel()
        writer.cancel()
        engine.stop()
        server.close()
        engine_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await engine_task
        for task in (loader, writer):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        truth.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return 0


def main(ns: argparse.Namespace) -> int:
    """Entry point for `specdecode sim` with parsed arguments."""
    if ns.list_profiles:
        print(options.profiles_table())
        return 0
    try:
        opts = options.resolve(ns)
    except options.OptionsError as e:
        print(f"specdecode sim: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(name)s: %(message)s")
    with asyncio.Runner(loop_factory=_loop_factory) as runner:
        return runner.run(serve(opts))
