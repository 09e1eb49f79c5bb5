"""A fake `vllm` for `run --local` tests without a GPU: vLLM's command line, the simulator behind it.

`vllm --version` prints FAKE_VLLM_VERSION (default 0.33.0). `vllm serve MODEL ...` checks its argv as
vLLM's argparse would (unknown flags: exit 2 with `vllm: error: unrecognized arguments: ...`),
including what the release lacks: vLLM 0.20 has neither `--disable-prefix-caching` (only
`--no-enable-prefix-caching`) nor `--per-request-spec-decode-metrics`; 0.33 has both. The fake knows
those two releases only: a version below 0.33 gets 0.20's flags. Simulator-only flags are refused
too (a real-engine argv must not carry them). Then it becomes the simulator (`exec python -m
specdecode sim ...`, flags from FAKE_VLLM_SIM_ARGS appended), so the pid that `run --local` started
is the server, as with vLLM's API server.

Like a GPU, each device in CUDA_VISIBLE_DEVICES (default "0") is a lock file under FAKE_GPU_DIR,
held (flock) by the server and every child it keeps: a second engine on a busy device fails at
start-up with vLLM's "Free memory on device ..." error, as after a leaked EngineCore on the H200.

Options (environment):
- FAKE_VLLM_RECORD=FILE: append one JSON line per `serve` (arm, CUDA_VISIBLE_DEVICES, argv, pid).
- FAKE_VLLM_ENGINECORE=MODE: start a child that ignores SIGTERM and outlives the server (vLLM's
  EngineCore): `group` (stays in the group and session), `session` (calls setsid), `hidden` (setsid
  and an environment without the arm's token, `SPECDECODE_ARM_TOKEN`). Its argv carries
  FAKE_ENGINECORE_TAG.
- FAKE_VLLM_FAIL_AT_START=ARM: that arm (`control`, `treatment` or `both`) exits 1 while loading;
  `ARM@DEVICES` only when started on those devices (CUDA_VISIBLE_DEVICES).
- FAKE_VLLM_DIE_AFTER=ARM:N: that arm is killed (SIGKILL) once it has finished N requests.
- FAKE_GPU_SPEED_FACTORS=DEVICE=X,...: a device's speed (the simulator's `SPECDECODE_SIM_SPEED_FACTOR`,
  every step X times as long; the slowest of the server's devices counts): GPUs of unequal speed, so
  that a placement effect can be measured and swapped (`analysis.crossover`).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from specdecode.simulator import options

#: flags vLLM 0.33 has and 0.20 lacks
SINCE_0_33 = ("--disable-prefix-caching", "--per-request-spec-decode-metrics")
#: the simulator's own flags: a real vLLM refuses them
SIM_ONLY = (
    "--profile",
    "--list-profiles",
    "--startup-delay",
    "--crash-after",
    "--disconnect-rate",
    "--ground-truth",
    "--wake-margin-ms",
    *(f"--{name.replace('_', '-')}" for name in options.PARAM_FLAGS),
)
ENGINECORE = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if sys.argv[1] != "group":
    os.setsid()
while True:
    time.sleep(1)
"""


def release(version: str) -> tuple[int, int]:
    major, minor = version.lstrip("v").split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def refuse(tokens: list[str]) -> None:
    print("usage: vllm serve [model_tag] [options]", file=sys.stderr)
    print(f"vllm: error: unrecognized arguments: {' '.join(tokens)}", file=sys.stderr)
    sys.exit(2)


def check_argv(argv: list[str], version: str) -> None:
    """Exit 2 as vLLM would on a flag this release does not know."""
    missing = SIM_ONLY + (SINCE_0_33 if release(version) < (0, 33) else ())
    refused: list[str] = []
    for i, token in enumerate(argv):
        flag = token.split("=", 1)[0]
        if flag.replace("_", "-") in missing:
            refused.append(token)
            if "=" not in token and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                refused.append(argv[i + 1])
    parser = options.build_parser()
    parser.prog = "vllm serve"
    _, unknown = parser.parse_known_args(argv)
    refused += [t for t in unknown if t not in refused]
    if refused:
        refuse(refused)


