"""The children of an experiment, as plain dicts from pure `build_*` functions: here the arms (their
command lines, Deployments, Services, NetworkPolicy, PodDisruptionBudget) and `build_all`; the load
Job and what it reads in `load_manifests.py`, the names and labels they share in `children.py`.

Invariants (tested):
- the two arms' pod specs differ only in `--speculative-config '<json>'` and, on releases that have
  it, `--per-request-spec-decode-metrics summary` on the treatment (plus the arm label and names);
  in `analysis.mode: NoiseFloor` (an A/A run) not even in those;
- the command line is what the arms' vLLM release accepts (`releases.py`);
- every name derives deterministically from the experiment's name (`children.py`: `<exp>-control`,
  `<exp>-treatment`, `<exp>-load`, ...), so a restarted operator finds what it created;
- owner references are not set here: the controller adopts each child (`kopf.adopt`) before creating it.
"""

from __future__ import annotations

import json
from typing import Any

from specdecode.experiment import keys, releases, spec

# What every child shares (children.py) and the load's children (load_manifests.py), for the
# callers that spell them `manifests.X`.
from specdecode.experiment.children import API_KEY_ENV as API_KEY_ENV
from specdecode.experiment.children import DATASET_MOUNT as DATASET_MOUNT
from specdecode.experiment.children import EXPERIMENT_FILE as EXPERIMENT_FILE
from specdecode.experiment.children import JOB_NAME_ENV as JOB_NAME_ENV
from specdecode.experiment.children import JOB_UID_ENV as JOB_UID_ENV
from specdecode.experiment.children import MANAGED_BY as MANAGED_BY
from specdecode.experiment.children import MODEL_CACHE_VOLUME as MODEL_CACHE_VOLUME
from specdecode.experiment.children import PORT as PORT
from specdecode.experiment.children import SPEC_MOUNT as SPEC_MOUNT
from specdecode.experiment.children import Names as Names
from specdecode.experiment.children import Settings as Settings
from specdecode.experiment.children import arm_url as arm_url
from specdecode.experiment.children import container_security
from specdecode.experiment.children import labels as labels
from specdecode.experiment.children import selector as selector
from specdecode.experiment.load_manifests import build_load_job as build_load_job
from specdecode.experiment.load_manifests import build_load_rbac as build_load_rbac
from specdecode.experiment.load_manifests import build_spec_config_map as build_spec_config_map
from specdecode.experiment.load_manifests import document_generation as document_generation
from specdecode.experiment.load_manifests import load_salt as load_salt

# -------------------------------------------------------------------------------- command lines


def speculative_config(sp: spec.SpeculativeSpec) -> dict[str, Any]:
    """The `--speculative-config` object, with vLLM's snake_case keys."""
    config: dict[str, Any] = {"method": sp.method.value}
    optional = {
        "model": sp.model,
        "num_speculative_tokens": sp.num_speculative_tokens,
        "draft_tensor_parallel_size": sp.draft_tensor_parallel_size,
        "prompt_lookup_min": sp.prompt_lookup_min,
        "prompt_lookup_max": sp.prompt_lookup_max,
    }
    config.update({key: value for key, value in optional.items() if value is not None})
    config.update({key.replace("-", "_"): value for key, value in sp.extra.items()})
    return config


def speculative_config_json(sp: spec.SpeculativeSpec) -> str:
    """The JSON argument, compact (one argv element; no shell quoting involved)."""
    return json.dumps(speculative_config(sp), separators=(",", ":"))


def serve_args(s: spec.ExperimentSpec, arm: spec.Arm, release: releases.Release | None = None) -> list[str]:
    """The full argv of one arm: `vllm serve ...`, or `specdecode sim ...` with the same flags.

    Spelled for the arms' release (`release`, else `releases.resolve(s.engine)`): prefix caching (on
    for multi-turn sessions: `ExperimentSpec.prefix_caching`) as
    `--enable-prefix-caching` / `--no-enable-prefix-caching`, which every supported release accepts
    (0.33 prefers `--disable-prefix-caching`, which 0.20 lacks), and per-request acceptance metrics
    only where the release has them.
    """
    engine = s.engine
    release = release or releases.resolve(engine)
    program = ["specdecode", "sim"] if engine.simulator is not None else ["vllm", "serve"]
    argv = [
        *program,
        s.model,
        "--served-model-name",
        s.served_name,
        "--host",
        "0.0.0.0",
        "--port",
        str(PORT),
        "--seed",
        str(engine.seed),
        "--enable-prefix-caching" if s.prefix_caching else "--no-enable-prefix-caching",
        "--generation-config",
        "vllm",
    ]
    if s.model_revision:
        argv += ["--revision", s.model_revision]
    argv += engine.args
    if engine.simulator is not None:
        argv += ["--profile", engine.simulator.profile]
        for key, value in engine.simulator.overrides().items():
            argv += ["--" + key.replace("_", "-"), str(value)]
        for kind in engine.simulator.log_degradations:
            argv += ["--log-degradation", kind]
    if arm is spec.Arm.TREATMENT and s.speculates:
        argv += ["--speculative-config", speculative_config_json(s.speculative)]
        if release.per_request_spec_metrics:
            argv += ["--per-request-spec-decode-metrics", "summary"]
    return argv


