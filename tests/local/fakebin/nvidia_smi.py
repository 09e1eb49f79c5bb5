"""A fake `nvidia-smi` listing FAKE_NVIDIA_SMI_GPUS (default 1) H200s.

`nvidia-smi -L`: `GPU 0: NVIDIA H200 (UUID: GPU-...)` per GPU.
`nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]`: one CSV line per GPU with the
fields asked for (name, uuid, driver_version, memory.total, memory.used, index, pci.bus_id); an
unknown field exits 2 with nvidia-smi's message. Anything else prints the banner (driver and CUDA
version).
"""

from __future__ import annotations

import os
import sys

DRIVER = "580.95.05"
CUDA = "13.0"


def fields(index: int) -> dict[str, tuple[str, str]]:
    """Field -> (value, unit) of one GPU."""
    return {
        "index": (str(index), ""),
        "name": ("NVIDIA H200", ""),
        "uuid": (f"GPU-{index:08x}-fake-4e1d-9c3a-{index:012x}", ""),
        "driver_version": (DRIVER, ""),
        "memory.total": ("143771", " MiB"),
        "memory.used": ("0", " MiB"),
        "pci.bus_id": (f"00000000:{0x18 + index:02X}:00.0", ""),
    }


def main(argv: list[str]) -> int:
    count = int(os.environ.get("FAKE_NVIDIA_SMI_GPUS", "1"))
    if argv == ["-L"]:
        for i in range(count):
            print(f"GPU {i}: NVIDIA H200 (UUID: {fields(i)['uuid'][0]})")
        return 0
    query = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")), None)
    if query is not None:
        form = next((a.split("=", 1)[1] for a in argv if a.startswith("--format=")), "")
        if "csv" not in form.split(","):
            print("\"--format=\" switch is missing. Please run 'nvidia-smi -h' for help.", file=sys.stderr)
            return 2
        names = [n.strip() for n in query.split(",")]
        unknown = [n for n in names if n not in fields(0)]
        if unknown:
            print(f'Field "{unknown[0]}" is not a valid field to query.', file=sys.stderr)
            return 2
        units = "nounits" not in form.split(",")
        if "noheader" not in form.split(","):
            print(
                ", ".join(
                    n + (fields(0)[n][1].replace(" ", " [") + "]" if fields(0)[n][1] else "") for n in names
                )
            )
        for i in range(count):
            row = fields(i)
            print(", ".join(row[n][0] + (row[n][1] if units else "") for n in names))
        return 0
    # the banner of a plain `nvidia-smi` (its table of GPUs and processes is left out)
    print("+" + "-" * 89 + "+")
    print(f"| NVIDIA-SMI {DRIVER}              Driver Version: {DRIVER}      CUDA Version: {CUDA}     |")
    print("+" + "-" * 89 + "+")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
