"""NVIDIA DCGM exporter series of the simulator's one GPU (`specdecode sim --dcgm`), issue #18.

A real cluster gets them from dcgm-exporter, a DaemonSet on each GPU node; the simulator serves them
on its own `/metrics` instead, so the operator's GPU telemetry (`experiment/telemetry.py`) is tested
end to end against a real Prometheus. Names, units and labels are the exporter's: the default
counters `DCGM_FI_DEV_GPU_UTIL` (%), `DCGM_FI_DEV_FB_USED` (MiB), `DCGM_FI_DEV_POWER_USAGE` (W)
(https://github.com/NVIDIA/dcgm-exporter/blob/main/etc/default-counters.csv), the GPU's `gpu`, `UUID`,
`device`, `modelName`, `Hostname`, and with its Kubernetes pod mapping the pod holding the GPU as
`pod`, `namespace`, `container`. This pod is `$POD_NAME` (else the hostname, which Kubernetes sets to
the pod's name) in `$POD_NAMESPACE`.

The figures are a model, not a measurement: utilisation is 100% while a request runs (DCGM's is the
share of its sample period with a kernel executing), 0 when idle; memory is what vLLM takes up front
(`gpu_memory_utilization` 0.9 of an H200's 143,771 MiB) whatever the load; power goes linearly from
idle to the board's 700 W with utilisation.
"""

from __future__ import annotations

import os
import socket
import uuid

H200_MIB = 143_771
IDLE_WATTS = 120.0
MAX_WATTS = 700.0
GPU_MEMORY_UTILIZATION = 0.9


class DcgmGpu:
    """The series dcgm-exporter would publish for the GPU of this pod."""

    def __init__(self, *, pod: str | None = None, namespace: str | None = None) -> None:
        self.pod = pod or os.environ.get("POD_NAME") or socket.gethostname()
        self.namespace = namespace or os.environ.get("POD_NAMESPACE") or "default"
        gpu_uuid = uuid.uuid5(uuid.NAMESPACE_DNS, f"{self.namespace}/{self.pod}")
        self.labels = (
            f'gpu="0",UUID="GPU-{gpu_uuid}",pci_bus_id="00000000:18:00.0",device="nvidia0",'
            f'modelName="NVIDIA H200",Hostname="{socket.gethostname()}",'
            f'container="engine",namespace="{self.namespace}",pod="{self.pod}"'
        )

    def render(self, running: int, out: list[str]) -> None:
        """Append the three gauges for a moment when `running` requests are in the batch."""
        util = 100.0 if running > 0 else 0.0
        series = (
            ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", util),
            (
                "DCGM_FI_DEV_FB_USED",
                "Framebuffer memory used (in MiB).",
                float(int(H200_MIB * GPU_MEMORY_UTILIZATION)),
            ),
            (
                "DCGM_FI_DEV_POWER_USAGE",
                "Power draw (in W).",
                IDLE_WATTS + (MAX_WATTS - IDLE_WATTS) * util / 100.0,
            ),
        )
        for name, help_, value in series:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} gauge")
            out.append(f"{name}{{{self.labels}}} {value!r}")
