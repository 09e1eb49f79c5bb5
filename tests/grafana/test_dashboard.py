"""deploy/grafana/specdecode.json (#18): a Grafana dashboard templated on a Prometheus data source,
the namespace and the experiment, whose every query selects that one experiment. That the queries
return data is the e2e test's job (tests/e2e/test_experiment.py)."""

from __future__ import annotations

import re

from tests.grafana import dashboard

DOC = dashboard.load()
VARIABLES = {"datasource": "prom", "namespace": "llm", "experiment": "exp"}


def test_the_dashboard_is_templated_on_a_prometheus_data_source_a_namespace_and_an_experiment() -> None:
    templating = {v["name"]: v for v in DOC["templating"]["list"]}
    assert list(templating) == ["datasource", "namespace", "experiment"]
    assert templating["datasource"]["type"] == "datasource"
    assert templating["datasource"]["query"] == "prometheus"
    for name in ("namespace", "experiment"):
        assert templating[name]["type"] == "query"
        assert templating[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert "label_values(specdecode_experiment_phase" in templating[name]["query"]["query"]
    assert '{namespace="$namespace"}' in templating["experiment"]["query"]["query"]
    assert DOC["uid"] and DOC["title"] and isinstance(DOC["schemaVersion"], int)


def test_every_panel_has_a_unique_id_a_place_and_prometheus_targets_with_unique_ref_ids() -> None:
    ids = [panel["id"] for panel in DOC["panels"]]
    assert len(ids) == len(set(ids))
    for panel in DOC["panels"]:
        where = panel["title"]
        assert panel["type"] in {"stat", "bargauge", "timeseries", "table"}, where
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert (
            set(panel["gridPos"]) == {"x", "y", "w", "h"}
            and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        )
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert ref_ids and len(ref_ids) == len(set(ref_ids)), where
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], where
            assert target["expr"].strip() and "legendFormat" in target, where


def test_every_query_selects_the_chosen_experiment_and_leaves_no_variable_unsubstituted() -> None:
    for where, expr in dashboard.queries(DOC):
        # each selector names the namespace and the experiment: the arms' target labels or the operator's
        for selector in re.findall(r"\{[^{}]*\}", expr):
            if "$" in selector or selector.startswith("{{"):
                assert 'namespace="$namespace"' in selector, (where, selector)
                assert re.search(r'(specdecode_io_)?experiment="\$experiment"', selector), (where, selector)
        assert "$" not in dashboard.substitute(expr, VARIABLES), where


def test_the_dashboard_covers_latency_and_acceptance_per_arm_and_position_and_the_operator_s_gauges() -> None:
    exprs = " ".join(expr for _, expr in dashboard.queries(DOC))
    for metric in (
        "vllm:request_time_per_output_token_seconds_bucket",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        "specdecode_experiment_phase",
        "specdecode_experiment_verdict",
        "specdecode_stage_verdict",
        "specdecode_speedup",
        "specdecode_speedup_ci_low",
        "specdecode_speedup_ci_high",
        "specdecode_stage_start_time_seconds",
        "specdecode_stage_end_time_seconds",
    ):
        assert metric in exprs, metric
    assert "by (specdecode_io_arm" in exprs and "by (position)" in exprs


def test_substitution_replaces_both_spellings_and_grafana_s_interval_variables() -> None:
    assert (
        dashboard.substitute('rate(x{a="$namespace",b="${experiment}"}[$__rate_interval])', VARIABLES)
        == 'rate(x{a="llm",b="exp"}[5s])'
    )


def test_stage_markers_are_annotations_at_the_time_the_operator_exports_in_milliseconds() -> None:
    markers = [a for a in DOC["annotations"]["list"] if "specdecode_stage_" in a.get("expr", "")]
    assert {a["name"] for a in markers} == {"Stage starts", "Stage ends"}
    for a in markers:
        # Grafana reads the value as the annotation's time, in milliseconds
        assert a["useValueForTime"] is True and a["expr"].endswith("* 1000"), a["name"]
        assert a["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
