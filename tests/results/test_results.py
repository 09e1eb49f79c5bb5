from __future__ import annotations

import asyncio
import base64
import io
import json
import random
import tracemalloc
import zipfile
import zlib
from typing import Any

import pytest

from specdecode import results
from specdecode.experiment import keys, validation
from tests.controller.fake_kube import FakeKube
from tests.factories import experiment_document
from tests.report import synthetic


def run_files(
    requests: int = 20, *, stages: int = 1, seed: int = 0, mismatch_rate: float = 0.0, text: str = "same text"
) -> dict[str, str]:
    """A load Job's three files for a synthetic run (`requests` a stage, both arms)."""
    doc = experiment_document(
        workload={
            "stages": [{"name": f"c{i}", "concurrency": 1} for i in range(stages)],
            "requestsPerStage": requests,
            "warmupRequests": 0,
        }
    )
    experiment, _ = validation.parse_experiment(doc)
    recs, windows = synthetic.run(
        experiment, seed=seed, warmup=1, mismatch_rate=mismatch_rate, error_rate=0.1
    )
    lines = "".join(
        r.model_copy(update={"text": text if r.ok else None}).model_dump_json() + "\n" for r in recs
    )
    doc_windows = {
        "anchor": {"monotonic": 1.0, "wall": 2.0},
        "windows": [w.model_dump(mode="json") for w in windows],
    }
    return {
        "requests.jsonl": lines,
        "windows.json": json.dumps(doc_windows),
        "loadgen-summary.json": json.dumps({"validity": {"valid": True, "reasons": []}}),
    }


FILES = run_files()
FORGED = run_files(3, seed=7)


def noisy_files() -> dict[str, str]:
    """Files whose bundle needs two parts: every pair's outputs differ and are kept, as random hex."""
    files = run_files(100, mismatch_rate=1.0)
    rng = random.Random(0)
    lines = [json.loads(line) for line in files["requests.jsonl"].splitlines()]
    for rec in lines:
        rec["text"] = "".join(rng.choice("0123456789abcdef") for _ in range(8000))
    return {**files, "requests.jsonl": "".join(json.dumps(rec) + "\n" for rec in lines)}


NOISY = noisy_files()


def fingerprint(read: results.Results) -> Any:
    """What two reads of the same results share, comparably."""
    recs, anchor, windows, summary = read
    return (
        [(r.stage, r.index, r.arm, r.sent, r.ttft_ms, r.text_hash, r.ok) for r in recs],
        anchor,
        windows,
        summary,
    )


JOB_UID = "job-uid-1"
EXPERIMENT_OWNER = {
    "apiVersion": "specdecode.io/v1alpha1",
    "kind": "SpecDecodeExperiment",
    "name": "exp",
    "uid": "e",
}
JOB_OWNER = {"apiVersion": "batch/v1", "kind": "Job", "name": "exp-load", "uid": JOB_UID}


def stored(
    parts: list[bytes], *, generation: int = 3, owners: Any = (EXPERIMENT_OWNER, JOB_OWNER)
) -> FakeKube:
    """A namespace holding the parts as the load Job writes them."""
    client = FakeKube()
    for cm in results.build_config_maps("exp-results", "exp", parts, owners=owners, generation=generation):
        client.add(cm)
    return client


def download(client: FakeKube, *, generation: int = 3, job_uid: str | None = JOB_UID, **limits: int) -> Any:
    """What the operator reads from the namespace, compared by `fingerprint`."""
    return fingerprint(results.parse(fetch(client, generation=generation, job_uid=job_uid, **limits)))


def fetch(
    client: FakeKube, *, generation: int = 3, job_uid: str | None = JOB_UID, **limits: int
) -> results.Bundle:
    return asyncio.run(
        results.download(
            client,
            namespace="ns",
            experiment="exp",
            generation=generation,
            job_uid=job_uid,
            limits=results.Limits(**limits),
        )
    )


def test_results_round_trip_through_config_maps() -> None:
    maps = results.build_config_maps(
        "exp-results", "exp", results.pack(FILES), owners=[JOB_OWNER], generation=3
    )
    assert maps[0]["metadata"]["ownerReferences"] == [JOB_OWNER]
    assert maps[0]["metadata"]["labels"]["specdecode.io/results"] == "exp"
    assert maps[0]["metadata"]["annotations"][keys.GENERATION_ANNOTATION] == "3"
    assert download(stored(results.pack(FILES))) == fingerprint(results.parse_files(FILES))


