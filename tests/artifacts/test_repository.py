"""A model repository served over REST: what export-triton writes is what `temper serve` serves (the highest
version of each model), Triton's repository index, load and unload in model control modes none and explicit,
strict readiness, per-model memory; real servers, real Runtimes, ONNX Runtime directly as the reference."""

from __future__ import annotations

import concurrent.futures
import json
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from temper.artifacts.formats.bundle import read
from temper.artifacts.formats.integrity import check_bundle
from temper.artifacts.formats.repository import ModelRepository
from tests.artifacts.repositories import OTHER, Gate, models, outputs
from tests.artifacts.servers import MODEL, Client, Served, _expected, _families, _inputs, _json_request


def _post(client: Client, path: str, body: dict | None = None) -> tuple[int, object]:
    status, _, raw = client.call("POST", path, json.dumps(body).encode() if body is not None else b"")
    return status, json.loads(raw) if raw else None


def _infer_ok(client: Client, name: str, refs: dict[str, ort.InferenceSession], seed: int = 3,
              path: str | None = None) -> dict:
    inputs = _inputs(seed)
    request = json.dumps(_json_request(inputs)).encode()
    status, _, body = client.call("POST", path or f"/v2/models/{name}/infer", request)
    assert status == 200, body
    reply = json.loads(body)
    got, want = outputs(reply), _expected(refs[name], inputs)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-6)
    assert np.array_equal(got["total"], want["total"])
    return reply


def test_each_version_folder_is_a_bundle_and_the_highest_is_served(repo: Path) -> None:
    repository = ModelRepository(repo)
    assert repository.names() == [OTHER, MODEL] and repository.versions(MODEL) == ["1", "2"]
    source = repository.locate(MODEL)
    assert source.version == "2" and source.folder == repo / MODEL / "2"
    assert read(source.folder).name == MODEL and check_bundle(source.folder, "") is not None  # no manifest: unchecked
    assert (repo / MODEL / "config.pbtxt").is_file() and (repo / MODEL / "1" / "runtime.json").is_file()
    (repo / MODEL / "01").mkdir(exist_ok=True)  # Triton ignores a version with a leading 0, and names not numbers
    (repo / MODEL / "latest").mkdir(exist_ok=True)
    assert repository.versions(MODEL) == ["1", "2"]
    assert ModelRepository.recognizes(repo) and not ModelRepository.recognizes(repo / MODEL / "2")


def test_mode_none_serves_every_model_at_its_version(repo: Path, refs: dict[str, ort.InferenceSession]) -> None:
    with Served(models(repo)) as served:
        c = Client(served.port)
        assert c.call("GET", "/v2/health/ready")[0] == 200
        status, index = _post(c, "/v2/repository/index")
        assert status == 200 and index == [{"name": OTHER, "version": "1", "state": "READY"},  # sorted, as Triton's
                                           {"name": MODEL, "version": "2", "state": "READY"}]
        assert _infer_ok(c, MODEL, refs)["model_version"] == "2"
        assert _infer_ok(c, OTHER, refs)["model_version"] == "1"
        _infer_ok(c, MODEL, refs, path=f"/v2/models/{MODEL}/versions/2/infer")
        status, _, body = c.call("POST", f"/v2/models/{MODEL}/versions/1/infer", b"{}")
        assert status == 404 and "serves version 2" in json.loads(body)["error"]
        assert json.loads(c.call("GET", f"/v2/models/{MODEL}")[2])["versions"] == ["2"]
        for action in ("load", "unload"):  # Triton's answer: UNAVAILABLE while model control is off
            status, reply = _post(c, f"/v2/repository/models/{OTHER}/{action}")
            assert status == 503 and "--model-control-mode explicit" in reply["error"], reply  # type: ignore[index]
        assert c.call("GET", f"/v2/models/{OTHER}/ready")[0] == 200
        c.close()


def test_stats_and_metrics_per_model_with_memory(repo: Path, refs: dict[str, ort.InferenceSession]) -> None:
    with Served(models(repo)) as served:
        c = Client(served.port)
        _infer_ok(c, OTHER, refs)
        stats = json.loads(c.call("GET", "/v2/models/stats")[2])["model_stats"]
        assert [(m["name"], m["version"]) for m in stats] == [(OTHER, "1"), (MODEL, "2")]
        assert [m["inference_stats"]["success"]["count"] for m in stats] == [1, 0]
        for model in stats:  # in-process: the RSS growth across the load, which can be 0 when pages are reused
            (memory,) = model["memory_usage"]
            assert memory["type"] == "CPU" and memory["byte_size"] >= 0
        families = _families(c)
        success = {s.labels["model"]: s.value for s in families["nv_inference_request_success"].samples}
        assert success == {MODEL: 0, OTHER: 1}
        memory_samples = families["temper_model_memory_bytes"].samples
        assert {(s.labels["model"], s.labels["version"], s.labels["measure"]) for s in memory_samples} == {
            (MODEL, "2", "load_rss_growth"), (OTHER, "1", "load_rss_growth")}
        c.close()


def test_worker_instances_report_their_processes_memory(repo: Path, refs: dict[str, ort.InferenceSession]) -> None:
    with Served(models(repo, "explicit", [OTHER], instances=1)) as served:
        c = Client(served.port)
        _infer_ok(c, OTHER, refs)
        (model,) = json.loads(c.call("GET", f"/v2/models/{OTHER}/stats")[2])["model_stats"]
        assert model["memory_usage"][0]["byte_size"] > 10 * 1024 * 1024  # a Python process with ONNX Runtime in it
        (sample,) = _families(c)["temper_model_memory_bytes"].samples
        assert sample.labels["measure"] == "workers_rss" and sample.value > 10 * 1024 * 1024
        c.close()


