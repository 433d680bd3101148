"""A bundle selected on OpenVINO serves on OpenVINO: `temper serve`'s runtime compiles it with the settings
the gates recorded, precision read back from the compiled model; a real server answers a real tritonclient
request with the gated engine's outputs under dynamic batching, warm-up and metrics; the Triton export
names the openvino backend with those settings; the pyfunc model requires openvino; a BF16 bundle on a CPU
without native BF16 refuses to serve rather than compute FP32 under a BF16 label."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from google.protobuf import text_format

from temper.artifacts.core.errors import EnvironmentProblem
from temper.artifacts.core.host import profile, usable_cores
from temper.artifacts.engines.openvino import OpenVinoSettings, open_engine
from temper.artifacts.engines.providers import BF16_FLAGS
from temper.artifacts.formats import bundle
from temper.artifacts.registry.pyfunc import pinned_requirements
from temper.artifacts.serving.runtime import Runtime
from temper.artifacts.triton.config import export_repository
from tests.artifacts.servers import (
    MODEL,
    Client,
    Served,
    _counter,
    _free_port,
    _inputs,
    _json_request,
    _metrics,
    _serve_process,
    _tiny_model,
    _wait_ready,
)

pytest.importorskip("openvino", reason="the OpenVINO engine needs openvino (the openvino extra, in dev)")
httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is in the dev extra")
model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2", reason="tritonclient[grpc] (dev)")

GATED = OpenVinoSettings(inference_precision="f32", num_threads=1)
NATIVE_BF16 = any(f in profile().features for f in BF16_FLAGS)


def _openvino_bundle(folder: Path, engine: str = "openvino", session: OpenVinoSettings | None = GATED) -> Path:
    model = _tiny_model(folder.parent / f"{folder.name}.onnx")
    config = bundle.config_for(model, MODEL, engine=engine, session=session, max_batch_size=8, max_delay_ms=20)
    return bundle.write(folder, model, config)


@pytest.fixture(scope="module")
def selected(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _openvino_bundle(tmp_path_factory.mktemp("ov") / "bundle")


def test_the_runtime_runs_the_recorded_engine_with_its_settings_read_back(selected: Path, started):
    runtime = started(Runtime(selected))
    assert runtime.provider == "openvino" and runtime.ready and runtime.batch1_ms is not None
    assert runtime.engine_settings == GATED  # read back from the compiled model, not copied from runtime.json
    assert runtime.intra_op_threads == 1
    gated = open_engine(selected / bundle.MODEL, "f32", 1)
    inputs = _inputs(3, rows=5)
    served = runtime.infer(inputs)
    expected = dict(zip(["y", "total"], gated.run(None, inputs)))
    np.testing.assert_array_equal(served["y"], expected["y"])
    np.testing.assert_array_equal(served["total"], expected["total"])


def test_searched_streams_and_hint_in_runtime_json_are_what_the_runtime_compiles(tmp_path: Path, started):
    """The session search may keep two streams with the throughput hint: serving runs those, not the defaults.
    Two streams need two threads (OpenVINO gives one thread one stream), so two usable cores."""
    if usable_cores() < 2:
        pytest.skip(f"premise: two streams of one thread each need 2 usable cores; this host has {usable_cores()}")
    searched = OpenVinoSettings(inference_precision="f32", num_threads=2, num_streams=2, performance_hint="THROUGHPUT")
    runtime = started(Runtime(_openvino_bundle(tmp_path / "streams", session=searched)))
    assert runtime.engine_settings == searched  # read back from the compiled model


def test_a_real_server_answers_tritonclient_with_the_gated_engines_outputs_batched(selected: Path):
    gated = open_engine(selected / bundle.MODEL, "f32", 1)
    with Served(Runtime(selected)) as served:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{served.port}", concurrency=8)
        requests = [_inputs(seed, rows=1 + seed % 3) for seed in range(24)]

        def parts(inputs: dict[str, np.ndarray]) -> list:
            found = []
            for name, array in inputs.items():
                part = httpclient.InferInput(name, list(array.shape), "FP32" if array.dtype == np.float32 else "INT64")
                part.set_data_from_numpy(array, binary_data=True)
                found.append(part)
            return found

        wanted = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("y", "total")]
        pending = [client.async_infer(MODEL, parts(inputs), outputs=wanted) for inputs in requests]  # 8 in flight
        answers = [{n: r.as_numpy(n) for n in ("y", "total")} for r in (p.get_result() for p in pending)]
        for inputs, answer in zip(requests, answers):
            expected = dict(zip(["y", "total"], gated.run(None, inputs)))
            np.testing.assert_allclose(answer["y"], expected["y"], rtol=0, atol=1e-6)
            np.testing.assert_array_equal(answer["total"], expected["total"])
        metadata = client.get_model_config(MODEL)
        assert client.get_model_metadata(MODEL)["platform"] == "openvino"
        http = Client(served.port)
        metrics = _metrics(http)
        http.close()
        client.close()
    assert metadata["backend"] == "openvino"
    assert {key: value["string_value"] for key, value in metadata["parameters"].items()} == {  # a map, as Triton's
        "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": "1"}
    assert _counter(metrics, "nv_inference_request_success") == len(requests)
    executions = _counter(metrics, "nv_inference_exec_count")
    assert 1 <= executions <= len(requests)  # inline runs or batches: batching itself is the next test's
    info = [labels for (name, labels), value in metrics.items() if name == "temper_runtime_info" and value == 1]
    assert [dict(labels)["engine"] for labels in info] == ["openvino"]


def test_an_openvino_pick_runs_in_isolated_workers_that_restart_with_its_settings(selected: Path) -> None:
    """With --instances, each worker compiles the bundle on OpenVINO with the server's read-back settings: the
    answers are the gated engine's, a SIGKILLed worker is restarted, and the restarted one answers right."""
    gated = open_engine(selected / bundle.MODEL, "f32", 1)
    runtime = Runtime(selected, instances=1)
    with Served(runtime) as served:
        assert runtime.pool is not None and runtime.provider == "openvino" and runtime.engine_settings == GATED
        instance = runtime.pool.instances[0]
        worker = psutil.Process(instance.pid)
        assert "temper.artifacts.serving.worker" in " ".join(worker.cmdline())
        assert any("openvino" in m.path for m in worker.memory_maps())  # the engine is loaded in the worker
        http = Client(served.port)
        try:
            inputs = _inputs(5, rows=3)
            expected = gated.run(["y"], inputs)[0]
            np.testing.assert_allclose(_served_y(http, inputs), expected, rtol=0, atol=1e-6)
            os.kill(worker.pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while not (instance.ready and instance.pid != worker.pid):
                assert time.monotonic() < deadline, "the killed OpenVINO worker did not restart"
                time.sleep(0.05)
            np.testing.assert_allclose(_served_y(http, inputs), expected, rtol=0, atol=1e-6)
            assert _counter(_metrics(http), "temper_model_instance_restarts_total", instance="0") == 1
        finally:
            http.close()


def test_sigterm_stops_an_openvino_pick_with_workers_with_exit_0(selected: Path) -> None:
    """`temper serve --instances 2` of an OpenVINO pick, stopped with SIGTERM after answering: exit 0, twice in a
    row. It ended in SIGSEGV (exit 139 in 5 of 6 runs, every run here): loading OpenVINO's CPU plugin installs
    an alternate signal stack on the main thread, freed with the model on another thread, and the SIGTERM
    uvicorn re-raises after its graceful stop then had no stack to run on."""
    for attempt in range(2):
        port = _free_port()
        process = _serve_process(str(selected), port, args=("--instances", "2"))
        try:
            _wait_ready(process, port)
            http = Client(port)
            inputs = _inputs(attempt, rows=2)
            assert _served_y(http, inputs).shape == (2, 2)
            http.close()
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=60)
        finally:
            process.kill()
        assert process.returncode == 0, (process.returncode, stderr[-2000:])
        assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == "stopped", stderr[-2000:]


