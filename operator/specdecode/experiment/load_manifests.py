"""The load's children, as plain dicts from pure `build_*` functions: the Job that sends the same
prompts on the same schedule to both arms, the experiment document it reads (`<exp>-spec`, bound to
the generation it was rendered for) and the RBAC that lets it write its results, nothing else.

Owner references are not set here: the controller adopts each child (`kopf.adopt`) before creating it.
"""

from __future__ import annotations

from typing import Any

import yaml

from specdecode.experiment import keys, spec
from specdecode.experiment.children import (
    API_KEY_ENV,
    DATASET_MOUNT,
    EXPERIMENT_FILE,
    JOB_NAME_ENV,
    JOB_UID_ENV,
    SPEC_MOUNT,
    Names,
    Settings,
    arm_url,
    container_security,
    labels,
)


def build_spec_config_map(
    name: str, document: dict[str, Any], generation: int | None = None, *, round_name: str | None = None
) -> dict[str, Any]:
    """The experiment document, mounted into the load Job (it plans the same stages as the operator).

    The document carries the `generation` it was rendered for (annotation `keys.GENERATION_ANNOTATION`),
    and the load Job refuses a document of another generation than its `--generation`: a load never
    measures one spec while its results are filed under another.
    """
    metadata: dict[str, Any] = {"name": name}
    if generation is not None:
        metadata["annotations"] = {keys.GENERATION_ANNOTATION: str(generation)}
    minimal = {
        "apiVersion": document.get("apiVersion"),
        "kind": document.get("kind"),
        "metadata": metadata,
        "spec": document["spec"],
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": Names(name).spec_config_map_of(round_name),
            "labels": labels(name, component="load"),
        },
        "data": {EXPERIMENT_FILE: yaml.safe_dump(minimal, sort_keys=False)},
    }


def _secret_key(secret: str, key: str) -> dict[str, Any]:
    return {"secretKeyRef": {"name": secret, "key": key}}


def document_generation(document: dict[str, Any]) -> int | None:
    """The generation an experiment document was rendered for (`build_spec_config_map`), if any."""
    metadata = document.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    value = annotations.get(keys.GENERATION_ANNOTATION) if isinstance(annotations, dict) else None
    return int(value) if isinstance(value, str) and value.isdigit() else None