def test_explicit_mode_loads_and_unloads_on_request(repo: Path, refs: dict[str, ort.InferenceSession]) -> None:
    with Served(models(repo, "explicit", [MODEL])) as served:
        c = Client(served.port)
        assert c.call("GET", "/v2/health/ready")[0] == 200  # strict: only what was asked for
        assert _post(c, "/v2/repository/index")[1] == [{"name": OTHER},
                                                         {"name": MODEL, "version": "2", "state": "READY"}]
        assert _post(c, "/v2/repository/index", {"ready": True})[1] == [{"name": MODEL, "version": "2",
                                                                          "state": "READY"}]
        status, _, body = c.call("POST", f"/v2/models/{OTHER}/infer", json.dumps(_json_request(_inputs(1))).encode())
        assert status == 404 and "not loaded" in json.loads(body)["error"]
        assert c.call("GET", f"/v2/models/{OTHER}/ready")[0] == 404
        assert _post(c, f"/v2/repository/models/{OTHER}/load") == (200, None)
        _infer_ok(c, OTHER, refs)
        assert _post(c, f"/v2/repository/models/{OTHER}/unload") == (200, None)
        assert c.call("POST", f"/v2/models/{OTHER}/infer", json.dumps(_json_request(_inputs(1))).encode())[0] == 404
        assert _post(c, "/v2/repository/index")[1][0] == {"name": OTHER, "version": "1", "state": "UNAVAILABLE",
                                                          "reason": "unloaded"}
        assert c.call("GET", "/v2/health/ready")[0] == 200  # an unloaded model is not waited for, as in Triton
        status, reply = _post(c, "/v2/repository/models/nothing/load")
        assert status == 400 and "no model 'nothing'" in reply["error"]  # type: ignore[index]
        status, reply = _post(c, "/v2/repository/index", {"ready": "yes"})
        assert status == 400
        c.close()


@pytest.mark.parametrize("strict", [True, False])
def test_readiness_while_a_model_loads(repo: Path, refs: dict[str, ort.InferenceSession], strict: bool) -> None:
    gate = Gate()
    gate.open.set()  # the startup load of tiny passes; the gate is closed for the load of other
    with Served(models(repo, "explicit", [MODEL], strict=strict, gate=gate)) as served:
        gate.open.clear()
        gate.waiting.clear()
        c, loading = Client(served.port), Client(served.port)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            load = pool.submit(_post, loading, f"/v2/repository/models/{OTHER}/load")
            assert gate.waiting.wait(30)
            assert _post(c, "/v2/repository/index")[1][0] == {"name": OTHER, "version": "1", "state": "LOADING"}
            assert c.call("GET", "/v2/health/ready")[0] == (503 if strict else 200)
            assert c.call("GET", "/v2/health/live")[0] == 200
            _infer_ok(c, MODEL, refs)  # the event loop serves on while the load runs
            gate.open.set()
            assert load.result(60) == (200, None)
        assert c.call("GET", "/v2/health/ready")[0] == 200
        _infer_ok(c, OTHER, refs)
        c.close()
        loading.close()


def test_unload_fails_queued_requests_cleanly_then_404(repo: Path, refs: dict[str, ort.InferenceSession]) -> None:
    with Served(models(repo, "explicit", ["*"])) as served:
        body = json.dumps(_json_request(_inputs(2))).encode()
        statuses: list[int] = []
        stop = threading.Event()

        def client_loop() -> None:
            c = Client(served.port)
            while not stop.is_set():
                status = c.call("POST", f"/v2/models/{OTHER}/infer", body)[0]
                statuses.append(status)
                if status == 404:
                    break
            c.close()

        threads = [threading.Thread(target=client_loop) for _ in range(4)]
        for thread in threads:
            thread.start()
        c = Client(served.port)
        while len(statuses) < 20:
            threading.Event().wait(0.01)
        assert _post(c, f"/v2/repository/models/{OTHER}/unload") == (200, None)
        for thread in threads:
            thread.join(30)
        stop.set()
        assert set(statuses) <= {200, 503, 404} and statuses.count(404) == 4, statuses  # never a 500 or a hang
        _infer_ok(c, MODEL, refs)  # the other model is untouched
        c.close()


def test_loads_of_unknown_models_leave_nothing_behind(repo: Path, refs: dict[str, ort.InferenceSession]) -> None:
    """Explicit mode kept a lock per name a load request named, known or not: 3,000 requests for made-up names
    held 172 MiB for good (#36.5). What the server keeps per model is bounded by the repository's models."""
    served_models = models(repo, "explicit", [MODEL])
    with Served(served_models) as served:
        c = Client(served.port)
        for i in range(300):  # long names: what a hostile client would send to grow the server
            status, reply = _post(c, f"/v2/repository/models/{'x' * 2000}{i}/load")
            assert status == 400 and "no model 'xxx" in reply["error"], reply  # type: ignore[index]
        assert _post(c, f"/v2/repository/models/{OTHER}/load") == (200, None)
        _infer_ok(c, OTHER, refs)
        c.close()
    kept = {*served_models._guards, *served_models._states, *served_models._loaded, *served_models._wanted}
    assert kept <= {MODEL, OTHER}, sorted(name[:20] for name in kept)
