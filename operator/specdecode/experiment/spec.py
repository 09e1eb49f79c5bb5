"""The `SpecDecodeExperiment` spec: typed, frozen models parsed once at the edge.

These models are the contract of design.md §3. The CRD's OpenAPI schema is generated from them
(`specdecode.experiment.crd`), so every field carries a description, and the schema-expressible
rules (types, enums, ranges, CEL cross-field rules) live here too, next to the field they guard.
The rules that need more than one section or vLLM's knowledge are in `validation.py`.

Invariants:
- Defaults make a *fair* comparison: prefix caching off (on for both arms alike with multi-turn
  sessions, whose later turns repeat earlier ones), greedy sampling, a fixed seed.
- Both arms share everything in `engine`; only `speculative` differs between them.
- Field names are camelCase on the wire (aliases), snake_case in Python.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from specdecode.experiment import loadpods, sweep

#: the longest experiment name whose children (`<name>-treatment`, ...) are still DNS labels
MAX_NAME_LENGTH = 53


class Model(BaseModel):
    """Base of every spec model: frozen, no unknown fields, camelCase on the wire."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
    )


def cel(rule: str, message: str) -> dict[str, Any]:
    """One `x-kubernetes-validations` entry, for `json_schema_extra`."""
    return {"rule": rule, "message": message}


