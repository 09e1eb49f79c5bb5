"""The operator's own settings, all in one place, read once from the environment.

The Helm chart sets these variables (see charts/specdecode-operator/values.yaml); each has a
default that works in a plain cluster.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from datetime import timedelta

from specdecode import results
from specdecode.controller import lease
from specdecode.experiment import manifests, reconcile
from specdecode.results import s3
from specdecode.sources import prometheus


@dataclass(frozen=True)
class OperatorSettings:
    """Every knob of the operator."""

    operator_image: str = "ghcr.io/specdecode/specdecode-operator:0.1.0"
    """Image of the load Job and of simulator arms (the operator's own image)."""
    image_pull_policy: str = "IfNotPresent"
    """Pull policy for that image."""
    prometheus_url: str | None = None
    """Used when an experiment names no `spec.prometheus.url`."""
    interval: float = 5.0
    """Seconds between reconcile ticks of an active experiment."""
    unschedulable_grace: float = 60.0
    """Seconds a pod may stay Unschedulable before the experiment fails."""
    analysis_grace: float = 300.0
    """Seconds transient collection failures (Prometheus down) are retried."""
    results_max_bytes: int = 48 * 1024 * 1024
    """The most the load Job's results may inflate to; more ends in Failed/ResultsTooLarge. The
    operator's memory while judging grows with it (benchmarks/README.md, "Results size")."""
    results_configmap_max_bytes: int = results.CONFIG_MAP_MAX_BYTES
    """The most results an experiment may plan to keep in ConfigMaps, inflated; more is refused before
    anything is deployed, naming the S3 store (`results_s3`) as the way past it."""
    results_s3: s3.Location | None = None
    """The S3 bucket the load Jobs store their results in and the operator reads them from (chart values
    `resultsStore.s3`, `SPECDECODE_RESULTS_S3_*`; the keys from the environment: `AWS_ACCESS_KEY_ID`...);
    None: ConfigMaps."""
    results_s3_secret: str | None = None
    """The Secret of those keys (`SPECDECODE_RESULTS_S3_CREDENTIALS_SECRET`), which each load Job reads in
    its own namespace."""
    label_names: prometheus.LabelNames = field(default_factory=prometheus.LabelNames)
    """The Prometheus labels the arms' series are selected by (shared with `run --local`)."""
    prometheus_pod_labels: dict[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "prometheus"}
    )
    """Labels of the Prometheus pods the arms' NetworkPolicy admits."""
    operator_pod_labels: dict[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "specdecode-operator"}
    )
    """Labels of the operator's own pods, which the arms' NetworkPolicy admits."""
    leader_election: bool = False
    """Act only while holding a Lease (controller/lease.py), so replicas never act on one experiment.
    The chart turns it on; a single operator run by hand needs none."""
    leader_election_name: str = "specdecode-operator"
    """Name of that Lease."""
    leader_election_namespace: str = "default"
    """Namespace of that Lease (the chart: the release's namespace)."""
    leader_election_identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    """This replica's name in the Lease's `holderIdentity` (the chart: the pod's name)."""
    lease_duration: float = 15.0
    """Seconds an unrenewed Lease blocks the other replicas (a killed leader is replaced after it)."""
    renew_deadline: float = 10.0
    """Seconds the leader acts after the start of its last successful renewal (< lease_duration)."""
    retry_period: float = 2.0
    """Seconds between attempts to acquire or renew the Lease (< renew_deadline)."""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> OperatorSettings:
        """Settings from `SPECDECODE_*` variables."""
        env = dict(os.environ if env is None else env)
        default = cls()

        def get(key: str, fallback: str) -> str:
            return env.get(f"SPECDECODE_{key}", fallback)

        prom_labels = get("PROMETHEUS_POD_LABELS", "")
        operator_labels = get("OPERATOR_POD_LABELS", "")
        return cls(
            operator_image=get("OPERATOR_IMAGE", default.operator_image),
            image_pull_policy=get("IMAGE_PULL_POLICY", default.image_pull_policy),
            prometheus_url=get("PROMETHEUS_URL", "") or None,
            interval=float(get("INTERVAL", str(default.interval))),
            unschedulable_grace=float(get("UNSCHEDULABLE_GRACE", str(default.unschedulable_grace))),
            analysis_grace=float(get("ANALYSIS_GRACE", str(default.analysis_grace))),
            results_max_bytes=int(get("RESULTS_MAX_BYTES", str(default.results_max_bytes))),
            results_configmap_max_bytes=int(
                get("RESULTS_CONFIGMAP_MAX_BYTES", str(default.results_configmap_max_bytes))
            ),
            results_s3=s3.from_env(env),
            results_s3_secret=get("RESULTS_S3_CREDENTIALS_SECRET", "") or None,
            label_names=prometheus.LabelNames.from_env(env),
            prometheus_pod_labels=_parse_labels(prom_labels)
            if prom_labels
            else default.prometheus_pod_labels,
            operator_pod_labels=_parse_labels(operator_labels)
            if operator_labels
            else default.operator_pod_labels,
            leader_election=get("LEADER_ELECTION", "false").strip().lower() in ("1", "true", "yes"),
            leader_election_name=get("LEADER_ELECTION_NAME", default.leader_election_name),
            leader_election_namespace=get("LEADER_ELECTION_NAMESPACE", default.leader_election_namespace),
            leader_election_identity=get("LEADER_ELECTION_IDENTITY", "") or default.leader_election_identity,
            lease_duration=float(get("LEASE_DURATION", str(default.lease_duration))),
            renew_deadline=float(get("RENEW_DEADLINE", str(default.renew_deadline))),
            retry_period=float(get("RETRY_PERIOD", str(default.retry_period))),
        )

    @property
    def render(self) -> manifests.Settings:
        """What the manifest builders need."""
        return manifests.Settings(
            operator_image=self.operator_image,
            image_pull_policy=self.image_pull_policy,
            prometheus_pod_labels=self.prometheus_pod_labels,
            operator_pod_labels=self.operator_pod_labels,
            results_env=s3.as_env(self.results_s3) if self.results_s3 is not None else {},
            results_secret=self.results_s3_secret,
        )

    @property
    def results_limits(self) -> results.Limits:
        """How much of the load Job's results the operator reads."""
        return results.Limits(
            max_bytes=self.results_max_bytes,
            config_map_bytes=self.results_configmap_max_bytes,
            s3=self.results_s3 is not None,
        )

    @property
    def election(self) -> lease.Config | None:
        """The Lease to hold before acting, or None when leader election is off."""
        if not self.leader_election:
            return None
        return lease.Config(
            name=self.leader_election_name,
            namespace=self.leader_election_namespace,
            identity=self.leader_election_identity,
            duration=self.lease_duration,
            renew_deadline=self.renew_deadline,
            retry_period=self.retry_period,
        )

    @property
    def timing(self) -> reconcile.Timing:
        """What the decision function needs."""
        return reconcile.Timing(
            unschedulable_grace=timedelta(seconds=self.unschedulable_grace),
            analysis_grace=timedelta(seconds=self.analysis_grace),
        )


def _parse_labels(text: str) -> dict[str, str]:
    pairs = (item.split("=", 1) for item in text.split(",") if "=" in item)
    return {key.strip(): value.strip() for key, value in pairs}
