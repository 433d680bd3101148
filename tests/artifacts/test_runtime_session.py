"""What was gated is what serves: one SessionSettings from the speed gate's session, through
report.json and runtime.json, to the session a started Runtime really runs and Triton's config.
Settings are always read back from the real ONNX Runtime session objects, never from a name."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from temper.artifacts.core.host import usable_cores
from temper.artifacts.engines.onnxruntime import LEVELS, SPINNING, SessionSettings, open_session, settings_of
from temper.artifacts.engines.providers import CPU
from temper.artifacts.formats import bundle
from temper.artifacts.serving.runtime import Runtime
from temper.artifacts.triton.config import export_repository
from temper.validators.throughput import measure, tuned_session
from tests.artifacts.runtimes import linear_model
from tests.unit.reports import read_report
from tests.validators.test_gate_errors import _fast, _recipe, _write


@pytest.mark.parametrize("settings", [
    SessionSettings(intra_op_threads=1),
    SessionSettings(intra_op_threads=2, spinning=True, graph_optimization="basic"),
    SessionSettings(intra_op_threads=3, graph_optimization="disable"),
])
def test_a_session_runs_exactly_its_settings(tmp_path: Path, settings: SessionSettings) -> None:
    session = open_session(linear_model(tmp_path), settings, [CPU])
    options = session.get_session_options()
    assert options.intra_op_num_threads == settings.intra_op_threads
    assert options.get_session_config_entry(SPINNING) == ("1" if settings.spinning else "0")
    assert options.graph_optimization_level == LEVELS[settings.graph_optimization]
    assert settings_of(session) == settings


def test_spinning_is_off_by_default(tmp_path: Path) -> None:
    """The gates used to measure with ONNX Runtime's default (spinning on) while serving ran it off."""
    session = tuned_session(linear_model(tmp_path), "cpu", {"x": np.ones((4, 4), np.float32)})
    assert session.get_session_options().get_session_config_entry(SPINNING) == "0"
    assert session.get_session_options().intra_op_num_threads in {1, usable_cores()}


def test_a_measurement_records_the_settings_of_the_session_it_timed(tmp_path: Path) -> None:
    model = linear_model(tmp_path)
    session = open_session(model, SessionSettings(intra_op_threads=1, graph_optimization="extended"), [CPU])
    m = measure(model, {"x": np.ones((8, 4), np.float32)}, 8, "cpu", 0.05, 0.0, session=session)
    assert m.session == settings_of(session).model_dump() == {"intra_op_threads": 1, "spinning": False,
                                                               "graph_optimization": "extended"}


def test_a_runtime_runs_the_recorded_settings_without_choosing_again(tmp_path: Path, started) -> None:
    """All usable cores and extended optimizations, as a gate recorded them: a started Runtime keeps
    them even where a one-thread session would time faster on this host."""
    model = linear_model(tmp_path)
    recorded = SessionSettings(intra_op_threads=usable_cores(), graph_optimization="extended")
    folder = bundle.write(tmp_path / "bundle", model, bundle.config_for(model, "linear", session=recorded))
    assert bundle.read(folder).session == recorded
    assert json.loads((folder / bundle.CONFIG).read_text())["session"] == recorded.model_dump()
    runtime = started(Runtime(folder))
    assert settings_of(runtime._session) == recorded
    assert runtime.intra_op_threads == recorded.intra_op_threads


def test_recorded_threads_beyond_this_hosts_cores_are_chosen_again_with_one_log_line(tmp_path: Path, started,
                                                                                    caplog) -> None:
    model = linear_model(tmp_path)
    recorded = SessionSettings(intra_op_threads=usable_cores() + 3, graph_optimization="basic")
    folder = bundle.write(tmp_path / "bundle", model, bundle.config_for(model, "linear", session=recorded))
    with caplog.at_level(logging.WARNING, logger="temper.serving"):
        runtime = started(Runtime(folder))
    lines = [r.getMessage() for r in caplog.records if "choosing the thread count again" in r.getMessage()]
    assert len(lines) == 1 and f"records {recorded.intra_op_threads} intra-op threads" in lines[0]
    kept = settings_of(runtime._session)
    assert kept.intra_op_threads in {1, usable_cores()}
    assert (kept.spinning, kept.graph_optimization) == (False, "basic")  # the rest stays as recorded


