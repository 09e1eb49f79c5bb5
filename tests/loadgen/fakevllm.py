"""A small, honest stand-in for a vLLM server, for testing the load generator's parsing and timing.

Run as its own process (`python tests/loadgen/fakevllm.py --port 0 ...`; it prints `PORT <n>`), so
its work never shares the client's event loop. Step-synchronous like vLLM: one engine loop ticks
every `--step-ms`; each running stream emits one SSE chunk per step (after `--prefill-steps`), with
`--tokens-per-step` tokens (a range `1-4` draws per step: a speculative arm), cumulative `usage`
on every chunk, a final usage chunk with `metrics.speculative_decoding`, then `[DONE]`.

Ground truth: for each `x-request-id` it records, on `time.monotonic()` (one clock for all
processes on Linux), when the request was fully received and when each token chunk was handed to
the socket (stamped immediately before `transport.write`). `GET /truth` returns it as JSON.

Faults, chosen by a marker in the prompt text: `FAULT:http500`, `FAULT:http400`, `FAULT:badhttp`
(a response head that is not HTTP), `FAULT:stall` (the response head, then nothing: the client's
request timeout ends it), `FAULT:malformed` (a non-JSON event), `FAULT:badshape` (JSON of the wrong
shape: `{"choices": ["x"]}`), `FAULT:streamerror` (an error event), `FAULT:disconnect` (closes after
two chunks); engine data of the wrong type: `FAULT:finishobj` (`finish_reason` an object),
`FAULT:promptstr` (`prompt_tokens` a string), `FAULT:acceptstr` (a non-numeric
`num_accepted_draft_tokens` in the final `speculative_decoding`). `--metrics-fault nan|inf|garbage`
makes `/metrics` answer NaN counters, +Inf counters, or text that is not Prometheus exposition.
Deliberately not the product's simulator (`specdecode sim`): this one is small enough to trust.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any, cast


@dataclass
class Stream:
    rid: str
    transport: asyncio.Transport
    chat: bool
    max_tokens: int
    prompt: str
    prompt_tokens: int
    fault: str | None
    steps: int = 0
    emitted: int = 0
    chunks: int = 0
    hist: list[int] = field(default_factory=list)


class Server:
    def __init__(self, args: argparse.Namespace) -> None:
        self.step_s = args.step_ms / 1e3
        self.prefill_steps = args.prefill_steps
        lo, _, hi = args.tokens_per_step.partition("-")
        self.k_lo, self.k_hi = int(lo), int(hi or lo)
        self.rng = random.Random(args.seed)
        self.streams: list[Stream] = []
        self.truth: dict[str, dict[str, Any]] = {}
        self.counters = {
            "success": 0,
            "generation": 0,
            "prompt": 0,
            "drafts": 0,
            "draft_tokens": 0,
            "accepted": 0,
        }
        self.per_pos = [0] * max(self.k_hi - 1, 0)
        self.metrics_fault: str | None = args.metrics_fault
        self.wake = asyncio.Event()

    # ------------------------------------------------------------------ HTTP
    def handle(
        self, transport: asyncio.Transport, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> None:
        if method == "GET" and path == "/truth":
            self.reply(transport, 200, json.dumps(self.truth).encode(), "application/json")
        elif method == "GET" and path == "/metrics":
            self.reply(transport, 200, self.metrics().encode(), "text/plain; version=0.0.4")
        elif method == "GET" and path == "/health":
            self.reply(transport, 200, b"", "text/plain")
        elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            self.start(transport, path, headers, body)
        else:
            self.reply(transport, 404, b'{"error":"not found"}', "application/json")

    def reply(self, transport: asyncio.Transport, status: int, body: bytes, ctype: str) -> None:
        head = f"HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n\r\n"
        transport.write(head.encode() + body)

    def start(self, transport: asyncio.Transport, path: str, headers: dict[str, str], body: bytes) -> None:
        now = time.monotonic()
        req = json.loads(body)
        chat = path.endswith("chat/completions")
        prompt = req["messages"][-1]["content"] if chat else req["prompt"]
        rid = headers.get("x-request-id", f"anon-{len(self.truth)}")
        fault = next(
            (
                f
                for f in (
                    "http500",
                    "http400",
                    "badhttp",
                    "stall",
                    "malformed",
                    "badshape",
                    "streamerror",
                    "disconnect",
                    "finishobj",
                    "promptstr",
                    "acceptstr",
                )
                if f"FAULT:{f}" in prompt
            ),
            None,
        )
        self.truth[rid] = {"arrival": now, "emits": [], "fault": fault}
        if fault in ("http500", "http400"):
            status = 500 if fault == "http500" else 400
            self.reply(transport, status, b'{"error":{"message":"injected"}}', "application/json")
            return
        if fault == "badhttp":
            transport.write(b"NOT-HTTP garbage\r\n\r\n")
            return
        if fault == "stall":  # the head, then silence until the client gives up and closes
            transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            return
        transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        self.streams.append(
            Stream(rid, transport, chat, int(req.get("max_tokens", 16)), prompt, len(prompt.split()), fault)
        )
        self.wake.set()

    # ------------------------------------------------------------------ engine
    def token_text(self, s: Stream, j: int) -> str:
        h = hashlib.blake2s(f"{s.prompt}:{j}".encode(), digest_size=2).hexdigest()
        return f" t{h}"

    def chunk(self, s: Stream, text: str, finish: str | None, usage: dict[str, int]) -> dict[str, Any]:
        if s.chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
            return {"id": s.rid, "object": "chat.completion.chunk", "choices": [choice], "usage": usage}
        return {
            "id": s.rid,
            "object": "text_completion",
            "choices": [{"index": 0, "text": text, "finish_reason": finish}],
            "usage": usage,
        }

    @staticmethod
    def frame(obj: Any) -> bytes:
        data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
        return f"{len(data):x}\r\n".encode() + data + b"\r\n"

    def step(self) -> None:
        alive: list[Stream] = []
        for s in self.streams:
            s.steps += 1
            if s.transport.is_closing():
                continue
            if s.steps <= self.prefill_steps:
                alive.append(s)
                continue
            k = min(self.rng.randint(self.k_lo, self.k_hi), s.max_tokens - s.emitted)
            text = "".join(self.token_text(s, s.emitted + j) for j in range(k))
            s.emitted += k
            s.chunks += 1
            if s.chunks > 1 or s.emitted > k:  # the prefill step's first token is not a verify step
                s.hist.append(k - 1)
            finish = "length" if s.emitted >= s.max_tokens else None
            usage = {
                "prompt_tokens": s.prompt_tokens,
                "completion_tokens": s.emitted,
                "total_tokens": s.prompt_tokens + s.emitted,
            }
            chunk = self.chunk(s, text, finish, usage)
            if s.fault == "finishobj" and finish is not None:
                chunk["choices"][0]["finish_reason"] = {"type": finish}
            if s.fault == "promptstr":
                chunk["usage"] = dict(usage, prompt_tokens="many")
            payload = self.frame(chunk)
            if s.fault == "malformed" and s.chunks == 2:
                payload = self.frame(b"{not json")
            if s.fault == "badshape" and s.chunks == 2:
                payload = self.frame({"choices": ["x"]})
            if s.fault == "streamerror" and s.chunks == 2:
                payload = self.frame({"error": {"message": "injected stream error", "code": 500}})
            t = time.monotonic()
            s.transport.write(payload)
            self.truth[s.rid]["emits"].append((t, s.emitted))
            if s.fault == "disconnect" and s.chunks == 2:
                s.transport.close()
                continue
            if finish is None and not (s.fault in ("streamerror",) and s.chunks == 2):
                alive.append(s)
                continue
            self.finish(s, usage)
        self.streams = alive

    def finish(self, s: Stream, usage: dict[str, int]) -> None:
        final: dict[str, Any] = {"id": s.rid, "choices": [], "usage": usage}
        if self.k_hi > 1:
            k = self.k_hi - 1
            hist = [0] * (k + 1)
            for a in s.hist:
                hist[min(a, k)] += 1
            steps = len(s.hist)
            accepted = sum(s.hist)
            final["metrics"] = {
                "speculative_decoding": {
                    "mean_acceptance_length": 1 + accepted / steps if steps else 1.0,
                    "draft_acceptance_rate": accepted / (steps * k) if steps else 0.0,
                    "acceptance_histogram": hist,
                    "num_spec_steps": steps,
                    "num_accepted_draft_tokens": accepted,
                    "num_draft_tokens": steps * k,
                    "num_spec_tokens": k,
                }
            }
            if s.fault == "promptstr":
                final["usage"] = dict(usage, prompt_tokens="many")
            if s.fault == "acceptstr":
                final["metrics"]["speculative_decoding"]["num_accepted_draft_tokens"] = "lots"
            self.counters["drafts"] += steps
            self.counters["draft_tokens"] += steps * k
            self.counters["accepted"] += accepted
            for a in s.hist:
                for p in range(min(a, k)):
                    self.per_pos[p] += 1
        s.transport.write(self.frame(final) + self.frame(b"[DONE]") + b"0\r\n\r\n")
        self.truth[s.rid]["done"] = time.monotonic()
        self.counters["success"] += 1
        self.counters["generation"] += s.emitted
        self.counters["prompt"] += s.prompt_tokens

    async def engine(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.streams:
                self.wake.clear()
                await self.wake.wait()
            t = loop.time()
            self.step()
            await asyncio.sleep(max(0.0, self.step_s - (loop.time() - t)))

    def metrics(self) -> str:
        c = self.counters
        lab = 'model_name="fake",engine="0"'
        lines = [
            "# TYPE vllm:request_success counter",
            f'vllm:request_success_total{{{lab},finished_reason="length"}} {c["success"]}',
            "# TYPE vllm:generation_tokens counter",
            f"vllm:generation_tokens_total{{{lab}}} {c['generation']}",
            "# TYPE vllm:prompt_tokens counter",
            f"vllm:prompt_tokens_total{{{lab}}} {c['prompt']}",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{lab}}} {min(1.0, len(self.streams) / 100):.4f}",
        ]
        if self.k_hi > 1:
            lines += [
                "# TYPE vllm:spec_decode_num_drafts counter",
                f"vllm:spec_decode_num_drafts_total{{{lab}}} {c['drafts']}",
                "# TYPE vllm:spec_decode_num_draft_tokens counter",
                f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {c['draft_tokens']}",
                "# TYPE vllm:spec_decode_num_accepted_tokens counter",
                f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {c['accepted']}",
                "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
            ]
            lines += [
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{p}"}} {v}'
                for p, v in enumerate(self.per_pos)
            ]
        if self.metrics_fault == "garbage":
            return "vllm:request_success_total{ not exposition\n\x00\xff} 1 2 3 4\n<html>oops</html>\n"
        text = "\n".join(lines) + "\n"
        if self.metrics_fault in ("nan", "inf"):
            bad = "NaN" if self.metrics_fault == "nan" else "+Inf"
            text = "\n".join(
                f"{line.rsplit(' ', 1)[0]} {bad}" if line.startswith("vllm:") else line
                for line in text.splitlines()
            )
            text += "\n"
        return text


class Protocol(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports don't subclass it

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self.buf[:end].decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
            n = int(headers.get("content-length", "0"))
            if len(self.buf) < end + 4 + n:
                return
            body = self.buf[end + 4 : end + 4 + n]
            self.buf = self.buf[end + 4 + n :]
            method, path, _ = lines[0].split(" ", 2)
            assert self.transport is not None
            self.server.handle(self.transport, method, path, headers, body)


async def main(args: argparse.Namespace) -> None:
    server = Server(args)
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: Protocol(server), "127.0.0.1", args.port, backlog=4096)
    port = srv.sockets[0].getsockname()[1]
    print(f"PORT {port}", flush=True)
    engine = asyncio.create_task(server.engine())
    async with srv:
        await srv.serve_forever()
    engine.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--step-ms", type=float, default=10.0)
    parser.add_argument("--prefill-steps", type=int, default=2)
    parser.add_argument("--tokens-per-step", default="1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--metrics-fault", choices=("nan", "inf", "garbage"), default=None)
    parser.add_argument("--realtime", action="store_true", help="SCHED_FIFO when permitted (timing tests)")
    ns = parser.parse_args()
    if ns.realtime:
        with contextlib.suppress(AttributeError, PermissionError, OSError):
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        try:
            runner.run(main(ns))
        except KeyboardInterrupt:
            sys.exit(0)