def test_large_results_are_split_below_the_object_limit() -> None:
    parts = results.pack(NOISY)
    assert len(parts) > 1
    for cm in results.build_config_maps("exp-results", "exp", parts):
        size = sum(len(v) for v in cm["binaryData"].values())
        assert size < 1024 * 1024 - 16 * 1024
    recs = results.parse(fetch(stored(parts)))[0]
    lines = [json.loads(line) for line in NOISY["requests.jsonl"].splitlines()]
    ok = {(rec["stage"], rec["index"]) for rec in lines if rec["ok"] and rec["arm"] == "control"}
    paired = {
        key for key in ok if any(rec["ok"] and (rec["stage"], rec["index"]) == key for rec in lines[1::2])
    }
    texts = [
        rec["text"] if (rec["stage"], rec["index"]) in paired and not rec["warmup"] else None for rec in lines
    ]
    assert len(paired) > 50
    assert [r.text for r in recs] == texts  # every differing pair's texts, no other


def test_a_missing_part_is_named() -> None:
    client = stored(results.pack(NOISY))
    del client.store[(results.CONFIG_MAP, "exp-results-1")]
    with pytest.raises(results.ResultsMissing, match=r"result part 1 of \d \(exp-results-1\) is missing"):
        download(client)


def test_no_results_at_all() -> None:
    with pytest.raises(results.ResultsMissing, match="stored no results"):
        download(FakeKube())


def test_corrupt_bundle() -> None:
    with pytest.raises(results.ResultsCorrupt, match="neither a version-2 archive nor a version-1 gzip"):
        results.parse(results.unpack([b"not gzip"]))
    with pytest.raises(results.ResultsCorrupt, match="truncated"):
        results.parse(results.unpack([results.pack_legacy(FILES)[0][:-8]]))
    with pytest.raises(results.ResultsCorrupt, match="corrupt"):
        results.parse(results.unpack([results.pack(FILES)[0][:-8]]))


def test_a_foreign_config_map_labelled_for_the_experiment_is_never_read() -> None:
    """Labels are not trust: a ConfigMap of another name, even claiming to be part 0 of 1, is ignored."""
    client = stored(results.pack(FILES))
    (forged,) = results.build_config_maps("zz-forged", "exp", results.pack(FORGED), generation=3)
    client.add(forged)
    assert download(client) == fingerprint(results.parse_files(FILES))
    assert ("GET", results.CONFIG_MAP, "zz-forged-0") not in client.reads
    assert not any(method.startswith("LIST") for method, _, _ in client.reads)


@pytest.mark.parametrize(
    ("owners", "why"),
    [
        ((), "not owned by the load Job exp-load"),
        ((EXPERIMENT_OWNER,), "not owned by the load Job exp-load"),
        (({**JOB_OWNER, "uid": "another-job"},), "not owned by the load Job exp-load"),
        (({**JOB_OWNER, "name": "other-load"},), "not owned by the load Job exp-load"),
    ],
    ids=["no owner", "the experiment only", "another Job's uid", "another Job's name"],
)
def test_a_part_the_load_job_did_not_write_is_untrusted(owners: Any, why: str) -> None:
    """A forged part in the right place (e.g. created before the Job wrote its own) is refused."""
    with pytest.raises(results.ResultsUntrusted, match=why):
        download(stored(results.pack(FORGED), owners=owners))


def test_results_of_another_generation_or_none_are_untrusted() -> None:
    with pytest.raises(results.ResultsUntrusted, match="generation 2, not 3"):
        download(stored(results.pack(FILES), generation=2))
    client = stored(results.pack(FILES))
    del client.named(results.CONFIG_MAP, "exp-results-0")["metadata"]["annotations"][
        keys.GENERATION_ANNOTATION
    ]
    with pytest.raises(results.ResultsUntrusted, match="generation None, not 3"):
        download(client)


def test_without_the_load_job_nothing_is_trusted() -> None:
    with pytest.raises(results.ResultsUntrusted, match="exp-load is gone"):
        download(stored(results.pack(FILES)), job_uid=None)


def test_parts_of_different_uploads_do_not_join() -> None:
    """A Job killed while storing leaves new and old parts: they are refused, not spliced."""
    client = stored(results.pack(NOISY))
    newer = results.pack({**NOISY, "windows.json": "{}"})
    client.add(results.build_config_maps("exp-results", "exp", newer, owners=[JOB_OWNER], generation=3)[0])
    with pytest.raises(results.ResultsCorrupt, match="not part 1/2 of the same upload"):
        download(client)


