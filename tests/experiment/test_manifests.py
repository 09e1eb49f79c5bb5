from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from specdecode.experiment import manifests, spec, validation
from tests.factories import experiment_document

SETTINGS = manifests.Settings(operator_image="specdecode:test")


def experiment(**overrides: Any) -> spec.ExperimentSpec:
    parsed, _ = validation.parse_experiment(experiment_document(**overrides))
    return parsed


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return result


def strip_arm(deployment: dict[str, Any]) -> dict[str, Any]:
    text = json.dumps(deployment).replace("treatment", "ARM").replace("control", "ARM")
    result: dict[str, Any] = json.loads(text)
    return result


def test_arms_differ_only_in_the_speculative_flags() -> None:
    s = experiment(
        engine={
            "args": ["--max-model-len", "8192"],
            "apiKeySecret": {"name": "k", "key": "key"},
            "modelCache": {"claimName": "hf-models", "subPath": "hf", "readOnly": True},
            "hfTokenSecret": {"name": "hf", "key": "token"},
            "offline": True,
        }
    )
    control = manifests.build_deployment("exp", s, spec.Arm.CONTROL, SETTINGS)
    treatment = manifests.build_deployment("exp", s, spec.Arm.TREATMENT, SETTINGS)
    control_args = pod_spec(control)["containers"][0]["args"]
    treatment_args = pod_spec(treatment)["containers"][0]["args"]
    config = json.dumps(
        {"method": "draft_model", "model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 5},
        separators=(",", ":"),
    )
    assert treatment_args == [
        *control_args,
        "--speculative-config",
        config,
        "--per-request-spec-decode-metrics",
        "summary",
    ]
    pod_spec(treatment)["containers"][0]["args"] = control_args
    assert strip_arm(control) == strip_arm(treatment)


def test_a_noise_floor_run_renders_no_speculative_config_in_either_arm() -> None:
    """An A/A run: the two arms are the same server, on vLLM and on the simulator."""
    for engine in ({}, {"simulator": {"profile": "h200-8b-draft-tiny", "batchVarianceRate": 0.15}}):
        s = experiment(engine=engine, analysis={"mode": "NoiseFloor"})
        control = manifests.build_deployment("exp", s, spec.Arm.CONTROL, SETTINGS)
        treatment = manifests.build_deployment("exp", s, spec.Arm.TREATMENT, SETTINGS)
        for deployment in (control, treatment):
            args = pod_spec(deployment)["containers"][0]["args"]
            assert "--speculative-config" not in args
            assert "--per-request-spec-decode-metrics" not in args
        assert strip_arm(control) == strip_arm(treatment)
        if engine:
            args = pod_spec(control)["containers"][0]["args"]
            assert args[args.index("--batch-variance-rate") + 1] == "0.15"


def test_both_arms_get_the_fair_common_flags() -> None:
    argv = manifests.serve_args(experiment(servedModelName="qwen"), spec.Arm.CONTROL)
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-4B-Thinking-2507"]
    joined = " ".join(argv)
    for flag in (
        "--served-model-name qwen",
        "--host 0.0.0.0",
        "--port 8000",
        "--seed 42",
        "--no-enable-prefix-caching",
        "--generation-config vllm",
    ):
        assert flag in joined
    assert "--speculative-config" not in joined and "--per-request-spec-decode-metrics" not in joined


def test_prefix_caching_follows_the_spec() -> None:
    argv = manifests.serve_args(experiment(engine={"prefixCaching": True}), spec.Arm.CONTROL)
    assert "--enable-prefix-caching" in argv and "--no-enable-prefix-caching" not in argv


def test_the_command_line_is_spelled_for_the_arms_release() -> None:
    """0.20 has neither --disable-prefix-caching nor per-request metrics; 0.29+ has the metrics."""
    for image, per_request in (
        ("vllm/vllm-openai:v0.20.0", False),
        ("vllm/vllm-openai:v0.28.0", False),
        ("vllm/vllm-openai:v0.29.0", True),
        ("vllm/vllm-openai:v0.33.0", True),
    ):
        treatment = manifests.serve_args(experiment(engine={"image": image}), spec.Arm.TREATMENT)
        assert "--no-enable-prefix-caching" in treatment and "--disable-prefix-caching" not in treatment
        assert ("--per-request-spec-decode-metrics" in treatment) is per_request, image


def test_the_spec_release_wins_over_the_image_tag() -> None:
    s = experiment(engine={"image": "vllm/vllm-openai:v0.33.0", "vllmVersion": "0.20.0"})
    assert "--per-request-spec-decode-metrics" not in manifests.serve_args(s, spec.Arm.TREATMENT)


def test_speculative_config_renders_vllm_keys_and_extras() -> None:
    s = experiment(
        speculative={
            "method": "ngram",
            "numSpeculativeTokens": 4,
            "promptLookupMin": 2,
            "promptLookupMax": 5,
            "extra": {"num_speculative_tokens_per_batch_size": [[1, 8, 4]]},
        }
    )
    assert manifests.speculative_config(s.speculative) == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 5,
        "num_speculative_tokens_per_batch_size": [[1, 8, 4]],
    }


