from __future__ import annotations

from datetime import timedelta

from specdecode.controller.settings import OperatorSettings


def test_settings_come_from_the_environment() -> None:
    settings = OperatorSettings.from_env(
        {
            "SPECDECODE_OPERATOR_IMAGE": "registry.local/specdecode:1",
            "SPECDECODE_PROMETHEUS_URL": "http://prom:9090",
            "SPECDECODE_INTERVAL": "1",
            "SPECDECODE_UNSCHEDULABLE_GRACE": "5",
            "SPECDECODE_PROMETHEUS_POD_LABELS": "app=prometheus, team=obs",
        }
    )
    assert settings.render.operator_image == "registry.local/specdecode:1"
    assert settings.prometheus_url == "http://prom:9090"
    assert settings.interval == 1.0
    assert settings.timing.unschedulable_grace == timedelta(seconds=5)
    assert settings.render.prometheus_pod_labels == {"app": "prometheus", "team": "obs"}


def test_defaults_work_without_any_variable() -> None:
    settings = OperatorSettings.from_env({})
    assert settings.prometheus_url is None
    assert settings.label_names.experiment == "specdecode_io_experiment"
