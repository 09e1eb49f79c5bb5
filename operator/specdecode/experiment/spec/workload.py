"""The load both arms receive (`spec.workload`): datasets, stages, sweeps and the break-even search."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator

from specdecode.experiment import sweep
from specdecode.experiment.spec.base import Model, cel, cel_extra

# ------------------------------------------------------------------------------------------- workload


#: the most load pods one experiment may ask for (`workload.loadPods`; `loadpods.py` shards among them)
MAX_LOAD_PODS = 16


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
        json_schema_extra=cel_extra(
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
        json_schema_extra=cel_extra(
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
        json_schema_extra=cel_extra(
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
        json_schema_extra=cel_extra(
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
        json_schema_extra=cel_extra(
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
        json_schema_extra=cel_extra(
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
        json_schema_extra=cel_extra(cel("self.from < self.to", "from must be below to")),
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
        json_schema_extra=cel_extra(
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
        json_schema_extra=cel_extra(
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
    load_pods: int = Field(default=1, ge=1, le=MAX_LOAD_PODS)
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