def test_without_recorded_settings_start_up_chooses_as_the_gates_do(tmp_path: Path, started) -> None:
    model = linear_model(tmp_path)
    folder = bundle.write(tmp_path / "bundle", model, bundle.config_for(model, "linear"))
    runtime = started(Runtime(folder))
    assert settings_of(runtime._session) == SessionSettings(intra_op_threads=runtime.intra_op_threads)
    assert runtime.intra_op_threads in {1, usable_cores()}


def test_triton_config_carries_the_recorded_settings(tmp_path: Path) -> None:
    pb = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    model = linear_model(tmp_path)
    recorded = SessionSettings(intra_op_threads=1, graph_optimization="extended")
    folder = bundle.write(tmp_path / "bundle", model, bundle.config_for(model, "linear", session=recorded))
    config = text_format.Parse((export_repository(folder, tmp_path / "repo") / "config.pbtxt").read_text(),
                               pb.ModelConfig())
    assert config.parameters["intra_op_thread_count"].string_value == "1"
    assert config.parameters["execution_mode"].string_value == "0"  # sequential, as ONNX Runtime here
    assert config.optimization.graph.level == 1  # the onnxruntime backend's "basic + extended"

    unmeasured = bundle.write(tmp_path / "plain", model, bundle.config_for(model, "plain"))
    plain = text_format.Parse((export_repository(unmeasured, tmp_path / "repo2") / "config.pbtxt").read_text(),
                              pb.ModelConfig())
    assert not plain.parameters and not plain.HasField("optimization")  # nothing gated: Triton's defaults


def test_the_settings_a_gate_measured_are_what_runtime_json_records_and_a_runtime_runs(temper, tmp_path: Path,
                                                                                     started) -> None:
    """The real path: `temper run` with a speed section and a publish section, `temper pull` of the
    registered bundle, a Runtime started on it; and `temper serve`'s path for an unpublished run."""
    data = _recipe(tmp_path, {"accuracy": {"metric": "top1", "max_drop": 0.5}, "throughput": _fast()})
    data["publish"] = {"mlflow": {"registered_model": "tiny", "alias": "candidate"}}
    out = tmp_path / "out"
    result = temper("run", _write(tmp_path, data), "--output", out)
    assert result.code == 0, result.stderr
    report = read_report(out)
    selected = report["selected"]
    figures = (report["baseline"] if selected == "baseline" else report["candidates"][selected])["throughput"]
    gated = {json.dumps(m["session"], sort_keys=True) for m in figures}
    assert len(gated) == 1, figures  # one thread choice per model, used at every batch size
    measured = SessionSettings.model_validate(figures[0]["session"])
    assert measured.intra_op_threads in {1, usable_cores()} and not measured.spinning

    pulled = tmp_path / "pulled"
    assert temper("pull", "models:/tiny@candidate", "--dest", pulled).code == 0
    assert bundle.read(pulled).session == measured
    runtime = started(Runtime(pulled))
    assert settings_of(runtime._session) == measured

    from temper.pipeline.outputs import servable

    folder, config = servable(out)
    assert config is not None and config.session == measured
    assert settings_of(started(Runtime(folder, config=config))._session) == measured


def test_a_searched_session_is_what_the_gates_measure_what_a_second_run_reuses_and_what_serves(
        temper, tmp_path: Path, started) -> None:
    """validate.throughput.session_search end to end: `temper run` searches each model's settings, measures
    it with the kept ones and records the search; a second run on this host reuses each record instead of
    searching again; the served session runs the selected model's kept settings, read back from it."""
    from temper.pipeline.outputs import servable

    data = _recipe(tmp_path, {"accuracy": {"metric": "top1", "max_drop": 0.5},
                              "throughput": _fast(session_search=True, session_search_s=0.6)})
    recipe = _write(tmp_path, data)
    reports = []
    for out in (tmp_path / "first", tmp_path / "second"):
        result = temper("run", recipe, "--output", out)
        assert result.code == 0, result.stderr
        reports.append(read_report(out))
    first, second = reports
    assert set(first["session_searches"]) == {"baseline", "fp16"}
    for name, (record,) in first["session_searches"].items():
        assert not record["cached"]
        (again,) = second["session_searches"][name]
        assert again["cached"] and again["trials"] == record["trials"] and again["seconds"] == record["seconds"]
        figures = (first["baseline"] if name == "baseline" else first["candidates"][name])["throughput"]
        assert all(m["session"] == record["settings"] for m in figures), name

    selected = second["selected"]
    kept = SessionSettings.model_validate(second["session_searches"][selected][0]["settings"])
    folder, config = servable(tmp_path / "second")
    assert config is not None and config.session == kept
    runtime = started(Runtime(folder, config=config))
    assert settings_of(runtime._session) == kept
