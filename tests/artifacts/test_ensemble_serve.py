"""A Triton ensemble served by a real `temper serve REPO` to real clients (tritonclient http and grpc): the ensemble
written by `temper export-ensemble`, its answers, concurrent ones included, equal to ONNX Runtime running the two
stages one after the other; each stage's own statistics and /metrics series count the ensemble's requests; /config
is Triton's ensemble config; in explicit mode loading the ensemble loads its stages and unloading it unloads them."""

from __future__ import annotations

import concurrent.futures
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.artifacts.ensembles import CNN, NORMALIZE, PIPELINE, Chained, make_pipeline_repository, pixels
from tests.artifacts.servers import Client, _families, _free_port, _temper_serve


@pytest.fixture(scope="module")
def stages_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pipeline_repository(tmp_path_factory.mktemp("served-ensemble"), ensemble=False)


def _http(client: httpclient.InferenceServerClient, x: np.ndarray) -> np.ndarray:
    given = httpclient.InferInput("pixels", list(x.shape), "FP32")
    given.set_data_from_numpy(x, binary_data=True)
    return client.infer(PIPELINE, [given]).as_numpy("logits")


def _grpc(client: grpcclient.InferenceServerClient, x: np.ndarray) -> np.ndarray:
    given = grpcclient.InferInput("pixels", list(x.shape), "FP32")
    given.set_data_from_numpy(x)
    return client.infer(PIPELINE, [given]).as_numpy("logits")


def _settle(future: concurrent.futures.Future, result: object, error: object) -> None:
    if error is not None:
        future.set_exception(error)  # type: ignore[arg-type]
    else:
        future.set_result(result)


def test_temper_serve_answers_the_exported_ensemble_over_http_and_grpc(temper, stages_repo: Path) -> None:
    result = temper("export-ensemble", f"{PIPELINE}={NORMALIZE},{CNN}", "--dest", stages_repo)
    assert result.code == 0 and "normalize -> cnn" in result.stdout, result
    chained = Chained(stages_repo)
    grpc_port = _free_port()
    with _temper_serve(str(stages_repo), args=("--grpc-port", str(grpc_port))) as (port, output):
        http = httpclient.InferenceServerClient(f"127.0.0.1:{port}", concurrency=8)
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        asked = [(seed, rows) for seed, rows in zip(range(24), [1, 3, 8] * 8)]
        for seed, rows in asked[:6]:  # one at a time, each protocol
            x = pixels(seed, rows)
            np.testing.assert_allclose(_http(http, x), chained(x), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(_grpc(grpc, x), chained(x), rtol=1e-5, atol=1e-5)
        answers = {}  # all at once, half over each protocol: the stages batch them with each other
        for seed, rows in asked:
            x, key = pixels(seed, rows), (seed, rows)
            if seed % 2:
                given = grpcclient.InferInput("pixels", list(x.shape), "FP32")
                given.set_data_from_numpy(x)
                answers[key] = concurrent.futures.Future()
                grpc.async_infer(PIPELINE, [given], partial(_settle, answers[key]))
            else:
                given = httpclient.InferInput("pixels", list(x.shape), "FP32")
                given.set_data_from_numpy(x, binary_data=True)
                answers[key] = http.async_infer(PIPELINE, [given])
        for (seed, rows), pending in answers.items():
            reply = pending.result(timeout=60) if seed % 2 else pending.get_result()
            np.testing.assert_allclose(reply.as_numpy("logits"), chained(pixels(seed, rows)), rtol=1e-5, atol=1e-5)
        requests, rows = 12 + len(asked), 2 * sum(r for _, r in asked[:6]) + sum(r for _, r in asked)

        config = grpc.get_model_config(PIPELINE).config  # Triton's ModelConfig, parsed by tritonclient
        assert config.platform == "ensemble" and [s.model_name for s in config.ensemble_scheduling.step] == \
            [NORMALIZE, CNN]
        assert http.get_model_metadata(PIPELINE)["platform"] == "ensemble"
        for name in (NORMALIZE, CNN, PIPELINE):  # each stage's own statistics count the ensemble's requests
            (stats,) = grpc.get_inference_statistics(name).model_stats
            assert stats.inference_stats.success.count == requests and stats.inference_count == rows, (name, stats)
            assert (stats.execution_count == 0) == (name == PIPELINE)
        c = Client(port)
        families = _families(c)
        c.close()
        per_model = {s.labels["model"]: s.value for s in families["nv_inference_request_success"].samples}
        assert per_model == {NORMALIZE: requests, CNN: requests, PIPELINE: requests}
        counted = {s.labels["model"]: s.value for s in families["nv_inference_count"].samples}
        assert counted == {NORMALIZE: rows, CNN: rows, PIPELINE: rows}
        assert not any(s.value for s in families["nv_inference_request_failure"].samples)
        runs = {s.labels["model"] for s in families["temper_runtime_info"].samples}
        assert runs == {NORMALIZE, CNN}  # an ensemble runs no engine of its own
        http.close()
        grpc.close()
    assert "3 model(s): cnn, digits, normalize" in output["stdout"]


def test_explicit_load_of_the_ensemble_loads_its_stages(temper, stages_repo: Path) -> None:
    if not (stages_repo / PIPELINE).is_dir():
        assert temper("export-ensemble", f"{PIPELINE}={NORMALIZE},{CNN}", "--dest", stages_repo).code == 0
    grpc_port = _free_port()
    args = ("--model-control-mode", "explicit", "--load-model", PIPELINE, "--grpc-port", str(grpc_port))
    chained = Chained(stages_repo)
    with _temper_serve(str(stages_repo), args=args) as (port, _):
        http = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        ready = {row["name"] for row in http.get_model_repository_index() if row.get("state") == "READY"}
        assert ready == {PIPELINE, NORMALIZE, CNN}
        grpc.unload_model(PIPELINE)
        index = {row["name"]: row for row in http.get_model_repository_index()}
        assert {index[n]["state"] for n in (PIPELINE, NORMALIZE, CNN)} == {"UNAVAILABLE"}
        assert not http.is_model_ready(CNN)
        http.load_model(PIPELINE)
        assert http.is_server_ready() and all(http.is_model_ready(n) for n in (PIPELINE, NORMALIZE, CNN))
        x = pixels(7, 4)
        np.testing.assert_allclose(_grpc(grpc, x), chained(x), rtol=1e-5, atol=1e-5)
        http.close()
        grpc.close()
