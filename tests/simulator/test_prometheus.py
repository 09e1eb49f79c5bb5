"""A real Prometheus server scrapes the simulator and computes the acceptance rate with PromQL."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .conftest import FAST, Prometheus, StartSim

ACCEPTANCE = (
    "sum(increase(vllm:spec_decode_num_accepted_tokens_total[1m]))"
    " / sum(increase(vllm:spec_decode_num_draft_tokens_total[1m]))"
)


def test_prometheus_scrapes_the_simulator_and_answers_the_acceptance_rate(
    start_sim: StartSim, start_prometheus: Callable[[list[str]], Prometheus]
) -> None:
    # Unconditional per-position rates 0.8, 0.64, 0.512 => expected accepted/drafted = (0.8+0.64+0.512)/3.
    spec = (
        '{"method":"draft_model","model":"d","num_speculative_tokens":3,'
        '"synthetic_acceptance_rates":[0.8,0.64,0.512]}'
    )
    sim = start_sim(*FAST, "--speculative-config", spec)
    prom = start_prometheus([f"127.0.0.1:{sim.port}"])
    stop = threading.Event()

    def load() -> None:
        i = 0
        while not stop.is_set():
            sim.post(
                "/v1/completions", {"model": "m", "prompt": f"p{i}", "max_tokens": 200, "ignore_eos": True}
            )
            i += 1

    worker = threading.Thread(target=load)
    worker.start()
    try:
        deadline = time.monotonic() + 60
        value = None
        while time.monotonic() < deadline:
            result = prom.query(ACCEPTANCE)
            up = prom.query('up{job="sim"}')
            if result and up and up[0]["value"][1] == "1" and result[0]["value"][1] not in ("NaN", "0"):
                # Wait for a few scrapes so the increase covers enough drafts.
                drafts = prom.query("sum(vllm:spec_decode_num_drafts_total)")
                if drafts and float(drafts[0]["value"][1]) > 2000:
                    value = float(result[0]["value"][1])
                    break
            time.sleep(0.5)
    finally:
        stop.set()
        worker.join()
    assert value is not None, "Prometheus never had the acceptance rate"
    assert abs(value - (0.8 + 0.64 + 0.512) / 3) < 0.05
    per_pos = prom.query(
        "sum by (position) (vllm:spec_decode_num_accepted_tokens_per_pos_total)"
        " / ignoring(position) group_left"
        " sum(vllm:spec_decode_num_drafts_total)"
    )
    rates = {r["metric"]["position"]: float(r["value"][1]) for r in per_pos}
    assert set(rates) == {"0", "1", "2"}
    assert abs(rates["0"] - 0.8) < 0.05 and abs(rates["2"] - 0.512) < 0.05
