"""CUDA graphs as a session setting: the bound-buffer run path, the settings reaching the CUDA and TensorRT
providers, the session search's GPU rows, the gates' replay check and the Triton export.

The run path is provider-agnostic (one set of pre-allocated buffers and one graph id per input shapes), so it
runs here on ONNX Runtime's CPU provider on real models: its answers must equal a plain session's at every
batch size, in any order of sizes. A replay that reads stale buffers (the known trap at batch >= 2) is injected
by skipping the copy of a request into its buffers: the check the gates and the search run must catch it.
Capture and replay themselves need a GPU: that test skips without one (the device script runs them).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from temper.artifacts import engines
from temper.artifacts.core.errors import EnvironmentProblem, StepFailed
from temper.artifacts.core.host import profile
from temper.artifacts.core.layout import AXIS0
from temper.artifacts.engines import cuda_graphs
from temper.artifacts.engines.cuda_graphs import GraphSession, replay_problem
from temper.artifacts.engines.onnxruntime import SessionSettings, provider_chain, settings_of
from temper.artifacts.engines.providers import CUDA, TENSORRT
from temper.artifacts.serving import graph_batches
from temper.validators import session_search
from temper.validators.report_model import SessionSearch
from temper.validators.rounds import Bench, Timing, interleave
from temper.validators.session_search import Plan, Row, search
from tests.artifacts.runtimes import linear_model, plain, pooling_model, runtime_for, save

CPU = ["CPUExecutionProvider"]
SIZES = [1, 2, 32, 2, 1, 32, 7, 32]  # back and forth: each size's buffers and graph id are reused


def _pooling_feed(rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = (rng.random((rows, 6)) > 0.3).astype(np.int64)
    mask[:, 0] = 1
    return {"input_ids": rng.integers(0, 10, (rows, 6)), "attention_mask": mask}


def _graphed(model: Path) -> GraphSession:
    return GraphSession(ort.InferenceSession(str(model), providers=CPU), "cpu")


def test_the_bound_path_answers_as_a_plain_session_at_every_batch_size_back_and_forth(tmp_path: Path):
    model = pooling_model(tmp_path)
    session = _graphed(model)
    for number, rows in enumerate(SIZES):
        feed = _pooling_feed(rows, number)
        got = dict(zip(["tokens", "pooled"], session.run(None, feed)))
        want = plain(model, feed)
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name} at batch {rows}")
    assert session.graphs == len(set(SIZES))  # one set of buffers and one graph id per shape, reused


def test_the_buffers_stay_where_they_were_bound_and_answers_are_copies(tmp_path: Path):
    """A replay reads the addresses it was captured with: a request is copied into the same buffers, and what
    a caller got is not overwritten by the next call."""
    model = linear_model(tmp_path)
    session = _graphed(model)
    first_feed = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    first = session.run(["y"], first_feed)[0]
    bound = next(iter(session._bound.values()))
    where = bound.inputs["x"].data_ptr(), bound.outputs["y"].data_ptr()
    second = session.run(["y"], {"x": -first_feed["x"]})[0]
    assert (bound.inputs["x"].data_ptr(), bound.outputs["y"].data_ptr()) == where
    np.testing.assert_array_equal(first, plain(model, first_feed)["y"])
    np.testing.assert_array_equal(second, -first)


def test_shapes_past_the_graph_limit_run_the_plain_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(cuda_graphs, "MOST_GRAPHS", 2)
    model = linear_model(tmp_path)
    session = _graphed(model)
    for rows in (1, 2, 3, 4):
        feed = {"x": np.full((rows, 4), rows, np.float32)}
        np.testing.assert_array_equal(session.run(None, feed)[0], plain(model, feed)["y"])
    assert session.graphs == 2


def test_the_replay_check_passes_a_sound_path_and_catches_stale_buffers(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch):
    model = pooling_model(tmp_path)
    feeds = [_pooling_feed(4, 1), _pooling_feed(4, 2)]
    assert replay_problem(_graphed(model), feeds) is None
    assert replay_problem(ort.InferenceSession(str(model), providers=CPU), feeds) is None  # no graphs: nothing
    _stale(monkeypatch)
    problem = replay_problem(_graphed(model), feeds)
    assert problem is not None and problem.startswith("output 'tokens' differs by up to ") and "\n" not in problem


def test_an_output_the_input_shapes_do_not_fix_fails_the_check_in_one_line(tmp_path: Path):
    """NonZero's output length depends on the data: no buffer bound once can hold it, so graphs cannot run it."""
    model = save(tmp_path, "nonzero", [helper.make_node("NonZero", ["x"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                 [helper.make_tensor_value_info("y", TensorProto.INT64, [2, None])], [])
    feeds = [{"x": np.array([[1, 0, 1, 0], [0, 0, 0, 1]], np.float32)}, {"x": np.ones((2, 4), np.float32)}]
    problem = replay_problem(_graphed(model), feeds)
    assert problem is not None and problem.startswith("the graph path failed (") and "\n" not in problem


def _stale(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay that keeps reading the batch it was captured with, as a graph bound to moved buffers does."""
    load = cuda_graphs._Bound.load

    def once(self: cuda_graphs._Bound, feed: dict[str, np.ndarray]) -> None:
        if not getattr(self, "loaded", False):
            load(self, feed)
            self.loaded = True  # type: ignore[attr-defined]

    monkeypatch.setattr(cuda_graphs._Bound, "load", once)


def test_the_setting_reaches_the_cuda_and_tensorrt_providers():
    """As the arena settings do (test_engines.py): CUDA's enable_cuda_graph, or TensorRT's own graph with the
    CUDA provider behind it left without one (one provider captures a session's graph)."""
    on = SessionSettings(intra_op_threads=1, cuda_graph=True)
    assert provider_chain([CUDA, "CPUExecutionProvider"], on)[0] == (
        CUDA, {"arena_extend_strategy": "kSameAsRequested", "enable_cuda_graph": "1"})
    tensorrt, cuda = provider_chain([TENSORRT, CUDA], on)
    assert isinstance(tensorrt, tuple) and tensorrt[1]["trt_cuda_graph_enable"] == "True"
    assert cuda == (CUDA, {"arena_extend_strategy": "kSameAsRequested"})
    off = SessionSettings(intra_op_threads=1)
    assert "enable_cuda_graph" not in off.cuda_options()
    assert "trt_cuda_graph_enable" not in provider_chain([TENSORRT], off)[0][1]
    # runtime.json and report.json keep their keys unless the setting is on
    assert "cuda_graph" not in off.model_dump() and on.model_dump()["cuda_graph"] is True
    assert SessionSettings.model_validate(on.model_dump()) == on


def test_the_session_search_tries_graphs_off_and_on_on_the_gpu_rows_only():
    for row in ("cuda", "tensorrt"):
        assert engines.of(row).search_rows(row) == (("cuda-graph", {"cuda_graph": True}),)
        assert [r.name for r in session_search.table(row)] == ["cuda-graph"]
        assert session_search.rows_for(row, engines.of(row).defaults(row))  # default off: the row changes it
    assert all("cuda_graph" not in changes for _, changes in engines.of("cpu").search_rows("cpu"))


def test_a_session_opened_with_the_setting_answers_through_the_bound_path_and_reads_it_back(tmp_path: Path):
    model = pooling_model(tmp_path)
    settings = SessionSettings(intra_op_threads=1, cuda_graph=True)
    session = engines.of("cpu").open(model, "cpu", settings)
    assert isinstance(session, GraphSession) and settings_of(session) == settings
    feed = _pooling_feed(3, 5)
    call = engines.of("cpu").bound_call(session, feed, "cpu")  # what the speed loop times
    call()
    bound = next(iter(session._bound.values()))
    np.testing.assert_array_equal(bound.outputs["pooled"].numpy(), plain(model, feed)["pooled"])


@pytest.mark.parametrize("instances", [0, 1])
def test_serving_answers_through_the_bound_path_in_process_and_in_workers(tmp_path: Path, instances: int):
    """runtime.json's cuda_graph is what `temper serve`, its workers and the pyfunc model (Runtime.run_batch)
    run: a batch of every size the batcher forms answers as a plain session does."""
    model = linear_model(tmp_path)
    runtime = runtime_for(model, tmp_path, instances=instances,
                          session=SessionSettings(intra_op_threads=1, cuda_graph=True))
    runtime.start()
    try:
        assert isinstance(runtime.engine_settings, SessionSettings) and runtime.engine_settings.cuda_graph
        for rows in (1, 5, 2, 5, 1):
            feed = {"x": np.random.default_rng(rows).standard_normal((rows, 4)).astype(np.float32)}
            np.testing.assert_allclose(runtime.run_batch(feed)["y"], plain(model, feed)["y"], rtol=1e-6)
        if instances == 0:
            # warm-up captured every size batches are padded to: no request pays for a capture, and a batch of
            # 5 rows ran padded to 8 (its answer cut back to 5, above)
            assert isinstance(runtime._session, GraphSession)
            assert runtime._session.graphs == len(graph_batches.sizes(runtime.max_rows))
    finally:
        runtime.stop()


def test_the_gates_fail_in_one_line_where_a_replay_differs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    model = pooling_model(tmp_path)
    sample = _pooling_feed(8, 3)
    settings = SessionSettings(intra_op_threads=1, cuda_graph=True)
    sessions = {"fp32@cpu": engines.of("cpu").open(model, "cpu", settings)}
    timing = Timing(0.01, 0.0, 1)
    bench = interleave(Bench(4, "fp32@cpu", {"fp32@cpu": {}}), sessions, {"fp32@cpu": (model, "cpu")}, sample,
                       AXIS0, timing, lambda *_: False)
    assert bench.slices["fp32@cpu"]  # a sound path is timed
    _stale(monkeypatch)
    sessions = {"fp32@cpu": engines.of("cpu").open(model, "cpu", settings)}
    with pytest.raises(StepFailed, match=r"^fp32@cpu: CUDA graph replay at batch 4: output 'tokens' differs by up "
                                         r"to .* from the plain run; gate it with cuda_graph off$"):
        interleave(Bench(4, "fp32@cpu", {"fp32@cpu": {}}), sessions, {"fp32@cpu": (model, "cpu")}, sample,
                   AXIS0, timing, lambda *_: False)


def test_the_search_times_a_sound_graph_row_and_rejects_one_whose_replay_differs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    model = pooling_model(tmp_path)
    sample = _pooling_feed(8, 4)
    plan = Plan("cpu", [1, 4], 0.95, 1.0, 0.0, profile())
    rows = (Row("cuda-graph", {"cuda_graph": True}),)
    record = search(model, plan, sample, AXIS0, "pooling", rows=rows).record
    SessionSearch.model_validate(record)
    assert record["trials"][0]["verdict"] != "rejected" and len(record["trials"][0]["speedups"]) == 2
    _stale(monkeypatch)
    found = search(model, plan, sample, AXIS0, "pooling", rows=rows)
    trial = SessionSearch.model_validate(found.record).trials[0]
    assert trial.verdict == "rejected" and trial.speedups == [] and found.record["kept"] == "default"
    assert trial.problem is not None and trial.problem.startswith("batch 1: output 'tokens' differs")
    assert not isinstance(found.session, GraphSession)


def test_the_triton_export_leaves_graphs_off_and_says_so():
    """Triton's onnxruntime backend binds each batch's own buffers and runs without gpu_graph_id, so no
    parameter of it replays safely: the export carries none and lists the difference."""
    on = SessionSettings(intra_op_threads=1, cuda_graph=True)
    for row in ("cuda", "tensorrt"):
        fields = engines.of(row).triton(row, on)
        assert not any("graph" in key for key in fields["parameters"])
        assert any("no CUDA graphs" in line for line in engines.of(row).triton_differences(row, on))
    assert engines.of("cuda").triton_differences("cuda", SessionSettings(intra_op_threads=1)) == []


def test_on_a_gpu_capture_and_replay_answer_as_the_plain_run_at_every_batch_size(tmp_path: Path):
    try:
        engines.of("cuda").available("cuda")
    except EnvironmentProblem as err:
        pytest.skip(f"needs a GPU with onnxruntime-gpu: {err}")
    model = pooling_model(tmp_path)
    session = engines.of("cuda").open(model, "cuda", SessionSettings(intra_op_threads=1, cuda_graph=True))
    assert settings_of(session).cuda_graph
    for rows in (1, 2, 32, 2, 1):
        assert replay_problem(session, [_pooling_feed(rows, rows), _pooling_feed(rows, rows + 100)]) is None


def test_the_pyfunc_model_answers_through_the_bound_path(tmp_path: Path):
    """A bundle recorded with cuda_graph, logged as the MLflow pyfunc model and loaded back: predict runs the
    recorded settings (Runtime.run_batch) and answers as a plain session."""
    import mlflow

    from temper.artifacts.formats.bundle import config_for, write
    from temper.artifacts.registry.pyfunc import log_bundle

    model = linear_model(tmp_path)
    config = config_for(model, "linear", max_batch_size=4, session=SessionSettings(intra_op_threads=1, cuda_graph=True))
    packed = write(tmp_path / "bundle", model, config)
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        experiment = mlflow.create_experiment("graphs", artifact_location=str(tmp_path / "mlartifacts"))
        with mlflow.start_run(experiment_id=experiment):
            info = log_bundle(packed)
        folder = mlflow.artifacts.download_artifacts(info.model_uri, dst_path=str(tmp_path / "model"))
    finally:
        mlflow.set_tracking_uri(previous)
    loaded = mlflow.pyfunc.load_model(folder)
    runtime = loaded.unwrap_python_model().runtime
    assert isinstance(runtime._session, GraphSession) and runtime.engine_settings.cuda_graph
    for rows in (1, 9, 2):  # 9 rows: chunked to max_batch_size 4, 4 and 1
        x = np.random.default_rng(rows).standard_normal((rows, 4)).astype(np.float32)
        np.testing.assert_allclose(loaded.predict({"x": x})["y"], plain(model, {"x": x})["y"], rtol=1e-6)


def test_batches_are_padded_to_powers_of_two_and_cut_back():
    assert graph_batches.sizes(64) == [1, 2, 4, 8, 16, 32, 64] and graph_batches.sizes(24) == [1, 2, 4, 8, 16, 24]
    assert graph_batches.sizes(1) == [1]
    layout = AXIS0.with_outputs({"y": 0})
    seen: list[int] = []

    def run(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen.append(len(feed["x"]))
        return {"y": feed["x"] * 2}

    x = np.arange(10, dtype=np.float32).reshape(5, 2)
    answer = graph_batches.GraphBatches(layout, 16, True).run(run, {"x": x})
    np.testing.assert_array_equal(answer["y"], x * 2)
    assert seen == [8]
    padded = graph_batches.pad({"x": x}, layout, 5, 8)["x"]
    np.testing.assert_array_equal(padded[5:], np.repeat(x[-1:], 3, axis=0))  # the last row, never zeros
    assert graph_batches.GraphBatches(layout, 16, False).run(run, {"x": x})["y"].shape == (5, 2) and seen[-1] == 5


def test_a_batch_dependent_model_is_not_padded(tmp_path: Path):
    model = linear_model(tmp_path)
    runtime = runtime_for(model, tmp_path, batch_dependent=True,
                          session=SessionSettings(intra_op_threads=1, cuda_graph=True))
    runtime.start()
    try:
        assert not runtime._graph_batches.sizes
        assert isinstance(runtime._session, GraphSession) and runtime._session.graphs == runtime.max_rows
    finally:
        runtime.stop()
