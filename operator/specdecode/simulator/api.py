"""The OpenAI-compatible surface of `vllm serve` 0.33, as the simulator answers it.

Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (streaming and not),
`GET /v1/models`, `/health`, `/ping`, `/version`, `/metrics`, and the simulator's own
`GET /sim/ground_truth[?request_id=ID][&clear=1]` and `GET /sim/host` (the simulated host's
`speedFactor`, which `run --local` records as provenance).

vLLM behaviours kept (shared/reference/vllm-0.33-facts.md §4–5): SSE events are exactly
`data: <json>\\n\\n` ending with `data: [DONE]`; the chat role chunk comes with the first token;
the chunk with the last tokens carries `finish_reason`; `stream_options.include_usage` adds a
final chunk with `choices: []` (and `metrics.speculative_decoding` with
`--per-request-spec-decode-metrics summary`); `continuous_usage_stats` puts cumulative usage on
every chunk; one chunk carries all tokens of a step; errors are `{"error": {message, type, param,
code}}`; `/v1` needs `Authorization: Bearer <key>` when `--api-key` is set; a request with
`min_p > 0` or `logit_bias` is refused while speculation is on. Text is ASCII words (see `text`),
so chunk JSON is assembled from pre-rendered pieces without escaping. Sampling parameters
(`temperature`, `top_p`, per-request `seed`, ...) are accepted and do not change the text: it is
always the "greedy" output for (server seed, prompt), so both arms can be compared exactly.

Fault injection, deterministic per request (keyed by seed, prompt and `x-request-id`):
`error_rate` (half answered HTTP 500, half — of streams — an in-stream error halfway),
`disconnect_rate` (the connection is dropped halfway through a stream), `output_mismatch_rate`
(treatment only: the text diverges from the control's at a deterministic position),
`batch_variance_rate` (either arm: the text diverges from the deterministic one at a position drawn
per request, as a real server's greedy output can when the batch around it changes).
"""

from __future__ import annotations

import json
import time
import uuid
from array import array
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from specdecode.experiment.simprofiles import SimParams
from specdecode.simulator import text
from specdecode.simulator.engine import Engine
from specdecode.simulator.groundtruth import GroundTruth
from specdecode.simulator.http import LAST_CHUNK, Connection, Request, frame
from specdecode.simulator.metrics import CONTENT_TYPE, EngineMetrics
from specdecode.simulator.scheduler import PREFIX_BLOCK, Emission, Sequence

VERSION = "0.33.0"
SPEC_SAMPLING_ERROR = (
    "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
)
DONE = frame(b"data: [DONE]\n\n") + LAST_CHUNK


@dataclass(frozen=True)
class ApiConfig:
    """What the API layer needs to know about the server."""

    model: str
    served_model_name: str
    seed: int
    params: SimParams
    num_spec_tokens: int
    per_request_metrics: str
    """none | summary | detailed."""
    api_keys: tuple[str, ...]
    max_model_len: int
    disconnect_rate: float = 0.0
    speed_factor: float = 1.0
    """The simulated host's speed factor, reported at /sim/host."""


class ApiError(Exception):
    """A request that vLLM would refuse, with its HTTP status and error type."""

    def __init__(
        self, message: str, *, status: int = 400, type_: str = "BadRequestError", param: str | None = None
    ):
        super().__init__(message)
        self.status = status
        self.type = type_
        self.param = param

    def body(self) -> bytes:
        """vLLM's error body."""
        err = {"message": str(self), "type": self.type, "param": self.param, "code": self.status}
        return json.dumps({"error": err}).encode()


