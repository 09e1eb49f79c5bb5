from __future__ import annotations

import pytest

from specdecode.experiment import fairness, manifests, releases, spec, validation
from specdecode.experiment.fairness import ArmPod
from specdecode.experiment.status import ArmDifference
from tests.factories import experiment_document

ARGV = ("vllm", "serve", "Qwen/Qwen3-4B", "--port", "8000", "--seed", "0")
SPECULATIVE = (
    "--speculative-config",
    '{"method":"draft_model"}',
    "--per-request-spec-decode-metrics",
    "summary",
)


def arm(**fields: object) -> ArmPod:
    base: dict[str, object] = {
        "pod": "p",
        "image_id": "docker.io/vllm/vllm-openai@sha256:aaa",
        "gpu_product": "NVIDIA-H200",
        "resources": {"limits.nvidia.com/gpu": "1", "requests.cpu": "2"},
        "argv": ARGV,
        "env": {"HF_HOME": "/models"},
    }
    return ArmPod(**(base | fields))  # type: ignore[arg-type]


def test_arms_that_differ_only_in_the_speculative_flags_do_not_differ() -> None:
    assert fairness.differences(arm(), arm(argv=(*ARGV, *SPECULATIVE))) == []


def test_the_speculative_flags_written_with_an_equals_sign_are_ignored_too() -> None:
    treatment = arm(argv=(*ARGV, '--speculative-config={"method":"ngram"}'))
    assert fairness.differences(arm(), treatment) == []


def test_a_speculative_flag_on_the_control_is_a_difference() -> None:
    found = fairness.differences(arm(argv=(*ARGV, *SPECULATIVE[:2])), arm(argv=(*ARGV, *SPECULATIVE)))
    assert found == [ArmDifference(field="args", control='--speculative-config {"method":"draft_model"}')]


def test_the_arms_as_manifests_renders_them_differ_only_in_the_speculative_flags() -> None:
    parsed, _ = validation.parse_experiment(experiment_document())
    assert parsed is not None
    release = releases.resolve(parsed.engine)
    assert release.per_request_spec_metrics, "the release renders both flags: both must be ignored"
    control = manifests.serve_args(parsed, spec.Arm.CONTROL, release)
    treatment = manifests.serve_args(parsed, spec.Arm.TREATMENT, release)
    assert control != treatment
    assert fairness.without_speculation(treatment) == tuple(control)


@pytest.mark.parametrize(
    ("treatment", "expected"),
    [
        (
            arm(image_id="docker.io/vllm/vllm-openai@sha256:bbb"),
            ArmDifference(
                field="imageID",
                control="docker.io/vllm/vllm-openai@sha256:aaa",
                treatment="docker.io/vllm/vllm-openai@sha256:bbb",
            ),
        ),
        (
            arm(gpu_product="NVIDIA-H100-80GB-HBM3"),
            ArmDifference(field="gpuProduct", control="NVIDIA-H200", treatment="NVIDIA-H100-80GB-HBM3"),
        ),
        (
            arm(resources={"limits.nvidia.com/gpu": "1", "requests.cpu": "4"}),
            ArmDifference(field="resources.requests.cpu", control="2", treatment="4"),
        ),
        (
            arm(resources={"limits.nvidia.com/gpu": "1", "requests.cpu": "2", "limits.memory": "64Gi"}),
            ArmDifference(field="resources.limits.memory", control=None, treatment="64Gi"),
        ),
        (
            arm(env={"HF_HOME": "/models", "VLLM_ATTENTION_BACKEND": "FLASHINFER"}),
            ArmDifference(field="env.VLLM_ATTENTION_BACKEND", control=None, treatment="FLASHINFER"),
        ),
        (arm(env={}), ArmDifference(field="env.HF_HOME", control="/models", treatment=None)),
        (
            arm(argv=(*ARGV[:-1], "1", *SPECULATIVE)),
            ArmDifference(field="args", control="0", treatment="1"),
        ),
        (
            arm(argv=(*ARGV[:3], "--max-num-seqs", "64", *ARGV[3:])),
            ArmDifference(field="args", control=None, treatment="--max-num-seqs 64"),
        ),
    ],
    ids=[
        "image digest",
        "gpu product",
        "a resource request",
        "a limit on one side",
        "an extra env var",
        "a missing env var",
        "an argument value",
        "an extra argument",
    ],
)
def test_each_kind_of_difference_is_named_with_both_sides(treatment: ArmPod, expected: ArmDifference) -> None:
    assert fairness.differences(arm(), treatment) == [expected]


def test_one_image_digest_written_two_ways_is_not_a_difference() -> None:
    treatment = arm(image_id="docker-pullable://vllm/vllm-openai@sha256:aaa")
    assert fairness.differences(arm(), treatment) == []
    assert fairness.differences(arm(image_id="sha256:aaa"), treatment) == []


def test_a_fact_known_for_one_arm_only_is_not_a_difference() -> None:
    assert fairness.differences(arm(image_id=None), arm(gpu_product=None)) == []


def test_every_difference_is_listed_and_the_message_names_each() -> None:
    treatment = arm(
        image_id="docker.io/vllm/vllm-openai@sha256:bbb",
        env={"HF_HOME": "/models", "X": "1"},
        resources={"limits.nvidia.com/gpu": "2", "requests.cpu": "2"},
    )
    found = fairness.differences(arm(), treatment)
    assert [d.field for d in found] == ["imageID", "resources.limits.nvidia.com/gpu", "env.X"]
    assert fairness.summary(found) == (
        "imageID: docker.io/vllm/vllm-openai@sha256:aaa (control) vs docker.io/vllm/vllm-openai@sha256:bbb "
        "(treatment); resources.limits.nvidia.com/gpu: 1 (control) vs 2 (treatment); "
        "env.X: absent (control) vs 1 (treatment)"
    )
    assert fairness.summary(found) in fairness.message(found)