def _cel_extra(*rules: dict[str, Any]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(rules)}


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
        json_schema_extra=_cel_extra(
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


# ------------------------------------------------------------------------------------------- workload


class ConfigMapKeyRef(Model):
    """A key in a ConfigMap in the experiment's namespace."""

    name: str = Field(min_length=1)
    """ConfigMap name."""
    key: str = Field(min_length=1)
    """Key within the ConfigMap."""


class SyntheticDataset(Model):
    """Synthetic prompts of fixed lengths, each with a unique nonce prefix (no prefix-cache reuse)."""

    type: Literal["synthetic"]
    """`synthetic`."""
    input_tokens: int = Field(default=512, ge=1, le=1_000_000)
    """Prompt length in tokens."""
    output_tokens: int = Field(default=256, ge=1, le=1_000_000)
    """Requested output length in tokens."""


class JsonlDataset(Model):
    """Prompts from a JSONL file: one `{"prompt": ...}` or `{"messages": [...]}` per line, optional `category`."""

    model_config = ConfigDict(
        json_schema_extra=_cel_extra(
            cel(
                "self.type != 'jsonl' || has(self.configMap) != has(self.path)",
                "a jsonl dataset needs exactly one of configMap or path",
            )
        )
    )

    type: Literal["jsonl"]
    """`jsonl`."""
    config_map: ConfigMapKeyRef | None = None
    """The ConfigMap key that holds the JSONL file (in a cluster)."""
    path: str | None = Field(default=None, min_length=1)
    """A local path to the JSONL file (for `specdecode run --local`; relative to the experiment file)."""


class BuiltinDataset(Model):
    """A prompt set shipped with specdecode."""

    type: Literal["builtin"]
    """`builtin`."""
    name: Literal["mixed", "real-mixed", "humaneval", "gsm8k", "self-instruct", "peps"] = "mixed"
    """`mixed`: 46 chat, code, summarisation and math prompts we wrote (acceptance differs by category);
    `real-mixed`: 40 each of chat, code, math and summarisation from the four real-text sets;
    `humaneval`: 164 Python functions to complete (code; OpenAI HumanEval, MIT);
    `gsm8k`: 200 grade-school maths word problems (math; OpenAI GSM8K test split, MIT);
    `self-instruct`: 252 user-oriented instructions (chat; Self-Instruct, Apache-2.0);
    `peps`: 150 excerpts of Python Enhancement Proposals to summarise (summarisation; public domain).
    Sources, licences and sampling: `loadgen/data/LICENSES.md`."""


class TraceDataset(Model):
    """A request trace replayed open loop (issue 17): one JSONL record per request, `{"timestamp":
    seconds, "prompt": str | "promptTokens": int, "outputTokens": int, "sessionId": str?}`, timestamps
    non-decreasing. Each open-loop stage replays it from its first record with its gaps scaled so that
    the stage's mean rate is the stage's `rate` (the same time scale for both arms; the summary
    records it); a closed-loop stage sends the trace's requests without its timing."""

    model_config = ConfigDict(
        json_schema_extra=_cel_extra(
            cel(
                "self.type != 'trace' || (has(self.configMap) ? 1 : 0) + (has(self.path) ? 1 : 0)"
                " + (has(self.builtin) ? 1 : 0) == 1",
                "a trace dataset needs exactly one of configMap, path or builtin",
            )
        )
    )

    type: Literal["trace"]
    """`trace`."""
    config_map: ConfigMapKeyRef | None = None
    """The ConfigMap key that holds the JSONL trace (in a cluster)."""
    path: str | None = Field(default=None, min_length=1)
    """A local path to the JSONL trace (for `specdecode run --local`; relative to the experiment file)."""
    builtin: Literal["bursty"] | None = None
    """`bursty`: a synthetic trace generated from `engine.seed`: bursts of requests with idle gaps between."""

    @model_validator(mode="after")
    def _one_source(self) -> TraceDataset:
        if sum(x is not None for x in (self.config_map, self.path, self.builtin)) != 1:
            raise ValueError("a trace dataset needs exactly one of configMap, path or builtin")
        return self


class MultiTurnDataset(Model):
    """Multi-turn sessions (issue 17): conversations, one JSONL object per line, `{"id": str?,
    "category": str?, "messages": [{"role": "system"?}, {"role": "user"}, {"role": "assistant"}, ...]}`.
    Each user message is one turn, sent with every earlier message of its conversation (so later turns
    repeat earlier ones and hit the prefix cache); the assistant messages are the replies those later
    turns carry, the same on both arms. Turn k of a session goes to an arm only after that arm's reply
    to turn k-1 has finished; each turn is one paired request (`requests` counts turns). Both arms run
    with prefix caching on (`--enable-prefix-caching`), whatever `engine.prefixCaching` says. Closed-loop
    stages only: `concurrency` is the number of sessions in flight."""

    model_config = ConfigDict(
        json_schema_extra=_cel_extra(
            cel(
                "self.type != 'multiTurn' || (has(self.configMap) ? 1 : 0) + (has(self.path) ? 1 : 0)"
                " + (has(self.builtin) ? 1 : 0) == 1",
                "a multiTurn dataset needs exactly one of configMap, path or builtin",
            )
        )
    )

    type: Literal["multiTurn"]
    """`multiTurn`."""
    config_map: ConfigMapKeyRef | None = None
    """The ConfigMap key that holds the JSONL conversations (in a cluster)."""
    path: str | None = Field(default=None, min_length=1)
    """A local path to the JSONL conversations (for `specdecode run --local`; relative to the experiment file)."""
    builtin: Literal["conversations"] | None = None
    """`conversations`: 16 short conversations of 3 to 5 user turns shipped with specdecode."""

    @model_validator(mode="after")
    def _one_source(self) -> MultiTurnDataset:
        if sum(x is not None for x in (self.config_map, self.path, self.builtin)) != 1:
            raise ValueError("a multiTurn dataset needs exactly one of configMap, path or builtin")
        return self


Dataset = Annotated[
    SyntheticDataset | JsonlDataset | BuiltinDataset | TraceDataset | MultiTurnDataset,
    Field(discriminator="type"),
]


class Sampling(Model):
    """Sampling parameters of every request; greedy by default, so outputs can be compared."""

    temperature: float = Field(default=0.0, ge=0, le=2)
    """Sampling temperature; 0 is greedy (needed for the output-equivalence check)."""
    max_tokens: int = Field(default=256, ge=1, le=1_000_000)
    """`max_tokens` of every request."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling threshold."""
    ignore_eos: bool = True
    """Ask the server to ignore EOS so both arms produce the same number of tokens."""


class Stage(Model):
    """One load level: open loop at `rate` requests/s, or closed loop at `concurrency`."""

    model_config = ConfigDict(
        json_schema_extra=_cel_extra(
            cel(
                "has(self.rate) != has(self.concurrency)",
                "a stage needs exactly one of rate (open loop) or concurrency (closed loop)",
            )
        )
    )

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """Stage name (a DNS label), unique within the experiment."""
    rate: float | None = Field(default=None, gt=0, le=100_000)
    """Open loop: requests per second."""
    concurrency: int | None = Field(default=None, ge=1, le=100_000)
    """Closed loop: requests in flight."""
    requests: int | None = Field(default=None, ge=1, le=1_000_000)
    """Overrides `requestsPerStage` for this stage."""
    input_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    """Overrides the synthetic dataset's `inputTokens` for this stage (context length as an axis;
    both arms get the same prompts). Only with `dataset.type: synthetic`."""
    output_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    """Overrides the synthetic dataset's `outputTokens` for this stage. Only with `dataset.type: synthetic`."""

    @property
    def is_open_loop(self) -> bool:
        """Open loop (a rate) rather than closed loop (a concurrency)."""
        return self.rate is not None

    @property
    def load_label(self) -> str:
        """`4 req/s` or `concurrency 16`."""
        return f"{self.rate:g} req/s" if self.rate is not None else f"concurrency {self.concurrency}"


class Arrival(StrEnum):
    """How intended send times are spaced in an open-loop stage."""

    POISSON = "poisson"
    """Exponential inter-arrival times (memoryless): the default, like real traffic."""
    CONSTANT = "constant"
    """Evenly spaced."""
    GAMMA = "gamma"
    """Gamma inter-arrival times with `burstiness` (< 1 burstier than Poisson, > 1 smoother)."""


class SweepAxis(Model):
    """The values of one swept load: a list, or `from`/`to`/`steps` spaced geometrically."""

    model_config = ConfigDict(
        json_schema_extra=_cel_extra(
            cel(
                "has(self.values) != (has(self.from) || has(self.to) || has(self.steps))",
                "give either values or from/to/steps",
            ),
            cel(
                "has(self.values) || (has(self.from) && has(self.to) && has(self.steps))",
                "a geometric sweep needs from, to and steps",
            ),
            cel("!has(self.from) || !has(self.to) || self.from < self.to", "from must be below to"),
        )
    )

    values: list[Annotated[float, Field(gt=0, le=100_000)]] | None = Field(
        default=None, min_length=1, max_length=sweep.MAX_STAGES
    )
    """The loads, one stage each (sorted ascending, duplicates dropped)."""
    from_: float | None = Field(default=None, alias="from", gt=0, le=100_000)
    """The lowest load of a geometric series."""
    to: float | None = Field(default=None, gt=0, le=100_000)
    """The highest load of a geometric series."""
    steps: int | None = Field(default=None, ge=2, le=sweep.MAX_STAGES)
    """How many loads from `from` to `to`, evenly spaced on a log scale (concurrencies are rounded;
    values that round to the same concurrency give one stage)."""

    @model_validator(mode="after")
    def _one_form(self) -> SweepAxis:
        geometric = (self.from_, self.to, self.steps)
        if (self.values is None) == all(v is None for v in geometric):
            raise ValueError("give either values or from/to/steps")
        if self.values is None:
            if any(v is None for v in geometric):
                raise ValueError("a geometric sweep needs from, to and steps")
            assert self.from_ is not None and self.to is not None
            if self.from_ >= self.to:
                raise ValueError(f"from ({self.from_:g}) must be below to ({self.to:g})")
        return self

    def raw(self) -> list[float]:
        """The listed values or the geometric series, before rounding."""
        return sweep.axis_values(self.values, self.from_, self.to, self.steps)


class Sweep(Model):
    """Stages generated over one load axis: `concurrency` (closed loop) or `rate` (open loop).

    Expanded into `workload.stages` before validation (`specdecode validate` prints them), named
    `c<N>` or `r<rate>` (`.` written `-`), in ascending load."""

    model_config = ConfigDict(
        json_schema_extra=_cel_extra(
            cel(
                "has(self.concurrency) != has(self.rate)", "a sweep needs exactly one of concurrency or rate"
            ),
        )
    )

    concurrency: SweepAxis | None = None
    """Closed-loop stages at these concurrencies (whole numbers)."""
    rate: SweepAxis | None = None
    """Open-loop stages at these rates, requests/s (rounded to 3 significant digits)."""

    @model_validator(mode="after")
    def _one_axis(self) -> Sweep:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("a sweep needs exactly one of concurrency or rate")
        if self.concurrency is not None and self.concurrency.values is not None:
            fractional = [v for v in self.concurrency.values if v != int(v)]
            if fractional:
                raise ValueError(f"concurrency values must be whole numbers, got {fractional[0]:g}")
        return self

    @property
    def axis(self) -> Literal["concurrency", "rate"]:
        """The swept load."""
        return "concurrency" if self.concurrency is not None else "rate"

    def stage_documents(self) -> list[dict[str, Any]]:
        """The generated stages, in wire format."""
        values = self.concurrency if self.concurrency is not None else self.rate
        assert values is not None
        return sweep.expand(self.axis, values.raw())


class SearchBounds(Model):
    """The load range a search bisects."""

    model_config = ConfigDict(
        json_schema_extra=_cel_extra(cel("self.from < self.to", "from must be below to")),
    )

    from_: float = Field(alias="from", gt=0, le=100_000)
    """The lowest load probed (probed first)."""
    to: float = Field(gt=0, le=100_000)
    """The highest load probed (probed second)."""

    @model_validator(mode="after")
    def _ordered(self) -> SearchBounds:
        if self.from_ >= self.to:
            raise ValueError(f"from ({self.from_:g}) must be below to ({self.to:g})")
        return self


class Search(Model):
    """An adaptive search run after the stages (issue 17). `goal: breakEven` finds the highest load at
    which the treatment still clears `minSpeedup`: bisection over `concurrency` or `rate` between
    `from` and `to`, each probe a paired stage judged by the same statistics (verdict Pass = clears).
    `specdecode run --local` runs the probes in its process, the operator as rounds (`status.rounds`)."""

    model_config = ConfigDict(
        json_schema_extra=_cel_extra(
            cel(
                "has(self.concurrency) != has(self.rate)", "a search needs exactly one of concurrency or rate"
            ),
        )
    )

    goal: Literal["breakEven"] = "breakEven"
    """`breakEven`: the highest load at which the treatment still clears `analysis.minSpeedup`."""
    concurrency: SearchBounds | None = None
    """Bisect over closed-loop concurrency (whole numbers) between these bounds."""
    rate: SearchBounds | None = None
    """Bisect over open-loop rate, requests/s, between these bounds."""
    max_probes: int = Field(default=8, ge=2, le=16)
    """The most probes (the bounds included) before the search stops with the bracket it has."""
    tolerance: float = Field(default=0.25, gt=0, le=10)
    """Rate searches stop when the bracket's upper load is within this fraction of its lower load
    (concurrency searches stop at adjacent whole numbers)."""
    requests_per_probe: int | None = Field(default=None, ge=1, le=1_000_000)
    """Measured requests of each probe (default `requestsPerStage`); sequential analysis may stop one earlier."""

    @model_validator(mode="after")
    def _one_axis(self) -> Search:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("a search needs exactly one of concurrency or rate")
        if self.concurrency is not None and (
            self.concurrency.from_ != int(self.concurrency.from_)
            or self.concurrency.to != int(self.concurrency.to)
        ):
            raise ValueError("concurrency bounds must be whole numbers")
        return self

    @property
    def axis(self) -> Literal["concurrency", "rate"]:
        """The searched load."""
        return "concurrency" if self.concurrency is not None else "rate"

    @property
    def bounds(self) -> SearchBounds:
        """The searched range."""
        bounds = self.concurrency if self.concurrency is not None else self.rate
        assert bounds is not None
        return bounds

    def probe_stage(self, index: int, load: float) -> Stage:
        """The paired stage of probe `index` (1-based) at `load`: `search<N>-c<load>` or `search<N>-r<load>`."""
        name = f"search{index}-{sweep.stage_name(self.axis, load)}"
        if self.axis == "concurrency":
            return Stage(name=name, concurrency=int(load), requests=self.requests_per_probe)
        return Stage(name=name, rate=load, requests=self.requests_per_probe)


class WorkloadSpec(Model):
    """The load both arms receive: the same prompts, on the same schedule, with the same seed."""

    model_config = ConfigDict(
        json_schema_extra=_cel_extra(
            cel(
                "!has(self.stages) || self.stages.all(s, self.stages.exists_one(t, t.name == s.name))",
                "stage names must be unique",
            ),
            cel("has(self.stages) != has(self.sweep)", "set exactly one of stages or sweep"),
        )
    )

    dataset: Dataset = Field(default_factory=lambda: SyntheticDataset(type="synthetic"))
    """Where prompts come from."""
    sampling: Sampling = Field(default_factory=Sampling)
    """Sampling parameters of every request."""
    stages: list[Stage] = Field(default_factory=list, min_length=1, max_length=sweep.MAX_STAGES)
    """Load levels, in order; both arms get each stage at the same time. Exactly one of `stages` or
    `sweep`."""
    sweep: Sweep | None = Field(default=None, exclude=True)
    """Generate the stages instead of listing them: over `concurrency` or `rate`, a list of `values`
    or `from`/`to`/`steps` (geometric). Exactly one of `stages` or `sweep`."""
    arrival: Arrival = Arrival.POISSON
    """Arrival process of open-loop stages."""
    burstiness: float = Field(default=1.0, gt=0, le=100)
    """Gamma shape for `arrival: gamma` (1 = Poisson)."""
    requests_per_stage: int = Field(default=300, ge=1, le=1_000_000)
    """Upper bound of measured requests per stage; sequential analysis may stop a stage earlier."""
    warmup_requests: int = Field(default=20, ge=0, le=100_000)
    """Warm-up requests before the first stage, with disjoint prompts; excluded from the analysis. A
    closed-loop stage at a concurrency not run just before also opens with one unmeasured round of that
    many requests (real vLLM pays a one-time cost at a new batch size)."""
    request_timeout_seconds: float = Field(default=600, gt=0, le=86_400)
    """A request that takes longer counts as an error (class `timeout`)."""
    load_pods: int = Field(default=1, ge=1, le=loadpods.MAX_PODS)
    """Load pods (the operator's load Job): request i of every stage goes from pod i mod loadPods to
    both arms, so the pods together send the one paired schedule at rates one pod's core cannot hold
    (a closed-loop stage's concurrency is shared out among them); their results are merged before
    the analysis and the run is valid only when every pod kept to its schedule. With more than one,
    sequential analysis judges at its looks but stages run to their bound, and a multi-turn dataset
    is refused. `run --local` sends the load from one process whatever this says."""
    search: Search | None = None
    """After the stages, search for the break-even load (`goal: breakEven`): bisection over
    `concurrency` or `rate` between bounds, each probe a paired stage (`status.search`); the operator
    runs each probe as a round of the experiment (`status.rounds`)."""

    @model_validator(mode="before")
    @classmethod
    def _expand_sweep(cls, data: Any) -> Any:
        """`sweep` becomes `stages` before anything else looks at them (issue 17)."""
        if not isinstance(data, dict) or data.get("sweep") is None:
            return data
        if data.get("stages") is not None:
            raise ValueError("set either stages or sweep, not both")
        try:
            generated = Sweep.model_validate(data["sweep"]).stage_documents()
        except ValidationError:
            return data  # the field's own errors are reported, with their paths
        return {**data, "stages": generated}

    @model_validator(mode="after")
    def _has_stages(self) -> WorkloadSpec:
        if not self.stages:
            raise ValueError("needs stages (the load levels) or sweep")
        return self


# ------------------------------------------------------------------------------------------- analysis


class PrimaryMetric(StrEnum):
    """The metric whose speed-up decides the verdict."""

    TPOT = "tpot"
    """Time per output token after the first: the decode speed speculation is meant to improve."""
    E2E = "e2e"
    """End-to-end request latency."""
    TTFT = "ttft"
    """Time to first token."""
    THROUGHPUT = "throughput"
    """Output tokens per second over the stage."""


class Guardrails(Model):
    """Limits that block a promotion whatever the speed-up."""

    max_ttft_regression: float | None = Field(default=0.10, ge=0, le=100)
    """p90 TTFT may get worse by at most this fraction (0.10 = +10%), unless it rises by no more than
    `ttftToleranceMs`; null disables."""
    ttft_tolerance_ms: float = Field(default=50.0, ge=0, le=3_600_000)
    """A TTFT regression counts only when p90 TTFT also rises by more than this many milliseconds:
    speculation adds a draft prefill, so TTFT rises a little almost always (H200: +9 ms), which no
    user perceives next to a faster decode. 0 judges the ratio alone."""
    max_goodput_drop: float | None = Field(default=0.02, ge=0, le=1)
    """With `analysis.slo` set: goodput (the fraction of requests meeting every SLO) must not surely
    drop (its interval's upper bound below 0 blocks a Pass), nor surely drop by more than this
    (0.02 = 2 points: fails the stage); null disables."""
    max_error_rate: float = Field(default=0.01, ge=0, le=1)
    """Highest tolerated fraction of failed requests in the treatment arm."""
    min_output_match: float = Field(default=0.99, ge=0, le=1)
    """Lowest fraction of treatment outputs equal to the control's under greedy sampling (lossless check)."""
    baseline_mismatch_rate: float | None = Field(default=None, ge=0, le=1)
    """The rate at which two identical servers already give different greedy outputs (the
    `suggestedBaselineMismatchRate` of a `NoiseFloor` run). Set: the output-match limit becomes
    `minOutputMatch - baselineMismatchRate` and only a sure breach (the whole interval below it)
    fails; a breach of the estimate alone blocks a Pass. Unset: any breach is critical."""
    min_acceptance_rate: float | None = Field(default=None, ge=0, le=1)
    """Lowest acceptable draft acceptance rate; null disables."""


class SloLimits(Model):
    """Latency limits of one metric, in milliseconds, per percentile: `p90: 500` = 90% of requests
    within 500 ms."""

    model_config = ConfigDict(
        json_schema_extra=_cel_extra(
            cel(
                "has(self.p50) || has(self.p90) || has(self.p95) || has(self.p99)",
                "set at least one of p50, p90, p95, p99",
            )
        )
    )

    p50: float | None = Field(default=None, gt=0, le=3_600_000)
    """Median limit, ms."""
    p90: float | None = Field(default=None, gt=0, le=3_600_000)
    """p90 limit, ms."""
    p95: float | None = Field(default=None, gt=0, le=3_600_000)
    """p95 limit, ms."""
    p99: float | None = Field(default=None, gt=0, le=3_600_000)
    """p99 limit, ms."""

    @model_validator(mode="after")
    def _one_set(self) -> SloLimits:
        if not self.limits():
            raise ValueError("set at least one of p50, p90, p95, p99")
        return self

    def limits(self) -> list[tuple[int, float]]:
        """(percentile, ms) of each limit set, lowest percentile first."""
        pairs = ((50, self.p50), (90, self.p90), (95, self.p95), (99, self.p99))
        return [(p, ms) for p, ms in pairs if ms is not None]


class Slo(Model):
    """Service-level objectives: what the platform promises its users, per metric and percentile.

    They judge each arm absolutely: an SLO guardrail per limit (the treatment must not miss one the
    control meets) and goodput (the fraction of requests meeting every SLO) per arm and stage."""

    ttft: SloLimits | None = None
    """Time to first token, ms."""
    tpot: SloLimits | None = None
    """Time per output token after the first, ms."""
    e2e: SloLimits | None = None
    """End-to-end request latency, ms."""

    def limits(self) -> list[tuple[str, int, float]]:
        """(metric, percentile, ms) of every limit set."""
        return [
            (metric, p, ms)
            for metric, limits in (("ttft", self.ttft), ("tpot", self.tpot), ("e2e", self.e2e))
            if limits is not None
            for p, ms in limits.limits()
        ]


RequireStages = Literal["all", "any"] | list[str]


class Crossover(StrEnum):
    """Whether to repeat the stages with the arms' placements swapped, to measure the placement effect
    (issue 22; `crossover.py`)."""

    OFF = "Off"
    """No repeat: when the arms ran on different hosts, the speed-up includes the placement (flagged)."""
    IF_APART = "IfApart"
    """Repeat only when the arms' hosts differ (`status.environment.hostDifferences` not empty)."""
    ALWAYS = "Always"
    """Repeat whenever the arms have placements that can be swapped."""


class AnalysisMode(StrEnum):
    """What the run measures."""

    COMPARE = "Compare"
    """Control against the speculative treatment: the verdict."""
    NOISE_FLOOR = "NoiseFloor"
    """An A/A pre-flight: both arms without speculation, the same analysis; reports per stage the
    smallest speed-up measurable at that load and how often identical servers disagree on greedy
    outputs (`status.noiseFloor`). Always Inconclusive with reason `NoiseFloor`."""


class Fairness(StrEnum):
    """What a difference between the arms' live pods beyond speculation does (issue 18;
    `experiment/fairness.py`): another image digest, GPU product, resources, args or env."""

    WARN = "Warn"
    """Measure anyway: a Warning event, the condition ArmsDiffer and `status.armDifferences` name it."""
    FAIL = "Fail"
    """Fail with reason ArmsDiffer before the load (the arms are released per `spec.cleanup`)."""


class AnalysisSpec(Model):
    """How the verdict is reached."""

    mode: AnalysisMode = AnalysisMode.COMPARE
    """`Compare` (default): control against treatment. `NoiseFloor`: an A/A pre-flight, both arms
    without speculation (the speculative config is still validated, not used); every stage runs
    its full request count."""
    primary_metric: PrimaryMetric = PrimaryMetric.TPOT
    """The metric whose speed-up decides."""
    min_speedup: float = Field(default=1.10, gt=0, le=100)
    """Promote only if the lower confidence bound of the speed-up clears this (1.10 = 10% faster)."""
    confidence: float = Field(default=0.95, gt=0, lt=1)
    """Confidence level of the intervals, in (0, 1)."""
    guardrails: Guardrails = Field(default_factory=Guardrails)
    """Limits that block a promotion whatever the speed-up."""
    slo: Slo = Field(default_factory=Slo)
    """Latency SLOs per metric and percentile (ms); none by default, since they depend on the model,
    the hardware and the prompts. Setting one adds its guardrail and goodput."""
    require_stages: RequireStages = Field(
        default="all", json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """`all`, `any`, or a list of stage names that must pass for Promote."""
    sequential: bool = True
    """Stop a stage early once its decision can no longer change (error guarantee holds under the looks)."""
    crossover: Crossover = Crossover.OFF
    """`Off` (default), `IfApart` or `Always`: after the stages, repeat each with the arms' placements
    swapped (the control where the treatment ran and back), estimate the placement effect from the two
    rounds, and turn a stage that would pass into Inconclusive (`PlacementEffect`) when that effect is
    comparable to its margin over minSpeedup. The operator swaps the arms' nodes (each arm's pod
    pinned to the other's node: `status.rounds`); `specdecode run --local` swaps the arms' GPU sets.
    Arms on one node have nothing to swap (`SamePlacement`)."""
    crossover_fraction: float = Field(default=0.5, gt=0, le=1)
    """The swapped round's share of each stage's requests, in (0, 1] (0.5: half as many pairs; at least
    10 requests a stage)."""
    confirm: bool = False
    """After the stages, restart the treatment with the recommended `num_speculative_tokens_per_batch_size`
    and run the stages against the control again; `status.recommendation.confirmed` is true only if no
    stage of that round Fails (stages where the schedule turns speculation off are judged as
    non-inferior, speed-up >= 0.98). In a cluster the treatment's Deployment is rendered again with
    the schedule on its node (`status.rounds`); the stages' verdict stands whatever the round finds."""

    fairness: Fairness = Fairness.WARN
    """`Warn` (default) or `Fail`: what the operator does when, once both arms are Ready, their pods
    differ in anything but the speculative flags (image digest, node GPU product, resources, args,
    env). `specdecode run --local` starts both arms from one command line and does not check."""

    @field_validator("require_stages")
    @classmethod
    def _non_empty(cls, value: RequireStages) -> RequireStages:
        if isinstance(value, list) and not value:
            raise ValueError("must name at least one stage (or be 'all' or 'any')")
        return value


# --------------------------------------------------------------------------------------- the rest


class PrometheusSpec(Model):
    """Where the operator reads server-side metrics."""

    url: str = Field(min_length=1, pattern=r"^https?://")
    """Prometheus base URL, e.g. http://prometheus-operated.monitoring:9090."""


_DURATION = re.compile(r"^(\d+h)?(\d+m)?(\d+s)?$")


def parse_duration(text: str) -> float:
    """`1h30m`, `90s`, `2h` -> seconds."""
    match = _DURATION.fullmatch(text)
    if not text or match is None:
        raise ValueError(f"{text!r} is not a duration like 30m, 2h or 1h30m")
    hours, minutes, seconds = (int(g[:-1]) if g else 0 for g in match.groups())
    return float(hours * 3600 + minutes * 60 + seconds)


Duration = Annotated[str, Field(pattern=r"^(\d+h)?(\d+m)?(\d+s)?$", min_length=2)]


class Deadlines(Model):
    """Time limits; passing one ends the experiment Failed (never with a verdict)."""

    deploy: Duration = "30m"
    """From creation until both arms are Ready (model download and loading included)."""
    run: Duration = "2h"
    """From the start of the load until the verdict."""

    @property
    def deploy_seconds(self) -> float:
        """`deploy` in seconds."""
        return parse_duration(self.deploy)

    @property
    def run_seconds(self) -> float:
        """`run` in seconds."""
        return parse_duration(self.run)


class Colocate(StrEnum):
    """Whether both arms must share a node (each with its own GPUs)."""

    PREFERRED = "Preferred"
    """Ask the scheduler to put both arms on one node (preferred pod affinity); they land apart when
    no node has GPUs for both, and the status says so."""
    REQUIRED = "Required"
    """Both arms on one node or not at all: an arm that cannot join the other stays Unschedulable, and
    the experiment fails after the grace period."""
    OFF = "Off"
    """No affinity: the scheduler places each arm on its own."""


class PlacementSpec(Model):
    """Where the arms run. A host's CPU, driver, clocks and neighbours weigh on a small draft's many
    short passes far more than on the control: arms on different nodes measure the nodes too."""

    colocate: Colocate = Colocate.PREFERRED
    """`Preferred` (default), `Required` or `Off`: pod affinity on the experiment's label with topology
    key `kubernetes.io/hostname`."""


class Cleanup(StrEnum):
    """What happens to the arms' Deployments once the experiment ends."""

    ALWAYS = "Always"
    """Delete them whatever the outcome (frees the GPUs)."""
    ON_SUCCESS = "OnSuccess"
    """Delete them when Completed; keep them after a failure for debugging."""
    NEVER = "Never"
    """Keep them."""


class ExperimentSpec(Model):
    """`spec` of a SpecDecodeExperiment."""

    model: str = Field(min_length=1)
    """Target model: a Hugging Face id, or a path inside the image or under `/models` (`engine.modelCache`)."""
    model_revision: str = ""
    """Target model revision (recorded in status)."""
    served_model_name: str = ""
    """Name the arms serve the model under (default: `model`)."""
    engine: EngineSpec = Field(default_factory=EngineSpec)
    """The engine shared by both arms."""
    speculative: SpeculativeSpec
    """The speculative config of the treatment arm."""
    workload: WorkloadSpec
    """The load both arms receive."""
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec)
    """How the verdict is reached."""
    prometheus: PrometheusSpec | None = None
    """Where server-side metrics are read (operator: required unless it has a default; local: optional)."""
    deadlines: Deadlines = Field(default_factory=Deadlines)
    """Time limits."""
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    """Where the arms run: on one node by preference (the status records each arm's host)."""
    cleanup: Cleanup = Cleanup.ALWAYS
    """What happens to the arms once the experiment ends."""

    @property
    def speculates(self) -> bool:
        """The treatment runs with speculation (False in an A/A `NoiseFloor` run)."""
        return self.analysis.mode is AnalysisMode.COMPARE

    @property
    def served_name(self) -> str:
        """The name requests use as `model`."""
        return self.served_model_name or self.model

    @property
    def sessions(self) -> bool:
        """The workload is multi-turn sessions (`dataset.type: multiTurn`)."""
        return isinstance(self.workload.dataset, MultiTurnDataset)

    @property
    def prefix_caching(self) -> bool:
        """Both arms run with vLLM's prefix caching: `engine.prefixCaching`, or multi-turn sessions
        (whose later turns are measured with the earlier turns cached, on both arms alike)."""
        return self.engine.prefix_caching or self.sessions

    def stage_requests(self, stage: Stage) -> int:
        """Measured requests of one stage (its own bound or `requestsPerStage`)."""
        return stage.requests if stage.requests is not None else self.workload.requests_per_stage

    def stage_dataset(self, stage: Stage) -> SyntheticDataset:
        """The synthetic dataset of one stage: the workload's with the stage's `inputTokens` and
        `outputTokens` where set (the workload's dataset must be synthetic)."""
        dataset = self.workload.dataset
        assert isinstance(dataset, SyntheticDataset)
        update = {
            k: v
            for k, v in (("input_tokens", stage.input_tokens), ("output_tokens", stage.output_tokens))
            if v is not None
        }
        return dataset.model_copy(update=update) if update else dataset


class Arm(StrEnum):
    """The two arms of an experiment."""

    CONTROL = "control"
    """vLLM without speculative decoding."""
    TREATMENT = "treatment"
    """vLLM with `--speculative-config` (without it in `analysis.mode: NoiseFloor`)."""