def test_deployment_shape() -> None:
    s = experiment(
        engine={
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "apiKeySecret": {"name": "vllm-key", "key": "token"},
        }
    )
    deployment = manifests.build_deployment("exp", s, spec.Arm.TREATMENT, SETTINGS)
    assert deployment["metadata"]["name"] == "exp-treatment"
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["specdecode.io/experiment"] == "exp"
    assert labels["specdecode.io/arm"] == "treatment"
    assert labels["app.kubernetes.io/managed-by"] == "specdecode-operator"
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    pod = pod_spec(deployment)
    container = pod["containers"][0]
    assert pod["enableServiceLinks"] is False
    assert pod["automountServiceAccountToken"] is False  # the engine's image gets no API credentials
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert container["image"] == "vllm/vllm-openai:v0.33.0"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 1}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    # 30m deploy deadline: the startup probe allows that long for loading the model
    assert container["startupProbe"]["periodSeconds"] * container["startupProbe"]["failureThreshold"] >= 1800
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "vllm-key", "key": "token"}}} in (
        container["env"]
    )
    assert "vllm-key" not in " ".join(container["args"])
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "8000"


def test_simulator_arms_run_specdecode_sim_from_the_operator_image() -> None:
    s = experiment(engine={"simulator": {"profile": "h200-8b-draft-1b", "acceptanceRate": 0.6}})
    deployment = manifests.build_deployment("exp", s, spec.Arm.TREATMENT, SETTINGS)
    container = pod_spec(deployment)["containers"][0]
    assert container["image"] == "specdecode:test"
    assert container["command"] == ["specdecode", "sim"]
    args = container["args"]
    assert args[args.index("--profile") + 1] == "h200-8b-draft-1b"
    assert args[args.index("--acceptance-rate") + 1] == "0.6"
    assert "--speculative-config" in args
    assert container["securityContext"]["runAsNonRoot"] is True


