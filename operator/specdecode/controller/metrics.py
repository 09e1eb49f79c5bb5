"""The operator's own Prometheus metrics: experiments by phase and verdict, and per experiment its
phase, verdict and each stage's speed-up (estimate and bounds), verdict, start and end (#18, #23).

The per-experiment gauges carry `namespace` and `experiment` labels, so a dashboard or an alert
needs nothing but Prometheus (no reading of the status or the results ConfigMaps). Scrape the
operator with `honor_labels: true`: a pod scrape's own `namespace` target label would otherwise
rename the gauges' `namespace` to `exported_namespace`.

Phase and verdicts are one-hot (kube-state-metrics' style): every value of the enum has a series, 1
for the current one and 0 for the others, and no verdict is all zeros. Every series of an
experiment is removed when it is deleted (`forget`), and a series its latest status no longer
holds (a spec edit drops the verdict) is removed at once.
"""

from __future__ import annotations

from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from specdecode.experiment.status import ExperimentStatus, Phase, StageVerdict, Verdict

#: The labels of one series, in the gauge's label order (namespace and experiment first).
Labels = tuple[str, ...]


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
        self.phase = Gauge(
            "specdecode_experiment_phase",
            "1 for the experiment's phase, 0 for the other phases.",
            ["namespace", "experiment", "phase"],
            registry=self.registry,
        )
        self.verdict = Gauge(
            "specdecode_experiment_verdict",
            "1 for the experiment's verdict, 0 for the others (all 0 while it has none).",
            ["namespace", "experiment", "verdict"],
            registry=self.registry,
        )
        self.speedup = Gauge(
            "specdecode_speedup",
            "Primary-metric speed-up estimate of the last verdict, per stage.",
            ["namespace", "experiment", "stage"],
            registry=self.registry,
        )
        self.speedup_ci_low = Gauge(
            "specdecode_speedup_ci_low",
            "Lower confidence bound of the primary-metric speed-up of the last verdict, per stage.",
            ["namespace", "experiment", "stage"],
            registry=self.registry,
        )
        self.speedup_ci_high = Gauge(
            "specdecode_speedup_ci_high",
            "Upper confidence bound of the primary-metric speed-up of the last verdict, per stage.",
            ["namespace", "experiment", "stage"],
            registry=self.registry,
        )
        self.stage_verdict = Gauge(
            "specdecode_stage_verdict",
            "1 for the stage's verdict (Pass, Fail, Inconclusive) in the last verdict, 0 for the others.",
            ["namespace", "experiment", "stage", "verdict"],
            registry=self.registry,
        )
        self.stage_start = Gauge(
            "specdecode_stage_start_time_seconds",
            "When the stage's first request was due (Unix seconds): the dashboard's stage markers.",
            ["namespace", "experiment", "stage"],
            registry=self.registry,
        )
        self.stage_end = Gauge(
            "specdecode_stage_end_time_seconds",
            "When the stage's last response finished (Unix seconds).",
            ["namespace", "experiment", "stage"],
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "specdecode_reconcile_errors",
            "Reconcile ticks that raised (retried by kopf).",
            registry=self.registry,
        )
        self._known: dict[tuple[str, str], tuple[str, str]] = {}
        #: (namespace, name) -> each per-experiment gauge's series of it, removed by `forget`
        self._series: dict[tuple[str, str], dict[Gauge, set[Labels]]] = {}

    def serve(self, port: int) -> None:
        """Expose /metrics on all interfaces."""
        start_http_server(port, registry=self.registry)

    def observe(self, namespace: str, name: str, status: ExperimentStatus) -> None:
        """Record one experiment's latest status."""
        self._known[(namespace, name)] = (status.phase.value, status.verdict.value if status.verdict else "")
        self._count()
        values = self._values(namespace, name, status)
        for gauge, series in values.items():
            for labels, value in series.items():
                gauge.labels(*labels).set(value)
        # A spec edit drops the old verdict from the status: its series go with it.
        for gauge, old in self._series.get((namespace, name), {}).items():
            for labels in old - set(values.get(gauge, {})):
                gauge.remove(*labels)
        self._series[(namespace, name)] = {gauge: set(series) for gauge, series in values.items()}

    def forget(self, namespace: str, name: str) -> None:
        """The experiment was deleted: it is no longer counted and all its series are removed."""
        self._known.pop((namespace, name), None)
        self._count()
        for gauge, old in self._series.pop((namespace, name), {}).items():
            for labels in old:
                gauge.remove(*labels)

    def _values(
        self, namespace: str, name: str, status: ExperimentStatus
    ) -> dict[Gauge, dict[Labels, float]]:
        """Every per-experiment series the status holds, with its value."""
        values: dict[Gauge, dict[Labels, float]] = {
            self.phase: {(namespace, name, p.value): float(p is status.phase) for p in Phase},
            self.verdict: {(namespace, name, v.value): float(v is status.verdict) for v in Verdict},
            self.speedup: {},
            self.speedup_ci_low: {},
            self.speedup_ci_high: {},
            self.stage_verdict: {},
            self.stage_start: {},
            self.stage_end: {},
        }
        for stage in status.stages:
            stage_labels = (namespace, name, stage.name)
            if stage.speedup is not None:
                for gauge, value in (
                    (self.speedup, stage.speedup.estimate),
                    (self.speedup_ci_low, stage.speedup.ci_low),
                    (self.speedup_ci_high, stage.speedup.ci_high),
                ):
                    if value is not None:
                        values[gauge][stage_labels] = value
            for gauge, moment in ((self.stage_start, stage.started_at), (self.stage_end, stage.finished_at)):
                if moment is not None:
                    values[gauge][stage_labels] = datetime.fromisoformat(moment).timestamp()
            if status.verdict is not None:
                for v in StageVerdict:
                    values[self.stage_verdict][(*stage_labels, v.value)] = float(v is stage.verdict)
        return values

    def _count(self) -> None:
        """`specdecode_experiments` from the known experiments (a phase left by all drops its series)."""
        self.experiments.clear()
        counts: dict[tuple[str, str], int] = {}
        for key in self._known.values():
            counts[key] = counts.get(key, 0) + 1
        for (phase, verdict), count in counts.items():
            self.experiments.labels(phase=phase, verdict=verdict).set(count)
