"""The Grafana dashboards in infra/grafana/: generated, and in agreement with the metrics.

- The committed JSON is exactly what infra/grafana/build_dashboards.py writes.
- Every metric a panel queries is one `gravityocr.metrics` defines (under its exported
  name) or one Ray exports itself (listed, with where Ray defines or documents it); every
  metric the code defines is on some panel.
- Every query is valid PromQL (promtool, from Debian's `prometheus` package).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gravityocr import metrics

REPO = Path(__file__).resolve().parents[1]
BUILDER = REPO / "infra" / "grafana" / "build_dashboards.py"


def _builder():
    spec = importlib.util.spec_from_file_location("build_dashboards", BUILDER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def builder():
    return _builder()


@pytest.fixture(scope="module")
def dashboards(builder) -> dict[str, dict]:
    return {name: json.loads((builder.OUT_DIR / name).read_text()) for name in builder.DASHBOARDS}


def panel_queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of every panel."""
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel.get("targets", [])]


_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
             "group_right", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names in a PromQL expression (no functions, labels, keywords)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', "", expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)  # label lists
    names = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
        token, rest = match.group(), expr[match.end():].lstrip()
        if rest.startswith("(") or token.lower() in _KEYWORDS:
            continue
        names.add(token)
    return names


def test_metric_name_extraction():
    expr = ('histogram_quantile(0.5, sum by (le, content_type) '
            '(rate(ray_x_bucket{a="b(c)", d=~"e|f"}[$__rate_interval])))'
            ' / on() (sum(autoscaler_y) or vector(0)) > bool 1')
    assert metric_names(expr) == {"ray_x_bucket", "autoscaler_y"}


def test_committed_json_is_what_the_builder_writes(builder):
    for name, text in builder.render().items():
        path = builder.OUT_DIR / name
        assert path.exists(), f"{name} not committed: run python infra/grafana/build_dashboards.py"
        assert path.read_text() == text, f"{name} is stale: run python infra/grafana/build_dashboards.py"
    assert sorted(p.name for p in builder.OUT_DIR.glob("*.json")) == sorted(builder.DASHBOARDS)


def _code_metric(name: str) -> str | None:
    """The exported name of ours that `name` is a series of, if any."""
    exported = metrics.prometheus_names()
    if name in exported:
        return name
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    if base in exported and exported[base].kind == "histogram":
        return base
    return None


def test_every_queried_metric_exists(builder, dashboards):
    unknown = []
    for file, dashboard in dashboards.items():
        for title, expr in panel_queries(dashboard):
            for name in metric_names(expr):
                if _code_metric(name) is None and name not in builder.RAY_METRICS:
                    unknown.append(f"{file} / {title}: {name}")
    assert not unknown, "queried metrics that neither gravityocr.metrics nor Ray define:\n" + "\n".join(unknown)


def test_every_code_metric_is_on_a_panel(dashboards):
    queried = {_code_metric(name) for d in dashboards.values() for _, expr in panel_queries(d)
               for name in metric_names(expr)}
    missing = set(metrics.prometheus_names()) - queried
    assert not missing, f"metrics defined in gravityocr/metrics.py but on no panel: {sorted(missing)}"


def test_every_listed_ray_metric_is_used_and_real(builder, dashboards):
    """Each Ray metric the dashboards use is listed with its source: a Ray documentation
    page, or a file of Ray's that defines it, which must define it in the installed Ray."""
    import ray

    queried = {name for d in dashboards.values() for _, expr in panel_queries(d) for name in metric_names(expr)}
    assert set(builder.RAY_METRICS) <= queried, f"listed but unused: {set(builder.RAY_METRICS) - queried}"
    ray_root = Path(ray.__file__).parent
    for name, source in builder.RAY_METRICS.items():
        if source.startswith("https://docs.ray.io/"):
            continue
        assert source.startswith("python/ray/"), source
        defined_in = (ray_root / source.removeprefix("python/ray/")).read_text()
        base = re.sub(r"^(ray_|autoscaler_)", "", re.sub(r"_total$", "", name))
        assert f'"{base}"' in defined_in, f"{name}: {source} does not define {base!r} in Ray {ray.__version__}"


def test_panels_are_well_formed(dashboards):
    for file, dashboard in dashboards.items():
        ids = [panel["id"] for panel in dashboard["panels"]]
        assert len(ids) == len(set(ids)), file
        assert dashboard["uid"] == file.removesuffix(".json")
        assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]
        for panel in dashboard["panels"]:
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert panel["targets"] and panel.get("description"), panel["title"]
            assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"]), panel["title"]


def test_every_query_is_valid_promql(dashboards, tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: install Debian's `prometheus` package (apt-get install prometheus)")
    rules = [{"record": f"gravityocr:panel_{i}", "expr": expr.replace("$__rate_interval", "1m")}
             for i, (_, expr) in enumerate(q for d in dashboards.values() for q in panel_queries(d))]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(rules)} rules found" in result.stdout