# ------------------------------------------------------------------------------------ the arms


def build_deployment(
    name: str,
    s: spec.ExperimentSpec,
    arm: spec.Arm,
    settings: Settings,
    *,
    round_name: str | None = None,
    node: str | None = None,
) -> dict[str, Any]:
    """One arm's Deployment: one replica, recreated (never two GPU pods at once).

    `round_name`, `node`: a round after the stages (`rounds.py`) renders the arm again, annotated with
    the round and pinned to `node` (a required node affinity on the Node's name).
    """
    names = Names(name)
    engine = s.engine
    simulated = engine.simulator is not None
    argv = serve_args(s, arm)
    env: list[dict[str, Any]] = [e.model_dump(by_alias=True, exclude_none=True) for e in engine.env]
    if engine.api_key_secret is not None:
        # vLLM reads VLLM_API_KEY when --api-key is absent: the key never appears in the pod's argv.
        env.append(
            {
                "name": "VLLM_API_KEY",
                "valueFrom": {
                    "secretKeyRef": {"name": engine.api_key_secret.name, "key": engine.api_key_secret.key}
                },
            }
        )
    env += model_source_env(engine)
    probe = {"httpGet": {"path": "/health", "port": "http"}}
    # Model download and loading can take most of the deploy deadline; the startup probe waits for it.
    startup_failures = max(30, int(s.deadlines.deploy_seconds // 10))
    container: dict[str, Any] = {
        "name": "engine",
        "image": settings.operator_image if simulated else engine.image,
        "imagePullPolicy": settings.image_pull_policy if simulated else "IfNotPresent",
        "command": argv[:2],
        "args": argv[2:],
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "env": env,
        "resources": arm_resources(engine),
        "startupProbe": {**probe, "periodSeconds": 10, "failureThreshold": startup_failures},
        "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 6, "timeoutSeconds": 5},
        "securityContext": container_security(non_root=simulated),
    }
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if not simulated:
        # vLLM's workers share tensors through /dev/shm; the default 64 MiB breaks tensor parallelism.
        # Bounded: a memory-backed emptyDir without a limit may take the node's memory.
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": engine.shm_size}})
    if engine.model_cache is not None:
        # Simulator arms mount it too (they load no weights): the same pod shape, and a missing
        # claim shows in a dry run before any GPU is spent.
        cache = engine.model_cache
        mount: dict[str, Any] = {"name": MODEL_CACHE_VOLUME, "mountPath": spec.MODEL_CACHE_MOUNT}
        if cache.sub_path:
            mount["subPath"] = cache.sub_path
        if cache.read_only:
            mount["readOnly"] = True
        mounts.append(mount)
        claim: dict[str, Any] = {"claimName": cache.claim_name}
        if cache.read_only:
            claim["readOnly"] = True
        volumes.append({"name": MODEL_CACHE_VOLUME, "persistentVolumeClaim": claim})
    if mounts:
        container["volumeMounts"] = mounts
    pod_labels = labels(name, arm=arm, component="engine")
    pod_spec: dict[str, Any] = {
        "containers": [container],
        # A Service named `vllm` would inject VLLM_PORT=tcp://..., which vLLM refuses (reference §2).
        "enableServiceLinks": False,
        # The engine (any image the experiment names) has no business with the API server.
        "automountServiceAccountToken": False,
        "nodeSelector": dict(engine.node_selector),
        "tolerations": [t.model_dump(by_alias=True, exclude_none=True) for t in engine.tolerations],
        **_affinity(colocation(name, s.placement.colocate), node),
        "securityContext": {
            "seccompProfile": {"type": "RuntimeDefault"},
            **({"runAsNonRoot": True} if simulated else {}),
        },
        "terminationGracePeriodSeconds": 30,
        "volumes": volumes,
    }
    round_annotations = {keys.ROUND_ANNOTATION: round_name} if round_name is not None else {}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": names.arm(arm),
            "labels": pod_labels,
            **({"annotations": dict(round_annotations)} if round_annotations else {}),
        },
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector(name, arm)},
            "template": {
                "metadata": {
                    "labels": pod_labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(PORT),
                        "prometheus.io/path": "/metrics",
                        **round_annotations,
                    },
                },
                "spec": pod_spec,
            },
        },
    }


# What an arm requests of what the experiment neither requests nor limits (spec.Resources): without
# CPU and memory requests its QoS class would be BestEffort, the first the kubelet evicts.
DEFAULT_VLLM_REQUESTS: dict[str, str] = {"cpu": "2", "memory": "16Gi"}
DEFAULT_SIMULATOR_REQUESTS: dict[str, str] = {"cpu": "100m", "memory": "256Mi"}


