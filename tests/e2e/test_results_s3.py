"""Issue 16: results that outgrow the ConfigMap budget go to an S3 bucket (a real s3proxy, which
checks SigV4 signatures), written by the real load Job and read back by the real operator."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from k8s_cluster import Cluster
from node_agent import NodeAgent
from operator_process import OperatorProcess
from prometheus_server import Prometheus
from test_experiment import experiment, load_logs, run_to_the_end
from tests.s3_server import S3Server, running

from specdecode import results
from specdecode.experiment import validation
from specdecode.results import s3

pytestmark = pytest.mark.e2e

BUCKET = "sd-results"


@pytest.fixture
def s3_server(node_agent: NodeAgent, tmp_path: Path) -> Iterator[S3Server]:
    """On the node agent's bridge: the load pods reach it there, and so does the operator (this host)."""
    with running(tmp_path / "s3", host=node_agent.gateway) as server:
        server.make_bucket(BUCKET)
        yield server


def test_results_over_the_config_map_budget_go_to_the_bucket_and_reach_the_verdict(
    cluster: Cluster,
    crd: Path,
    node_agent: NodeAgent,
    prometheus: Prometheus,
    namespace: str,
    tmp_path: Path,
    s3_server: S3Server,
) -> None:
    doc = experiment("exp", "h200-8b-draft-tiny")
    budget = 20_000  # bytes: this experiment plans ~54 kB of results
    # over the ConfigMap budget: without the bucket this experiment is refused before it deploys
    limits = results.Limits(config_map_bytes=budget)
    parsed = validation.parse_experiment(doc)[0]
    assert "give the operator an S3 bucket" in (results.check_size(parsed, limits) or "")
    assert results.check_size(parsed, results.Limits(config_map_bytes=budget, s3=True)) is None
    cluster.kubectl(
        "-n",
        namespace,
        "create",
        "secret",
        "generic",
        "s3-keys",
        f"--from-literal=AWS_ACCESS_KEY_ID={s3_server.access_key}",
        f"--from-literal=AWS_SECRET_ACCESS_KEY={s3_server.secret_key}",
    )
    env = {
        "SPECDECODE_PROMETHEUS_URL": prometheus.url,
        "SPECDECODE_RESULTS_CONFIGMAP_MAX_BYTES": str(budget),
        "SPECDECODE_RESULTS_S3_BUCKET": BUCKET,
        "SPECDECODE_RESULTS_S3_PREFIX": "e2e",
        "SPECDECODE_RESULTS_S3_ENDPOINT": s3_server.endpoint,
        "SPECDECODE_RESULTS_S3_CREDENTIALS_SECRET": "s3-keys",
        "AWS_ACCESS_KEY_ID": s3_server.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
    }
    operator = OperatorProcess(cluster, namespace, tmp_path, env=env)
    operator.start()
    try:
        operator.apply(doc)
        status, _ = run_to_the_end(operator, prometheus, node_agent, "exp", timeout=360)
        detail = f"{status}\n{load_logs(operator, node_agent, 'exp')}\noperator:\n{operator.log_tail()}"
        assert status["phase"] == "Completed" and status["verdict"] == "Promote", detail
        generation = operator.get("sdx", "exp")["metadata"]["generation"]
        job_uid = operator.get("job", "exp-load")["metadata"]["uid"]
    finally:
        operator.stop()
    prefix = f"e2e/{namespace}/exp/generation-{generation}/"
    assert status["resultsRef"]["objects"] == f"s3://{BUCKET}/{prefix}", detail
    assert not [
        cm["metadata"]["name"]
        for cm in operator.get("configmaps")["items"]
        if cm["metadata"]["name"].startswith("exp-results")
    ], "results went to ConfigMaps, not to the bucket"
    store = s3.Store(
        s3.Location(BUCKET, endpoint=s3_server.endpoint),
        s3.Credentials(s3_server.access_key, s3_server.secret_key),
    )

    async def listed() -> dict[str, int]:
        try:
            return await store.list(prefix)
        finally:
            await store.aclose()

    objects = asyncio.run(listed())
    assert list(objects) == [f"{prefix}exp-results/job-{job_uid}/pod-0-of-1.results.v2.npz"], objects
