"""Conformance: what the operator renders is accepted by vLLM's own code, oldest and newest supported release.

For representative experiments (every speculative method, with and without `speculative.extra` keys, API key,
prefix caching on and off, extra engine args), both arms' `manifests.serve_args` with `spec.engine.vllmVersion`
set to the release are checked by that release's real `vllm serve` parser and config classes, installed by
`hack/install-vllm.sh` (`make vllm-parsers`). `vllm_check.py` says how far each check goes without a GPU.
One subprocess per release runs every case (importing vLLM takes seconds).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from specdecode.experiment import manifests, spec, speculative_rules, validation
from tests.factories import ROOT, experiment_document

# The oldest and the newest supported vLLM release; hack/install-vllm.sh installs the same two.
RELEASES = ("0.20.0", "0.33.0")
CHECKER = Path(__file__).with_name("vllm_check.py")
INSTALL_SCRIPT = ROOT / "hack" / "install-vllm.sh"
CHECK_TIMEOUT_S = 300


def release_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


@dataclass(frozen=True)
class Case:
    """One representative experiment: spec overrides, and the releases that have what it uses.

    In those releases specdecode must accept the experiment and vLLM what it renders. In the others
    specdecode may refuse it (what the release lacks); if specdecode renders it, vLLM must accept it.
    """

    name: str
    speculative: dict[str, Any]
    engine: dict[str, Any] = field(default_factory=dict)
    spec_overrides: dict[str, Any] = field(default_factory=dict)
    since: str = RELEASES[0]
    until: str | None = None
    """The first release without it."""

    def applies_to(self, release: str) -> bool:
        key = release_key(release)
        return key >= release_key(self.since) and (self.until is None or key < release_key(self.until))

    def experiment(self, release: str) -> spec.ExperimentSpec:
        document = experiment_document(
            speculative=self.speculative,
            engine={**self.engine, "vllmVersion": release},
            **self.spec_overrides,
        )
        parsed, _ = validation.parse_experiment(document)
        return parsed


DRAFT = {"method": "draft_model", "model": "Qwen/Qwen3-0.6B", "numSpeculativeTokens": 4}
EAGLE3 = {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "numSpeculativeTokens": 3}
SYNTHETIC = {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.9, 0.7, 0.5, 0.3]}
USER_ARGS = [
    "--max-model-len",
    "4096",
    "--gpu-memory-utilization",
    "0.85",
    "--max-num-seqs",
    "64",
    "--enforce-eager",
]

CASES = [
    # Every method the project supports, plain (the deprecated MTP aliases are refused by our validation).
    Case("ngram", {"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMin": 2, "promptLookupMax": 5}),
    Case("ngram_gpu", {"method": "ngram_gpu", "numSpeculativeTokens": 4}),
    Case("draft_model", DRAFT),
    Case("draft_model-draft_tp", {**DRAFT, "draftTensorParallelSize": 1}),
    Case("suffix", {"method": "suffix"}),
    Case(
        "eagle", {"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "numSpeculativeTokens": 3}
    ),
    Case(
        "eagle3",
        {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "numSpeculativeTokens": 3},
    ),
    Case("mtp", {"method": "mtp"}),
    Case("mtp-k", {"method": "mtp", "numSpeculativeTokens": 1}),
    Case("dflash", {"method": "dflash", "model": "z-lab/Qwen3-8B-DFlash-b16", "numSpeculativeTokens": 4}),
    Case("extract_hidden_states", {"method": "extract_hidden_states", "numSpeculativeTokens": 1}),
    Case(
        "custom_class",
        {"method": "custom_class", "model": "proposers.Mine", "numSpeculativeTokens": 2},
        since="0.22.1",
    ),
    Case("dspark", {"method": "dspark"}, since="0.25.1"),
    # speculative.extra: synthetic acceptance (by rates and by length), other keys, batch-size schedule.
    Case("draft_model-synthetic", {**DRAFT, "extra": SYNTHETIC}),
    Case("ngram-synthetic", {"method": "ngram", "numSpeculativeTokens": 4, "extra": SYNTHETIC}),
    Case(
        "eagle3-synthetic-length",
        {
            "method": "eagle3",
            "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
            "numSpeculativeTokens": 3,
            "extra": {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.5},
        },
    ),
    Case("draft_model-extra", {**DRAFT, "extra": {"enforce_eager": True, "max_model_len": 4096}}),
    # Lossless, said explicitly: 0.20.x spells it `strict` (its default), 0.21.0 and later `standard`.
    Case("draft_model-standard", {**DRAFT, "extra": {"rejection_sample_method": "standard"}}, since="0.21.0"),
    Case("draft_model-strict", {**DRAFT, "extra": {"rejection_sample_method": "strict"}}, until="0.21.0"),
    # Keys that only some releases have.
    Case(
        "draft_model-token_tree",
        {**DRAFT, "numSpeculativeTokens": 2, "extra": {"speculative_token_tree": "[(0,), (0, 0)]"}},
        until="0.21.0",
    ),
    Case(
        "eagle3-draft_sample_method",
        {**EAGLE3, "extra": {"draft_sample_method": "greedy", "attention_backend": "FLASH_ATTN"}},
        since="0.21.0",
    ),
    Case("draft_model-kv_cache_dtype", {**DRAFT, "extra": {"kv_cache_dtype": "auto"}}, since="0.26.0"),
    Case("eagle-block_drop", {**EAGLE3, "extra": {"disable_eagle_block_drop": True}}, since="0.30.0"),
    Case(
        "draft_model-per_batch_size",
        {**DRAFT, "extra": {"num_speculative_tokens_per_batch_size": [[1, 32, 4], [33, 4096, 0]]}},
        since="0.24.0",
    ),
    # The engine: prefix caching on (off is the default above), API key, user args, a pinned revision.
    Case("draft_model-prefix_caching", DRAFT, engine={"prefixCaching": True}),
    Case(
        "ngram-prefix_caching", {"method": "ngram", "numSpeculativeTokens": 4}, engine={"prefixCaching": True}
    ),
    # Multi-turn sessions turn prefix caching on in both arms (engine.prefixCaching left off).
    Case(
        "draft_model-multi_turn",
        DRAFT,
        spec_overrides={
            "workload": {
                "dataset": {"type": "multiTurn", "builtin": "conversations"},
                "stages": [{"name": "c4", "concurrency": 4}],
            }
        },
    ),
    Case("draft_model-api_key", DRAFT, engine={"apiKeySecret": {"name": "vllm-key", "key": "token"}}),
    Case("draft_model-args", DRAFT, engine={"args": USER_ARGS}),
    Case(
        "eagle3-everything",
        {
            "method": "eagle3",
            "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
            "numSpeculativeTokens": 3,
            "extra": SYNTHETIC | {"synthetic_acceptance_rates": [0.8, 0.6, 0.4]},
        },
        engine={
            "prefixCaching": True,
            "apiKeySecret": {"name": "vllm-key", "key": "token"},
            "args": USER_ARGS,
        },
        spec_overrides={"servedModelName": "llama", "modelRevision": "main"},
    ),
]


def with_speculative_config(config: dict[str, Any]) -> list[str]:
    return ["vllm", "serve", "m", "--speculative-config", json.dumps(config)]


# Command lines vLLM must refuse, and the check that refuses each: they prove the check can fail.
PROBES: dict[str, tuple[list[str], str]] = {
    "unknown flag": (["vllm", "serve", "m", "--no-such-flag"], "parse"),
    "unknown speculative key": (
        with_speculative_config({"method": "ngram", "num_speculative_tokens": 2, "no_such_key": 1}),
        "speculative_fields",
    ),
    "k of zero": (
        with_speculative_config({"method": "ngram", "num_speculative_tokens": 0}),
        "speculative_fields",
    ),
    "synthetic rates longer than k": (
        with_speculative_config(
            {"method": "draft_model", "model": "d", "num_speculative_tokens": 2} | SYNTHETIC
        ),
        "speculative_fields",
    ),
    "ngram min above max": (
        with_speculative_config(
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 2}
        ),
        "speculative_config",
    ),
}


def case_id(case: Case, arm: spec.Arm) -> str:
    return f"{case.name}-{arm.value}"


@functools.cache
def rendered(release: str) -> dict[str, list[str] | str]:
    """Both arms' argv of every case, by case id (or why specdecode's validation refused it)."""
    out: dict[str, list[str] | str] = {}
    for case in CASES:
        try:
            experiment = case.experiment(release)
        except validation.InvalidSpecError as exc:
            for arm in spec.Arm:
                out[case_id(case, arm)] = (
                    f"specdecode's validation refuses case {case.name!r} for vLLM {release}: {exc}"
                )
            continue
        for arm in spec.Arm:
            out[case_id(case, arm)] = manifests.serve_args(experiment, arm)
    return out


def argv_of(release: str, key: str) -> list[str]:
    argv = rendered(release)[key]
    if isinstance(argv, str):
        pytest.fail(argv, pytrace=False)
    return argv


def vllm_dir() -> Path:
    configured = os.environ.get("SPECDECODE_VLLM_DIR")
    if configured:
        return Path(configured)
    out = subprocess.run(
        ["bash", str(INSTALL_SCRIPT), "--print-dir"], capture_output=True, text=True, check=True
    ).stdout
    return Path(out.strip().splitlines()[-1])


def answer(release: str) -> dict[str, Any]:
    """The release's verdict on every case and probe (a failure to get it fails each test that asks)."""
    got = _answer(release)
    if isinstance(got, str):
        pytest.fail(got, pytrace=False)
    return got


