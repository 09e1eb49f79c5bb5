"""The children of an experiment, as plain dicts from pure `build_*` functions.

Invariants (tested):
- the two arms' pod specs differ only in `--speculative-config '<json>'` and, on releases that have
  it, `--per-request-spec-decode-metrics summary` on the treatment (plus the arm label and names);
  in `analysis.mode: NoiseFloor` (an A/A run) not even in those;
- the command line is what the arms' vLLM release accepts (`releases.py`);
- every name derives deterministically from the experiment's name (`<exp>-control`, `<exp>-treatment`,
  `<exp>-load`, ...), so a restarted operator finds what it created (idempotence by name);
- owner references are not set here: the controller adopts each child (`kopf.adopt`) before creating it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import yaml

from specdecode.experiment import keys, releases, spec

PORT = 8000
MANAGED_BY = "specdecode-operator"
EXPERIMENT_FILE = "experiment.yaml"
SPEC_MOUNT = "/etc/specdecode"
#: beside SPEC_MOUNT, not inside it: a mount point inside a read-only ConfigMap volume needs the
#: runtime to create it there (kubelet does since kubernetes/kubernetes#60342; other runtimes, such as
#: the e2e node agent, do not: "mount point does not exist")
DATASET_MOUNT = "/etc/specdecode-dataset"
API_KEY_ENV = "SPECDECODE_API_KEY"
JOB_UID_ENV = "SPECDECODE_JOB_UID"
"""The load pod's Job uid (downward API): the results it writes are owned by that Job."""
JOB_NAME_ENV = "SPECDECODE_JOB_NAME"
"""The load pod's Job name (downward API): a round's Job is not `<exp>-load` (`rounds.py`)."""
MODEL_CACHE_VOLUME = "model-cache"


@dataclass(frozen=True)
class Names:
    """Deterministic names of every child of one experiment."""

    experiment: str

    def arm(self, arm: spec.Arm) -> str:
        """Deployment and Service of an arm."""
        return f"{self.experiment}-{arm.value}"

    @property
    def load_job(self) -> str:
        """The load Job, its ServiceAccount, Role and RoleBinding."""
        return f"{self.experiment}-load"

    @property
    def spec_config_map(self) -> str:
        """The experiment document the load Job reads."""
        return f"{self.experiment}-spec"

    @property
    def results_prefix(self) -> str:
        """Prefix of the ConfigMaps the load Job writes its results into (`<prefix>-<n>`)."""
        return f"{self.experiment}-results"

    def load_job_of(self, round_name: str | None) -> str:
        """The load Job of a round (`rounds.py`; None: the stages)."""
        return self.load_job if round_name is None else f"{self.load_job}-{round_name.lower()}"

    def spec_config_map_of(self, round_name: str | None) -> str:
        """The spec a round's load Job reads (None: the stages)."""
        base = self.spec_config_map
        return base if round_name is None else f"{base}-{round_name.lower()}"

    def results_prefix_of(self, round_name: str | None) -> str:
        """Prefix of a round's result ConfigMaps (None: the stages)."""
        base = self.results_prefix
        return base if round_name is None else f"{base}-{round_name.lower()}"

    @property
    def network_policy(self) -> str:
        """The policy that admits only the load Job, Prometheus and the operator to the arms."""
        return f"{self.experiment}-arms"

    @property
    def disruption_budget(self) -> str:
        """The PodDisruptionBudget that keeps voluntary evictions (drains) off the arms while they run."""
        return f"{self.experiment}-arms"


@dataclass(frozen=True)
class Settings:
    """What rendering needs from the operator's own configuration."""

    operator_image: str = "ghcr.io/specdecode/specdecode-operator:0.1.0"
    """The one image of the operator, the load Job and the simulator."""
    prometheus_pod_labels: dict[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "prometheus"}
    )
    """Pods (any namespace) allowed to scrape the arms."""
    operator_pod_labels: dict[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": MANAGED_BY}
    )
    """Pods (any namespace) of the operator, allowed to probe the arms."""
    image_pull_policy: str = "IfNotPresent"
    """Pull policy of the operator's image in the load Job and simulator arms."""
    results_env: dict[str, str] = field(default_factory=dict)
    """The load Job's results store (`results.s3.as_env`; empty: ConfigMaps)."""
    results_secret: str | None = None
    """The Secret (in the experiment's namespace) of that store's AWS keys, as the load Job's env."""


def labels(experiment: str, *, arm: spec.Arm | None = None, component: str) -> dict[str, str]:
    """The labels of design.md §2, plus a component."""
    result = {
        keys.LABEL_EXPERIMENT: experiment,
        keys.LABEL_MANAGED_BY: MANAGED_BY,
        keys.LABEL_COMPONENT: component,
    }
    if arm is not None:
        result[keys.LABEL_ARM] = arm.value
    return result


def selector(experiment: str, arm: spec.Arm) -> dict[str, str]:
    """The labels that select one arm's pods (also used to find them in Prometheus)."""
    return {keys.LABEL_EXPERIMENT: experiment, keys.LABEL_ARM: arm.value}


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
        "securityContext": _container_security(non_root=simulated),
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


def arm_url(name: str, arm: spec.Arm) -> str:
    """The URL of an arm's Service, from inside the namespace."""
    return f"http://{Names(name).arm(arm)}:{PORT}"


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


# ---------------------------------------------------------------------------------- the load


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
                            "securityContext": _container_security(non_root=True),
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


def _container_security(*, non_root: bool) -> dict[str, Any]:
    context: dict[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    if non_root:
        context["runAsNonRoot"] = True
    return context
