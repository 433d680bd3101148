"""What a Kubernetes cluster needs to run one model of a Triton repository `triton.export_repository`
wrote: a Deployment and a Service (plain Kubernetes), and a KServe InferenceService for the same
repository (where KServe runs: apply it instead of the two). One folder per model:

    <folder>/<model>/
      deployment.yaml         Triton with explicit model control (this model only), strict readiness,
                              startup/readiness/liveness probes on the v2 health endpoints, the metrics port
      service.yaml            ports http 8000, grpc 8001, metrics 8002
      inferenceservice.yaml   KServe's kserve-tritonserver runtime, the same image, repository and flags
      prometheusrule.yaml     with a capacity measured (capacity.json): alerts on the design's four signals
      hpa.yaml                with a capacity measured: the HorizontalPodAutoscaler (artifacts/triton/alerts.py)
      .temper-output          the marker that lets a later export replace this folder

The repository reaches the pod through one storage URI, the form KServe's `storageUri` takes:
`pvc://CLAIM[/PATH]` (the Deployment mounts the claim read-only; KServe mounts it at /mnt/models) or
`s3://BUCKET[/PATH]`, `gs://BUCKET[/PATH]` (the Deployment's Triton reads the bucket itself, with the
pod's cloud credentials; KServe's storage initializer downloads it). Nothing is copied into the image,
so a new model version is a new repository folder, not a new build. Probe timings follow Triton's
own Helm chart (deploy/k8s-onprem): the startup probe gives loading and warm-up 5 minutes.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from temper.artifacts.core.folders import MANIFESTS, MARKER, WRITERS, claim, discard, mark, owner, replaceable, swap_in
from temper.artifacts.formats.capacity import Capacity
from temper.artifacts.triton.alerts import autoscaler, memory_request, rules
from temper.artifacts.triton.config import folder_name

IMAGE = "nvcr.io/nvidia/tritonserver:24.08-py3"
STORAGE_URI = "pvc://triton-models"
PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
MOUNT = "/models"  # where the Deployment mounts a pvc:// repository
KSERVE_RUNTIME = "kserve-tritonserver"  # KServe's ClusterServingRuntime for Triton (its ports: http 8080, grpc 9000)
GPU = "nvidia.com/gpu"
FILES = {
    "deployment.yaml": "Deployment: Triton loading only this model (explicit model control), strict readiness, "
                       "probes on :8000/v2/health/ready and /live, metrics on :8002",
    "service.yaml": "Service: ports 8000 (http), 8001 (grpc), 8002 (metrics)",
    "inferenceservice.yaml": "KServe InferenceService (kserve-tritonserver runtime): apply it instead of the two above "
                             "where KServe runs",
    "prometheusrule.yaml": "PrometheusRule: alerts on throughput, p99, memory and errors from capacity.json",
    "hpa.yaml": "HorizontalPodAutoscaler: requests queued per replica at the measured knee, memory at 90%",
}
_CLAIM = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # a PersistentVolumeClaim name (DNS-1123 subdomain)
_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")  # Triton also takes s3://HOST:PORT/BUCKET
_PART = re.compile(r"[A-Za-z0-9_.-]+")
_NAME_MAX = 45  # KServe adds "-predictor" and Knative a revision suffix within the 63 a DNS label allows


class BadSetting(ValueError):
    """A Cluster field that cannot be written; `field` names it (image, storage_uri)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


@dataclass(frozen=True)
class Cluster:
    """Where the cluster runs the repository from: the serving team's image and storage URI, whether the pod asks
    for a GPU (every instance kind but KIND_CPU: triton.plan resolves KIND_AUTO from the engine gated on), the CPU
    cores it requests and the capacity measured (memory, alerts, autoscaler)."""

    image: str = IMAGE
    storage_uri: str = STORAGE_URI
    gpu: bool = True
    cpus: int | None = None  # CPU cores the pod requests: instances x the engine's threads per inference
    capacity: Capacity | None = None  # what `temper capacity` measured: the memory request, the alerts, the HPA

    def __post_init__(self) -> None:
        if not self.image or any(c.isspace() for c in self.image):
            raise BadSetting("image", f"{self.image!r} is not a container image reference, e.g. {IMAGE}")
        _repository(self.storage_uri)  # refused now, not half-way through writing


