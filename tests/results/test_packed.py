"""The packed results format (version 2) against the JSON records it replaces (version 1)."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
from typing import Any

import numpy as np
import pytest

from specdecode import results
from specdecode.experiment import records, status, validation, verdict
from specdecode.experiment.validity import Validity
from specdecode.report import page
from tests.controller.fake_kube import FakeKube
from tests.factories import experiment_document
from tests.report import synthetic

JOB_OWNER = {"apiVersion": "batch/v1", "kind": "Job", "name": "exp-load", "uid": "job-uid-1"}
# Every field the analysis and the report read (records.PackedRequest), the text apart: it is kept only
# where it is needed.
READ = [field.name for field in dataclasses.fields(records.PackedRequest) if field.name != "text"]


def experiment() -> Any:
    doc = experiment_document(
        workload={
            "stages": [{"name": "c1", "concurrency": 1}, {"name": "c4", "concurrency": 4}],
            "requestsPerStage": 60,
            "warmupRequests": 2,
        }
    )
    return validation.parse_experiment(doc)[0]


def files_of(recs: list[records.RequestRecord], windows: list[records.StageWindow]) -> dict[str, str]:
    return {
        "requests.jsonl": "".join(r.model_dump_json() + "\n" for r in recs),
        "windows.json": json.dumps(
            {
                "anchor": {"monotonic": 3.0, "wall": 4.0},
                "windows": [w.model_dump(mode="json") for w in windows],
            }
        ),
        "loadgen-summary.json": json.dumps({"validity": {"valid": True, "reasons": []}, "x": [1, 2]}),
    }


def varied_run() -> tuple[Any, dict[str, str]]:
    """A run with errors, mismatched outputs, categories, sessions and odd fields set."""
    spec = experiment()
    recs, windows = synthetic.run(
        spec, error_rate=0.1, mismatch_rate=0.2, categories={"chat": (1.2, 0.7), "code": (1.5, 0.8)}, warmup=2
    )
    varied = []
    for i, r in enumerate(recs):
        text = f"out-{r.stage}-{r.index}" + (
            "-x" if r.text_hash and r.arm == "treatment" and i % 5 == 0 else ""
        )
        varied.append(
            r.model_copy(
                update={
                    "text": text if r.ok else None,
                    "request_id": f"req-{i}",
                    "session": i % 3 if i % 2 else None,
                    "turn": 1 + i % 2 if i % 2 else None,
                    "http_status": 200 if r.ok else 503,
                    "error": None if r.ok else "server said no, twice",
                    "finish_reason": "length" if r.ok else None,
                    "server_metrics": {"queue_ms": 1.5},
                    "prompt_tokens": 100 + i,
                    "headers": r.sent + 0.001,
                    "connect_ms": 0.25 if i % 7 == 0 else None,
                    "diverges_at": 3 if i % 5 == 0 else None,
                }
            )
        )
    return spec, files_of(varied, windows)


def test_every_field_the_analysis_reads_survives_packing() -> None:
    _, files = varied_run()
    before, anchor, windows, summary = results.parse_files(files)
    after = results.parse(results.unpack(results.pack(files)))
    assert (after[1], after[2], after[3]) == (anchor, windows, summary)
    assert len(after[0]) == len(before) == 244
    for old, new in zip(before, after[0], strict=True):
        assert isinstance(new, records.PackedRequest)
        assert {n: getattr(new, n) for n in READ} == {n: getattr(old, n) for n in READ}


def test_texts_are_kept_for_differing_pairs_and_a_sample_only() -> None:
    _, files = varied_run()
    before = results.parse_files(files)[0]
    after = results.parse(results.unpack(results.pack(files)))[0]
    pairs: dict[tuple[str, int], dict[str, records.Request]] = {}
    for r in before:
        if not r.warmup:
            pairs.setdefault((r.stage, r.index), {})[r.arm] = r
    both = [(k, p) for k, p in pairs.items() if p["control"].ok and p["treatment"].ok]
    differ = {k for k, p in both if p["control"].text_hash != p["treatment"].text_hash}
    sample = {
        k for stage in ("c1", "c4") for k in [k for k, _ in both if k[0] == stage and k not in differ][:3]
    }
    kept = {(r.stage, r.index) for r in after if r.text is not None}
    assert differ and kept == differ | sample
    for old, new in zip(before, after, strict=True):
        assert new.text in (None, old.text)


def test_the_verdict_and_the_report_are_the_same_from_either_format() -> None:
    spec, files = varied_run()
    judged = []
    for parts in (results.pack_legacy(files), results.pack(files)):
        recs, _, windows, summary = results.parse(results.unpack(parts))
        analysis = verdict.analyse(spec, recs, windows, validity=Validity.of_summary(summary))
        result = analysis.apply(status.ExperimentStatus())
        judged.append((result.wire(), page.render_html(result, recs, windows, spec, name="exp")))
    assert judged[0][0] == judged[1][0]
    assert judged[0][1] == judged[1][1]
    assert judged[1][0]["stages"][0]["outputMatch"] < 1  # the mismatches were seen, and shown
    assert "paired output(s) differ" in judged[1][1]
    assert "texts not kept" not in judged[1][1]


def test_an_operator_reads_the_bundle_of_an_older_load_image() -> None:
    """Version 1 under its own key, as load images before version 2 store it."""
    _, files = varied_run()
    client = FakeKube()
    maps = results.build_config_maps(
        "exp-results", "exp", results.pack_legacy(files), owners=[JOB_OWNER], generation=1
    )
    assert list(maps[0]["binaryData"]) == [results.LEGACY_DATA_KEY]
    for cm in maps:
        client.add(cm)
    bundle = asyncio.run(
        results.download(client, namespace="ns", experiment="exp", generation=1, job_uid="job-uid-1")
    )
    assert bundle.version == 1
    recs = results.parse(bundle)[0]
    assert [r.request_id for r in recs] == [f"req-{i}" for i in range(244)]


def test_a_newer_format_is_refused_naming_its_version() -> None:
    _, files = varied_run()
    with np.load(io.BytesIO(results.encode_files(files))) as archive:
        arrays = {name: archive[name] for name in archive.files}
    header = json.loads(arrays["header"].tobytes())
    arrays["header"] = np.frombuffer(json.dumps({**header, "version": 3}).encode(), dtype=np.uint8)
    out = io.BytesIO()
    np.savez_compressed(out, **arrays)
    with pytest.raises(
        results.ResultsUnsupported, match="format version 3; this operator reads versions 1 and 2"
    ):
        results.parse(results.Bundle(out.getvalue()))
    assert results.ResultsUnsupported.reason == "ResultsUnsupported"


def test_a_record_without_its_keys_does_not_pack() -> None:
    """The load generator's own lines only: a line missing the pair key is an error, not a row of nulls."""
    with pytest.raises(ValueError, match=r"requests.jsonl line 2: no 'arm'"):
        results.encode_files(
            {
                "requests.jsonl": '{"stage": "c", "index": 0, "arm": "control", "sent": 1}\n{"stage": "c", "index": 0, "sent": 1}\n'
            }
        )
