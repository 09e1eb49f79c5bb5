"""Which store the operator reads a load Job's bundle from: ConfigMaps (the default) or S3."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specdecode.experiment import manifests
from specdecode.results import configmaps, s3
from specdecode.results.format import Bundle
from specdecode.results.limits import Limits, ResultsUntrusted

DEFAULT_LIMITS = Limits()


async def download(
    kube: configmaps.ConfigMaps,
    *,
    namespace: str,
    experiment: str,
    generation: int,
    job_uid: str | None,
    limits: Limits = DEFAULT_LIMITS,
    round_name: str | None = None,
    pod: tuple[int, int] | None = None,
    store: s3.Location | None = None,
) -> Bundle:
    """The result bundle that load Job `job_uid` stored for `generation` of an experiment (of the
    round `round_name`: `rounds.py`; None: the stages); `pod` (k, N): that of its load pod k of N;
    from the S3 bucket `store`, else from ConfigMaps (`configmaps.download`). `parse` reads it."""
    names = manifests.Names(experiment)
    if not job_uid:
        job_name = names.load_job_of(round_name)
        raise ResultsUntrusted(f"the load Job {job_name} is gone, so nothing shows who wrote the results")
    if store is None:
        return await configmaps.download(
            kube,
            namespace=namespace,
            experiment=experiment,
            generation=generation,
            job_uid=job_uid,
            limits=limits,
            round_name=round_name,
            pod=pod,
        )
    return await s3.download(
        store,
        namespace=namespace,
        experiment=experiment,
        prefix=names.results_prefix_of(round_name),
        generation=generation,
        job_uid=job_uid,
        limits=limits,
        pod=pod,
    )


def objects_url(store: s3.Location | None, metadata: Mapping[str, Any]) -> str | None:
    """Where this generation's bundles are in the S3 bucket `store` (None: in ConfigMaps)."""
    if store is None:
        return None
    generation = int(metadata.get("generation") or 1)
    key = store.key(s3.generation_prefix(str(metadata["namespace"]), str(metadata["name"]), generation))
    return store.url(key + "/")
