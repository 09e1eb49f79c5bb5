"""`run --local` provenance: this machine's facts from canned nvidia-smi and /proc/cpuinfo output."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence

import httpx

from specdecode.experiment import spec
from specdecode.local import engines, hosts, runner

GPU_CSV = """\
0, NVIDIA H200, GPU-3f1a2b4c-0000-1111-2222-333344445555, 570.133.20
1, NVIDIA H200, GPU-9e8d7c6b-aaaa-bbbb-cccc-ddddeeeeffff, 570.133.20
"""
BANNER = """\
Tue Dec  1 07:40:12 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 570.133.20             Driver Version: 570.133.20     CUDA Version: 12.8     |
|-----------------------------------------+------------------------+----------------------+
"""
CPUINFO = """\
processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
"""


def test_the_gpus_of_cuda_visible_devices_are_chosen_by_index_or_uuid() -> None:
    gpus = hosts.parse_gpus(GPU_CSV)
    assert [g.index for g in gpus] == ["0", "1"]
    assert [g.index for g in hosts.select(gpus, "1")] == ["1"]
    assert [g.index for g in hosts.select(gpus, "GPU-3f1a2b4c-0000-1111-2222-333344445555,1")] == ["0", "1"]
    assert hosts.select(gpus, "7") == []
    assert len(hosts.select(gpus, None)) == 2


def test_the_cuda_version_and_the_cpu_model_are_read_from_the_banners() -> None:
    assert hosts.parse_cuda_version(BANNER) == "12.8"
    assert hosts.parse_cuda_version("NVIDIA-SMI has failed") is None
    assert hosts.parse_cpu_model(CPUINFO) == "Intel(R) Xeon(R) Platinum 8480+"
    assert hosts.parse_cpu_model("processor : 0\nisa : rv64\n") is None


def test_an_arm_on_gpu_one_records_that_gpu_and_this_machine() -> None:
    calls: list[list[str]] = []

    def run(argv: Sequence[str]) -> str | None:
        calls.append(list(argv))
        return GPU_CSV if any(a.startswith("--query-gpu=") for a in argv) else BANNER

    host = hosts.this_host("1", run=run)
    assert host.node == socket.gethostname()
    assert host.gpu_product == "NVIDIA H200"
    assert host.gpu_uuids == ["GPU-9e8d7c6b-aaaa-bbbb-cccc-ddddeeeeffff"]
    assert (host.driver_version, host.cuda_version) == ("570.133.20", "12.8")
    assert host.cpu_count == os.cpu_count()
    assert calls[0] == ["nvidia-smi", "--query-gpu=index,name,uuid,driver_version", "--format=csv,noheader"]


def test_an_arm_without_gpus_or_without_nvidia_smi_has_no_gpu_facts() -> None:
    def missing(argv: Sequence[str]) -> str | None:
        return None

    for host in (hosts.this_host(None, run=lambda argv: GPU_CSV), hosts.this_host("0", run=missing)):
        assert (host.gpu_product, host.gpu_uuids, host.driver_version, host.cuda_version) == (None,) * 4
        assert host.node == socket.gethostname()


# Captured on the lent H200 on 2026-12-01 (nvidia-smi's two queries and /proc/cpuinfo's model line).
H200_CSV = "0, NVIDIA H200, GPU-9b8f4456-07bf-1b96-1a42-2a7721ba8774, 580.159.04\n"
H200_BANNER = (
    "Tue Dec  1 07:25:15 2026       \n"
    "+-----------------------------------------------------------------------------------------+\n"
    "| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |\n"
)
H200_CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\n"


def test_the_lent_h200s_real_output_gives_its_host_block() -> None:
    host = hosts.host_of(
        node="vm", gpu_csv=H200_CSV, smi_banner=H200_BANNER, cpuinfo=H200_CPUINFO, cpu_count=16, visible="0"
    )
    assert host.wire() == {
        "node": "vm",
        "gpuProduct": "NVIDIA H200",
        "gpuUuids": ["GPU-9b8f4456-07bf-1b96-1a42-2a7721ba8774"],
        "driverVersion": "580.159.04",
        "cudaVersion": "13.0",
        "cpuModel": "Intel(R) Xeon(R) Processor",
        "cpuCount": 16,
    }


def test_an_arm_given_by_a_remote_url_is_recorded_by_its_host_and_its_answers() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/version":
            return httpx.Response(200, json={"version": "0.20.0"})
        return httpx.Response(404, json={"detail": "Not Found"})  # a real vLLM: no /sim/host

    with httpx.Client(transport=httpx.MockTransport(answer)) as client:
        remote = runner._arm_host(client, engines.Arm(spec.Arm.CONTROL, "http://gpu-7.lab:8000"), None)
        local = runner._arm_host(client, engines.Arm(spec.Arm.CONTROL, "http://127.0.0.1:8000"), None)
    assert remote.wire() == {"node": "gpu-7.lab", "vllmVersion": "0.20.0"}  # nothing of this machine
    assert (local.node, local.cpu_count, local.vllm_version) == (
        socket.gethostname(),
        os.cpu_count(),
        "0.20.0",
    )
    assert local.speed_factor is None
