"""The chart's monitoring kit against the components' real metrics: every metric the Grafana
dashboard and the alert rules query is one the runtime or the operator exports, and every label
they group by is one the ServiceMonitor puts on the runtime's targets."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.packaging_support import CHART, one, template

from mmprep_operator import api
from mmprep_operator.api.autoscaling import SIGNALS
from mmprep_operator.control.leadership import LeaderMetrics
from mmprep_operator.control.metrics import Metrics as OperatorMetrics
from mmprep_operator.logic import autoscaling, identity
from mmprep_runtime.server.metrics import Metrics as RuntimeMetrics

ENABLED = {"grafanaDashboard": {"enabled": True}, "prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True}}
#: Prometheus' own series: a target's health.
PROMETHEUS_SERIES = {"up"}
#: A series name in PromQL: not a recording rule's (those have colons), not a label in `{...}`/`by`.
SERIES = re.compile(r"(?<![:\w])(mmprep_[a-z_]+|up)\b(?!:)")


def _sample_names(text: str) -> set[str]:
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def _exported() -> set[str]:
    runtime = RuntimeMetrics()
    runtime.bind_live(in_flight=lambda: 0, queue_depth=lambda: 0, busy=lambda: 0, workers=2, busy_seconds=lambda: 0.0)
    runtime.queue_wait(0.01)
    runtime.answered("ok", 0.01)
    runtime.describe_engine(
        {
            "workers": {"processor": 2, "io": 2, "reason": "CPUPathDefault"},
            "clone_seconds": 0.1, "cloneable": True, "intra_op_threads": 1, "model": "m", "pool": "cpu",
            "processor_class": "Qwen2VLProcessor", "path": "cpu", "device": "cpu",
        }
    )  # fmt: skip
    operator = OperatorMetrics()
    operator.duration.observe(0.1)
    LeaderMetrics(operator.registry)  # registered by `mmprep-operator run --leader-election`
    return _sample_names(runtime.render().decode()) | _sample_names(generate_latest(operator.registry).decode())


def _target_labels(rendered: list[dict]) -> set[str]:
    monitor = next(m for m in rendered if m["kind"] == "ServiceMonitor" and m["metadata"]["name"].endswith("-runtime"))
    return {re.sub(r"[^a-zA-Z0-9_]", "_", label) for label in monitor["spec"]["podTargetLabels"]}


def _queries(rendered: list[dict]) -> list[str]:
    dashboard = json.loads(one(rendered, "ConfigMap", "-dashboard")["data"]["mmprep-pools.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    rule = one(rendered, "PrometheusRule")
    exprs += [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    return exprs


def test_every_metric_the_dashboard_and_the_alerts_query_is_exported() -> None:
    rendered = template(ENABLED)
    labels = _target_labels(rendered)
    names = {n for e in _queries(rendered) for n in SERIES.findall(e)}
    assert {"mmprep_requests_total", "mmprep_operator_reconciles_total", "up"} <= names, names
    grouped = {n for n in names if n.startswith("mmprep_dev_")}
    assert grouped <= labels, f"labels the ServiceMonitor does not add: {grouped - labels}"
    missing = names - grouped - _exported() - PROMETHEUS_SERIES
    assert not missing, f"queried but exported by no component: {missing}"


@pytest.mark.parametrize("signal", [s for s in SIGNALS if s != "cpu"])
def test_every_metric_a_keda_trigger_queries_is_exported_under_the_servicemonitors_labels(signal: str) -> None:
    owner = identity.Owner(name="m", namespace="ns", uid="u")
    section = api.Autoscaling(maxReplicas=2, signal=signal, prometheus=api.Prometheus(serverAddress="http://p:9090"))
    (scaling,) = autoscaling.pool_scaling(owner, section, ["cpu"], autoscaling.ASSUMED).values()
    query = autoscaling.scaled_object_manifest(owner, section, scaling)["spec"]["triggers"][0]["metadata"]["query"]
    names = set(SERIES.findall(query))
    grouped = {n for n in names if n.startswith("mmprep_dev_")}
    # Selected by pool: without both labels the query would sum every pool's (or resource's) pods.
    assert grouped == {"mmprep_dev_resource", "mmprep_dev_pool"} and grouped <= _target_labels(template(ENABLED))
    assert names - grouped and not (names - grouped - _exported()), f"queried but not exported: {names - grouped - _exported()}"


def test_a_misspelled_metric_would_be_caught() -> None:
    names = set(SERIES.findall("rate(mmprep_request_total[5m])"))
    assert names - _exported() == {"mmprep_request_total"}


def test_the_dashboard_covers_each_pool_and_the_operator() -> None:
    dashboard = json.loads((CHART / "files" / "grafana-dashboard.json").read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"]), "panel ids repeat"
    text = json.dumps(panels)
    for metric in (
        "mmprep_requests_total", "mmprep_request_seconds_bucket", "mmprep_worker_busy_seconds_total",
        "mmprep_queue_wait_seconds_bucket", "mmprep_ready", "mmprep_runtime_info", "mmprep_operator_reconciles_total",
    ):  # fmt: skip
        assert metric in text, f"no panel shows {metric}"
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "namespace", "resource", "pool"}


def test_the_dashboard_configmap_carries_the_sidecars_label_and_is_off_by_default() -> None:
    config_map = one(template({"grafanaDashboard": {"enabled": True, "namespace": "monitoring"}}), "ConfigMap", "-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert not [o for o in template() if o["metadata"]["name"].endswith("-dashboard")]


def test_the_operator_alerts_exist_with_their_values() -> None:
    values = {"prometheusRule": {"enabled": True, "operator": {"downFor": "2m", "severity": "critical"}}}
    rule = one(template(values), "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert {"MmprepOperatorDown", "MmprepOperatorNoLeader", "MmprepOperatorReconcileErrors", "MmprepResourcesNotReady"} <= set(
        alerts
    )
    assert alerts["MmprepOperatorDown"]["for"] == "2m"
    assert alerts["MmprepOperatorDown"]["labels"]["severity"] == "critical"
    assert yaml.safe_dump(alerts)  # renders as plain YAML