def test_arms_request_cpu_and_memory_by_default_so_they_are_never_best_effort() -> None:
    vllm = pod_spec(manifests.build_deployment("exp", experiment(), spec.Arm.CONTROL, SETTINGS))
    assert vllm["containers"][0]["resources"] == {
        "limits": {"nvidia.com/gpu": 1},
        "requests": {"cpu": "2", "memory": "16Gi"},
    }
    sim = experiment(engine={"simulator": {"profile": "h200-8b-draft-tiny"}})
    simulated = pod_spec(manifests.build_deployment("exp", sim, spec.Arm.CONTROL, SETTINGS))
    assert simulated["containers"][0]["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}


def test_requests_or_limits_the_experiment_gives_replace_the_default_requests() -> None:
    resources = {"limits": {"nvidia.com/gpu": 2, "memory": "64Gi"}, "requests": {"cpu": "8"}}
    s = experiment(engine={"resources": resources})
    pod = pod_spec(manifests.build_deployment("exp", s, spec.Arm.CONTROL, SETTINGS))
    # memory: limited, so the API server requests the limit; cpu: requested as given.
    assert pod["containers"][0]["resources"] == resources


def test_dev_shm_is_memory_backed_and_bounded_by_shm_size() -> None:
    default = pod_spec(manifests.build_deployment("exp", experiment(), spec.Arm.CONTROL, SETTINGS))
    assert default["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}]
    s = experiment(engine={"shmSize": "32Gi"})
    pod = pod_spec(manifests.build_deployment("exp", s, spec.Arm.CONTROL, SETTINGS))
    assert pod["volumes"][0]["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in pod["containers"][0]["volumeMounts"]


CACHE_ENGINE = {
    "modelCache": {"claimName": "hf-models"},
    "hfTokenSecret": {"name": "hf", "key": "token"},
}


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_both_arms_mount_the_model_cache_claim_as_their_hugging_face_home() -> None:
    s = experiment(engine={**CACHE_ENGINE, "modelCache": {"claimName": "hf-models", "subPath": "team/hf"}})
    for arm in spec.Arm:
        pod = pod_spec(manifests.build_deployment("exp", s, arm, SETTINGS))
        (container,) = pod["containers"]
        assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "hf-models"}} in pod["volumes"]
        mounts = container["volumeMounts"]
        assert {"name": "model-cache", "mountPath": "/models", "subPath": "team/hf"} in mounts
        assert {"name": "dshm", "mountPath": "/dev/shm"} in mounts
        env = env_of(container)
        assert env["HF_HOME"] == "/models" and env["HF_HUB_CACHE"] == "/models/hub"
        # vLLM finds weights, config and tokenizer through HF_HOME; --download-dir would split them
        assert not any(a.startswith("--download-dir") for a in container["args"])
        assert "HF_HUB_OFFLINE" not in env and "TRANSFORMERS_OFFLINE" not in env


def test_the_hugging_face_token_comes_from_its_secret_never_the_command_line() -> None:
    s = experiment(engine=CACHE_ENGINE)
    container = pod_spec(manifests.build_deployment("exp", s, spec.Arm.CONTROL, SETTINGS))["containers"][0]
    assert env_of(container)["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert not any(a == "hf" or "token" in a for a in container["args"])


def test_a_read_only_offline_cache_is_mounted_read_only_and_the_arms_never_call_the_hub() -> None:
    s = experiment(engine={"modelCache": {"claimName": "hf-models", "readOnly": True}, "offline": True})
    pod = pod_spec(manifests.build_deployment("exp", s, spec.Arm.TREATMENT, SETTINGS))
    (container,) = pod["containers"]
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "hf-models", "readOnly": True}} in (
        pod["volumes"]
    )
    assert {"name": "model-cache", "mountPath": "/models", "readOnly": True} in container["volumeMounts"]
    env = env_of(container)
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"


def test_without_a_model_source_the_arms_get_no_cache_and_no_hugging_face_env() -> None:
    pod = pod_spec(manifests.build_deployment("exp", experiment(), spec.Arm.CONTROL, SETTINGS))
    assert [v["name"] for v in pod["volumes"]] == ["dshm"]
    assert not [e for e in pod["containers"][0]["env"] if e["name"].startswith(("HF_", "TRANSFORMERS_"))]


def test_simulator_arms_mount_the_model_cache_too() -> None:
    s = experiment(engine={**CACHE_ENGINE, "simulator": {"profile": "h200-8b-draft-tiny"}})
    pod = pod_spec(manifests.build_deployment("exp", s, spec.Arm.CONTROL, SETTINGS))
    assert pod["volumes"] == [{"name": "model-cache", "persistentVolumeClaim": {"claimName": "hf-models"}}]
    assert pod["containers"][0]["volumeMounts"] == [{"name": "model-cache", "mountPath": "/models"}]
    assert env_of(pod["containers"][0])["HF_HOME"] == "/models"


