"""What `temper export-triton` does with what was gated and measured: the instance kind and the pod's resources from
runtime.json's engine row (a model gated on the CPU asks for no GPU), and, from a bundle's capacity.json, the
batching and instance count in config.pbtxt, the PrometheusRule of the design's four signals and the
HorizontalPodAutoscaler, each valid against its vendored published schema (schemas/README.md) with thresholds that
are the measured figures."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
import yaml
from google.protobuf import text_format
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from tritonclient.grpc import model_config_pb2

from temper.artifacts.core.host import profile
from temper.artifacts.engines.onnxruntime import SessionSettings
from temper.artifacts.formats import bundle, capacity
from tests.artifacts.servers import _tiny_model
from tests.artifacts.test_triton_cluster import SCHEMAS, _container, _structural, invalid

MIB = 2**20


@cache
def _validators() -> dict[str, Draft202012Validator]:
    kubernetes = [json.loads((SCHEMAS / "kubernetes-v1.34.0" / name).read_text())
                  for name in ("horizontalpodautoscaler-autoscaling-v2.json", "_definitions.json")]
    registry: Registry = Registry().with_resources((s["$id"], Resource.from_contents(s)) for s in kubernetes)
    rule = _structural(json.loads((SCHEMAS / "prometheus-operator-v0.82.2" / "prometheusrule-v1.json").read_text()))
    assert isinstance(rule, dict)
    rule["properties"]["metadata"] = {"$ref": "https://kubernetes.io/api/_definitions.json#/$defs/"
                                              "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    return {"HorizontalPodAutoscaler": Draft202012Validator(kubernetes[0], registry=registry),
            "PrometheusRule": Draft202012Validator(rule, registry=registry)}


def _invalid(document: dict) -> list[str]:
    if document["kind"] not in ("HorizontalPodAutoscaler", "PrometheusRule"):
        return invalid(document)
    errors = _validators()[document["kind"]].iter_errors(document)
    return sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


def _bundle(folder: Path, engine: str | None, threads: int = 2) -> Path:
    model = _tiny_model(folder.parent / f"{folder.name}.onnx")
    config = bundle.config_for(model, "tiny", engine=engine, session=SessionSettings(intra_op_threads=threads))
    return bundle.write(folder, model, config)


def _measured(folder: Path) -> capacity.Capacity:
    """A capacity record as `temper capacity` writes it (its measuring is tested in tests/pipeline/)."""
    chosen = capacity.Choice(max_batch_size=8, max_delay_ms=2.5, instances=2)
    point = capacity.Point(choice=chosen, rate=400.0, sent=398.0, answered=399.0, p50_ms=3.0, p99_ms=41.0,
                           mean_ms=4.0, requests=1200, errors=0, queue_us=900.0, memory_bytes=300 * MIB, under=True)
    record = capacity.Capacity(target_p99_ms=50.0, chosen=chosen, rate=390.0, knees=[400.0, 380.0, 390.0],
                               interval=(365.2, 414.8), p99_ms=41.0, queue_us=900.0, in_flight=1.6, queued=0.36,
                               memory_bytes=300 * MIB, protocol="http", tool="perf_analyzer 2.47.0",
                               measured_on=profile(), measured_at="2026-12-04T00:00:00+00:00", points=[point])
    capacity.write(folder, record)
    return record


def _exported(temper, source: Path, tmp_path: Path, *flags: str) -> tuple[model_config_pb2.ModelConfig, dict]:
    result = temper("export-triton", source, "--dest", tmp_path / "repo", *flags)
    assert result.code == 0, result.stderr
    config = text_format.Parse((tmp_path / "repo" / "tiny" / "config.pbtxt").read_text(),
                               model_config_pb2.ModelConfig())
    documents = {p.name: yaml.safe_load(p.read_text()) for p in (tmp_path / "repo-kubernetes" / "tiny").glob("*.yaml")}
    for document in documents.values():
        assert _invalid(document) == [], document["kind"]
    return config, documents


def test_a_model_gated_on_the_cpu_asks_for_no_gpu_and_for_its_cores(temper, tmp_path: Path) -> None:
    config, documents = _exported(temper, _bundle(tmp_path / "cpu", "cpu", threads=2), tmp_path)
    assert [(g.kind, g.count) for g in config.instance_group] == [(model_config_pb2.ModelInstanceGroup.KIND_CPU, 1)]
    resources = _container(documents["deployment.yaml"])["resources"]
    assert resources == {"requests": {"cpu": "2"}}  # 1 instance x 2 threads; no GPU; no memory measured
    assert documents["inferenceservice.yaml"]["spec"]["predictor"]["model"]["resources"] == resources
    assert "prometheusrule.yaml" not in documents and "hpa.yaml" not in documents


def test_a_model_gated_on_a_gpu_asks_for_one(temper, tmp_path: Path) -> None:
    config, documents = _exported(temper, _bundle(tmp_path / "gpu", "cuda"), tmp_path)
    assert [g.kind for g in config.instance_group] == [model_config_pb2.ModelInstanceGroup.KIND_GPU]
    assert _container(documents["deployment.yaml"])["resources"] == {"requests": {"cpu": "1"},
                                                                     "limits": {"nvidia.com/gpu": "1"}}


def test_the_capacity_measured_sets_batching_instances_resources_alerts_and_autoscaler(temper, tmp_path: Path) -> None:
    source = _bundle(tmp_path / "cpu", "cpu", threads=1)
    measured = _measured(source)
    config, documents = _exported(temper, source, tmp_path)

    assert config.max_batch_size == 8 and config.dynamic_batching.max_queue_delay_microseconds == 2500
    assert [(g.kind, g.count) for g in config.instance_group] == [(model_config_pb2.ModelInstanceGroup.KIND_CPU, 2)]
    copied = tmp_path / "repo" / "tiny" / "1" / capacity.CAPACITY
    assert copied.read_text() == (source / capacity.CAPACITY).read_text()
    memory = -(-300 * 125 // 100)  # MiB: the knee's 300 MiB with 25% headroom
    assert _container(documents["deployment.yaml"])["resources"] == {
        "requests": {"cpu": "2", "memory": f"{memory}Mi"}, "limits": {"memory": f"{2 * memory}Mi"}}

    hpa = documents["hpa.yaml"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "tiny"}
    pods, resource = hpa["metrics"]
    assert pods["pods"]["metric"]["name"] == "nv_inference_pending_request_count"
    assert pods["pods"]["target"] == {"type": "AverageValue", "averageValue": "360m"}  # queued at the knee: 0.36
    assert resource["resource"] == {"name": "memory", "target": {"type": "Utilization", "averageUtilization": 90}}

    alerts = {r["alert"]: r["expr"] for g in documents["prometheusrule.yaml"]["spec"]["groups"] for r in g["rules"]}
    assert sorted(alerts) == ["TritonErrorRate", "TritonLatencyP99", "TritonMemoryHigh", "TritonThroughputNearCapacity",
                              "TritonThroughputUnderCapacity"]
    near = measured.rate * 0.95
    assert alerts["TritonThroughputNearCapacity"].endswith(f"> {near:g}")
    assert f"< {near:g}" in alerts["TritonThroughputUnderCapacity"] and "> 900.0" in alerts[
        "TritonThroughputUnderCapacity"]
    assert alerts["TritonLatencyP99"].endswith("> 40000.0")  # 80% of the 50 ms target, in microseconds
    assert 'quantile="0.99"' in alerts["TritonLatencyP99"]
    assert f"/ {memory * MIB} > 0.9" in alerts["TritonMemoryHigh"]
    assert alerts["TritonErrorRate"].endswith("> 0.01")
    args = _container(documents["deployment.yaml"])["args"]
    assert "--metrics-config=summary_latencies=true" in args  # the p99 alert's series


@pytest.mark.parametrize("breakage", ["rule without expr", "bad duration", "hpa without max"])
def test_the_vendored_schemas_refuse_broken_alerts_and_autoscalers(temper, tmp_path: Path, breakage: str) -> None:
    source = _bundle(tmp_path / "cpu", "cpu")
    _measured(source)
    _, documents = _exported(temper, source, tmp_path)
    rule, hpa = documents["prometheusrule.yaml"], documents["hpa.yaml"]
    first = rule["spec"]["groups"][0]["rules"][0]
    if breakage == "rule without expr":
        first.pop("expr")
    elif breakage == "bad duration":
        first["for"] = "five minutes"
    else:
        hpa["spec"].pop("maxReplicas")
    assert _invalid(rule) != [] or _invalid(hpa) != []


def test_temper_serve_runs_the_measured_configuration(tmp_path: Path) -> None:
    from temper.artifacts.serving.runtime import Runtime

    source = _bundle(tmp_path / "cpu", "cpu", threads=1)
    _measured(source)
    runtime = Runtime(source, instances=None)
    assert (runtime.config.max_batch_size, runtime.config.max_delay_ms, runtime.instances) == (8, 2.5, 2)
    assert Runtime(source, instances=0).instances == 0  # a flag still wins
