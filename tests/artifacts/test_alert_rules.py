"""The PrometheusRule `temper export-triton` writes from a capacity measurement, run by Prometheus itself (Debian's
2.42, tests/tools/prometheus.sh): promtool parses every expression, its rule tests show each alert firing just over
its measured threshold (after its `for`) and silent just under it, and a real Prometheus scraping a real `temper
serve` under load finds the series each expression reads, with the rates the client sent."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.artifacts.servers import Client, _free_port, _inputs, _json_request, _temper_serve
from tests.artifacts.test_triton_capacity import _bundle, _exported, _measured
from tests.helpers import REPO

STEPS = 15  # minutes of input series: past every alert's `for: 5m` and its rate()'s 5-minute window


@pytest.fixture(scope="module")
def prometheus() -> Path:
    """The folder holding prometheus and promtool (installed now if `make test` did not do it already)."""
    setup = subprocess.run(["bash", str(REPO / "tests/tools/prometheus.sh")], capture_output=True, text=True,
                           timeout=600)
    if setup.returncode != 0:
        pytest.fail(f"Prometheus could not be installed (tests/tools/prometheus.sh): {setup.stderr.strip()}")
    return Path(setup.stdout.strip().splitlines()[-1])


@pytest.fixture
def exported(temper, tmp_path: Path) -> tuple[dict, Path]:
    """The exported rules as a Prometheus rule file (the PrometheusRule's spec is one), and the bundle measured."""
    source = _bundle(tmp_path / "cpu", "cpu", threads=1)
    _measured(source)  # rate 390 req/s per replica, target 50 ms, 900 us queued at the knee, 300 MiB
    _, documents = _exported(temper, source, tmp_path)
    spec = documents["prometheusrule.yaml"]["spec"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    return spec, source


def _rules(spec: dict) -> dict[str, dict]:
    return {r["alert"]: r for g in spec["groups"] for r in g["rules"]}


def test_promtool_parses_every_rule(prometheus: Path, exported, tmp_path: Path) -> None:
    checked = subprocess.run([prometheus / "promtool", "check", "rules", tmp_path / "rules.yaml"],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 5 rules found" in checked.stdout, checked.stdout


def _counter(per_s: float) -> str:
    """A counter rising `per_s` a second, one sample a minute, in promtool's series notation."""
    return f"0+{per_s * 60:g}x{STEPS}"


def _scenario(name: str, series: dict[str, str], fires: set[str], rules: dict[str, dict]) -> dict:
    """One promtool rule test: the input series, and at the end which alerts fire (every other alert: none)."""
    return {"name": name, "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in series.items()],
            "alert_rule_test": [{"eval_time": f"{STEPS}m", "alertname": alert,
                                 "exp_alerts": [{"exp_labels": rules[alert]["labels"],
                                                 "exp_annotations": rules[alert]["annotations"]}]
                                 if alert in fires else []} for alert in sorted(rules)]}


def test_each_alert_fires_just_over_its_measured_threshold_and_not_under(prometheus: Path, exported,
                                                                         tmp_path: Path) -> None:
    """Two replicas (the throughput alerts are per replica), at 1.1x and 0.9x each threshold of capacity.json:
    390 req/s with p99 under 50 ms, 900 us queued at the knee, 300 MiB (a request of 375 MiB)."""
    spec, _ = exported
    rules = _rules(spec)
    near = 390 * 0.95

    def load(per_replica: float, queue_us: float = 0.0, failed: float = 0.0, p99_us: float = 1000.0,
             memory: float = 0.0) -> dict[str, str]:
        series = {}
        for pod in ("tiny-a", "tiny-b"):
            labels = f'model="tiny",version="1",pod="{pod}"'
            series |= {f"nv_inference_request_success{{{labels}}}": _counter(per_replica),
                       f"nv_inference_queue_duration_us{{{labels}}}": _counter(per_replica * queue_us),
                       f'nv_inference_request_failure{{{labels},reason="BACKEND"}}': _counter(failed),
                       f"nv_inference_pending_request_count{{{labels}}}": f"1x{STEPS}",
                       f'nv_inference_request_summary_us{{{labels},quantile="0.99"}}': f"{p99_us:g}x{STEPS}",
                       f'container_memory_working_set_bytes{{container="tritonserver",pod="{pod}-7d9f"}}':
                           f"{memory * 375 * 2**20:g}x{STEPS}"}
        return series

    tests = [
        _scenario("quiet", load(near * 0.9, queue_us=900 * 0.9), set(), rules),
        _scenario("near capacity", load(near * 1.1), {"TritonThroughputNearCapacity"}, rules),
        _scenario("under capacity, queueing", load(near * 0.9, queue_us=900 * 1.1),
                  {"TritonThroughputUnderCapacity"}, rules),
        _scenario("p99 over 80% of the target", load(100, p99_us=40_000 * 1.1), {"TritonLatencyP99"}, rules),
        _scenario("p99 under it", load(100, p99_us=40_000 * 0.9), set(), rules),
        _scenario("errors over 1%", load(100, failed=100 * 0.011), {"TritonErrorRate"}, rules),
        _scenario("errors under 1%", load(100, failed=100 * 0.009), set(), rules),
        _scenario("memory over 90% of the request", load(100, memory=0.95), {"TritonMemoryHigh"}, rules),
        _scenario("memory under it", load(100, memory=0.85), set(), rules),
    ]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
                                                         "tests": tests}))
    ran = subprocess.run([prometheus / "promtool", "test", "rules", "tests.yaml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "SUCCESS" in ran.stdout, ran.stdout


@contextlib.contextmanager
def _scraping(prometheus: Path, target_port: int, folder: Path) -> Iterator[str]:
    """A real Prometheus scraping `temper serve`'s /metrics every 0.5 s: its HTTP API's address."""
    port = _free_port()
    config = {"global": {"scrape_interval": "500ms", "evaluation_interval": "500ms"},
              "scrape_configs": [{"job_name": "temper", "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}]}]}
    (folder / "prometheus.yaml").write_text(yaml.safe_dump(config))
    process = subprocess.Popen([prometheus / "prometheus", f"--config.file={folder / 'prometheus.yaml'}",
                                f"--storage.tsdb.path={folder / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "HOME": str(folder)})
    try:
        api = f"http://127.0.0.1:{port}/api/v1"
        for _ in range(100):
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1) as answer:
                    if answer.status == 200:
                        break
            time.sleep(0.1)
        yield api
    finally:
        process.terminate()
        process.wait(timeout=30)


def _query(api: str, expr: str, at: float) -> list[float]:
    """The expression's values at the instant `at` (one instant for every query: rate() extrapolates to it)."""
    query = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
    try:
        with urllib.request.urlopen(f"{api}/query?{query}", timeout=10) as answer:
            body = json.loads(answer.read())
    except urllib.error.HTTPError as exc:  # a query Prometheus refuses: say which, and why
        raise AssertionError(f"{expr}: {exc.read().decode()}") from None
    assert body["status"] == "success", body
    return [float(r["value"][1]) for r in body["data"]["result"]]


def test_a_real_prometheus_finds_what_each_rule_reads_on_temper_serve(prometheus: Path, exported,
                                                                      tmp_path: Path) -> None:
    """temper serve exports Triton's names and labels, so the throughput, queue and error expressions read its
    series as they would Triton's: one series each, the counters at what the client sent, the error ratio at the
    share of requests that failed. The p99 and memory alerts read Triton's latency summary and the kubelet's
    cAdvisor series, which temper serve does not export: empty here, by design."""
    spec, source = exported
    rules = _rules(spec)
    good, bad = _json_request(_inputs(0)), {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32",
                                                        "data": [0.0, 0.0, 0.0]}]}
    with _temper_serve(str(source), args=("--instances", "0")) as (port, _), \
            _scraping(prometheus, port, tmp_path) as api:
        client = Client(port)
        began, sent, failed = time.monotonic(), 0, 0
        while time.monotonic() - began < 6:
            assert client.infer(good, model="tiny")[0] == 200
            sent += 1
            if sent % 20 == 0:
                assert client.infer(bad, model="tiny")[0] == 400
                failed += 1
            time.sleep(0.01)
        time.sleep(1.5)  # the last scrape after the load
        client.close()
        at = time.time()
        sides = {alert: rule["expr"].rsplit(" > ", 1)[0] for alert, rule in rules.items()}
        per_replica = _query(api, sides["TritonThroughputNearCapacity"], at)
        queued = rules["TritonThroughputUnderCapacity"]["expr"].split(" and ")[1]  # (QUEUE_US > KNEE)
        queue_us = _query(api, queued[1:-1].rsplit(" > ", 1)[0], at)
        errors = _query(api, sides["TritonErrorRate"], at)
        fired = {alert: _query(api, rule["expr"], at) for alert, rule in rules.items()}
        answered = _query(api, 'nv_inference_request_success{model="tiny"}', at)
        replicas = _query(api, 'count(nv_inference_pending_request_count{model="tiny"})', at)
        p99, memory = _query(api, sides["TritonLatencyP99"], at), _query(api, sides["TritonMemoryHigh"], at)
    assert answered == [sent] and replicas == [1.0]  # the counter the rules read, and one replica counted
    assert len(per_replica) == 1 and per_replica[0] > 0  # (its value needs rate()'s whole 5 minutes of samples)
    assert len(queue_us) == 1 and queue_us[0] >= 0
    # a ratio of two rates over the same window: what the client saw, within a scrape's worth of requests
    assert len(errors) == 1 and np.isclose(errors[0], failed / (sent + failed), rtol=0.25), (errors, failed, sent)
    assert fired["TritonErrorRate"] == errors  # 1 in 21 failed: over the 1% the rule allows
    assert fired["TritonThroughputNearCapacity"] == []  # well under the 390 req/s measured
    assert p99 == [] and memory == []
