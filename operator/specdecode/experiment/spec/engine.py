"""The engine both arms share (`spec.engine`) and the treatment's speculative config (`spec.speculative`)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from specdecode.experiment.spec.base import Model, cel, cel_extra

# --------------------------------------------------------------------------------------------- engine


class EnvVar(Model):
    """An environment variable for both arms' containers (a Kubernetes EnvVar)."""

    name: str = Field(min_length=1)
    """Variable name."""
    value: str | None = None
    """Literal value."""
    value_from: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """A Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, ...)."""


Quantity = Annotated[int | str, Field(json_schema_extra={"x-kubernetes-int-or-string": True})]


class Resources(Model):
    """Compute resources of each arm's vLLM container (a Kubernetes ResourceRequirements)."""

    limits: dict[str, Quantity] = Field(default_factory=lambda: dict[str, int | str]({"nvidia.com/gpu": 1}))
    """Resource limits, e.g. `nvidia.com/gpu: 1`. Both arms get the same."""
    requests: dict[str, Quantity] = Field(default_factory=dict)
    """Resource requests. CPU and memory neither requested nor limited here default to 2 CPUs and 16Gi
    for vLLM arms (100m and 256Mi for simulator arms), so the arms are never BestEffort, the first pods
    the kubelet evicts under memory pressure."""


class Toleration(Model):
    """A Kubernetes toleration, applied to both arms."""

    key: str | None = None
    """Taint key to tolerate."""
    operator: Literal["Exists", "Equal"] | None = None
    """`Exists` or `Equal`."""
    value: str | None = None
    """Taint value (with `Equal`)."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to tolerate; empty means all."""
    toleration_seconds: int | None = None
    """How long a `NoExecute` taint is tolerated."""


class SecretKeyRef(Model):
    """A key in a Secret in the experiment's namespace."""

    name: str = Field(min_length=1)
    """Secret name."""
    key: str = Field(min_length=1)
    """Key within the Secret."""


#: where both arms mount `engine.modelCache`; also their HF_HOME, so `spec.model` may be a path under it
MODEL_CACHE_MOUNT = "/models"

#: a DNS-1123 subdomain, which PersistentVolumeClaim names must be
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class ModelCache(Model):
    """An existing PersistentVolumeClaim that both arms mount as their Hugging Face cache.

    Mounted at `/models` in both arms, with `HF_HOME=/models` (so Hub downloads live in
    `/models/hub`): the weights are downloaded once, or never when the volume is pre-populated, and
    both arms read the same files. A directory on the volume that holds a model (e.g. one written by
    `hf download ORG/NAME --local-dir`) is named by its path: `spec.model: /models/NAME`.
    """

    claim_name: str = Field(min_length=1, max_length=253, json_schema_extra={"pattern": DNS_SUBDOMAIN})
    """Name of the PersistentVolumeClaim, in the experiment's namespace (the operator does not create it).
    Both arms mount it at once: on different nodes that needs a ReadOnlyMany or ReadWriteMany volume."""
    sub_path: str = ""
    """A directory inside the volume to use instead of its root (a relative path, no `..`)."""
    read_only: bool = False
    """Mount the volume read-only: the cache must already hold every model the arms load, so this
    needs `engine.offline: true` (an online Hugging Face client writes lock files even for cached models)."""


class SimulatorSpec(Model):
    """Run the built-in vLLM simulator instead of vLLM (dry runs, CI, the demo).

    Unset parameters come from `profile`. The meaning of each parameter is in design.md §6.
    """

    profile: str = "h200-8b-draft-tiny"
    """Named parameter set fitted to real measurements (see `specdecode sim --list-profiles`)."""
    decode_step_ms: float | None = Field(default=None, gt=0, le=10_000)
    """Target decode step time at batch 1, in milliseconds."""
    batch_token_ms: float | None = Field(default=None, ge=0, le=1_000)
    """Extra step time per token processed in the step (the compute-bound slope), in milliseconds."""
    prefill_token_ms: float | None = Field(default=None, ge=0, le=1_000)
    """Prefill time per prompt token, in milliseconds."""
    request_overhead_ms: float | None = Field(default=None, ge=0, le=10_000)
    """Time from a request's arrival to the engine queue (HTTP, tokenisation, scheduling): TTFT and E2E only."""
    max_num_seqs: int | None = Field(default=None, ge=1, le=65_536)
    """Batch cap; further requests wait in the queue."""
    max_num_batched_tokens: int | None = Field(default=None, ge=1, le=1_048_576)
    """Tokens one step may process (chunked prefill budget), as vLLM's --max-num-batched-tokens."""
    acceptance_rate: float | None = Field(default=None, ge=0, le=1)
    """Per-position conditional acceptance probability of a draft token (treatment arm)."""
    draft_cost_ratio: float | None = Field(default=None, ge=0, le=100)
    """One draft forward pass relative to a target decode step."""
    draft_fixed_ms: float | None = Field(default=None, ge=0, le=10_000)
    """A fixed cost per draft pass, in milliseconds (launch overhead; fitted on the H200)."""
    output_mismatch_rate: float | None = Field(default=None, ge=0, le=1)
    """Fraction of treatment requests whose text diverges from the control's (fault injection)."""
    batch_variance_rate: float | None = Field(default=None, ge=0, le=1)
    """Fraction of requests, in either arm, whose greedy text diverges at a random position (models
    servers that are not bitwise reproducible across batch compositions; default 0)."""
    error_rate: float | None = Field(default=None, ge=0, le=1)
    """Fraction of requests answered with an error (fault injection)."""
    log_degradations: list[
        Literal[
            "AsyncSchedulingDisabled", "MaxModelLenLowered", "MethodFallback", "DraftLimited", "ChatTemplate"
        ]
    ] = Field(default_factory=list, max_length=5)
    """The treatment logs at start-up the line real vLLM logs when it weakens speculation this way
    (fault injection for the SpeculationDegraded condition)."""

    def overrides(self) -> dict[str, float | int]:
        """The parameters set explicitly, by their snake_case names (the profile fills the rest)."""
        fields = self.model_dump(exclude={"profile"}, exclude_none=True)
        return {k: v for k, v in fields.items() if isinstance(v, int | float)}


