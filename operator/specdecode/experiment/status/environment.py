"""Where the arms ran (`status.arms`, `status.environment`) and how they differ beyond speculation
(`status.degradations`, `status.armDifferences`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from specdecode.experiment.status.base import StatusModel


class ArmRef(StatusModel):
    """The child Deployment of one arm."""

    deployment: str = ""
    """Deployment name."""
    ready_replicas: int = 0
    """Ready replicas."""
    pod: str | None = None
    """The Ready pod; from Running on, the pod the load measures: another in its place voids the run."""
    url: str | None = None
    """Where the load reached it."""


class Arms(StatusModel):
    """Both arms' children."""

    control: ArmRef = Field(default_factory=ArmRef)
    """The arm without speculative decoding."""
    treatment: ArmRef = Field(default_factory=ArmRef)
    """The arm with speculative decoding."""


class Host(StatusModel):
    """Where one arm ran: the facts of its host that can move a latency (issue 22)."""

    node: str | None = None
    """Node name (in `run --local`: the hostname)."""
    gpu_product: str | None = None
    """GPU product (`nvidia.com/gpu.product`, or nvidia-smi's name)."""
    gpu_uuids: list[str] | None = None
    """UUIDs of the arm's GPUs (known in `run --local`; Kubernetes does not publish them)."""
    driver_version: str | None = None
    """NVIDIA driver version."""
    cuda_version: str | None = None
    """CUDA version the driver supports (GPU Feature Discovery's runtime label, or nvidia-smi's header)."""
    cpu_model: str | None = None
    """CPU model (/proc/cpuinfo's model name, or NFD's vendor/family/model id)."""
    cpu_count: int | None = None
    """CPUs of the host (the node's capacity)."""
    instance_type: str | None = None
    """The node's `node.kubernetes.io/instance-type` label, where present."""
    vllm_version: str | None = None
    """The engine's version (`/version`, or the declared `engine.vllmVersion`)."""
    speed_factor: float | None = None
    """Simulator only: the simulated host's speed factor (1 = nominal, 1.1 = every step 10% slower)."""
    kv_cache_tokens: int | None = None
    """The arm's KV-cache capacity in tokens (`vllm:cache_config_info`: num_gpu_blocks x block_size);
    the treatment's is smaller by what the draft takes (issue #18)."""
    max_concurrency: int | None = None
    """Requests of the workload's length (a synthetic dataset's inputTokens + outputTokens) the arm's
    KV cache holds at once, each rounded up to whole blocks; unknown for prompts of varying length."""


class ArmHosts(StatusModel):
    """Where each arm ran."""

    control: Host | None = None
    """The control arm's host."""
    treatment: Host | None = None
    """The treatment arm's host."""


class Environment(StatusModel):
    """Provenance: what was actually measured."""

    image: str | None = None
    """Engine image (a cluster run of vLLM; `run --local` and the simulator use none)."""
    engine_command: str | None = None
    """`run --local`: the command line that started the control arm (the treatment's adds the
    speculative config), recorded instead of an image."""
    image_digest: str | None = None
    """Engine image digest, as the kubelet resolved it."""
    gpu_product: str | None = None
    """GPU product label of the nodes."""
    nodes: list[str] = Field(default_factory=list)
    """Nodes the arms ran on."""
    vllm_version: str | None = None
    """`/version` of the engine."""
    vllm_rules: str | None = None
    """The vLLM release whose flags and speculative-config rules the arms were rendered and validated
    with, and where it came from: `0.20.0 (image tag)`, `(spec.engine.vllmVersion)`, `(vllm --version)`,
    or `(assumed: ...)` when it could not be known and the newest supported release's rules applied."""
    model_revision: str | None = None
    """Target model revision."""
    draft_model: str | None = None
    """Draft model (or method, for model-free methods)."""
    simulator: dict[str, Any] | None = None
    """Simulator parameters, when the arms were simulated."""
    prefix_caching: bool | None = None
    """True when both arms ran with vLLM's prefix caching (`--enable-prefix-caching`): multi-turn
    sessions, or `engine.prefixCaching`; absent when off (the default, `--no-enable-prefix-caching`)."""
    arms: ArmHosts | None = None
    """Where each arm ran (node, GPU, driver, CUDA, CPU, instance type, engine version)."""
    host_differences: list[str] = Field(default_factory=list)
    """The host facts in which the arms differ (`node`, `cpuModel`, ...): when not empty, the speed-up
    may partly be the placement, which the paired interval cannot see, so no pass is promoted unless
    the crossover separates the two (`PlacementUnseparated`)."""


class Degradation(StatusModel):
    """A start-up log line of the treatment where vLLM says it weakened speculation (`experiment/degradations.py`)."""

    kind: str
    """AsyncSchedulingDisabled, MaxModelLenLowered, MethodFallback, DraftLimited or ChatTemplate."""
    message: str
    """vLLM's message, from the log line (at most 300 characters)."""


class ArmDifference(StatusModel):
    """One way the arms' live pods differ beyond speculation (`experiment/fairness.py`)."""

    field: str
    """What differs: `imageID`, `gpuProduct`, `args`, `env.<NAME>` or `resources.<requests|limits>.<name>`."""
    control: str | None = None
    """The control's value (absent: the control has none)."""
    treatment: str | None = None
    """The treatment's value (absent: the treatment has none)."""