@functools.cache
def _answer(release: str) -> dict[str, Any] | str:
    """Run every case and probe through the release's own code, in one process."""
    python = vllm_dir() / release / "venv" / "bin" / "python"
    if not (python.parent.parent.parent / ".installed").is_file():
        return f"vLLM {release} is not installed in {vllm_dir()}: run `make test` (or `make vllm-parsers`)"
    cases = [{"id": key, "argv": argv} for key, argv in rendered(release).items() if isinstance(argv, list)]
    cases += [{"id": f"probe: {name}", "argv": argv} for name, (argv, _) in PROBES.items()]
    # No network: a check that reached for the Hugging Face hub would fail here, not hang.
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [str(python), str(CHECKER)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT_S,
        env=env,
        check=False,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        return f"the vLLM {release} check did not run (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(proc.stdout)
    if result["release"] != release:
        return f"{python} runs vLLM {result['release']}, not {release}"
    return result


def outcome(release: str, key: str) -> dict[str, Any]:
    return next(r for r in answer(release)["results"] if r["id"] == key)


PARAMS = [
    pytest.param(release, case, arm, id=f"{release}-{case_id(case, arm)}")
    for release in RELEASES
    for case in CASES
    for arm in spec.Arm
]


@pytest.mark.parametrize(("release", "case", "arm"), PARAMS)
def test_vllm_accepts_the_rendered_command_line(release: str, case: Case, arm: spec.Arm) -> None:
    if not case.applies_to(release) and isinstance(rendered(release)[case_id(case, arm)], str):
        return  # the release lacks what the case uses, and specdecode's validation says so
    argv = argv_of(release, case_id(case, arm))
    result = outcome(release, case_id(case, arm))
    assert result["ok"], (
        f"vLLM {release} refuses case {case.name!r} ({arm.value} arm) at {result['stage']}: {result['error']}\n"
        f"  argv: {shlex.join(argv)}"
    )
    expected = ["parse", "validate", "engine_args"]
    if arm is spec.Arm.TREATMENT:
        expected.append("speculative_fields")
    assert result["ran"][: len(expected)] == expected, (
        f"only {result['ran']} ran; not run: {result['not_run']}"
    )


@pytest.mark.parametrize("release", RELEASES)
def test_every_flag_the_renderer_emits_exists_in_vllm(release: str) -> None:
    options = set(answer(release)["options"])
    emitted: dict[str, set[str]] = {}
    for key, argv in rendered(release).items():
        if isinstance(argv, str):
            continue  # refused by specdecode's validation (test_vllm_accepts_... says whether rightly)
        for token in argv[2:]:
            if token.startswith("-") and not token.lstrip("-").replace(".", "").isdigit():
                emitted.setdefault(token.split("=", 1)[0], set()).add(key)
    missing = {flag: cases for flag, cases in emitted.items() if flag not in options}
    assert not missing, f"vLLM {release} has no such flag: " + "; ".join(
        f"{flag} (rendered in {', '.join(sorted(cases))})" for flag, cases in sorted(missing.items())
    )


@pytest.mark.parametrize("release", RELEASES)
def test_model_free_speculative_configs_are_built_by_vllm(release: str) -> None:
    """ngram's whole SpeculativeConfig (post-init and validators) runs, so that check is not vacuous."""
    for key in ("ngram-treatment", "ngram-synthetic-treatment", "ngram_gpu-treatment"):
        assert "speculative_config" in outcome(release, key)["ran"], outcome(release, key)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("probe", PROBES)
def test_the_check_refuses_what_vllm_refuses(release: str, probe: str) -> None:
    result = outcome(release, f"probe: {probe}")
    assert not result["ok"], f"vLLM {release} accepted {PROBES[probe][0]}"
    assert result["stage"] == PROBES[probe][1], result


@pytest.mark.parametrize("release", RELEASES)
def test_specdecode_knows_every_speculative_config_field(release: str) -> None:
    """Each field is settable (a typed field or `extra`) or refused with a hint: none is unknown to validation."""
    known = (
        set(speculative_rules.SPECULATIVE_EXTRA_KEYS)
        | set(speculative_rules.TYPED_SPECULATIVE_KEYS)
        | set(speculative_rules.SPECULATIVE_KEY_TRAPS)
    )
    unknown = sorted(set(answer(release)["speculative"]["fields"]) - known)
    assert not unknown, f"vLLM {release}'s SpeculativeConfig has fields specdecode does not know: {unknown}"


def test_every_method_specdecode_names_exists_in_the_newest_release() -> None:
    methods = set(answer(RELEASES[-1])["speculative"]["literals"]["method"])
    missing = sorted({m.value for m in spec.SpeculativeMethod} - methods)
    assert not missing, f"not a `method` of vLLM {RELEASES[-1]}: {missing}"


def test_the_install_script_installs_these_releases() -> None:
    script = INSTALL_SCRIPT.read_text()
    installed = re.search(r'^VLLM_VERSIONS="\$\{VLLM_VERSIONS:-([^}]*)\}"', script, re.MULTILINE)
    assert installed is not None, "VLLM_VERSIONS not found in hack/install-vllm.sh"
    assert tuple(installed.group(1).split()) == RELEASES


def _families_read() -> dict[str, str]:
    """Every `vllm:` series the load generator, the operator and the KV-cache reader ask for, by where."""
    from specdecode.experiment import kvcache, promql
    from specdecode.loadgen import scrape

    read: dict[str, str] = {}
    for module in (promql, scrape, kvcache):
        for attr, value in vars(module).items():
            if attr.isupper() and isinstance(value, str) and value.startswith("vllm:"):
                read[value] = f"{module.__name__}.{attr}"
    return read


def _family(series: str, families: dict[str, str]) -> str | None:
    """The family a series name belongs to: itself (a gauge, a histogram, even one named `..._total`
    like vllm:iteration_tokens_total) or, for `x_total`, the counter `x`."""
    if families.get(series) in ("gauge", "histogram"):
        return series
    base = series.removesuffix("_total")
    return base if base != series and families.get(base) == "counter" else None


@pytest.mark.parametrize("release", RELEASES)
def test_every_vllm_metric_specdecode_reads_is_one_vllm_registers(release: str) -> None:
    """A renamed metric would read as no data (an Inconclusive or a missing acceptance rate), not an error:
    each series we ask for must be one the release registers, a counter under its `_total` name."""
    families = answer(release)["metrics"]
    assert len(families) > 30, families  # the source scan found the stat loggers
    wrong = []
    for name, where in sorted(_families_read().items()):
        family = _family(name, families)
        if family is None:
            wrong.append(f"{name} ({where}): vLLM {release} registers no such series")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("release", RELEASES)
def test_the_simulator_exposes_only_metrics_vllm_registers_with_their_kinds(release: str) -> None:
    """The simulator stands in for vLLM in every test and the demo: each family it serves is one the
    release serves, of the same kind, and the KV-cache info gauge's labels are CacheConfig fields."""
    from specdecode.simulator.metrics import EngineMetrics

    metrics = (
        EngineMetrics(model_name="m", num_spec_tokens=3, kv_cache_tokens=16384, prefix_caching=True)
        .render()
        .decode()
    )
    served = dict(re.findall(r"^# TYPE (vllm:\w+) (\w+)$", metrics, re.MULTILINE))
    assert len(served) > 20, served
    families = answer(release)["metrics"]
    wrong = {name: (kind, families.get(name)) for name, kind in served.items() if families.get(name) != kind}
    assert not wrong, f"served as (simulator kind, vLLM {release} kind): {wrong}"
    info = re.search(r"^vllm:cache_config_info\{(.*)\}", metrics, re.MULTILINE)
    assert info is not None
    labels = set(re.findall(r'(\w+)="', info.group(1))) - {"model_name", "engine"}
    fields = set(answer(release)["cache_config_fields"])
    assert {"num_gpu_blocks", "block_size"} <= labels <= fields, labels - fields