def arm_resources(engine: spec.EngineSpec) -> dict[str, Any]:
    """The arms' container resources: the spec's, plus default requests (a limit alone already
    makes the API server request as much)."""
    resources: dict[str, Any] = engine.resources.model_dump(by_alias=True, exclude_none=True)
    defaults = DEFAULT_SIMULATOR_REQUESTS if engine.simulator is not None else DEFAULT_VLLM_REQUESTS
    given = resources.get("requests", {}).keys() | resources.get("limits", {}).keys()
    added = {key: value for key, value in defaults.items() if key not in given}
    if added:
        resources["requests"] = {**resources.get("requests", {}), **added}
    return resources


def model_source_env(engine: spec.EngineSpec) -> list[dict[str, Any]]:
    """Where both arms find weights: the Hugging Face cache, the Hub token, offline mode.

    `HF_HOME` rather than vLLM's `--download-dir`: the latter moves only the weights (config and
    tokenizer still go to the default cache) and puts vLLM's download lock file into that directory,
    which fails on a read-only volume. `HF_HUB_CACHE` is set as well because an image's own
    `HF_HUB_CACHE` would otherwise win over `HF_HOME`.
    """
    env: list[dict[str, Any]] = []
    if engine.model_cache is not None:
        env += [
            {"name": "HF_HOME", "value": spec.MODEL_CACHE_MOUNT},
            {"name": "HF_HUB_CACHE", "value": f"{spec.MODEL_CACHE_MOUNT}/hub"},
        ]
    if engine.hf_token_secret is not None:
        ref = engine.hf_token_secret
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    if engine.offline:
        env += [{"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "TRANSFORMERS_OFFLINE", "value": "1"}]
    return env


def colocation(name: str, colocate: spec.Colocate) -> dict[str, Any]:
    """The arms' pod affinity to the experiment's engine pods on one host (issue 22); {} when Off.

    Each arm's pod matches the term itself, which lets the scheduler place the first arm anywhere
    (its rule for a required term that no pod matches yet); the second then joins it.
    """
    if colocate is spec.Colocate.OFF:
        return {}
    term = {
        "labelSelector": {"matchLabels": {keys.LABEL_EXPERIMENT: name, keys.LABEL_COMPONENT: "engine"}},
        "topologyKey": "kubernetes.io/hostname",
    }
    if colocate is spec.Colocate.REQUIRED:
        rule: dict[str, Any] = {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    else:
        rule = {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]}
    return {"affinity": {"podAffinity": rule}}


def _affinity(colocated: dict[str, Any], node: str | None) -> dict[str, Any]:
    """The pod's affinity: the colocation's, plus a pin to `node` (by the Node's name, which a
    `kubernetes.io/hostname` label need not equal)."""
    if node is None:
        return colocated
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    pinned = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    return {"affinity": {**colocated.get("affinity", {}), "nodeAffinity": pinned}}


def build_service(name: str, arm: spec.Arm) -> dict[str, Any]:
    """The arm's ClusterIP Service, which the load Job reaches it through."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": Names(name).arm(arm), "labels": labels(name, arm=arm, component="engine")},
        "spec": {
            "type": "ClusterIP",
            "selector": selector(name, arm),
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def build_network_policy(name: str, settings: Settings) -> dict[str, Any]:
    """Only the load Job, Prometheus and the operator may talk to the arms."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": Names(name).network_policy, "labels": labels(name, component="engine")},
        "spec": {
            "podSelector": {"matchLabels": {keys.LABEL_EXPERIMENT: name, keys.LABEL_COMPONENT: "engine"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [
                        {
                            "podSelector": {
                                "matchLabels": {keys.LABEL_EXPERIMENT: name, keys.LABEL_COMPONENT: "load"}
                            }
                        },
                        {
                            "namespaceSelector": {},
                            "podSelector": {"matchLabels": dict(settings.prometheus_pod_labels)},
                        },
                        {
                            "namespaceSelector": {},
                            "podSelector": {"matchLabels": dict(settings.operator_pod_labels)},
                        },
                    ],
                    "ports": [{"protocol": "TCP", "port": PORT}],
                }
            ],
        },
    }


def build_disruption_budget(name: str) -> dict[str, Any]:
    """No voluntary disruption of either arm (`kubectl drain`, the cluster autoscaler): the Eviction
    API refuses while the experiment holds its arms, since a replaced arm voids the run (ArmDisrupted).
    Deleted when the experiment ends, whatever the cleanup policy. Preemption and the kubelet's
    evictions under node pressure are not voluntary and still happen."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": Names(name).disruption_budget, "labels": labels(name, component="engine")},
        "spec": {
            "maxUnavailable": 0,
            "selector": {"matchLabels": {keys.LABEL_EXPERIMENT: name, keys.LABEL_COMPONENT: "engine"}},
        },
    }


def build_all(
    name: str,
    document: dict[str, Any],
    s: spec.ExperimentSpec,
    settings: Settings,
    *,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """Every child, in creation order (arms first: they take longest to become Ready)."""
    return [
        build_deployment(name, s, spec.Arm.CONTROL, settings),
        build_deployment(name, s, spec.Arm.TREATMENT, settings),
        build_service(name, spec.Arm.CONTROL),
        build_service(name, spec.Arm.TREATMENT),
        build_network_policy(name, settings),
        build_disruption_budget(name),
        build_spec_config_map(name, document, generation),
        *build_load_rbac(name),
    ]
