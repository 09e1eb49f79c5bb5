"""How accurate and how fast is the load generator? Client minus server ground truth, on loopback.

Usage (from the repository root, with the project's venv):

    python benchmarks/loadgen/bench.py [--server sim|fake] [--realtime] [--out FILE]
                                       [--streams 50,200,500] [--rates 100,200,300,400]
                                       [--guidellm /tmp/guidellm-venv/bin/guidellm]

1. Measurement error: one arm, closed loop at 50/200/500 concurrent streams against the simulator
   (`python -m specdecode.simulator`, or `--server fake`: tests/loadgen/fakevllm.py). Per request:
   TTFT error = client TTFT - (server write of the first token chunk - client send stamp);
   TPOT error = client TPOT - server TPOT (first to last token chunk write). Both processes read
   CLOCK_MONOTONIC, so the differences are direct. The server's `arrival -> first write` TTFT is
   also reported (its own read delay belongs to the true TTFT, not to the client's error).
2. Open-loop pacing: paired arms (the product's load), Poisson at each rate, the client pinned to
   one core; schedule lag = send - intended. The figure is the highest rate with p99 <= 1 ms.
3. An established client side by side: GuideLLM (if `--guidellm` is given) at the same
   concurrency against a fresh simulator; its TTFT/ITL percentiles next to the server's.

The client runs in this process, pinned to CPU 0 (`os.sched_setaffinity`); servers run on the
other CPUs. `--realtime` puts the client (and GuideLLM) under SCHED_FIFO (needs root) to separate
the client's own overhead from other processes on a shared machine; `--server-realtime` the
servers too (then without the simulator's pre-step spin, which would use up the real-time budget). `uptime`'s load is recorded with
every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specdecode.experiment import records, spec
from specdecode.loadgen import eventloop, runner, sse, summary
from specdecode.loadgen import plan as plan_mod

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "loadgen" / "fakevllm.py"


#: `--server-realtime`: servers under SCHED_FIFO too (else they run as normal processes on their CPUs)
SERVER_REALTIME = False
#: `--loop-stamps`: stamp reads when the event loop delivers them, not with the kernel's receive time
LOOP_STAMPS = False


def load() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A simulator (or fake) process on its own CPUs.

    `truth()` returns {x-request-id: (arrival, [(write time, cumulative tokens), ...])}.
    """

    def __init__(self, kind: str, *, spec_k: int | None, realtime: bool, python: str) -> None:
        self.kind = kind
        cpus = sorted(os.sched_getaffinity(0))
        pin = ["taskset", "-c", ",".join(str(c) for c in cpus[1:]) or "0"] if len(cpus) > 1 else []
        rt = ["chrt", "-f", "10"] if realtime and SERVER_REALTIME else []
        realtime = realtime and SERVER_REALTIME
        if kind == "sim":
            self.port = free_port()
            cmd = [
                python,
                "-m",
                "specdecode.simulator",
                "bench-model",
                "--port",
                str(self.port),
                "--host",
                "127.0.0.1",
                "--max-num-seqs",
                "1024",
                "--seed",
                "1",
                # the simulator spins for its last 1.5 ms before each step; under SCHED_FIFO that spin
                # exhausts the real-time budget and the kernel throttles the client's CPU too
                "--wake-margin-ms",
                "0" if realtime else "1.5",
            ]
            if spec_k:
                cmd += [
                    "--speculative-config",
                    json.dumps({"method": "ngram", "num_speculative_tokens": spec_k}),
                    "--per-request-spec-decode-metrics",
                    "summary",
                ]
            self.proc = subprocess.Popen(rt + pin + cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self._wait_ready()
        else:
            cmd = [python, str(FAKE), "--port", "0", "--step-ms", "10"]
            if spec_k:
                cmd += ["--tokens-per-step", f"1-{spec_k + 1}"]
            self.proc = subprocess.Popen(rt + pin + cmd, stdout=subprocess.PIPE, text=True)
            assert self.proc.stdout is not None
            self.port = int(self.proc.stdout.readline().split()[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1),
            ):
                return
            time.sleep(0.1)
        raise RuntimeError("simulator did not start")

    def sim_records(self) -> list[dict[str, Any]]:
        """The simulator's raw ground truth (one object per finished request)."""
        with urllib.request.urlopen(self.url + "/sim/ground_truth", timeout=30) as resp:
            return [json.loads(line) for line in resp.read().decode().splitlines()]

    def truth(self) -> dict[str, tuple[float, list[tuple[float, int]]]]:
        if self.kind == "sim":
            with urllib.request.urlopen(self.url + "/sim/ground_truth", timeout=30) as resp:
                lines = resp.read().decode().splitlines()
            out = {}
            for line in lines:
                rec = json.loads(line)
                cum, emits = 0, []
                for written, tokens, *_ in rec["chunks"]:
                    cum += tokens
                    emits.append((written, cum))
                out[rec["x_request_id"]] = (rec["arrival"], emits)
            return out
        with urllib.request.urlopen(self.url + "/truth", timeout=30) as resp:
            raw = json.load(resp)
        return {k: (v["arrival"], [tuple(e) for e in v["emits"]]) for k, v in raw.items()}

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@contextlib.contextmanager
def servers(
    kind: str, n: int, *, realtime: bool, python: str, spec_k: int | None = None
) -> Iterator[list[Server]]:
    started = [Server(kind, spec_k=spec_k if i else None, realtime=realtime, python=python) for i in range(n)]
    try:
        yield started
    finally:
        for s in started:
            s.stop()


def make_plan(
    stages: list[dict[str, Any]], n: int, *, input_tokens: int, output_tokens: int
) -> plan_mod.Plan:
    s = spec.ExperimentSpec.model_validate(
        {
            "model": "bench-model",
            "speculative": {"method": "ngram", "numSpeculativeTokens": 3},
            "workload": {
                "dataset": {"type": "synthetic", "inputTokens": input_tokens, "outputTokens": output_tokens},
                "stages": stages,
                "requestsPerStage": n,
                "warmupRequests": 0,
            },
        }
    )
    return plan_mod.plan_from_spec(s, ROOT)


def run_plan(plan: plan_mod.Plan, endpoints: dict[str, runner.Endpoint], out: Path) -> runner.RunResult:
    with asyncio.Runner(loop_factory=eventloop.loop_factory()) as loop:
        return loop.run(runner.run(plan, endpoints, out))


def read_records(out: Path) -> list[records.RequestRecord]:
    return [
        records.RequestRecord.model_validate_json(x)
        for x in (out / runner.REQUESTS_FILE).read_text().splitlines()
    ]


def pct(values: list[float]) -> dict[str, float | None]:
    return {
        "p50": summary.quantile(values, 0.5),
        "p99": summary.quantile(values, 0.99),
        "max": max(values) if values else None,
    }


def httpx_error(kind: str, streams: int, *, realtime: bool, python: str) -> dict[str, Any]:
    """The same closed loop on httpx (the project's default client), stamping each `aiter_raw` chunk.

    Why the load generator has its own client: this is what httpx's stack adds to the stamps.
    """
    import httpx

    with servers(kind, 1, realtime=realtime, python=python) as (srv,):
        n = max(2 * streams, 200)
        plan = make_plan(
            [{"name": f"c{streams}", "concurrency": streams}], n, input_tokens=64, output_tokens=64
        )
        reqs = plan.stages[0].requests
        rows: list[tuple[str, float, list[tuple[float, bytes]]]] = []

        async def main() -> None:
            limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
            async with httpx.AsyncClient(
                base_url=srv.url, limits=limits, timeout=httpx.Timeout(60.0)
            ) as client:
                next_i = 0

                async def worker() -> None:
                    nonlocal next_i
                    while next_i < n:
                        i = next_i
                        next_i += 1
                        rid = f"httpx-{i}"
                        headers = {"content-type": "application/json", "x-request-id": rid}
                        pieces: list[tuple[float, bytes]] = []
                        sent = time.monotonic()
                        async with client.stream(
                            "POST", reqs[i].path, content=reqs[i].body, headers=headers
                        ) as r:
                            async for chunk in r.aiter_raw():
                                pieces.append((time.monotonic(), chunk))
                        rows.append((rid, sent, pieces))

                await asyncio.gather(*(worker() for _ in range(streams)))

        with asyncio.Runner(loop_factory=eventloop.loop_factory()) as loop:
            loop.run(main())
        truth = srv.truth()
    ttft_err, tpot_err = [], []
    for rid, _sent, pieces in rows:
        stream = sse.parse(sse.split_events(pieces))
        _, emits = truth[rid]
        ev = stream.token_events
        ttft_err.append((ev[0][0] - emits[0][0]) * 1e3)
        n_tok = ev[-1][1]
        tpot_err.append(((ev[-1][0] - ev[0][0]) - (emits[-1][0] - emits[0][0])) * 1e3 / (n_tok - 1))
    return {
        "client": "httpx " + httpx.__version__,
        "streams": streams,
        "ok": len(rows),
        "ttft_error_ms": pct(ttft_err),
        "ttft_abs_error_p99_ms": summary.quantile([abs(x) for x in ttft_err], 0.99),
        "tpot_error_ms": pct(tpot_err),
        "tpot_abs_error_p99_ms": summary.quantile([abs(x) for x in tpot_err], 0.99),
        "load": load(),
    }


def measurement_error(kind: str, streams: int, *, realtime: bool, python: str, out: Path) -> dict[str, Any]:
    with servers(kind, 1, realtime=realtime, python=python) as (srv,):
        n = max(2 * streams, 200)
        plan = make_plan(
            [{"name": f"c{streams}", "concurrency": streams}], n, input_tokens=64, output_tokens=64
        )
        if LOOP_STAMPS:
            plan = dataclasses.replace(plan, kernel_timestamps=False)
        load_before = load()
        result = run_plan(plan, {"control": runner.Endpoint(srv.url)}, out)
        truth = srv.truth()
    recs = [r for r in read_records(out) if r.ok]
    a = result.anchor.monotonic
    ttft_err, tpot_err, server_ttft_err, first_delay = [], [], [], []
    for r in recs:
        arrival, emits = truth[r.request_id]
        assert r.ttft_ms is not None and r.tpot_ms is not None
        true_ttft = (emits[0][0] - (r.sent + a)) * 1e3
        ttft_err.append(r.ttft_ms - true_ttft)
        server_ttft_err.append(r.ttft_ms - (emits[0][0] - arrival) * 1e3)
        tpot_err.append(r.tpot_ms - (emits[-1][0] - emits[0][0]) * 1e3 / (emits[-1][1] - 1))
        first_delay.append((r.first_token + a - emits[0][0]) * 1e3 if r.first_token is not None else 0.0)
    v = result.summary["validity"]
    return {
        "streams": streams,
        "requests": n,
        "ok": len(recs),
        "load_before": load_before,
        "load_after": load(),
        "ttft_error_ms": pct(ttft_err),
        "ttft_abs_error_p99_ms": summary.quantile([abs(x) for x in ttft_err], 0.99),
        "tpot_error_ms": pct(tpot_err),
        "tpot_abs_error_p99_ms": summary.quantile([abs(x) for x in tpot_err], 0.99),
        "ttft_minus_server_side_ttft_ms": pct(server_ttft_err),
        "client_ttft_ms": pct([r.ttft_ms for r in recs if r.ttft_ms is not None]),
        "client_cpu_percent": v["client_cpu_percent"],
        "loop_lag_ms": v["loop_lag_ms"],
    }


def pacing(
    kind: str, rate: float, *, realtime: bool, python: str, out: Path, seconds: float
) -> dict[str, Any]:
    with servers(kind, 2, realtime=realtime, python=python, spec_k=3) as (control, treatment):
        n = int(rate * seconds)
        plan = make_plan([{"name": "open", "rate": rate}], n, input_tokens=64, output_tokens=16)
        load_before = load()
        result = run_plan(
            plan, {"control": runner.Endpoint(control.url), "treatment": runner.Endpoint(treatment.url)}, out
        )
    recs = read_records(out)
    lags = [r.schedule_lag_ms for r in recs if r.schedule_lag_ms is not None]
    v = result.summary["validity"]
    window = result.windows[0]
    return {
        "rate": rate,
        "requests_per_arm": n,
        "ok": sum(r.ok for r in recs),
        "load_before": load_before,
        "load_after": load(),
        "schedule_lag_ms": pct(lags),
        "achieved_send_rate": n / max(1e-9, max(r.sent for r in recs) - min(r.sent for r in recs))
        if recs
        else None,
        "window_s": window.end - window.start,
        "client_cpu_percent": v["client_cpu_percent"],
        "loop_lag_ms": v["loop_lag_ms"],
    }


def guidellm(exe: str, kind: str, streams: int, *, realtime: bool, python: str, out: Path) -> dict[str, Any]:
    """GuideLLM at `streams` concurrent streams; its percentiles next to the server's truth."""
    with servers(kind, 1, realtime=realtime, python=python) as (srv,):
        n = max(2 * streams, 200)
        prompts = out / "prompts.jsonl"
        out.mkdir(parents=True, exist_ok=True)
        words = " ".join(["the"] * 60)
        prompts.write_text(
            "".join(
                json.dumps({"prompt": f"{i} {words}", "output_tokens_count": 64}) + "\n" for i in range(n)
            )
        )
        report = out / "guidellm.json"
        cmd = [
            exe,
            "run",
            "--backend",
            f"kind=openai_http,target={srv.url},model=bench-model",
            "--profile",
            f"kind=concurrent,streams={streams}",
            "--constraint",
            f"kind=max_requests,count={n}",
            "--data",
            f"kind=json_file,path={prompts}",
            "--output",
            f"kind=json,path={report}",
            "--disable-console-interactive",
        ]
        load_before = load()
        t0 = time.monotonic()
        rt = ["chrt", "-f", "10"] if realtime else []  # the same priority as our client
        proc = subprocess.run(rt + cmd, capture_output=True, text=True, timeout=600, check=False)
        elapsed = time.monotonic() - t0
        sim_truth = srv.sim_records() if kind == "sim" else []
    result: dict[str, Any] = {
        "streams": streams,
        "returncode": proc.returncode,
        "elapsed_s": elapsed,
        "load_before": load_before,
        "load_after": load(),
        "command": " ".join(cmd),
    }
    if kind != "sim":
        result["error"] = "the comparison joins on the simulator's response ids: use --server sim"
        return result
    if proc.returncode != 0 or not report.exists():
        result["error"] = (proc.stderr or proc.stdout)[-2000:]
        return result
    # Per request, joined on the response id: GuideLLM stamps time.time(), the simulator
    # CLOCK_MONOTONIC plus its wall_minus_monotonic offset.
    by_id = {r["request_id"]: r for r in sim_truth}
    doc = json.loads(report.read_text())
    ttft_err: list[float] = []
    tpot_err: list[float] = []
    for req in doc["benchmarks"][0]["requests"]["successful"]:
        truth_rec = by_id.get(req.get("response_id"))
        timings = req["info"]["timings"]
        if truth_rec is None or not truth_rec["chunks"] or req.get("time_to_first_token_ms") is None:
            continue
        offset = truth_rec["wall_minus_monotonic"]
        cum, emits = 0, []
        for written, tokens, *_ in truth_rec["chunks"]:
            cum += tokens
            emits.append((written + offset, cum))
        true_ttft = (emits[0][0] - timings["request_start"]) * 1e3
        ttft_err.append(req["time_to_first_token_ms"] - true_ttft)
        if cum > 1 and req.get("inter_token_latency_ms") is not None:
            tpot_err.append(req["inter_token_latency_ms"] - (emits[-1][0] - emits[0][0]) * 1e3 / (cum - 1))
    result["matched"] = len(ttft_err)
    result["ttft_error_ms"] = pct(ttft_err)
    result["ttft_abs_error_p99_ms"] = summary.quantile([abs(x) for x in ttft_err], 0.99)
    result["tpot_error_ms"] = pct(tpot_err)
    result["tpot_abs_error_p99_ms"] = summary.quantile([abs(x) for x in tpot_err], 0.99)
    result["guidellm"] = _guidellm_figures(report)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    have_sim = (
        subprocess.run([sys.executable, "-c", "import specdecode.simulator"], capture_output=True).returncode
        == 0
    )
    ap.add_argument("--server", choices=["sim", "fake"], default="sim" if have_sim else "fake")
    ap.add_argument("--sim-python", default=sys.executable, help="interpreter that has specdecode.simulator")
    ap.add_argument("--streams", default="50,200,500")
    ap.add_argument("--rates", default="100,200,300,400")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each open-loop rate step")
    ap.add_argument("--realtime", action="store_true", help="SCHED_FIFO for the client (and GuideLLM) (root)")
    ap.add_argument("--server-realtime", action="store_true", help="SCHED_FIFO for the servers too")
    ap.add_argument("--loop-stamps", action="store_true", help="our client without kernel receive timestamps")
    ap.add_argument(
        "--guidellm", help="path of a guidellm executable (a throwaway venv, not a project dependency)"
    )
    ap.add_argument("--out", type=Path, help="write the results JSON here")
    ap.add_argument("--httpx", action="store_true", help="also measure the same closed loop on httpx")
    args = ap.parse_args()
    python = args.sim_python if args.server == "sim" else sys.executable
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # the client: one core
    global SERVER_REALTIME, LOOP_STAMPS
    SERVER_REALTIME = args.server_realtime
    LOOP_STAMPS = args.loop_stamps
    if args.realtime:  # children (servers) do not inherit it: SCHED_RESET_ON_FORK
        os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(10))
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "model": _cpu_model(),
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
        "server": args.server,
        "realtime": args.realtime,
        "server_realtime": args.server_realtime,
        "loop_stamps": args.loop_stamps,
        "client_cpu": sorted(os.sched_getaffinity(0)),
        "error": [],
        "pacing": [],
        "guidellm": [],
        "httpx": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for c in [int(x) for x in args.streams.split(",") if x]:
            r = measurement_error(
                args.server, c, realtime=args.realtime, python=python, out=Path(tmp) / f"e{c}"
            )
            results["error"].append(r)
            print(json.dumps(r), flush=True)
        if args.httpx:
            for c in [int(x) for x in args.streams.split(",") if x]:
                r = httpx_error(args.server, c, realtime=args.realtime, python=python)
                results["httpx"].append(r)
                print(json.dumps(r), flush=True)
        for rate in [float(x) for x in args.rates.split(",") if x]:
            r = pacing(
                args.server,
                rate,
                realtime=args.realtime,
                python=python,
                out=Path(tmp) / f"r{rate}",
                seconds=args.seconds,
            )
            results["pacing"].append(r)
            print(json.dumps(r), flush=True)
        if args.guidellm:
            for c in [int(x) for x in args.streams.split(",") if x]:
                r = guidellm(
                    args.guidellm,
                    args.server,
                    c,
                    realtime=args.realtime,
                    python=python,
                    out=Path(tmp) / f"g{c}",
                )
                results["guidellm"].append(r)
                print(json.dumps(r)[:2000], flush=True)
    ok_rates = [p["rate"] for p in results["pacing"] if (p["schedule_lag_ms"]["p99"] or 0) <= 1.0]
    results["highest_rate_within_1ms_p99_lag"] = max(ok_rates) if ok_rates else None
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps({"highest_rate_within_1ms_p99_lag": results["highest_rate_within_1ms_p99_lag"]}))
    return 0


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _guidellm_figures(report: Path) -> dict[str, Any]:
    """TTFT and ITL percentiles out of GuideLLM's JSON report (its own definitions: ITL = our TPOT)."""
    doc = json.loads(report.read_text())
    bench = doc["benchmarks"][0]
    metrics = bench["metrics"]
    out: dict[str, Any] = {}
    for key in ("time_to_first_token_ms", "inter_token_latency_ms", "time_per_output_token_ms"):
        m = metrics.get(key, {}).get("successful", {})
        pcts = m.get("percentiles", {})
        out[key] = {"p50": pcts.get("p50"), "p99": pcts.get("p99"), "mean": m.get("mean")}
    return out


if __name__ == "__main__":
    sys.exit(main())
