from __future__ import annotations

import os
import random

import pytest

from specdecode.controller import results


def test_results_round_trip_through_config_maps() -> None:
    files = {"requests.jsonl": '{"a": 1}\n' * 10, "windows.json": "{}", "loadgen-summary.json": "{}"}
    maps = results.build_config_maps(
        "exp-results", "exp", results.pack(files), owner={"uid": "u"}, generation=3
    )
    assert maps[0]["metadata"]["ownerReferences"] == [{"uid": "u"}]
    assert maps[0]["metadata"]["labels"]["specdecode.io/results"] == "exp"
    assert results.unpack(results.parts_from_config_maps(list(reversed(maps)))) == files


def test_large_results_are_split_below_the_object_limit() -> None:
    rng = random.Random(0)
    noisy = "".join(rng.choice("0123456789abcdef") for _ in range(3_000_000))  # compresses poorly
    parts = results.pack({"requests.jsonl": noisy})
    assert len(parts) > 1
    for cm in results.build_config_maps("exp-results", "exp", parts):
        size = sum(len(v) for v in cm["binaryData"].values())
        assert size < 1024 * 1024 - 16 * 1024
    assert results.unpack(parts)["requests.jsonl"] == noisy


def test_a_missing_part_is_named() -> None:
    parts = results.pack({"requests.jsonl": os.urandom(2_000_000).hex()})
    maps = results.build_config_maps("exp-results", "exp", parts)
    with pytest.raises(results.ResultsError, match=r"result parts \[1\] of"):
        results.parts_from_config_maps([maps[0], *maps[2:]])


def test_no_results_at_all() -> None:
    with pytest.raises(results.ResultsError, match="stored no results"):
        results.parts_from_config_maps([])


def test_corrupt_bundle() -> None:
    with pytest.raises(results.ResultsError, match="corrupt"):
        results.unpack([b"not gzip"])