def test_a_part_rewritten_in_place_fails_its_digest() -> None:
    client = stored(results.pack(FILES))
    part = client.named(results.CONFIG_MAP, "exp-results-0")
    part["binaryData"][results.DATA_KEY] = base64.b64encode(results.pack(FORGED)[0]).decode()
    with pytest.raises(results.ResultsCorrupt, match="do not hash to their digest"):
        download(client)


def test_a_decompression_bomb_is_refused_with_bounded_memory() -> None:
    """700 KiB of gzip (version 1) that inflates to 700 MB: refused once past the limit, never held whole."""
    deflater = zlib.compressobj(9, wbits=31)  # gzip, built a MB at a time
    chunks = [deflater.compress(b'{"requests.jsonl": "')]
    chunks += [deflater.compress(b"a" * 2**20) for _ in range(700)]
    bomb = b"".join([*chunks, deflater.compress(b'"}'), deflater.flush()])
    assert len(bomb) < results.PART_BYTES
    client = stored([bomb])
    tracemalloc.start()
    try:
        with pytest.raises(results.ResultsTooLarge, match="inflate to more than 16 MiB"):
            results.parse(fetch(client, max_bytes=16 * 2**20))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 40 * 2**20


def test_more_parts_than_the_operator_reads_are_refused_before_reading_them() -> None:
    client = stored(results.pack(FILES))
    client.named(results.CONFIG_MAP, "exp-results-0")["metadata"]["annotations"][keys.PART_ANNOTATION] = (
        "0/100000"
    )
    with pytest.raises(results.ResultsTooLarge, match="announces 100000 parts"):
        download(client)
    assert [name for _, _, name in client.reads] == ["exp-results-0"]


def test_an_oversized_part_is_refused() -> None:
    client = stored(results.pack(FILES))
    part = client.named(results.CONFIG_MAP, "exp-results-0")
    part["binaryData"][results.DATA_KEY] = base64.b64encode(b"x" * (results.PART_BYTES + 100)).decode()
    with pytest.raises(results.ResultsTooLarge, match="larger than a part"):
        download(client)


def test_the_planned_size_is_a_lower_bound_of_what_the_load_job_writes() -> None:
    """The check before deploying may not refuse what would fit: measured bytes >= planned."""
    doc = experiment_document(
        workload={
            "stages": [{"name": "c1", "concurrency": 1}, {"name": "c2", "concurrency": 2}],
            "requestsPerStage": 400,
            "warmupRequests": 0,
            "sampling": {"maxTokens": 256},
        }
    )
    experiment, _ = validation.parse_experiment(doc)
    recs, _ = synthetic.run(experiment, tokens=256, warmup=0)
    text = " ".join("tok" for _ in range(256))  # shorter text than real tokens: a conservative record
    lines = "".join(r.model_copy(update={"text": text}).model_dump_json() + "\n" for r in recs)
    bundle = results.encode_files({"requests.jsonl": lines})
    with zipfile.ZipFile(io.BytesIO(bundle)) as archive:
        written = sum(member.file_size for member in archive.infolist())  # what the operator inflates
    assert len(recs) == 1600
    assert results.planned_bytes(experiment) <= written
    # and a bound that binds: within a factor of two of what is written, or the check before deploying
    # would pass experiments whose results the operator then refuses (mutation benchmark survivor:
    # `TOKEN_BYTES * max_tokens` -> `+`, a bound 6x too low)
    assert results.planned_bytes(experiment) >= written / 2
    assert results.check_size(experiment, results.Limits(max_bytes=written)) is None
    refused = results.check_size(experiment, results.Limits(max_bytes=1000)) or ""
    assert "more than the 0 MiB" in refused
    assert "800 requests to each arm: 2 stage(s) of up to 400 requests" in refused
    assert "lower requestsPerStage or the number of stages" in refused


def test_a_bundle_inflating_past_the_limit_is_refused_before_it_is_read() -> None:
    """Version 2 is bounded by its members' declared sizes (zip reads no more than those)."""
    bundle = results.encode_files(NOISY)
    with zipfile.ZipFile(io.BytesIO(bundle)) as archive:
        inflated = sum(member.file_size for member in archive.infolist())
    with pytest.raises(results.ResultsTooLarge, match="inflate to more than"):
        results.parse(results.Bundle(bundle, max_bytes=inflated - 1))
    assert len(results.parse(results.Bundle(bundle, max_bytes=inflated))[0]) == 202


