#!/usr/bin/env python3
"""Writes an experiment's stage prompts for `vllm bench serve --dataset-name custom`, and the bench flags
that send them the way `specdecode run --local` does.

    export_prompts.py EXP.yaml OUTDIR [STAGE...]   -> OUTDIR/STAGE.jsonl, OUTDIR/STAGE.args.json

The prompts come from the project's own plan (loadgen.plan.plan_from_spec) with the salt `run --local`
uses (f"{seed}-local"), so request i of stage S is byte for byte the prompt the project sent as request i
of S (nonce prefix included). Each line: {"prompt": ..., "output_tokens": max_tokens}. The flags keep the
project's request body: the same max_tokens (--custom-output-len), ignore_eos, temperature, top_p,
stream_options with continuous usage stats (--extra-body), no chat template (--skip-chat-template), the
file's order (--disable-shuffle), and the stage's load: closed loop at concurrency C is
`--max-concurrency C --request-rate inf`. What differs: vLLM's client adds repetition_penalty 1.0 and
logprobs null (both no-ops) and sends no per-request seed (irrelevant under greedy sampling).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from specdecode.experiment import documents
from specdecode.loadgen import plan as plan_mod


def export(exp_path: Path, out: Path, stages: list[str]) -> list[Path]:
    exp = documents.load_experiment(exp_path)
    s = exp.spec
    plan = plan_mod.plan_from_spec(s, exp_path.parent, salt=f"{s.engine.seed}-local")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for st in plan.stages:
        if st.warmup or (stages and st.name not in stages):
            continue
        bodies = [json.loads(r.body) for r in st.requests]
        if any(r.path != "/v1/completions" or "prompt" not in b for r, b in zip(st.requests, bodies)):
            raise SystemExit(f"stage {st.name}: chat requests; this exporter handles completions prompts only")
        keys = {(b["max_tokens"], b.get("ignore_eos", False), b["temperature"], b["top_p"]) for b in bodies}
        if len(keys) != 1:
            raise SystemExit(f"stage {st.name}: requests differ in max_tokens/ignore_eos/temperature/top_p: {keys}")
        max_tokens, ignore_eos, temperature, top_p = keys.pop()
        path = out / f"{st.name}.jsonl"
        with path.open("w") as f:
            for b in bodies:
                f.write(json.dumps({"prompt": b["prompt"], "output_tokens": max_tokens}) + "\n")
        stream_options = bodies[0].get("stream_options", {"include_usage": True})
        args = [
            "--backend", "openai", "--endpoint", "/v1/completions",
            "--model", s.model, "--tokenizer", s.model, "--served-model-name", s.served_name,
            "--dataset-name", "custom", "--dataset-path", str(path.resolve()),
            "--custom-output-len", str(max_tokens), "--skip-chat-template", "--disable-shuffle",
            "--num-prompts", str(len(bodies)),
            "--temperature", repr(float(temperature)), "--top-p", repr(float(top_p)),
            "--extra-body", json.dumps({"stream_options": stream_options}, separators=(",", ":")),
        ]
        if ignore_eos:
            args.append("--ignore-eos")
        if st.concurrency is not None:
            args += ["--max-concurrency", str(st.concurrency), "--request-rate", "inf"]
        else:  # open loop: vLLM's own Poisson schedule, not the project's (an approximation)
            args += ["--request-rate", repr(float(st.rate or 0)), "--burstiness", repr(float(s.workload.burstiness))]
        meta = {"stage": st.name, "requests": len(bodies), "concurrency": st.concurrency, "rate": st.rate,
                "max_tokens": max_tokens, "ignore_eos": ignore_eos, "temperature": temperature, "top_p": top_p,
                "salt": plan.salt, "bench_args": args}
        (out / f"{st.name}.args.json").write_text(json.dumps(meta, indent=1) + "\n")
        written.append(path)
        print(f"{st.name}: {len(bodies)} prompts -> {path}")
    return written


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    export(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
