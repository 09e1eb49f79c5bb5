"""The operator's own Prometheus metrics: experiments by phase and verdict, the last speed-ups."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from specdecode.experiment.status import ExperimentStatus


class OperatorMetrics:
    """One registry per operator process (no module-level state)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.experiments = Gauge(
            "specdecode_experiments",
            "Experiments by phase and verdict.",
            ["phase", "verdict"],
            registry=self.registry,
        )
        self.speedup = Gauge(
            "specdecode_speedup",
            "Primary-metric speed-up estimate of the last verdict, per stage.",
            ["namespace", "experiment", "stage"],
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "specdecode_reconcile_errors",
            "Reconcile ticks that raised (retried by kopf).",
            registry=self.registry,
        )
        self._known: dict[tuple[str, str], tuple[str, str]] = {}
        #: (namespace, name) -> the stages with a `specdecode_speedup` series, removed by `forget`
        self._stages: dict[tuple[str, str], set[str]] = {}

    def serve(self, port: int) -> None:
        """Expose /metrics on all interfaces."""
        start_http_server(port, registry=self.registry)

    def observe(self, namespace: str, name: str, status: ExperimentStatus) -> None:
        """Record one experiment's latest status."""
        self._known[(namespace, name)] = (status.phase.value, status.verdict.value if status.verdict else "")
        self._count()
        estimated: set[str] = set()
        for stage in status.stages:
            if stage.speedup is not None and stage.speedup.estimate is not None:
                self.speedup.labels(namespace=namespace, experiment=name, stage=stage.name).set(
                    stage.speedup.estimate
                )
                estimated.add(stage.name)
        # A spec edit drops the old verdict from the status: its speed-ups go with it.
        for gone in self._stages.get((namespace, name), set()) - estimated:
            self.speedup.remove(namespace, name, gone)
        self._stages[(namespace, name)] = estimated

    def forget(self, namespace: str, name: str) -> None:
        """The experiment was deleted: it is no longer counted and its speed-up series are removed."""
        self._known.pop((namespace, name), None)
        self._count()
        for stage in self._stages.pop((namespace, name), set()):
            self.speedup.remove(namespace, name, stage)

    def _count(self) -> None:
        """`specdecode_experiments` from the known experiments (a phase left by all drops its series)."""
        self.experiments.clear()
        counts: dict[tuple[str, str], int] = {}
        for key in self._known.values():
            counts[key] = counts.get(key, 0) + 1
        for (phase, verdict), count in counts.items():
            self.experiments.labels(phase=phase, verdict=verdict).set(count)
