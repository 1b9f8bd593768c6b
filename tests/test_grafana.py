"""The Grafana dashboard (grafana/diagtrain-live.json, issue 52) queries only what `--metrics-port` serves: every
metric name and every label it selects, groups by or shows, checked against a real scrape of the endpoint's
collector (prometheus-client's own text exposition) filled with every column a rank's step record can carry."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from diagtrain.profiler.collect.metrics import MEMORY, RANK_GAUGES, LiveMetrics

DASHBOARD = Path(__file__).resolve().parents[1] / "grafana" / "diagtrain-live.json"
PROMETHEUS_LABELS = {"instance", "job"}  # what Prometheus adds to every scraped series
METRIC = re.compile(r"\b(diagtrain_[a-z_]+)\b")
SELECTOR = re.compile(r"\b(diagtrain_[a-z_]+)\{([^}]*)\}")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def served() -> dict[str, set[str]]:
    """Metric name -> the labels its samples carry, from one scrape of a filled endpoint."""
    metrics = LiveMetrics()
    row = {column: 12.5 for _, _, column, _ in RANK_GAUGES} | {column: 2.0**30 for column in MEMORY.values()}
    metrics.update({0: row, 1: row}, [{"kind": "straggler", "severity": "warning"},
                                      {"kind": "dataloader_stall", "severity": "info"}],
                   {"startup": 3.0, "compute": 4.0, "data": 2.0})
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


def queries() -> list[tuple[str, str, str]]:
    """(panel title, expression, legend format) of every query the dashboard makes."""
    doc = json.loads(DASHBOARD.read_text())
    found = [(p["title"], t["expr"], t.get("legendFormat", "")) for p in doc["panels"] for t in p.get("targets", [])]
    found += [("variable " + v["name"], v["query"]["query"], "") for v in doc["templating"]["list"]
              if isinstance(v.get("query"), dict)]
    return found


def test_every_metric_and_label_the_dashboard_queries_is_served():
    have = served()
    assert len(queries()) >= 12
    for title, expr, legend in queries():
        names = set(METRIC.findall(expr))
        assert names, f"{title}: {expr} queries no diagtrain metric"
        missing = names - set(have)
        assert not missing, f"{title}: {sorted(missing)} not served (served: {sorted(have)})"
        for name, matchers in SELECTOR.findall(expr):
            labels = {m.split("=")[0].rstrip("!~").strip() for m in matchers.split(",") if m.strip()}
            assert labels <= have[name] | PROMETHEUS_LABELS, f"{title}: {name} has no label {labels - have[name]}"
        used = {label.strip() for group in GROUPING.findall(expr) for label in group.split(",") if label.strip()}
        used |= set(LEGEND.findall(legend))
        carried = set.intersection(*(have[n] for n in names)) | PROMETHEUS_LABELS
        assert used <= carried, f"{title}: labels {sorted(used - carried)} are on none of {sorted(names)}"


def test_every_served_metric_has_a_panel():
    shown = {name for _, expr, _ in queries() for name in METRIC.findall(expr)}
    assert set(served()) <= shown, f"served but on no panel: {sorted(set(served()) - shown)}"


def test_the_check_catches_a_query_of_something_not_served():
    have = served()
    assert "diagtrain_step_seconds" in have and "rank" in have["diagtrain_step_seconds"]
    assert "diagtrain_step_second" not in have  # a typo in a panel would fail the first test
    assert "kind" not in have["diagtrain_step_seconds"]  # so would a label the metric does not carry