def test_validation_knows_every_variable_the_model_source_fields_render() -> None:
    # engine.env may not set these: validation must name exactly what rendering sets, field by field
    for engine in (
        {"modelCache": {"claimName": "c"}},
        {"hfTokenSecret": {"name": "hf", "key": "t"}},
        {"modelCache": {"claimName": "c"}, "offline": True},
        {},
    ):
        e = experiment(engine=engine).engine
        rendered = {v["name"] for v in manifests.model_source_env(e)}
        assert rendered == set(validation.model_source_env_names(e)), engine


def test_service_selects_one_arm() -> None:
    service = manifests.build_service("exp", spec.Arm.CONTROL)
    assert service["metadata"]["name"] == "exp-control"
    assert service["spec"]["selector"] == {"specdecode.io/experiment": "exp", "specdecode.io/arm": "control"}
    assert service["spec"]["ports"][0]["port"] == 8000


def test_network_policy_admits_only_load_prometheus_and_operator() -> None:
    policy = manifests.build_network_policy("exp", SETTINGS)
    sources = policy["spec"]["ingress"][0]["from"]
    assert sources[0]["podSelector"]["matchLabels"] == {
        "specdecode.io/experiment": "exp",
        "app.kubernetes.io/component": "load",
    }
    assert sources[1]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    assert sources[2]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "specdecode-operator"}
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "engine"


def test_load_job_targets_both_services_once() -> None:
    s = experiment(deadlines={"run": "1h"}, engine={"apiKeySecret": {"name": "k", "key": "t"}})
    job = manifests.build_load_job("exp", s, SETTINGS)
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == 3600
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "exp-load"
    args = pod["containers"][0]["args"]
    assert args[args.index("--control-url") + 1] == "http://exp-control:8000"
    assert args[args.index("--treatment-url") + 1] == "http://exp-treatment:8000"
    assert args[args.index("--results-configmap") + 1] == "exp-results"
    assert pod["containers"][0]["image"] == "specdecode:test"


def test_the_load_pod_knows_its_job_s_uid_and_name_to_own_its_results_by_it() -> None:
    job = manifests.build_load_job("exp", experiment(), SETTINGS)
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[manifests.JOB_UID_ENV]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/controller-uid']"}
    }
    # A round's Job (`<exp>-load-crossover`) names itself as the owner, not `<exp>-load`.
    assert env[manifests.JOB_NAME_ENV]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/job-name']"}
    }


def test_the_spec_config_map_names_its_generation_in_the_file_the_load_reads() -> None:
    document = experiment_document()
    (config_map,) = [
        c
        for c in manifests.build_all("exp", document, experiment(), SETTINGS, generation=4)
        if c["kind"] == "ConfigMap"
    ]
    assert config_map["metadata"]["name"] == "exp-spec"
    loaded = yaml.safe_load(config_map["data"][manifests.EXPERIMENT_FILE])
    assert manifests.document_generation(loaded) == 4
    assert loaded["spec"] == document["spec"]


def test_a_disruption_budget_admits_no_voluntary_eviction_of_either_arm() -> None:
    children = manifests.build_all("exp", experiment_document(), experiment(), SETTINGS)
    (budget,) = [c for c in children if c["kind"] == "PodDisruptionBudget"]
    assert budget["apiVersion"] == "policy/v1"
    assert budget["metadata"]["name"] == "exp-arms"
    assert budget["spec"]["maxUnavailable"] == 0
    selected = budget["spec"]["selector"]["matchLabels"]
    for arm in spec.Arm:
        pod_labels = manifests.build_deployment("exp", experiment(), arm, SETTINGS)["spec"]["template"]
        assert selected.items() <= pod_labels["metadata"]["labels"].items()
    load_labels = manifests.build_load_job("exp", experiment(), SETTINGS)["spec"]["template"]["metadata"]
    assert not selected.items() <= load_labels["labels"].items()  # the load Job is not covered