def _served_y(http: Client, inputs: dict[str, np.ndarray]) -> np.ndarray:
    status, _, body = http.infer(_json_request(inputs))
    assert status == 200, body
    (y,) = [o for o in json.loads(body)["outputs"] if o["name"] == "y"]
    return np.asarray(y["data"], dtype=np.float32).reshape(y["shape"])


def test_requests_queued_together_run_as_one_batch_on_openvino(selected: Path):
    """Submitted before start(), eight one-row requests wait in the queue and run as one 8-row execution."""
    runtime = Runtime(selected)
    gated = open_engine(selected / bundle.MODEL, "f32", 1)
    requests = [_inputs(seed, rows=1) for seed in range(8)]
    futures = [runtime.submit(inputs) for inputs in requests]
    runtime.start()
    try:
        answers = [runtime.result(f, 30) for f in futures]
        counts = runtime.metrics.snapshot()
    finally:
        runtime.stop()
    joined = {k: np.concatenate([r[k] for r in requests]) for k in requests[0]}
    np.testing.assert_array_equal(np.concatenate([a["y"] for a in answers]), gated.run(["y"], joined)[0])
    assert counts["executed_requests"] == 8 and counts["execution_count"] == 1 and list(counts["batches"]) == [8]


def test_the_triton_export_names_the_openvino_backend_and_the_gated_settings(selected: Path, tmp_path: Path):
    folder = export_repository(selected, tmp_path / "repo")
    config = text_format.Parse((folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert config.backend == "openvino" and config.platform == "" and config.default_model_filename == "model.onnx"
    assert {k: v.string_value for k, v in config.parameters.items()} == {
        "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": "1"}
    assert (folder / "1" / "model.onnx").is_file()
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert config.dynamic_batching.max_queue_delay_microseconds == 20_000
    bf16 = _openvino_bundle(tmp_path / "bf16", "openvino-bf16",
                            GATED.model_copy(update={"inference_precision": "bf16"}))
    config = text_format.Parse((export_repository(bf16, tmp_path / "repo2") / "config.pbtxt").read_text(),
                               model_config_pb2.ModelConfig())
    assert config.parameters["HINT_BF16"].string_value == "YES"
    with pytest.raises(ValueError, match="OpenVINO's CPU engine"):
        export_repository(selected, tmp_path / "repo3", kind="KIND_GPU")


def test_the_pyfunc_model_of_an_openvino_pick_requires_openvino():
    import openvino

    plain, picked = pinned_requirements(), pinned_requirements("openvino")
    assert not any(r.startswith("openvino") for r in plain)
    assert f"openvino=={openvino.__version__.split('-')[0]}" in picked and set(plain) < set(picked)


@pytest.mark.skipif(not NATIVE_BF16, reason="premise: a CPU with native BF16 (avx512_bf16 or amx_bf16); "
                                             "this one has neither, so a BF16 bundle refuses to serve (next test)")
def test_a_bf16_bundle_serves_in_bf16_on_a_cpu_with_native_bf16(tmp_path: Path, started):
    """The runtime compiles it in BF16, says so read back, and answers what OpenVINO's BF16 computes: close to
    FP32, not equal to it."""
    folder = _openvino_bundle(tmp_path / "bf16", "openvino-bf16", GATED.model_copy(update={"inference_precision":
                                                                                          "bf16"}))
    runtime = started(Runtime(folder))
    assert runtime.provider == "openvino-bf16" and runtime.engine_settings.inference_precision == "bf16"
    inputs = _inputs(11, rows=4)
    served = runtime.infer(inputs)["y"]
    np.testing.assert_array_equal(served, open_engine(folder / bundle.MODEL, "bf16", 1).run(["y"], inputs)[0])
    fp32 = open_engine(folder / bundle.MODEL, "f32", 1).run(["y"], inputs)[0]
    np.testing.assert_allclose(served, fp32, rtol=0.05, atol=0.05)
    assert not np.array_equal(served, fp32)


@pytest.mark.skipif(NATIVE_BF16,
                    reason="premise: a CPU without native BF16 (no avx512_bf16 or amx_bf16); "
                           "this one has it, so a BF16 bundle serves here")
def test_a_bf16_bundle_refuses_to_serve_on_a_cpu_without_native_bf16(tmp_path: Path):
    folder = _openvino_bundle(tmp_path / "bf16", "openvino-bf16", None)
    with pytest.raises(EnvironmentProblem, match="asked to compute in bf16 but the compiled model reports f32"):
        Runtime(folder)
