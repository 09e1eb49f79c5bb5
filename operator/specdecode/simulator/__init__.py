"""The vLLM simulator (design.md §6): a step-synchronous stand-in for `vllm serve` 0.33.

Modules, each one job:
- `text`: the deterministic tokenizer and output text;
- `scheduler`: the pure step model and batch scheduler (no I/O, no clock: also driven in virtual time);
- `metrics`: vLLM 0.33's Prometheus metrics, rendered by hand;
- `api`: the OpenAI-compatible endpoints (request validation, response and SSE rendering);
- `http`: a small HTTP/1.1 server on asyncio + httptools, so the engine writes chunks straight to sockets;
- `engine`: the real-time loop that runs the scheduler against absolute step deadlines;
- `groundtruth`: per-request server-side chunk timestamps (JSONL file and `/sim/ground_truth`);
- `options`: the command line (vLLM's flag names where they overlap), `server`: process lifecycle.
"""