def resource_name(model: str) -> str:
    """The Kubernetes name for a Triton model name: a lowercase DNS label KServe accepts
    ([a-z]([-a-z0-9]*[a-z0-9])?), shortened with a hash of the model name when it is too long."""
    name = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")
    if not name[:1].isalpha():
        name = f"m-{name}".rstrip("-")
    if len(name) > _NAME_MAX:
        name = f"{name[:_NAME_MAX - 9].rstrip('-')}-{hashlib.sha256(model.encode()).hexdigest()[:8]}"
    return name


def manifests(model: str, cluster: Cluster) -> dict[str, dict]:
    """The resources, by file name: the three always, the alert rules and the autoscaler with a capacity measured."""
    found = {"deployment.yaml": deployment(model, cluster), "service.yaml": service(model),
             "inferenceservice.yaml": inference_service(model, cluster)}
    if cluster.capacity is not None:
        found["prometheusrule.yaml"] = rules(model, resource_name(model), cluster.capacity)
        found["hpa.yaml"] = autoscaler(model, resource_name(model), cluster.capacity)
    return found


def writable(parent: Path, model: str) -> Path:
    """parent/<model>, when `write_manifests` may write it (nothing there, empty, or manifests temper wrote);
    ValueError or FileExistsError saying why not. Asked before anything is exported."""
    folder = parent / folder_name(model)
    if not replaceable(folder):
        raise FileExistsError(f"{folder} exists and temper did not write it (no {MARKER} marker): "
                              "delete it or choose another --manifests")
    if not replaceable(folder, only="manifests"):
        raise FileExistsError(f"{folder} was written by {WRITERS[owner(folder) or 'temper']}, not as manifests: "
                              "choose another --manifests")
    return folder


def write_manifests(parent: Path, model: str, cluster: Cluster) -> Path:
    """Write parent/<model>/{deployment,service,inferenceservice}.yaml and return that folder; an existing
    one is replaced whole, and only when temper wrote it (its marker)."""
    folder = writable(parent, model)
    texts = {file: _yaml(model, document) for file, document in manifests(model, cluster).items()}
    parent.mkdir(parents=True, exist_ok=True)
    staging = claim(parent, f".{model}.partial-")
    try:
        for file, text in texts.items():
            (staging / file).write_text(text)
        mark(staging, model=model, holds=MANIFESTS)
        swap_in(staging, folder)
    except BaseException:
        discard(staging)
        raise
    return folder


def deployment(model: str, cluster: Cluster) -> dict:
    repository, volumes, mounts = _repository(cluster.storage_uri)
    name = resource_name(model)
    container: dict = {
        "name": "tritonserver",
        "image": cluster.image,
        "args": ["tritonserver", f"--model-repository={repository}", *_flags(model),
                 *(f"--{port}-port={number}" for port, number in PORTS.items())],
        "ports": [{"name": port, "containerPort": number} for port, number in PORTS.items()],
        # Triton answers no endpoint until its startup load is done: the startup probe holds the other two
        # back until the model is ready, so a long load or warm-up is not a liveness failure
        "startupProbe": _probe("ready", period=10, failures=30),
        "readinessProbe": _probe("ready", period=5, failures=3),
        "livenessProbe": _probe("live", period=10, failures=3),
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    if resources := _resources(cluster):
        container["resources"] = resources
    if mounts:
        container["volumeMounts"] = mounts
    pod: dict = {"securityContext": {"runAsUser": 1000, "runAsNonRoot": True, "fsGroup": 1000},  # Triton's image user
                 "containers": [container]}
    if volumes:
        pod["volumes"] = volumes
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": _labels(name)},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": _selector(name)},
            "template": {
                "metadata": {"labels": _labels(name),
                             "annotations": {"prometheus.io/scrape": "true", "prometheus.io/path": "/metrics",
                                             "prometheus.io/port": str(PORTS["metrics"])}},
                "spec": pod,
            },
        },
    }


