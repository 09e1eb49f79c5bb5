"""Which GPUs `run --local`'s arms get: GPUs per arm (the tensor-parallel size), the split of two
arms side by side, the check that one arm at least fits when they must run one after the other, and
the local vLLM release the arms are rendered for."""

from __future__ import annotations

from specdecode.experiment import releases, spec, speculative_rules, validation
from specdecode.local import engines


def per_arm(s: spec.ExperimentSpec) -> int:
    """GPUs one vLLM arm uses: its tensor-parallel size."""
    return max(1, validation.target_tensor_parallel(s.engine.args) or 1)


def split(s: spec.ExperimentSpec) -> dict[spec.Arm, str]:
    """Each arm's GPUs side by side (the control's first; none for the simulator)."""
    if s.engine.simulator is not None:
        return {}
    n_per_arm = per_arm(s)
    return {arm: ",".join(str(i + n * n_per_arm) for i in range(n_per_arm)) for n, arm in enumerate(spec.Arm)}


def one_arm_at_a_time(s: spec.ExperimentSpec) -> str:
    """One GPU (or GPUs for one arm only): enough for one arm at least (EngineError otherwise); the
    line that says the arms will run one after the other."""
    n_per_arm, count = per_arm(s), engines.gpu_count()
    if count < n_per_arm:
        raise engines.EngineError(
            f"each arm needs {n_per_arm} GPUs (--tensor-parallel-size {n_per_arm} in spec.engine.args) "
            f"but nvidia-smi lists {count}; lower the tensor-parallel size or run where {n_per_arm} GPUs are"
        )
    return f"{count} GPU(s) for arms of {n_per_arm}: the arms run one after the other on the same prompts and schedule"


def local_release(s: spec.ExperimentSpec) -> tuple[releases.Release, spec.ExperimentSpec, list[str]]:
    """The local vLLM's release (`vllm --version`) unless the spec names one, the spec naming it (the
    analysis, e.g. the recommendation, reads the release from the spec), and its rules' problems."""
    release = releases.resolve(s.engine, local=engines.local_vllm_version(), here=True)
    if s.engine.vllm_version is None and release.known:
        engine = s.engine.model_copy(update={"vllm_version": releases.fmt(release.version)})
        s = s.model_copy(update={"engine": engine})
    problems = speculative_rules.check_speculative(
        s.speculative, target_tp=validation.target_tensor_parallel(s.engine.args), release=release
    )
    return release, s, [str(problem) for problem in problems]