class EngineSpec(Model):
    """The inference engine, shared by both arms; only the speculative config differs."""

    image: str = Field(default="vllm/vllm-openai:v0.33.0", min_length=1)
    """Container image of vLLM (ignored with `simulator`, which runs from the operator's image)."""
    vllm_version: str | None = Field(default=None, pattern=r"^v?\d+\.\d+(\.\d+)?([.+-]?[0-9A-Za-z.]+)?$")
    """vLLM release of the image (e.g. `0.20.0`): decides which flags and speculative-config keys are
    rendered and accepted. Unset: read from the image tag where it is a release tag (`vllm/vllm-openai:v0.33.0`),
    in `run --local` from `vllm --version`; when it cannot be known, the newest supported release's rules apply."""
    args: list[str] = Field(default_factory=list)
    """Extra `vllm serve` arguments for both arms. Flags the operator owns are refused."""
    env: list[EnvVar] = Field(default_factory=list)
    """Extra environment variables for both arms."""
    resources: Resources = Field(default_factory=Resources)
    """Resources of each arm's container."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node selector for both arms; pin them to the same GPU product."""
    tolerations: list[Toleration] = Field(default_factory=list)
    """Tolerations for both arms (GPU nodes are often tainted)."""
    prefix_caching: bool = False
    """Enable vLLM's prefix caching. Off by default: a warm shared prefix distorts the comparison. A
    multiTurn dataset turns it on in both arms whatever this says (its later turns repeat earlier ones)."""
    seed: int = Field(default=42, ge=0)
    """Engine seed (`--seed`), the same in both arms."""
    api_key_secret: SecretKeyRef | None = None
    """A Secret holding the API key both arms require (`--api-key`); the load Job sends it."""
    model_cache: ModelCache | None = None
    """A PersistentVolumeClaim both arms mount at `/models` as their Hugging Face cache (`HF_HOME`), so a
    model is downloaded at most once; `spec.model` may also be a directory under `/models`. Cluster arms
    only: `run --local` uses this machine's own cache."""
    hf_token_secret: SecretKeyRef | None = None
    """A Secret key holding a Hugging Face access token, for gated or private models: given to both arms
    as `HF_TOKEN` (never on the command line). `run --local` uses this machine's own token."""
    offline: bool = False
    """Air-gapped: both arms get `HF_HUB_OFFLINE=1` and `TRANSFORMERS_OFFLINE=1` and load only what
    `modelCache` holds (target and draft), never contacting the Hub. Needs `modelCache`. Cluster arms
    only: `run --local` runs with this machine's own environment."""
    simulator: SimulatorSpec | None = None
    """Set to run the built-in vLLM simulator instead of vLLM (dry run, CI, demo)."""
    shm_size: Quantity = "2Gi"
    """Size limit of each vLLM arm's `/dev/shm` (a memory-backed emptyDir; it counts against the
    container's memory). 2Gi as in vLLM's Kubernetes guide; raise it for tensor parallelism over many
    GPUs. Simulator arms get none."""


# ---------------------------------------------------------------------------------------- speculative