@pytest.mark.parametrize("label", ["0/2", "2/2", "1/3", ""])
def test_a_part_labelled_with_another_index_or_count_is_refused(label: str) -> None:
    """Part 1 of 2 must say `1/2`: a label that sorts before or after it is another part or upload
    (mutation benchmark survivor: `!=` -> `<` let every label after `1/2` through)."""
    client = stored(results.pack(NOISY))
    part = client.named(results.CONFIG_MAP, "exp-results-1")
    part["metadata"]["annotations"][keys.PART_ANNOTATION] = label
    with pytest.raises(results.ResultsCorrupt, match="not part 1/2 of the same upload"):
        download(client)


def stored_pods(
    bundles: dict[int, dict[str, str]], pods: int, *, annotated: dict[int, int] | None = None
) -> FakeKube:
    """Load pods' bundles as each pod of an Indexed Job stores its own; `annotated`: a pod's bundle
    stored under another pod's annotation."""
    client = FakeKube()
    for k, files in bundles.items():
        pod = ((annotated or {}).get(k, k), pods)
        for cm in results.build_config_maps(
            "exp-results", "exp", results.pack_legacy(files), owners=[JOB_OWNER], generation=3, pod=pod
        ):
            cm["metadata"]["name"] = cm["metadata"]["name"].replace(f"-pod{pod[0]}-", f"-pod{k}-")
            client.add(cm)
    return client


def download_pod(client: FakeKube, pod: tuple[int, int]) -> dict[str, str]:
    return results.unpack_files(
        asyncio.run(
            results.download(client, namespace="ns", experiment="exp", generation=3, job_uid=JOB_UID, pod=pod)
        )
    )


def test_each_load_pod_stores_its_own_bundle_which_is_read_back_as_that_pod_s() -> None:
    second = {**FILES, "requests.jsonl": '{"b": 2}\n'}
    client = stored_pods({0: FILES, 1: second}, 2)
    cm = client.named(results.CONFIG_MAP, "exp-results-pod1-0")
    assert cm["metadata"]["annotations"][keys.LOAD_POD_ANNOTATION] == "1/2"
    assert download_pod(client, (0, 2)) == FILES and download_pod(client, (1, 2)) == second
    # one pod: the names and annotations of before
    (single,) = results.build_config_maps("exp-results", "exp", results.pack_legacy(FILES), pod=(0, 1))
    assert single["metadata"]["name"] == "exp-results-0"
    assert keys.LOAD_POD_ANNOTATION not in single["metadata"]["annotations"]


def test_a_load_pod_that_stored_nothing_is_results_missing_naming_it() -> None:
    client = stored_pods({0: FILES, 2: FILES}, 3)
    with pytest.raises(
        results.ResultsMissing, match=r"load pod 1 of 3 stored no results \(exp-results-pod1-0\)"
    ):
        download_pod(client, (1, 3))


def test_a_bundle_annotated_as_another_pod_s_is_untrusted() -> None:
    client = stored_pods({0: FILES, 1: FILES}, 2, annotated={1: 0})
    with pytest.raises(results.ResultsUntrusted, match="not annotated as the results of load pod 1/2"):
        download_pod(client, (1, 2))


def test_results_over_the_config_map_budget_are_refused_naming_the_s3_store_and_pass_with_it() -> None:
    """The budget of the store the operator is configured with (issue 16): ConfigMaps keep at most
    `config_map_bytes`, whatever the operator would read; the S3 store takes up to `max_bytes`."""
    doc = experiment_document(
        workload={"stages": [{"name": "c1", "concurrency": 1}], "requestsPerStage": 400}
    )
    experiment, _ = validation.parse_experiment(doc)
    planned = results.planned_bytes(experiment)
    in_config_maps = results.Limits(max_bytes=10 * planned, config_map_bytes=planned - 1)
    refused = results.check_size(experiment, in_config_maps) or ""
    assert "the operator stores in ConfigMaps (SPECDECODE_RESULTS_CONFIGMAP_MAX_BYTES" in refused
    assert "give the operator an S3 bucket for results (the chart's resultsStore.s3)" in refused
    with_s3 = results.Limits(max_bytes=10 * planned, config_map_bytes=planned - 1, s3=True)
    assert results.check_size(experiment, with_s3) is None
    # the S3 store is still bounded by what the operator reads (its memory)
    beyond = results.check_size(experiment, results.Limits(max_bytes=planned - 1, s3=True)) or ""
    assert "the operator reads (SPECDECODE_RESULTS_MAX_BYTES) from its S3 store" in beyond
    assert results.check_size(experiment, results.Limits(max_bytes=planned, config_map_bytes=planned)) is None
