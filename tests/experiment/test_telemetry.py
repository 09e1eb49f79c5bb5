"""GPU telemetry from NVIDIA's DCGM exporter (issue #18): the queries and their folding. Pure."""

from __future__ import annotations

import math

from specdecode.experiment import status, telemetry

SELECTOR = '{namespace="llm",pod=~"exp-treatment-[a-z0-9]+-[a-z0-9]+"}'


def test_the_arm_s_pods_are_selected_by_namespace_and_their_deployment_s_pod_names() -> None:
    selector = telemetry.pod_selector(
        namespace_label="namespace", pod_label="pod", namespace="llm", deployment="exp-treatment"
    )
    assert selector == SELECTOR


def test_the_exporter_s_label_names_are_those_configured_and_dots_are_literal() -> None:
    selector = telemetry.pod_selector(
        namespace_label="exported_namespace",
        pod_label="exported_pod",
        namespace="llm",
        deployment="a.b-control",
    )
    assert selector == '{exported_namespace="llm",exported_pod=~"a\\\\.b-control-[a-z0-9]+-[a-z0-9]+"}'


def test_each_figure_is_one_query_over_the_stage_window() -> None:
    queries = telemetry.queries(SELECTOR, 30.2)
    assert queries == {
        "gpus": f"count(last_over_time(DCGM_FI_DEV_GPU_UTIL{SELECTOR}[33s]))",
        "utilization_mean": f"avg(avg_over_time(DCGM_FI_DEV_GPU_UTIL{SELECTOR}[33s]))",
        "memory_used_mean_mib": f"avg(avg_over_time(DCGM_FI_DEV_FB_USED{SELECTOR}[33s]))",
        "memory_used_max_mib": f"max(max_over_time(DCGM_FI_DEV_FB_USED{SELECTOR}[33s]))",
        "power_mean_watts": f"avg(avg_over_time(DCGM_FI_DEV_POWER_USAGE{SELECTOR}[33s]))",
    }


def test_the_answers_fold_into_one_arm_s_figures_rounded_and_nan_as_unknown() -> None:
    values = {
        "gpus": 2.0,
        "utilization_mean": 63.27,
        "memory_used_mean_mib": 129_393.0,
        "memory_used_max_mib": 129_400.0,
        "power_mean_watts": math.nan,
    }
    assert telemetry.arm_gpu(values) == status.ArmGpu(
        gpus=2,
        utilization_mean=63.3,
        memory_used_mean_mib=129_393.0,
        memory_used_max_mib=129_400.0,
        power_mean_watts=None,
    )


def test_an_arm_without_series_has_no_figures() -> None:
    assert telemetry.arm_gpu({"gpus": None, "utilization_mean": None}) is None
    assert telemetry.arm_gpu({"gpus": 0.0}) is None


def test_the_source_is_the_exporter_when_it_reported_either_arm_else_absent() -> None:
    arm = status.ArmGpu(gpus=1, utilization_mean=50.0)
    assert telemetry.stage_gpu(None, arm) == status.StageGpu(source="dcgm-exporter", treatment=arm)
    assert telemetry.stage_gpu(None, None) == status.StageGpu(source="absent")


def test_the_summary_gives_each_stage_s_arms_or_says_there_are_none() -> None:
    arm = status.ArmGpu(
        gpus=1,
        utilization_mean=63.3,
        memory_used_mean_mib=129_393,
        memory_used_max_mib=129_400,
        power_mean_watts=487,
    )
    measured = status.StageResult(name="c1", gpu=telemetry.stage_gpu(arm, None))
    assert telemetry.summary([measured]) == [
        "gpu c1: control util 63%, memory 129,393 MiB (max 129,400), 487 W; treatment no series"
    ]
    absent = status.StageResult(name="c1", gpu=telemetry.stage_gpu(None, None))
    assert telemetry.summary([absent]) == [
        "gpu: no DCGM metrics for the arms' pods (Prometheus holds no dcgm-exporter series for them)"
    ]
    assert telemetry.summary([status.StageResult(name="c1")]) == [
        "gpu: no DCGM metrics for the arms' pods (none read for this run: run --local reads no DCGM exporter)"
    ]
    assert telemetry.summary([]) == []