def build_load_job(
    name: str,
    s: spec.ExperimentSpec,
    settings: Settings,
    *,
    owner_uid: str = "",
    generation: int | None = None,
    round_name: str | None = None,
    salt: str | None = None,
) -> dict[str, Any]:
    """The Job that sends the same prompts on the same schedule to both arms and stores the results.

    The result ConfigMaps it writes are owned by the experiment (`owner_uid`) and labelled with the
    spec `generation` they measured. `round_name`: a round after the stages (`rounds.py`), with its
    own Job, spec ConfigMap and results. `salt`: the prompts' nonce salt (`load_salt`: one per
    generation, so that every round sends the same prompts).

    `spec.workload.loadPods` N > 1: an Indexed Job of N pods at once, each sending its shard of the
    schedule (`loadpods.py`; its index from JOB_COMPLETION_INDEX, which the Job controller sets);
    with `backoffLimit: 0` one pod failing fails the Job, which completes when all N have. One pod
    renders the Job as before (no completion mode): nothing changes for the experiments of today.
    """
    names = Names(name)
    argv = [
        "specdecode",
        "loadgen",
        "--experiment",
        f"{SPEC_MOUNT}/{EXPERIMENT_FILE}",
        "--control-url",
        arm_url(name, spec.Arm.CONTROL),
        "--treatment-url",
        arm_url(name, spec.Arm.TREATMENT),
        "--out",
        "/results",
        "--results-configmap",
        names.results_prefix_of(round_name),
        "--scrape-metrics",
    ]
    if salt is not None:
        argv += ["--salt", salt]
    if owner_uid:
        argv += ["--owner-uid", owner_uid]
    if generation is not None:
        argv += ["--generation", str(generation)]
    pods = s.workload.load_pods
    if pods > 1:
        argv += ["--load-pods", str(pods)]
    env: list[dict[str, Any]] = [
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {
            "name": JOB_UID_ENV,
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{keys.JOB_UID_LABEL}']"}},
        },
        {
            "name": JOB_NAME_ENV,
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{keys.JOB_NAME_LABEL}']"}},
        },
    ]
    env += [{"name": k, "value": v} for k, v in settings.results_env.items()]
    if settings.results_env and settings.results_secret:
        env.append(
            {
                "name": "AWS_ACCESS_KEY_ID",
                "valueFrom": _secret_key(settings.results_secret, "AWS_ACCESS_KEY_ID"),
            }
        )
        env.append(
            {
                "name": "AWS_SECRET_ACCESS_KEY",
                "valueFrom": _secret_key(settings.results_secret, "AWS_SECRET_ACCESS_KEY"),
            }
        )
    if s.engine.api_key_secret is not None:
        argv += ["--api-key-env", API_KEY_ENV]
        env.append(
            {
                "name": API_KEY_ENV,
                "valueFrom": {
                    "secretKeyRef": {"name": s.engine.api_key_secret.name, "key": s.engine.api_key_secret.key}
                },
            }
        )
    mounts = [
        {"name": "experiment", "mountPath": SPEC_MOUNT, "readOnly": True},
        {"name": "results", "mountPath": "/results"},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "experiment", "configMap": {"name": names.spec_config_map_of(round_name)}},
        {"name": "results", "emptyDir": {}},
    ]
    dataset = s.workload.dataset
    if (
        isinstance(dataset, spec.JsonlDataset | spec.TraceDataset | spec.MultiTurnDataset)
        and dataset.config_map is not None
    ):
        ref = dataset.config_map
        mounts.append({"name": "dataset", "mountPath": DATASET_MOUNT, "readOnly": True})
        volumes.append(
            {
                "name": "dataset",
                "configMap": {"name": ref.name, "items": [{"key": ref.key, "path": "prompts.jsonl"}]},
            }
        )
        argv += ["--dataset-file", f"{DATASET_MOUNT}/prompts.jsonl"]
    job_labels = labels(name, component="load")
    indexed = {"completionMode": "Indexed", "completions": pods, "parallelism": pods} if pods > 1 else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": names.load_job_of(round_name), "labels": job_labels},
        "spec": {
            **indexed,
            # A retried load would measure twice and mix the results: one attempt, a failure is final.
            "backoffLimit": 0,
            "activeDeadlineSeconds": int(s.deadlines.run_seconds),
            "template": {
                "metadata": {"labels": job_labels},
                "spec": {
                    "serviceAccountName": names.load_job,
                    "restartPolicy": "Never",
                    "enableServiceLinks": False,
                    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [
                        {
                            "name": "loadgen",
                            "image": settings.operator_image,
                            "imagePullPolicy": settings.image_pull_policy,
                            "command": argv[:2],
                            "args": argv[2:],
                            "env": env,
                            "volumeMounts": mounts,
                            "resources": {
                                "requests": {"cpu": "1", "memory": "512Mi"},
                                "limits": {"memory": "2Gi"},
                            },
                            "securityContext": container_security(non_root=True),
                        }
                    ],
                    "volumes": volumes,
                },
            },
        },
    }


def load_salt(seed: int, owner_uid: str, generation: int) -> str:
    """The prompts' nonce salt of one generation of an experiment: every round of it plans with this
    one, so they send the same prompts; a new generation or a new experiment of the same name does not
    (a server's prefix cache cannot remember them)."""
    return f"{seed}-{owner_uid}-{generation}"


def build_load_rbac(name: str) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding that let the load Job write its result ConfigMaps, nothing else."""
    names = Names(name)
    meta = {"name": names.load_job, "labels": labels(name, component="load")}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(meta)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": dict(meta),
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    # results.upload: POST, and PUT over an earlier upload; nothing else
                    "verbs": ["create", "update"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": dict(meta),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": names.load_job},
            "subjects": [{"kind": "ServiceAccount", "name": names.load_job}],
        },
    ]