def _json(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class App:
    """Routes requests; builds sequences for the engine."""

    def __init__(self, cfg: ApiConfig, engine: Engine, metrics: EngineMetrics, truth: GroundTruth) -> None:
        self.cfg = cfg
        self.engine = engine
        self.metrics = metrics
        self.truth = truth
        self.ready = False
        """False while "loading" (`--startup-delay`): /health answers 503 and /v1 refuses."""
        self.created = int(time.time())

    # ------------------------------------------------------------------------------------ routing
    def handle(self, req: Request, conn: Connection) -> None:
        """Answer one request."""
        path = req.path
        try:
            if path == "/health":
                conn.respond(200 if self.ready else 503, b"")
            elif path == "/metrics":
                conn.respond(200, self.metrics.render(), CONTENT_TYPE)
            elif path == "/version":
                conn.respond(200, _json({"version": VERSION}))
            elif path == "/ping":
                conn.respond(200 if self.ready else 503, b"{}")
            elif path == "/sim/ground_truth":
                q = parse_qs(req.query)
                conn.respond(200, self.truth.jsonl(q.get("request_id", [None])[0]), b"application/jsonl")
                if q.get("clear"):
                    self.truth.clear()
            elif path == "/sim/host":
                conn.respond(200, _json({"speedFactor": self.cfg.speed_factor}))
            elif path.startswith("/v1/"):
                self._v1(req, conn)
            else:
                conn.respond(404, b'{"detail":"Not Found"}')
        except ApiError as e:
            conn.respond(e.status, e.body(), headers=_rid_header(req))

    def _v1(self, req: Request, conn: Connection) -> None:
        if self.cfg.api_keys and req.headers.get("authorization", "") not in {
            f"Bearer {k}" for k in self.cfg.api_keys
        }:
            conn.respond(401, b'{"error":"Unauthorized"}')
            return
        if req.path == "/v1/models":
            self._require(req, "GET")
            conn.respond(200, _json(self._models()))
            return
        if req.path not in ("/v1/completions", "/v1/chat/completions"):
            conn.respond(404, b'{"detail":"Not Found"}')
            return
        self._require(req, "POST")
        if not self.ready:
            raise ApiError(
                "The server is still loading the model.", status=503, type_="ServiceUnavailableError"
            )
        self._generate(req, conn, chat=req.path == "/v1/chat/completions")

    @staticmethod
    def _require(req: Request, method: str) -> None:
        if req.method != method:
            raise ApiError("Method Not Allowed", status=405, type_="MethodNotAllowed")

    def _models(self) -> dict[str, Any]:
        perm = {
            "id": f"modelperm-{uuid.UUID(int=text.stable_hash(self.cfg.seed, 'perm')).hex}",
            "object": "model_permission",
            "created": self.created,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }
        card = {
            "id": self.cfg.served_model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": self.cfg.model,
            "parent": None,
            "max_model_len": self.cfg.max_model_len,
            "permission": [perm],
        }
        return {"object": "list", "data": [card]}

    # --------------------------------------------------------------------------------- generation
    def _generate(self, req: Request, conn: Connection, *, chat: bool) -> None:
        cfg = self.cfg
        try:
            body = json.loads(req.body or b"{}")
        except ValueError as e:
            raise ApiError(f"Invalid JSON body: {e}") from None
        if not isinstance(body, dict):
            raise ApiError("The request body must be a JSON object.")
        model = body.get("model")
        if model is not None and model not in (cfg.served_model_name, cfg.model):
            raise ApiError(
                f"The model `{model}` does not exist.", status=404, type_="NotFoundError", param="model"
            )
        prompt_key, prompt_tokens, blocks = self._prompt(body, chat=chat)
        stream = bool(body.get("stream", False))
        opts = body.get("stream_options")
        if opts is not None and not stream:
            raise ApiError("Stream options can only be defined when `stream=True`.")
        opts = opts if isinstance(opts, dict) else {}
        if cfg.num_spec_tokens > 0 and ((body.get("min_p") or 0) > 0 or body.get("logit_bias")):
            raise ApiError(SPEC_SAMPLING_ERROR)
        if body.get("n", 1) != 1:
            raise ApiError("The simulator supports only n=1.", param="n")
        max_tokens = body.get("max_completion_tokens") if chat else None
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        if max_tokens is None:
            max_tokens = cfg.max_model_len - prompt_tokens
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ApiError(f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens")
        if prompt_tokens + max_tokens > cfg.max_model_len:
            raise ApiError(
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, you requested "
                f"{max_tokens} output tokens and your prompt contains at least {prompt_tokens} input tokens, "
                f"for a total of at least {prompt_tokens + max_tokens} tokens. "
                "Please reduce the length of the "
                "input prompt or the number of requested output tokens.",
                param="max_tokens",
            )
        min_tokens = int(body.get("min_tokens") or 0)
        if body.get("ignore_eos"):
            out_tokens, reason = max_tokens, "length"
        else:
            natural = max(min_tokens, 16 + text.stable_hash(cfg.seed, "eos", prompt_key) % 1008)
            out_tokens, reason = (natural, "stop") if natural < max_tokens else (max_tokens, "length")

        xrid = req.headers.get("x-request-id")
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        fault_key = (cfg.seed, prompt_key, xrid)
        p = cfg.params
        arrival = time.monotonic()
        record: dict[str, Any] = {
            "request_id": rid,
            "x_request_id": xrid,
            "endpoint": req.path,
            "stream": stream,
            "status": "ok",
            "http_status": 200,
            "arrival": arrival,
            "scheduled": None,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 0,
            "finish_reason": None,
            "chunks": array("d"),  # flat (written, tokens, boundary) triples; see groundtruth
        }
        if text.unit("error", *fault_key) < p.error_rate and not (
            stream and text.unit("error-kind", *fault_key) < 0.5
        ):
            record.update(status="http_error", http_status=500)
            self.truth.add(record)
            raise ApiError("Injected failure (simulator errorRate).", status=500, type_="InternalServerError")
        error_after = None
        if text.unit("error", *fault_key) < p.error_rate:
            error_after = max(1, out_tokens // 2)
        disconnect_after = None
        if stream and text.unit("disconnect", *fault_key) < cfg.disconnect_rate:
            disconnect_after = max(1, out_tokens // 2)
        diverge_at = None
        if cfg.num_spec_tokens > 0 and text.unit("mismatch", cfg.seed, prompt_key) < p.output_mismatch_rate:
            diverge_at = text.stable_hash("mismatch-at", cfg.seed, prompt_key) % out_tokens
        if text.unit("batch-variance", *fault_key) < p.batch_variance_rate:
            at = text.stable_hash("batch-variance-at", *fault_key) % out_tokens
            diverge_at = at if diverge_at is None else min(diverge_at, at)

        seq = Sequence(
            request_id=rid,
            prompt_tokens=prompt_tokens,
            output_tokens=out_tokens,
            finish_reason=reason,
            arrival=arrival,
            max_tokens=max_tokens,
            prompt_blocks=blocks,
            error_after=error_after,
        )
        sink = ResponseSink(
            app=self,
            conn=conn,
            seq=seq,
            chat=chat,
            stream=stream,
            record=record,
            include_usage=bool(opts.get("include_usage")),
            continuous=bool(opts.get("include_usage") and opts.get("continuous_usage_stats")),
            text=text.TextStream(cfg.seed, prompt_key, diverge_at=diverge_at),
            disconnect_after=disconnect_after,
            headers=_rid_header(req),
        )
        seq.sink = sink
        conn.on_lost = sink.lost
        if stream:
            conn.start_stream(_rid_header(req))
        self.engine.submit(seq)

    def _prompt(self, body: dict[str, Any], *, chat: bool) -> tuple[str, int, tuple[int, ...]]:
        """(key for the text generator, prompt tokens, prefix-block hashes)."""
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ApiError("messages must be a non-empty list.", param="messages")
            toks: list[str] = []
            for m in messages:
                if not isinstance(m, dict):
                    raise ApiError("Each message must be an object.", param="messages")
                content = m.get("content")
                if isinstance(content, list):  # content parts
                    content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
                # A chat template adds a few tokens per message: <role> ... <end>.
                toks += ["<|", str(m.get("role", "user")), "|>", *text.tokenize(str(content or "")), "<end>"]
            toks += ["<|", "assistant", "|>"]
            key = json.dumps(messages, sort_keys=True)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1:
                prompt = prompt[0]
            if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                toks = [str(t) for t in prompt]
                key = json.dumps(prompt)
            elif isinstance(prompt, str):
                toks = text.tokenize(prompt)
                key = prompt
            else:
                raise ApiError(
                    "prompt must be a string, one string in a list, or a list of token ids.", param="prompt"
                )
        n = max(1, len(toks))
        blocks: list[int] = []
        h = 0
        for i in range(0, n - n % PREFIX_BLOCK, PREFIX_BLOCK):
            h = text.stable_hash(h, *toks[i : i + PREFIX_BLOCK])
            blocks.append(h)
        return key, n, tuple(blocks)


def _rid_header(req: Request) -> list[tuple[bytes, bytes]]:
    xrid = req.headers.get("x-request-id")
    return [(b"x-request-id", xrid.encode("latin-1"))] if xrid else []


class ResponseSink:
    """Turns a sequence's emissions into the HTTP response (SSE chunks or one JSON body)."""

    def __init__(
        self,
        *,
        app: App,
        conn: Connection,
        seq: Sequence,
        chat: bool,
        stream: bool,
        record: dict[str, Any],
        include_usage: bool,
        continuous: bool,
        text: text.TextStream,
        disconnect_after: int | None,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        self.app = app
        self.conn = conn
        self.seq = seq
        self.chat = chat
        self.stream = stream
        self.record = record
        self.include_usage = include_usage
        self.continuous = continuous
        self.text = text
        self.disconnect_after = disconnect_after
        self.headers = headers
        self.parts: list[str] = []
        self._pending = b""
        self._chunks: array[float] = record["chunks"]
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        model = app.cfg.served_model_name
        self._head = (
            f'data: {{"id":"{seq.request_id}","object":"{obj}","created":{created},"model":"{model}",'
        )
        self._created = created

    # -------------------------------------------------------------------------------- rendering
    def _usage(self, completion: int) -> str:
        p = self.seq.prompt_tokens
        total = p + completion
        return f'"usage":{{"prompt_tokens":{p},"total_tokens":{total},"completion_tokens":{completion}}}'

    def _chunk(self, delta: str, finish: str | None, completion: int) -> str:
        fin = "null" if finish is None else f'"{finish}"'
        if self.chat:
            choice = f'{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{fin}'
        else:
            choice = f'{{"index":0,"text":{delta},"logprobs":null,"finish_reason":{fin}'
        choice += ',"stop_reason":null}' if finish is not None else "}"
        usage = "," + self._usage(completion) if self.continuous else ""
        return f'{self._head}"choices":[{choice}]{usage}}}\n\n'

    def spec_metrics(self) -> dict[str, Any] | None:
        """`metrics.speculative_decoding` of this request, or None when not configured."""
        cfg = self.app.cfg
        if cfg.num_spec_tokens == 0 or cfg.per_request_metrics == "none":
            return None
        hist = self.seq.spec_histogram
        steps = sum(hist)
        accepted = sum(j * n for j, n in enumerate(hist))
        drafted = self.seq.num_draft_tokens
        out: dict[str, Any] = {
            "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
            "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
            "acceptance_histogram": list(hist),
            "num_spec_steps": steps,
            "num_accepted_draft_tokens": accepted,
            "num_draft_tokens": drafted,
            "num_spec_tokens": cfg.num_spec_tokens,
        }
        return out

    def prepare(self, em: Emission) -> None:
        """Render the bytes this emission writes (before the step boundary)."""
        piece = self.text.take(em.tokens)
        if not self.stream:
            self.parts.append(piece)
            return
        finish = None
        if em.finished and not em.error:
            finish = self.seq.finish_reason
        out = []
        if em.first and self.chat:
            out.append(self._chunk('{"role":"assistant","content":""}', None, 0))
        content = f'{{"content":"{piece}"}}' if self.chat else f'"{piece}"'
        out.append(self._chunk(content, finish, em.generated))
        if em.error:
            err = {
                "message": "Injected failure (simulator errorRate).",
                "type": "InternalServerError",
                "param": None,
                "code": 500,
            }
            out.append(f"data: {_json({'error': err}).decode()}\n\n")
        elif em.finished and self.include_usage:
            usage = self._usage(em.generated)
            sm = self.spec_metrics()
            metrics = f',"metrics":{{"speculative_decoding":{_json(sm).decode()}}}' if sm is not None else ""
            out.append(f'{self._head}"choices":[],{usage}{metrics}}}\n\n')
        data = frame("".join(out).encode())
        self._pending = data + DONE if em.finished else data

    def flush(self, em: Emission, scheduled: float) -> None:
        """Write at the step boundary; record the ground truth."""
        conn = self.conn
        if self.seq.aborted:
            return
        if self.stream and not em.finished and self.disconnect_after is None:
            # The hot path: one chunk of a running stream.
            self._chunks.extend((time.monotonic(), em.tokens, scheduled))
            if not conn.closed:
                conn.transport.write(self._pending)  # type: ignore[union-attr]
            return
        # The record is stored before the last write, so a client that has read the whole response
        # always finds it at /sim/ground_truth; chunks are stamped just before their write.
        if self.stream:
            self._chunks.extend((time.monotonic(), em.tokens, scheduled))
            if (
                self.disconnect_after is not None
                and em.generated >= self.disconnect_after
                and not em.finished
            ):
                self.seq.aborted = True
                self._finish("disconnected", em)
                conn.write(self._pending)
                conn.abort()
                return
            if em.finished:
                self._finish("error" if em.error else "ok", em)
            conn.write(self._pending)
            if em.finished:
                conn.end_stream()
            return
        self._chunks.extend((time.monotonic(), em.tokens, scheduled))
        if em.finished:
            if em.error:
                err = ApiError(
                    "Injected failure (simulator errorRate).", status=500, type_="InternalServerError"
                )
                self.record["http_status"] = 500
                body = err.body()
            else:
                body = _json(self._full_response(em))
            self._chunks[-3] = time.monotonic()
            self._finish("error" if em.error else "ok", em)
            conn.respond(self.record["http_status"], body, headers=self.headers)

    def _full_response(self, em: Emission) -> dict[str, Any]:
        content = "".join(self.parts)
        reason = self.seq.finish_reason
        if self.chat:
            message: dict[str, Any] = {
                "role": "assistant",
                "content": content,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "tool_calls": [],
                "reasoning": None,
            }
            choice: dict[str, Any] = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": reason,
                "stop_reason": None,
            }
        else:
            choice = {
                "index": 0,
                "text": content,
                "logprobs": None,
                "finish_reason": reason,
                "stop_reason": None,
                "prompt_logprobs": None,
            }
        p = self.seq.prompt_tokens
        sm = self.spec_metrics()
        if sm is not None:
            sm.update(per_step_accepted=None, per_step_drafted=None)
        return {
            "id": self.seq.request_id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self._created,
            "model": self.app.cfg.served_model_name,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {
                "prompt_tokens": p,
                "total_tokens": p + em.generated,
                "completion_tokens": em.generated,
                "prompt_tokens_details": None,
            },
            "prompt_logprobs": None,
            "kv_transfer_params": None,
            "metrics": {"speculative_decoding": sm} if sm is not None else None,
        }

    def _finish(self, status: str, em: Emission | None) -> None:
        r = self.record
        r["scheduled"] = self.seq.scheduled_at
        r["status"] = status
        r["completion_tokens"] = em.generated if em else self.seq.generated
        r["finish_reason"] = (
            "error" if status == "error" else (self.seq.finish_reason if status == "ok" else None)
        )
        self.app.truth.add(r)
        self.seq.sink = None  # break the seq <-> sink cycle: finished requests are freed without the GC

    def lost(self) -> None:
        """The client went away: abort the sequence (vLLM does not count it as finished)."""
        if self.seq.finished_at is None:
            self.seq.aborted = True
            self._finish("aborted", None)
