"""The comparison of the arms' hosts (issue 22): what counts as a difference, and the warning."""

from __future__ import annotations

from specdecode.experiment import placement, status


def arms(control: status.Host | None, treatment: status.Host | None) -> status.ArmHosts:
    return status.ArmHosts(control=control, treatment=treatment)


def test_every_host_fact_but_the_gpu_uuids_is_compared() -> None:
    base = status.Host(
        node="n",
        gpu_product="NVIDIA-H200",
        gpu_uuids=["GPU-1"],
        driver_version="575.57.08",
        cuda_version="12.9",
        cpu_model="x",
        cpu_count=64,
        instance_type="p5.48xlarge",
        vllm_version="0.20.0",
        speed_factor=1.0,
    )
    changed = {
        "node": "m",
        "gpu_product": "NVIDIA-H100",
        "driver_version": "580.1",
        "cuda_version": "13.0",
        "cpu_model": "y",
        "cpu_count": 32,
        "instance_type": "p4d",
        "vllm_version": "0.21.0",
        "speed_factor": 1.1,
    }
    assert set(changed) == set(placement.COMPARED)
    for name, value in changed.items():
        other = base.model_copy(update={name: value, "gpu_uuids": ["GPU-2"]})
        assert placement.differences(arms(base, other)) == [status.Host.model_fields[name].alias or name]


def test_a_fact_known_for_one_arm_only_is_unknown_not_different() -> None:
    known = status.Host(node="n", cpu_model="x")
    assert placement.differences(arms(known, status.Host(node="n"))) == []
    assert placement.differences(arms(known, None)) == []


def test_the_environment_gets_both_hosts_their_nodes_and_the_shared_gpu_product() -> None:
    env = placement.with_hosts(
        status.Environment(),
        arms(
            status.Host(node="a", gpu_product="NVIDIA-H200", vllm_version="0.20.0"),
            status.Host(node="b", gpu_product="NVIDIA-H200", vllm_version="0.20.0"),
        ),
    )
    assert (env.nodes, env.gpu_product, env.vllm_version) == (["a", "b"], "NVIDIA-H200", "0.20.0")
    assert env.host_differences == ["node"]
    warning = placement.warning(env)
    assert warning is not None and "node: a (control) vs b (treatment)" in warning


def test_no_warning_when_the_hosts_agree() -> None:
    host = status.Host(node="a", gpu_product="NVIDIA-H200")
    env = placement.with_hosts(status.Environment(), arms(host, host))
    assert env.host_differences == [] and placement.warning(env) is None