def hold_gpus(devices: list[str]) -> list[int]:
    """Lock each device's file (inheritable, so children keep holding it); exit 1 when one is busy."""
    folder = Path(os.environ.get("FAKE_GPU_DIR", "/tmp/fake-gpus"))
    folder.mkdir(parents=True, exist_ok=True)
    held = []
    for device in devices:
        fd = os.open(folder / f"gpu{device}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"ValueError: Free memory on device cuda:{device} (0.61/139.81 GiB) on startup is less "
                "than desired GPU memory utilization (0.9, 125.83 GiB). Decrease GPU memory utilization "
                "or reduce GPU memory used by other processes.",
                flush=True,
            )
            sys.exit(1)
        os.set_inheritable(fd, True)
        held.append(fd)
    return held


def watch_and_kill(server: int, truth: Path, after: int) -> None:
    """In a forked child: SIGKILL the server once `truth` holds `after` finished requests."""
    while os.getppid() == server:
        lines = truth.read_text().count("\n") if truth.exists() else 0
        if lines >= after:
            print(f"fake vllm: killing the server after {lines} requests", flush=True)
            os.kill(server, signal.SIGKILL)
            break
        time.sleep(0.05)
    os._exit(0)


def serve(argv: list[str], version: str) -> None:
    check_argv(argv, version)
    arm = "treatment" if any(t.split("=")[0] == "--speculative-config" for t in argv) else "control"
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")
    record = os.environ.get("FAKE_VLLM_RECORD")
    if record:
        entry = {
            "arm": arm,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "argv": argv,
            "pid": os.getpid(),
            "time": time.time(),
        }
        with Path(record).open("a") as sink:
            sink.write(json.dumps(entry) + "\n")
    print(f"INFO fake vLLM {version} serving {argv[0]} on cuda:{','.join(devices)}", flush=True)
    held = hold_gpus(devices)
    fail = os.environ.get("FAKE_VLLM_FAIL_AT_START", "")
    if fail in (arm, "both", f"{arm}@{','.join(devices)}"):
        print("ERROR EngineCore failed to start.", flush=True)
        print("RuntimeError: CUDA error: out of memory (fake vllm: FAKE_VLLM_FAIL_AT_START)", flush=True)
        sys.exit(1)
    mode = os.environ.get("FAKE_VLLM_ENGINECORE")
    if mode:
        tag = os.environ.get("FAKE_ENGINECORE_TAG", "fake-enginecore")
        env = dict(os.environ)
        if mode == "hidden":
            env.pop("SPECDECODE_ARM_TOKEN", None)
        subprocess.Popen(
            [sys.executable, "-c", ENGINECORE, mode, tag], env=env, pass_fds=held, stdin=subprocess.DEVNULL
        )
    speeds = dict(
        pair.split("=", 1) for pair in os.environ.get("FAKE_GPU_SPEED_FACTORS", "").split(",") if "=" in pair
    )
    if any(device in speeds for device in devices):
        factor = max(float(speeds.get(device, "1")) for device in devices)
        os.environ["SPECDECODE_SIM_SPEED_FACTOR"] = str(factor)
    extra = os.environ.get("FAKE_VLLM_SIM_ARGS", "").split()
    die = os.environ.get("FAKE_VLLM_DIE_AFTER", "")
    if die.split(":")[0] == arm:
        truth = Path(os.environ.get("FAKE_GPU_DIR", "/tmp")) / f"truth-{os.getpid()}.jsonl"
        extra += ["--ground-truth", str(truth)]
        server = os.getpid()
        if os.fork() == 0:
            for fd in held:
                os.close(fd)
            watch_and_kill(server, truth, int(die.split(":")[1]))
    os.execv(sys.executable, [sys.executable, "-m", "specdecode", "sim", *argv, *extra])


def main(argv: list[str]) -> None:
    version = os.environ.get("FAKE_VLLM_VERSION", "0.33.0")
    if argv[:1] in (["--version"], ["-v"]):
        print(version)
        return
    if argv[:1] != ["serve"] or len(argv) < 2:
        print("usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ...", file=sys.stderr)
        sys.exit(2)
    serve(argv[1:], version)


if __name__ == "__main__":
    main(sys.argv[1:])
