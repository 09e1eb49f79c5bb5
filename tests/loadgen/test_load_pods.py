"""`spec.workload.loadPods`: N load pods send disjoint shards of the one paired schedule, merged as one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specdecode import cli, results
from specdecode.experiment import loadpods, validity
from specdecode.loadgen import plan as plan_mod
from specdecode.loadgen import workload

from .test_runner import Start, experiment_file, make_spec, read_records, run, two_arms

MIXED = {
    "stages": [{"name": "open", "rate": 40.0}, {"name": "closed", "concurrency": 5}],
    "requestsPerStage": 23,
    "warmupRequests": 6,
    "dataset": {"type": "builtin", "name": "mixed"},
}


def requests_by_index(sp: plan_mod.StagePlan) -> dict[int, tuple[workload.PreparedRequest, float | None]]:
    """Each request of a stage plan by its stage index, with its planned send time (open loop)."""
    return {
        sp.index_of(i): (r, None if sp.offsets is None else sp.offsets[i]) for i, r in enumerate(sp.requests)
    }


@pytest.mark.parametrize("pods", [2, 3, 5])
def test_the_shards_of_n_pods_are_disjoint_and_together_the_one_pod_plan(pods: int) -> None:
    whole = plan_mod.plan_from_spec(make_spec(**MIXED), Path(), salt="s")
    shards = [plan_mod.shard(whole, k, pods) for k in range(pods)]
    for position, sp in enumerate(whole.stages):
        parts = [shard.stages[position] for shard in shards]
        assert {p.name for p in parts} == {sp.name}
        union: dict[int, tuple[workload.PreparedRequest, float | None]] = {}
        for k, part in enumerate(parts):
            mine = requests_by_index(part)
            assert union.keys().isdisjoint(mine), f"pod {k} sends a request another pod sends"
            assert all(i % pods == k for i in mine)
            union.update(mine)
            assert part.looks == ()  # no pod stops a stage on its shard alone
        # the same prompts (bytes and seeds) at the same planned send times, each index once
        assert union == requests_by_index(sp)
        if sp.concurrency is not None and not sp.warmup:
            assert sum(p.concurrency or 0 for p in parts) == sp.concurrency
        if sp.warmup:
            assert all(p.concurrency is not None and p.concurrency >= 1 for p in parts)


def test_one_pod_s_shard_is_the_plan_and_an_index_out_of_range_is_refused() -> None:
    whole = plan_mod.plan_from_spec(make_spec(**MIXED), Path(), salt="s")
    (only,) = [plan_mod.shard(whole, 0, 1)]
    assert [requests_by_index(s) for s in only.stages] == [requests_by_index(s) for s in whole.stages]
    with pytest.raises(ValueError, match="load pod 2 is not one of 2"):
        plan_mod.shard(whole, 2, 2)


def load(endpoints: Any, out: Path, pod: int | None, pods: int) -> loadpods.Measured:
    whole = plan_mod.plan_from_spec(make_spec(**MIXED), Path(), salt="same-salt")
    run(whole if pod is None else plan_mod.shard(whole, pod, pods), endpoints, out)
    return results.parse_files(results.read_dir(out))


def pair_key(rec: Any) -> tuple[str, int, str, str, str | None]:
    return (rec.stage, rec.index, rec.arm, rec.prompt_id, rec.text_hash)


def test_two_pods_send_the_one_pod_s_pairs_and_merge_into_one_run(fake_server: Start, tmp_path: Path) -> None:
    _, _, endpoints = two_arms(fake_server, "--step-ms", "1")
    one = load(endpoints, tmp_path / "one", None, 1)
    pods = [load(endpoints, tmp_path / f"pod{k}", k, 2) for k in range(2)]
    recs, anchor, windows, summary = loadpods.merge(pods)
    # the same requests to the same arms with the same replies: the fake server's text is a
    # function of the prompt and seed, so equal hashes mean the same prompt bytes were sent
    assert sorted(map(pair_key, recs)) == sorted(map(pair_key, one[0]))
    assert len({(r.stage, r.index, r.arm) for r in recs}) == len(recs)
    assert [w.stage for w in windows] == [w.stage for w in one[2]]
    # the pods ran one after the other here: the merged window spans both, on pod 0's clock
    assert anchor == pods[0][1]
    for w in windows:
        (first,) = [p for p in pods[0][2] if p.stage == w.stage]
        (second,) = [p for p in pods[1][2] if p.stage == w.stage]
        shift = pods[1][1].wall - anchor.wall
        assert w.start == first.start and w.end == pytest.approx(second.end + shift)
    # every record's times moved with its pod's clock: a pair's two records still sent together
    open_pairs: dict[int, list[float]] = {}
    for r in recs:
        if r.stage == "open":
            open_pairs.setdefault(r.index, []).append(r.sent)
    assert all(abs(a - b) < 0.05 for a, b in open_pairs.values())
    assert summary["loadPods"] == 2 and [p["pod"] for p in summary["validity"]["pods"]] == [0, 1]
    assert summary["validity"]["valid"] == all(p[3]["validity"]["valid"] for p in pods)
    merged = validity.Validity.model_validate(summary["validity"])
    assert validity.of_stage(merged, "open").valid == summary["validity"]["valid"]


def test_the_cli_sends_its_pod_s_shard_and_refuses_load_pods_without_its_index(
    fake_server: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    control, treatment, _ = two_arms(fake_server)
    exp = experiment_file(tmp_path, requests=12, rate=30.0, warmup=3)
    argv = ["loadgen", "--experiment", str(exp), "--control-url", control.url]
    argv += ["--treatment-url", treatment.url, "--out", str(tmp_path / "out"), "--load-pods", "2"]
    monkeypatch.delenv("JOB_COMPLETION_INDEX", raising=False)
    for index in (None, "2", "x"):
        if index is not None:
            monkeypatch.setenv("JOB_COMPLETION_INDEX", index)
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert "--load-pods 2 needs" in err and "JOB_COMPLETION_INDEX" in err, err
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "1")
    assert cli.main(argv) == 0
    recs = read_records(tmp_path / "out")
    assert {(r.stage, r.index) for r in recs} == {("warmup", 1), *(("low", i) for i in range(1, 12, 2))}
    assert len(recs) == 2 * 7