class SpeculativeMethod(StrEnum):
    """vLLM 0.33's `SpeculativeConfig.method` values (the model-specific MTP names are deprecated)."""

    NGRAM = "ngram"
    NGRAM_GPU = "ngram_gpu"
    DRAFT_MODEL = "draft_model"
    SUFFIX = "suffix"
    CUSTOM_CLASS = "custom_class"
    EAGLE = "eagle"
    EAGLE3 = "eagle3"
    EXTRACT_HIDDEN_STATES = "extract_hidden_states"
    DFLASH = "dflash"
    DSPARK = "dspark"
    MTP = "mtp"
    DEEPSEEK_MTP = "deepseek_mtp"
    DOTS3_NOTE_MTP = "dots3_note_mtp"
    MIMO_MTP = "mimo_mtp"
    MIMO_V2_MTP = "mimo_v2_mtp"
    GLM4_MOE_MTP = "glm4_moe_mtp"
    GLM4_MOE_LITE_MTP = "glm4_moe_lite_mtp"
    GLM_OCR_MTP = "glm_ocr_mtp"
    ERNIE_MTP = "ernie_mtp"
    NEMOTRON_H_MTP = "nemotron_h_mtp"
    EXAONE_MOE_MTP = "exaone_moe_mtp"
    EXAONE4_5_MTP = "exaone4_5_mtp"
    QWEN3_NEXT_MTP = "qwen3_next_mtp"
    QWEN4_EXP_MTP = "qwen4_exp_mtp"
    QWEN3_5_MTP = "qwen3_5_mtp"
    LONGCAT_FLASH_MTP = "longcat_flash_mtp"
    BAILING_HYBRID_V3_MTP = "bailing_hybrid_v3_mtp"
    MINIMAX_M3_MTP = "minimax_m3_mtp"
    BAILING_HYBRID_MTP = "bailing_hybrid_mtp"
    KIMI_K3_MTP = "kimi_k3_mtp"
    PANGU_ULTRA_MOE_MTP = "pangu_ultra_moe_mtp"
    STEP3P5_MTP = "step3p5_mtp"
    STEP5_MTP = "step5_mtp"
    HY_V3_MTP = "hy_v3_mtp"
    HY_V4_MTP = "hy_v4_mtp"
    GEMMA4_MTP = "gemma4_mtp"
    INKLING_MTP = "inkling_mtp"
    GLM5_NEXT_MTP = "glm5_next_mtp"

    @property
    def is_deprecated_mtp_alias(self) -> bool:
        """A model-specific MTP name that vLLM replaces with `mtp` (with a warning)."""
        return self.value.endswith("_mtp")

    @property
    def needs_draft_model(self) -> bool:
        """Methods whose proposer is a separate model that `model` must name."""
        return self in {
            SpeculativeMethod.DRAFT_MODEL,
            SpeculativeMethod.EAGLE,
            SpeculativeMethod.EAGLE3,
            SpeculativeMethod.DFLASH,
            SpeculativeMethod.CUSTOM_CLASS,
        }

    @property
    def is_ngram(self) -> bool:
        """Prompt-lookup methods, configured with `promptLookupMin/Max`."""
        return self in {SpeculativeMethod.NGRAM, SpeculativeMethod.NGRAM_GPU}

    @property
    def k_has_default(self) -> bool:
        """Methods where vLLM can supply `num_speculative_tokens` itself (MTP n_predict, dspark, suffix)."""
        return self in {SpeculativeMethod.MTP, SpeculativeMethod.DSPARK, SpeculativeMethod.SUFFIX} or (
            self.is_deprecated_mtp_alias
        )


_MODEL_METHODS_CEL = "['draft_model', 'eagle', 'eagle3', 'dflash', 'custom_class']"


class SpeculativeSpec(Model):
    """Rendered into `--speculative-config` JSON for the treatment arm only (vLLM 0.33 semantics)."""

    model_config = ConfigDict(
        json_schema_extra=cel_extra(
            cel(
                f"!(self.method in {_MODEL_METHODS_CEL}) || has(self.model)",
                "speculative.model is required for this method: name the draft model or head",
            ),
            cel(
                "!has(self.promptLookupMin) || !has(self.promptLookupMax) || "
                "self.promptLookupMin <= self.promptLookupMax",
                "promptLookupMin must be <= promptLookupMax",
            ),
        )
    )

    method: SpeculativeMethod
    """The proposer (vLLM `method`). Always explicit: vLLM's name-based inference is fragile."""
    model: str | None = Field(default=None, min_length=1)
    """Draft model, EAGLE head or proposer path; required for draft_model, eagle, eagle3, dflash, custom_class."""
    num_speculative_tokens: int | None = Field(default=None, gt=0, le=64)
    """k, the number of draft tokens per step (> 0)."""
    draft_tensor_parallel_size: int | None = Field(default=None, ge=1)
    """Draft tensor parallel size: 1 or the target's tensor parallel size (unset: the target's)."""
    prompt_lookup_min: int | None = Field(default=None, ge=1)
    """ngram: shortest n-gram window (vLLM default 5, or promptLookupMax if only that is set)."""
    prompt_lookup_max: int | None = Field(default=None, ge=1)
    """ngram: longest n-gram window (vLLM default 5, or promptLookupMin if only that is set)."""
    extra: dict[str, Any] = Field(
        default_factory=dict, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """Any other vLLM SpeculativeConfig key, by its vLLM (snake_case) name; unknown keys are refused."""