def service(model: str) -> dict:
    name = resource_name(model)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": _labels(name)},
        "spec": {"selector": _selector(name),
                 "ports": [{"name": port, "port": number, "targetPort": port} for port, number in PORTS.items()]},
    }


def inference_service(model: str, cluster: Cluster) -> dict:
    """KServe's Triton runtime starts `tritonserver --model-store=/mnt/models --http-port=8080 --grpc-port=9000`
    and appends a predictor's args to its own: these add what the Deployment runs with."""
    predictor: dict = {
        "modelFormat": {"name": "triton"},
        "runtime": KSERVE_RUNTIME,
        "protocolVersion": "v2",
        "storageUri": cluster.storage_uri,
        "image": cluster.image,  # the Deployment's image, not the tag the runtime was installed with
        "args": _flags(model),
    }
    if resources := _resources(cluster):
        predictor["resources"] = resources
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        # not the Deployment's labels: its pods must not join the Deployment's Service
        "metadata": {"name": resource_name(model), "labels": {"app.kubernetes.io/managed-by": "temper"}},
        "spec": {"predictor": {"model": predictor}},
    }


def _flags(model: str) -> list[str]:
    """Serve this model only, answer ready only once it is loaded and warm, and export the latency quantiles the
    p99 alert reads (nv_inference_request_summary_us)."""
    return ["--model-control-mode=explicit", f"--load-model={model}", "--strict-readiness=true",
            "--metrics-config=summary_latencies=true"]


def _resources(cluster: Cluster) -> dict:
    """What the pod asks for: one GPU when the model runs on one; the CPU cores its instances' threads use; the
    memory measured at the knee with headroom as the request, twice that as the limit. No CPU limit: Triton's
    onnxruntime sessions spin, and CFS throttling would stretch the tail the capacity was measured under."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if cluster.cpus is not None:
        requests["cpu"] = str(cluster.cpus)
    if (memory := memory_request(cluster.capacity)) is not None:
        requests["memory"], limits["memory"] = f"{memory}Mi", f"{2 * memory}Mi"
    if cluster.gpu:
        limits[GPU] = "1"
    return {key: value for key, value in (("requests", requests), ("limits", limits)) if value}


def _probe(endpoint: str, period: int, failures: int) -> dict:
    return {"httpGet": {"path": f"/v2/health/{endpoint}", "port": "http"}, "periodSeconds": period,
            "failureThreshold": failures}


def _selector(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "triton", "app.kubernetes.io/instance": name}


def _labels(name: str) -> dict[str, str]:
    return {**_selector(name), "app.kubernetes.io/managed-by": "temper"}


def _repository(uri: str) -> tuple[str, list[dict], list[dict]]:
    """The Deployment's --model-repository for a storage URI, with the volumes and mounts it needs."""
    scheme, _, rest = uri.partition("://")
    root, _, path = rest.partition("/")
    parts = [part for part in path.split("/") if part]
    if all(_PART.fullmatch(part) and part not in (".", "..") for part in parts):
        if scheme == "pvc" and _CLAIM.fullmatch(root):
            mount = {"name": "model-repository", "mountPath": MOUNT, "readOnly": True}
            volume = {"name": "model-repository", "persistentVolumeClaim": {"claimName": root, "readOnly": True}}
            return "/".join([MOUNT, *parts]), [volume], [mount]
        if scheme in ("s3", "gs") and _BUCKET.fullmatch(root):
            return "/".join([f"{scheme}://{root}", *parts]), [], []
    raise BadSetting("storage_uri", f"{uri!r} is not pvc://CLAIM[/PATH], s3://BUCKET[/PATH] or gs://BUCKET[/PATH]: "
                                    "name where the cluster finds this repository")


def _yaml(model: str, document: dict) -> str:
    header = (f"# {document['kind']} for Triton model {model!r}, written by `temper export-triton`: "
              "kubectl apply -f this file\n")
    return header + yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