def test_load_job_mounts_a_jsonl_dataset_from_its_config_map() -> None:
    s = experiment(
        workload={
            "stages": [{"name": "a", "rate": 1}],
            "dataset": {"type": "jsonl", "configMap": {"name": "prompts", "key": "p.jsonl"}},
        }
    )
    pod = manifests.build_load_job("exp", s, SETTINGS)["spec"]["template"]["spec"]
    assert {
        "name": "dataset",
        "configMap": {"name": "prompts", "items": [{"key": "p.jsonl", "path": "prompts.jsonl"}]},
    } in pod["volumes"]
    assert "--dataset-file" in pod["containers"][0]["args"]


@pytest.mark.parametrize(
    ("dataset_type", "stage"),
    [("trace", {"name": "a", "rate": 1}), ("multiTurn", {"name": "a", "concurrency": 2})],
)
def test_load_job_mounts_a_trace_or_conversations_from_its_config_map_as_the_dataset_file(
    dataset_type: str, stage: dict[str, Any]
) -> None:
    s = experiment(
        workload={
            "stages": [stage],
            "dataset": {"type": dataset_type, "configMap": {"name": "traces", "key": "prod.jsonl"}},
        }
    )
    pod = manifests.build_load_job("exp", s, SETTINGS)["spec"]["template"]["spec"]
    assert {
        "name": "dataset",
        "configMap": {"name": "traces", "items": [{"key": "prod.jsonl", "path": "prompts.jsonl"}]},
    } in pod["volumes"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--dataset-file") + 1] == f"{manifests.DATASET_MOUNT}/prompts.jsonl"


def test_load_rbac_only_writes_config_maps() -> None:
    account, role, binding = manifests.build_load_rbac("exp")
    assert account["kind"] == "ServiceAccount" and account["metadata"]["name"] == "exp-load"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "update"]}]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "exp-load"}]


def test_every_child_name_is_a_dns_label_for_the_longest_name() -> None:
    name = "a" * spec.MAX_NAME_LENGTH
    document = experiment_document()
    document["metadata"]["name"] = name
    s, _ = validation.parse_experiment(document)
    children = [
        *manifests.build_all(name, document, s, SETTINGS),
        manifests.build_load_job(name, s, SETTINGS),
    ]
    for child in children:
        assert len(child["metadata"]["name"]) <= 63
        for value in child["metadata"]["labels"].values():
            assert len(value) <= 63


def affinity(colocate: str | None) -> list[dict[str, Any] | None]:
    s = experiment(**({"placement": {"colocate": colocate}} if colocate else {}))
    return [pod_spec(manifests.build_deployment("exp", s, arm, SETTINGS)).get("affinity") for arm in spec.Arm]


TERM = {
    "labelSelector": {
        "matchLabels": {"specdecode.io/experiment": "exp", "app.kubernetes.io/component": "engine"}
    },
    "topologyKey": "kubernetes.io/hostname",
}


def test_both_arms_prefer_one_node_by_default() -> None:
    preferred = {
        "podAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": TERM}]
        }
    }
    assert affinity(None) == affinity("Preferred") == [preferred, preferred]


def test_required_colocation_is_a_required_pod_affinity_and_off_is_none() -> None:
    required = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [TERM]}}
    assert affinity("Required") == [required, required]
    assert affinity("Off") == [None, None]


def test_the_colocation_term_matches_both_arms_pods_and_not_the_load_job() -> None:
    s = experiment(placement={"colocate": "Required"})
    wanted = TERM["labelSelector"]["matchLabels"].items()  # type: ignore[index]
    for arm in spec.Arm:
        labels = manifests.build_deployment("exp", s, arm, SETTINGS)["spec"]["template"]["metadata"]["labels"]
        assert wanted <= labels.items()  # each arm matches its own term: the first can land anywhere
    load = manifests.build_load_job("exp", s, SETTINGS)["spec"]["template"]["metadata"]["labels"]
    assert not wanted <= load.items()
