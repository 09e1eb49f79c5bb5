"""The vLLM release of an experiment: where it comes from, and what rendering, validation and the
recommendation make of it (the release facts themselves are checked against vLLM's own parser in
tests/conformance)."""

from __future__ import annotations

from typing import Any

import pytest

from specdecode.experiment import releases, spec, validation, verdict
from tests.factories import experiment_document
from tests.report import synthetic


def parsed(**engine: Any) -> spec.ExperimentSpec:
    doc = experiment_document(engine=engine) if engine else experiment_document()
    result, _ = validation.parse_experiment(doc)
    return result


def problems(*, engine: dict[str, Any], speculative: dict[str, Any]) -> list[str]:
    return [
        str(p) for p in validation.check_document(experiment_document(engine=engine, speculative=speculative))
    ]


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("vllm/vllm-openai:v0.33.0", (0, 33, 0)),
        ("vllm/vllm-openai:0.20.0", (0, 20, 0)),
        ("registry.local:5000/vllm/vllm-openai:v0.27.1", (0, 27, 1)),
        ("vllm/vllm-openai:v0.26.0@sha256:" + "a" * 64, (0, 26, 0)),
        ("vllm/vllm-openai:latest", None),
        ("vllm/vllm-openai:nightly-0.30", None),
        ("registry.local:5000/vllm", None),
        ("vllm/vllm-openai", None),
    ],
)
def test_the_release_is_read_from_release_tags_only(image: str, expected: releases.Version | None) -> None:
    assert releases.image_release(image) == expected


def test_the_spec_wins_then_local_vllm_then_the_image_tag_then_the_newest_assumed() -> None:
    engine = parsed(image="vllm/vllm-openai:v0.33.0", vllmVersion="0.22.1").engine
    assert releases.resolve(engine, local="0.20.0") == releases.Release((0, 22, 1), releases.Source.SPEC)
    engine = parsed(image="vllm/vllm-openai:v0.33.0").engine
    assert releases.resolve(engine, local="0.20.0").source is releases.Source.LOCAL
    assert releases.resolve(engine).source is releases.Source.IMAGE_TAG
    # On this machine (run --local) no image runs: an unreadable local vLLM leaves the release unknown.
    assert not releases.resolve(engine, local=None, here=True).known
    unknown = releases.resolve(parsed(image="my/vllm:prod").engine)
    assert unknown.version == releases.NEWEST and not unknown.known
    assert "assumed" in unknown.describe() and "spec.engine.vllmVersion" in unknown.describe()


def test_a_release_older_than_the_oldest_supported_is_refused_with_the_field() -> None:
    found = [
        str(p)
        for p in validation.check_document(experiment_document(engine={"image": "vllm/vllm-openai:v0.19.1"}))
    ]
    assert len(found) == 1 and found[0].startswith("spec.engine.image: vLLM 0.19.1 (image tag) is older")
    found = [str(p) for p in validation.check_document(experiment_document(engine={"vllmVersion": "0.11.0"}))]
    assert found[0].startswith("spec.engine.vllmVersion:")


def test_a_newer_release_gets_the_newest_rules_and_says_so() -> None:
    engine = parsed(image="vllm/vllm-openai:v0.34.0").engine
    assert validation.check_release(engine) == []
    release = releases.resolve(engine)
    assert release.rules == releases.NEWEST
    assert "newer than 0.33.0" in release.describe()


def test_a_key_the_release_lacks_is_refused_naming_the_release() -> None:
    schedule = {
        "method": "ngram",
        "numSpeculativeTokens": 4,
        "extra": {"num_speculative_tokens_per_batch_size": [[1, 8, 4]]},
    }
    found = problems(engine={"image": "vllm/vllm-openai:v0.20.0"}, speculative=schedule)
    assert found == [
        "spec.speculative.extra.num_speculative_tokens_per_batch_size: does not exist in vLLM 0.20 "
        "(the arms' release, 0.20.0 (image tag)); it needs vLLM >= 0.24: remove it or set "
        "spec.engine.vllmVersion / the image to a release that has it"
    ]
    assert problems(engine={"image": "vllm/vllm-openai:v0.24.0"}, speculative=schedule) == []
    tree = {
        "method": "eagle",
        "model": "e/h",
        "numSpeculativeTokens": 4,
        "extra": {"speculative_token_tree": "[(0,)]"},
    }
    assert problems(engine={"vllmVersion": "0.20.0"}, speculative=tree) == []
    assert "it needs vLLM < 0.21" in problems(engine={"vllmVersion": "0.21.0"}, speculative=tree)[0]
    # and every later release (mutation benchmark survivor: `rules != until` for `rules < until`)
    assert "it needs vLLM < 0.21" in problems(engine={"vllmVersion": "0.33.0"}, speculative=tree)[0]


def test_values_that_changed_between_releases_follow_the_release() -> None:
    old = {"method": "ngram", "numSpeculativeTokens": 4, "extra": {"rejection_sample_method": "standard"}}
    assert (
        "must be one of strict, probabilistic, synthetic in vLLM 0.20"
        in problems(engine={"vllmVersion": "0.20.0"}, speculative=old)[0]
    )
    assert problems(engine={"vllmVersion": "0.21.0"}, speculative=old) == []
    fly = {"method": "ngram", "numSpeculativeTokens": 4, "extra": {"rejection_sample_method": "fly"}}
    assert problems(engine={"vllmVersion": "0.32.0"}, speculative=fly)
    sampler = {
        "method": "draft_model",
        "model": "d/m",
        "numSpeculativeTokens": 4,
        "extra": {"draft_sample_method": "gumbel"},
    }
    assert problems(engine={"vllmVersion": "0.21.0"}, speculative=sampler) == []
    assert "must be greedy or probabilistic in vLLM 0.33" in problems(engine={}, speculative=sampler)[0]


def test_a_method_the_release_lacks_is_refused() -> None:
    dspark = {"method": "dspark", "model": "d/s"}
    found = problems(engine={"vllmVersion": "0.24.0"}, speculative=dspark)
    assert found == [
        "spec.speculative.method: 'dspark' does not exist in vLLM 0.24 (the arms' release, "
        "0.24.0 (spec.engine.vllmVersion)); it needs vLLM >= 0.25"
    ]
    assert problems(engine={"vllmVersion": "0.25.1"}, speculative=dspark) == []


def test_the_recommendation_offers_what_the_release_has() -> None:
    for version, has_schedule in (("0.20.0", False), ("0.24.0", True)):
        s = parsed(vllmVersion=version)
        records, windows = synthetic.run(s, speedup={"low": 1.4, "c16": 0.85}, n=300)
        rec = verdict.analyse(s, records, windows).recommendation
        assert rec is not None and rec.beneficial_up_to == "low"
        assert (rec.num_speculative_tokens_per_batch_size is not None) is has_schedule, version
        if not has_schedule:
            assert rec.note is not None
            assert "vLLM 0.20 has no num_speculative_tokens_per_batch_size" in rec.note
            assert "--max-num-seqs" in rec.note


def test_a_release_without_its_patch_number_is_its_first_patch() -> None:
    """(mutation benchmark survivor in releases: `0.27` read as 0.27.1)"""
    assert releases.parse("0.27") == (0, 27, 0)
    assert releases.parse("v0.33.0") == (0, 33, 0)
    assert releases.parse("0.20.1.post1") == (0, 20, 1)
    assert releases.parse("latest") is None
