"""The Kubernetes Deployment, Service and KServe InferenceService `temper export-triton` writes beside a
Triton repository: valid against the published schemas of those resources (vendored in schemas/, see its
README), and running Triton the way the cluster needs (flags, probes, ports, storage), field by field."""

from __future__ import annotations

import json
import re
import shutil
from functools import cache
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from temper.artifacts.formats import bundle
from temper.artifacts.triton.cluster import (
    IMAGE,
    BadSetting,
    Cluster,
    manifests,
    resource_name,
    write_manifests,
)
from tests.artifacts.servers import MODEL
from tests.artifacts.test_server_cli import _run_output

SCHEMAS = Path(__file__).parent / "schemas"
OBJECT_META = "https://kubernetes.io/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # KServe's InferenceService name rule
SERVING = {"max_batch_size": 4, "max_delay_ms": 2.0, "pad": {"x": 0}}


def _structural(node: object) -> object:
    """A CRD's openAPIV3Schema as the API server applies it under strict field validation: an object
    that names its properties takes no others unless it says x-kubernetes-preserve-unknown-fields."""
    if isinstance(node, list):
        return [_structural(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: ({name: _structural(schema) for name, schema in value.items()} if key == "properties"
                 else _structural(value)) for key, value in node.items()}
    closed = "properties" in out and "additionalProperties" not in out
    if closed and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@cache
def _validators() -> dict[str, Draft202012Validator]:
    kubernetes = [json.loads((SCHEMAS / "kubernetes-v1.34.0" / name).read_text())
                  for name in ("deployment-apps-v1.json", "service-v1.json", "_definitions.json")]
    registry: Registry = Registry().with_resources((schema["$id"], Resource.from_contents(schema))
                                                   for schema in kubernetes)
    isvc = _structural(json.loads((SCHEMAS / "kserve-v0.20.0" / "inferenceservice-v1beta1.json").read_text()))
    assert isinstance(isvc, dict)
    isvc["properties"]["metadata"] = {"$ref": OBJECT_META}  # the API server checks a CR's metadata as ObjectMeta
    deployment, service, _ = kubernetes
    return {"Deployment": Draft202012Validator(deployment, registry=registry),
            "Service": Draft202012Validator(service, registry=registry),
            "InferenceService": Draft202012Validator(isvc, registry=registry)}


def invalid(document: dict) -> list[str]:
    """Where and why `document` breaks its kind's published schema: [] when it is valid."""
    errors = _validators()[document["kind"]].iter_errors(document)
    return sorted(f"{'.'.join(map(str, error.absolute_path))}: {error.message}" for error in errors)


def _container(deployment: dict) -> dict:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _flag(args: list[str], name: str) -> str:
    (value,) = [arg.split("=", 1)[1] for arg in args if arg.startswith(f"--{name}=")]
    return value


def _port(container: dict, ref: int | str) -> int:
    """A probe's or Service's port as the kubelet resolves it: a number, or the name of a container port."""
    if isinstance(ref, int):
        return ref
    (number,) = [port["containerPort"] for port in container["ports"] if port["name"] == ref]
    return number


@pytest.mark.parametrize("storage_uri", ["pvc://triton-models", "pvc://models/teams/search", "s3://bucket/repo",
                                         "gs://bucket"])
@pytest.mark.parametrize("gpu", [True, False])
def test_every_manifest_is_valid_against_its_published_schema(tmp_path: Path, storage_uri: str, gpu: bool) -> None:
    folder = write_manifests(tmp_path, "digits_v2", Cluster(IMAGE, storage_uri, gpu=gpu))
    written = {path.name: yaml.safe_load(path.read_text()) for path in folder.glob("*.yaml")}
    assert written == manifests("digits_v2", Cluster(IMAGE, storage_uri, gpu=gpu))
    assert [(name, document["kind"]) for name, document in sorted(written.items())] == [
        ("deployment.yaml", "Deployment"), ("inferenceservice.yaml", "InferenceService"), ("service.yaml", "Service")]
    for document in written.values():
        assert invalid(document) == [], document["kind"]


def _model(document: dict) -> dict:
    return document["spec"]["predictor"]["model"]


CONTAINER = "spec.template.spec.containers.0"
BREAKAGES = {  # how a manifest could be wrong -> (its kind, the edit, where the schema must object)
    "misspelt probe field": ("Deployment", lambda d: _container(d)["readinessProbe"]["httpGet"].update(prot=8000),
                             f"{CONTAINER}.readinessProbe.httpGet"),
    "port as text": ("Deployment", lambda d: _container(d)["ports"][0].update(containerPort="8000"),
                     f"{CONTAINER}.ports.0.containerPort"),
    "no selector": ("Deployment", lambda d: d["spec"].pop("selector"), "spec"),
    "service port by name": ("Service", lambda d: d["spec"]["ports"][0].update(port="http"), "spec.ports.0.port"),
    "misspelt storageUri": ("InferenceService", lambda d: _model(d).update(storageURI="pvc://x"),
                            "spec.predictor.model"),
    "model format without a name": ("InferenceService", lambda d: _model(d).update(modelFormat={"version": "2"}),
                                    "spec.predictor.model.modelFormat"),
    "a label that is not text": ("InferenceService", lambda d: d["metadata"]["labels"].update(replicas=2),
                                 "metadata.labels.replicas"),
    "no predictor": ("InferenceService", lambda d: d["spec"].pop("predictor"), "spec"),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_the_schemas_refuse_what_a_cluster_would(breakage: str) -> None:
    """The validation bites: a misspelt field, a wrong type, a missing required field each fail, where they are."""
    kind, edit, where = BREAKAGES[breakage]
    (document,) = [d for d in manifests("digits", Cluster()).values() if d["kind"] == kind]
    assert invalid(document) == []
    edit(document)
    errors = invalid(document)
    assert where in {error.split(": ", 1)[0] for error in errors}, errors


def test_the_deployment_serves_only_this_model_and_is_ready_only_once_it_is_loaded() -> None:
    deployment = manifests("digits_v2", Cluster())["deployment.yaml"]
    container = _container(deployment)
    args = container["args"]

    assert container["image"] == IMAGE == "nvcr.io/nvidia/tritonserver:24.08-py3"
    assert args[0] == "tritonserver"
    assert _flag(args, "model-control-mode") == "explicit" and _flag(args, "load-model") == "digits_v2"
    assert _flag(args, "strict-readiness") == "true"
    assert _flag(args, "model-repository") == "/models"
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert {name: int(_flag(args, f"{name}-port")) for name in ports} == ports  # Triton listens where the pod says

    probes = {kind: container[f"{kind}Probe"] for kind in ("startup", "readiness", "liveness")}
    assert {kind: probe["httpGet"]["path"] for kind, probe in probes.items()} == {
        "startup": "/v2/health/ready", "readiness": "/v2/health/ready", "liveness": "/v2/health/live"}
    assert {kind: _port(container, probe["httpGet"]["port"]) for kind, probe in probes.items()} == {
        "startup": 8000, "readiness": 8000, "liveness": 8000}
    assert probes["startup"]["periodSeconds"] * probes["startup"]["failureThreshold"] == 300  # 5 min to load

    pod = deployment["spec"]["template"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "8002"
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    (mount,) = container["volumeMounts"]
    (volume,) = pod["spec"]["volumes"]
    assert (mount["mountPath"], mount["readOnly"], mount["name"]) == ("/models", True, volume["name"])
    assert volume["persistentVolumeClaim"] == {"claimName": "triton-models", "readOnly": True}
    assert deployment["metadata"]["name"] == "digits-v2"


def test_the_service_exposes_http_grpc_and_metrics_of_the_deployments_pods() -> None:
    written = manifests("digits_v2", Cluster())
    deployment, service = written["deployment.yaml"], written["service.yaml"]
    container = _container(deployment)

    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert {port["name"]: (port["port"], _port(container, port["targetPort"])) for port in service["spec"]["ports"]} \
        == {"http": (8000, 8000), "grpc": (8001, 8001), "metrics": (8002, 8002)}
    assert service["metadata"]["name"] == deployment["metadata"]["name"]
    # the InferenceService's pods are KServe's: they must not join this Service
    isvc_labels = written["inferenceservice.yaml"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= isvc_labels.items()


def test_the_inference_service_runs_the_same_repository_image_and_flags_on_kserves_triton_runtime() -> None:
    model = manifests("digits_v2", Cluster("registry.example/triton:24.08-py3", "s3://models/prod"))[
        "inferenceservice.yaml"]
    predictor = model["spec"]["predictor"]["model"]

    assert model["apiVersion"] == "serving.kserve.io/v1beta1" and model["metadata"]["name"] == "digits-v2"
    assert predictor["modelFormat"] == {"name": "triton"} and predictor["runtime"] == "kserve-tritonserver"
    assert predictor["storageUri"] == "s3://models/prod" and predictor["image"] == "registry.example/triton:24.08-py3"
    # appended to the runtime's own `tritonserver --model-store=/mnt/models --http-port=8080 --grpc-port=9000`
    assert predictor["args"] == ["--model-control-mode=explicit", "--load-model=digits_v2", "--strict-readiness=true",
                                 "--metrics-config=summary_latencies=true"]
    assert predictor["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert "name" not in predictor  # KServe refuses a name in a standard predictor


def test_a_cpu_deployment_asks_for_no_gpu() -> None:
    written = manifests("digits", Cluster(gpu=False))
    assert "resources" not in _container(written["deployment.yaml"])
    assert "resources" not in written["inferenceservice.yaml"]["spec"]["predictor"]["model"]


@pytest.mark.parametrize(("uri", "repository", "claim"), [
    ("pvc://triton-models", "/models", "triton-models"),
    ("pvc://shared/teams/search/", "/models/teams/search", "shared"),
    ("s3://bucket/path/repo", "s3://bucket/path/repo", None),
    ("s3://minio.local:9000/bucket/repo", "s3://minio.local:9000/bucket/repo", None),
    ("gs://bucket", "gs://bucket", None),
])
def test_the_storage_uri_is_where_triton_and_kserve_find_the_repository(uri: str, repository: str,
                                                                        claim: str | None) -> None:
    written = manifests("digits", Cluster(storage_uri=uri))
    deployment = written["deployment.yaml"]
    assert _flag(_container(deployment)["args"], "model-repository") == repository
    volumes = deployment["spec"]["template"]["spec"].get("volumes", [])
    assert [v["persistentVolumeClaim"]["claimName"] for v in volumes] == ([claim] if claim else [])
    assert ("volumeMounts" in _container(deployment)) == (claim is not None)
    assert written["inferenceservice.yaml"]["spec"]["predictor"]["model"]["storageUri"] == uri


@pytest.mark.parametrize("uri", ["", "/mnt/models", "file:///models", "https://host/repo", "pvc://", "pvc://Big_Claim",
                                 "pvc://claim/../etc", "s3://", "gs://bucket/a b"])
def test_a_storage_uri_the_cluster_cannot_mount_is_refused(uri: str) -> None:
    with pytest.raises(BadSetting, match="pvc://CLAIM") as refused:
        Cluster(storage_uri=uri)
    assert refused.value.field == "storage_uri"


@pytest.mark.parametrize(("model", "name"), [("digits_v2", "digits-v2"), ("MiniLM.int8", "minilm-int8"),
                                             ("7b-chat", "m-7b-chat"), ("a__b--", "a-b")])
def test_resource_names_are_dns_labels(model: str, name: str) -> None:
    assert resource_name(model) == name


def test_a_long_model_name_is_shortened_without_colliding() -> None:
    first, second = resource_name("x" * 80 + "_fp16"), resource_name("x" * 80 + "_int8")
    assert first != second and all(len(n) <= 45 and DNS_LABEL.fullmatch(n) for n in (first, second))


# -- the command ----------------------------------------------------------------------------------


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("target", ["OUTPUT", "OUTPUT/baseline"])
def test_export_triton_takes_a_runs_output_folder_as_serve_does(temper, tiny: Path, tmp_path: Path,
                                                               target: str) -> None:
    output = _run_output(tmp_path / "out", tiny, "int8", {"mlflow": {"registered_model": MODEL}, "serving": SERVING})
    served = output if target == "OUTPUT" else output / "baseline"
    result = temper("export-triton", served, "--dest", tmp_path / "repo")
    assert result.code == 0 and result.stderr == "", result.stderr

    name = "int8" if target == "OUTPUT" else "baseline"  # OUTPUT: the run's selection
    repo = tmp_path / "repo" / MODEL
    assert (repo / "1" / bundle.MODEL).read_bytes() == (output / name / bundle.MODEL).read_bytes()
    config = (repo / "config.pbtxt").read_text()
    assert "max_batch_size: 4" in config and "max_queue_delay_microseconds: 2000" in config  # publish.serving
    cluster = tmp_path / "repo-kubernetes" / MODEL
    documents = {p.name: yaml.safe_load(p.read_text()) for p in cluster.glob("*.yaml")}
    assert sorted(documents) == ["deployment.yaml", "inferenceservice.yaml", "service.yaml"]
    assert all(invalid(document) == [] for document in documents.values())
    assert _flag(_container(documents["deployment.yaml"])["args"], "load-model") == MODEL
    lines = result.stdout.splitlines()
    assert f"wrote Triton model {MODEL} to {tmp_path / 'repo'}:" in lines
    assert any(line.startswith("wrote what a cluster needs to run it from pvc://triton-models on ")
               and line.endswith(f" to {cluster}:") for line in lines), lines
    assert "  a lone request waits the full 2 ms max_queue_delay for a batch (temper serve waits only while " \
           "concurrent clients keep arriving)" in lines
    assert "  the 30 s timeout covers time queued only, not execution" in lines
    assert any(line.startswith("  no padding (x): Triton batches only requests of one shape") for line in lines)


def test_export_triton_refuses_a_run_model_its_manifest_does_not_record(temper, tiny: Path, tmp_path: Path) -> None:
    output = _run_output(tmp_path / "out", tiny, "int8", None)
    shutil.copy2(output / "baseline" / bundle.MODEL, output / "int8" / bundle.MODEL)  # same size, other weights
    result = temper("export-triton", output, "--dest", tmp_path / "repo")
    (line,) = result.stderr.strip().splitlines()
    assert result.code == 2 and line.startswith(f"error: {output}/int8/model.onnx: is not the int8 model "
                                                "manifest.json records"), line
    assert not (tmp_path / "repo").exists() and not (tmp_path / "repo-kubernetes").exists()


@pytest.mark.parametrize(("option", "value", "key"), [("--storage-uri", "/mnt/models", "--storage-uri"),
                                                      ("--image", "", "--image")])
def test_export_triton_refuses_a_cluster_setting_before_writing_anything(temper, tiny: Path, tmp_path: Path,
                                                                        option: str, value: str, key: str) -> None:
    result = temper("export-triton", tiny, "--dest", tmp_path / "repo", option, value)
    (line,) = result.stderr.strip().splitlines()
    assert result.code == 2 and line.startswith(f"error: {tiny}: {key}: "), line
    assert list(tmp_path.iterdir()) == []


def test_export_triton_writes_manifests_only_into_a_folder_of_its_own(temper, tiny: Path, tmp_path: Path) -> None:
    mine = tmp_path / "repo-kubernetes" / MODEL
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    refused = temper("export-triton", tiny, "--dest", tmp_path / "repo")
    (line,) = refused.stderr.strip().splitlines()
    assert refused.code == 2 and "temper did not write it" in line and "--manifests" in line, line
    assert _tree(tmp_path) == {f"repo-kubernetes/{MODEL}/notes.txt": b"mine"}  # and no repository either

    elsewhere = tmp_path / "k8s"
    args = ("export-triton", tiny, "--dest", tmp_path / "repo", "--manifests", elsewhere, "--kind", "KIND_CPU")
    for _ in range(2):  # a new folder, then its own: replaced whole
        done = temper(*args)
        assert done.code == 0, done.stderr
        (elsewhere / MODEL / "stale.yaml").write_text("left from an older export")
    done = temper(*args)
    assert sorted(_tree(elsewhere / MODEL)) == [".temper-output", "deployment.yaml", "inferenceservice.yaml",
                                                "service.yaml"]
    assert "with 1 GPU" not in done.stdout
    deployment = yaml.safe_load((elsewhere / MODEL / "deployment.yaml").read_text())
    assert _container(deployment)["resources"] == {"requests": {"cpu": "1"}}  # its cores, no GPU


def test_export_triton_help_shows_the_cluster_options(temper) -> None:
    result = temper("export-triton", "--help")
    assert result.code == 0, result.stderr
    for option in ("--storage-uri", "--image", "--manifests"):  # rich markup in a help text can crash --help
        assert option in result.stdout, option
