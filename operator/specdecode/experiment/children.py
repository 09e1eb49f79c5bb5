"""What every child of an experiment shares: its deterministic name (`Names`), labels, the
constants of the pods' contract (ports, mounts, environment), and the operator's render settings.
Pure.

Every name derives deterministically from the experiment's name (`<exp>-control`, `<exp>-treatment`,
`<exp>-load`, ...), so a restarted operator finds what it created (idempotence by name). The
builders are in `manifests.py` (the arms) and `load_manifests.py` (the load Job and what it reads).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specdecode.experiment import keys, spec

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


def arm_url(name: str, arm: spec.Arm) -> str:
    """The URL of an arm's Service, from inside the namespace."""
    return f"http://{Names(name).arm(arm)}:{PORT}"


def container_security(*, non_root: bool) -> dict[str, Any]:
    """A container that escalates nothing and drops every capability (`non_root`: nor runs as root)."""
    context: dict[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    if non_root:
        context["runAsNonRoot"] = True
    return context
