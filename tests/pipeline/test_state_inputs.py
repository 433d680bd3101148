"""A model shaped like Silero VAD through the real CLI: audio [batch, 64], a scalar int64 sample rate `sr`
given in the recipe (`value`), a recurrent state [2, batch, 128] whose batch is on axis 1, outputs prob
[batch, 1] and stateN [2, batch, 128]. `temper check` runs it on a real batch, `temper run` gates an FP16
and a dynamic INT8 candidate and publishes, and `temper serve` on the pulled bundle answers several
clients at once; a layout the model does not take is one line at check."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import yaml

from tests.artifacts.runtimes import VAD_AUDIO, VAD_STATE, vad_model
from tests.artifacts.servers import Client, _temper_serve
from tests.helpers import edit_recipe
from tests.unit.reports import read_report

INPUTS = [{"name": "audio", "shape": ["batch", VAD_AUDIO]},
          {"name": "sr", "dtype": "int64", "shape": [], "value": 16000},
          {"name": "state", "shape": [2, "batch", VAD_STATE]}]  # batch_axis 1: the axis named like audio's batch


@pytest.fixture
def vad(tmp_path: Path) -> Path:
    """The model, data files holding one row per sample (state rows [2, 128], samples first), the recipe."""
    folder = tmp_path / "vad"
    folder.mkdir()
    (folder / "vad.onnx").write_bytes(vad_model(tmp_path / "build").read_bytes())
    rng = np.random.default_rng(0)
    for name, rows in (("calib", 48), ("eval", 40)):
        np.savez(folder / f"{name}.npz", audio=rng.standard_normal((rows, VAD_AUDIO)).astype(np.float32),
                 state=rng.normal(0, 0.5, (rows, 2, VAD_STATE)).astype(np.float32))
    recipe = folder / "vad.yaml"
    recipe.write_text(yaml.safe_dump({
        "version": 1, "name": "vad",
        "model": {"onnx": "vad.onnx", "inputs": INPUTS, "outputs": ["prob", "stateN"]},
        "data": {"calibration": {"path": "calib.npz", "batch_size": 16},
                 "evaluation": {"path": "eval.npz", "batch_size": 16}},
        "candidates": {"fp16": {"steps": ["fp16"]}, "int8-dynamic": {"steps": [{"quantize": {"mode": "dynamic"}}]}},
        "validate": {"accuracy": {"metric": "cosine", "output": "stateN", "max_drop": 0.02},
                     "fidelity": {"cosine_min": 0.99},
                     # No candidate is 100x faster, so the FP32 baseline is published whatever the host: served
                     # answers must then equal ONNX Runtime's on each request alone (dynamic INT8 quantizes a
                     # whole batch's activations with one scale: its rows depend on their batch-mates).
                     "throughput": {"batch_sizes": [1, 8], "duration_s": 0.25, "warmup_s": 0.05,
                                    "min_speedup": 100, "speedup_at": [8]}},
        "publish": {"mlflow": {"registered_model": "vad"}, "serving": {"max_batch_size": 8, "max_delay_ms": 5}},
    }, sort_keys=False))
    return recipe


def _one_error(result, recipe: Path, key: str) -> str:
    """Exit 2 and one line naming the recipe and the key; the line."""
    lines = result.stderr.strip().splitlines()
    assert result.code == 2 and "Traceback" not in result.stderr, result.stderr
    assert lines[-1].startswith(f"error: {recipe}: {key}"), result.stderr
    return lines[-1]


def test_check_runs_the_baseline_on_a_real_batch_and_finds_each_outputs_batch_axis(temper, vad: Path) -> None:
    result = temper("check", vad)
    assert result.code == 0, result.stderr
    said = " ".join(result.stderr.split() + result.stdout.split())
    assert "the baseline runs on a real batch laid out as model.inputs says (outputs' batch axes: prob 0, " \
           "stateN 1)" in said


FACTORY = """
import torch


class Vad(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.audio, self.state = torch.nn.Linear(64, 128), torch.nn.Linear(128, 128, bias=False)
        self.head = torch.nn.Linear(128, 1)

    def forward(self, audio, sr, state):
        new = torch.tanh(self.state(state) + torch.tanh(self.audio(audio)) * (sr.float() / 16000))
        return torch.sigmoid(self.head(new[1])), new


def build():
    return Vad()
"""


def test_a_factory_exports_the_scalar_as_a_scalar(temper, vad: Path) -> None:
    """The export check feeds sr as the 0-d tensor it is (np.ascontiguousarray would make it [1])."""
    (vad.parent / "vad_model.py").write_text(FACTORY)
    edit_recipe(vad, lambda d: (d["model"].pop("onnx"),
                                d["model"].update(factory="vad_model.py:build", export={"dynamo": False})))
    result = temper("check", vad)
    assert result.code == 0, result.stderr
    assert "(outputs' batch axes: prob 0, stateN 1)" in " ".join(result.stderr.split() + result.stdout.split())


def test_a_layout_the_model_does_not_take_is_one_line_at_check(temper, vad: Path) -> None:
    """The state's samples declared on axis 0 (the data batch-first, as the model does not take it)."""
    edit_recipe(vad, lambda d: d["model"]["inputs"][2].update(batch_axis=0))
    line = _one_error(temper("check", vad), vad, "model.inputs[2].batch_axis: ")
    assert "'state': a batch of 16 samples on batch_axis 0 is [16, 2, 128], but vad.onnx takes " \
           "[2, 'batch', 128]: set model.inputs[2].batch_axis: 1" in line


def test_data_in_the_models_layout_is_told_how_to_store_it(temper, vad: Path) -> None:
    data = np.load(vad.parent / "eval.npz")
    np.savez(vad.parent / "eval.npz", audio=data["audio"], state=np.moveaxis(data["state"], 0, 1))
    line = _one_error(temper("check", vad), vad, "data.evaluation: columns have different lengths: [2, 40]")
    assert "'state' [2, 40, 128] holds its 40 samples on axis 1" in line and "np.moveaxis(state, 1, 0)" in line


def test_a_scalar_input_needs_its_value(temper, vad: Path) -> None:
    edit_recipe(vad, lambda d: d["model"]["inputs"][1].pop("value"))
    line = _one_error(temper("check", vad), vad, "model.inputs[1]: ")
    assert "'sr' has shape [] (a scalar has no axis to hold samples): give the value" in line


@pytest.mark.slow
def test_run_gates_publishes_and_the_pulled_bundle_serves_several_clients(temper, vad: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = temper("run", vad, "--output", out)
    assert result.code == 0, result.stderr
    report = read_report(out)
    assert report["baseline"]["metric"] == pytest.approx(1.0)  # stateN against itself, samples first
    assert {m["batch_size"] for m in report["baseline"]["throughput"]} == {1, 8}
    for name in ("fp16", "int8-dynamic"):
        gates = {g["name"]: g for g in report["candidates"][name]["gates"]}
        assert gates["accuracy"]["passed"] and gates["fidelity.stateN.cosine"]["passed"], gates
        assert report["candidates"][name]["metric"] > 0.99 and not gates["throughput.cpu.b8"]["passed"]
    assert report["selected"] == "baseline"
    assert json.loads((out / "manifest.json").read_text())["layout"] == {"outputs": {"prob": 0, "stateN": 1}}

    pulled = tmp_path / "pulled"
    assert temper("pull", "models:/vad@candidate", "--dest", pulled).code == 0
    config = json.loads((pulled / "runtime.json").read_text())
    assert [(t["name"], t["shape"], t["batch_axis"], t["value"]) for t in config["inputs"]] == [
        ("audio", [-1, VAD_AUDIO], 0, None), ("sr", [], None, 16000), ("state", [2, -1, VAD_STATE], 1, None)]
    session = ort.InferenceSession(str(pulled / "model.onnx"), providers=["CPUExecutionProvider"])
    with _temper_serve(str(pulled)) as (port, _):
        metadata = Client(port).call("GET", "/v2/models/vad")[2]
        shapes = {t["name"]: t["shape"] for t in [*json.loads(metadata)["inputs"], *json.loads(metadata)["outputs"]]}
        assert shapes == {"audio": [-1, VAD_AUDIO], "sr": [], "state": [2, -1, VAD_STATE], "prob": [-1, 1],
                          "stateN": [2, -1, VAD_STATE]}
        _clients(port, session, clients=6, requests=8)


def _clients(port: int, session: ort.InferenceSession, clients: int, requests: int) -> None:
    """Each client sends requests of 1-3 rows at once with the others, half leaving sr out; every answer is
    plain ONNX Runtime's on that request alone."""
    barrier, failures = threading.Barrier(clients), []

    def client(index: int) -> None:
        c = Client(port)
        try:
            barrier.wait()
            for k in range(requests):
                rng, rows = np.random.default_rng(100 * index + k), 1 + (index + k) % 3
                audio = rng.standard_normal((rows, VAD_AUDIO)).astype(np.float32)
                state = rng.standard_normal((2, rows, VAD_STATE)).astype(np.float32)
                tensors = [{"name": name, "shape": list(a.shape), "datatype": "FP32", "data": a.ravel().tolist()}
                           for name, a in (("audio", audio), ("state", state))]
                if k % 2:
                    tensors.append({"name": "sr", "shape": [], "datatype": "INT64", "data": [16000]})
                status, _, body = c.infer({"inputs": tensors}, model="vad")
                assert status == 200, body
                got = {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in json.loads(body)["outputs"]}
                prob, state_n = session.run(None, {"audio": audio, "sr": np.array(16000, np.int64), "state": state})
                np.testing.assert_allclose(got["prob"], prob, rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(got["stateN"], state_n, rtol=1e-5, atol=1e-6)
        except Exception as exc:  # reported on the test's thread
            failures.append(exc)
        finally:
            c.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[0]


def test_bench_batches_the_state_on_its_own_axis_and_takes_the_sample_rate(temper, vad: Path) -> None:
    result = temper("bench", vad.parent / "vad.onnx", "--batch-sizes", "1,4", "--duration", "0.1", "--warmup", "0",
                    "--value", "sr=16000", "--json")
    assert result.code == 0, result.stderr
    measured = json.loads(result.stdout)
    assert [m["batch_size"] for m in measured] == [1, 4] and all(m["runs"] > 0 for m in measured)
    line = _one_error(temper("bench", vad.parent / "vad.onnx", "--value", "rate=1"), vad.parent / "vad.onnx",
                      "--value: ")
    assert "'rate' is not a scalar input of the model (its scalar inputs: sr)" in line


@pytest.mark.parametrize("value, fragment", [
    ("nan", "not a finite number"), ("inf", "not a finite number"), ("1e400", "not a finite number"),
    ("9223372036854775808", "outside int64's range"), ("-9223372036854775809", "outside int64's range"),
    ("1.5", "'sr' is an int64 input: give an integer"),
])
def test_bench_refuses_a_value_its_scalar_input_cannot_hold(vad: Path, value: str, fragment: str) -> None:
    """NaN, an infinity and an integer past int64 for the int64 `sr` were a traceback, exit 1; 1.5 was cut to 1."""
    from tests.pipeline.test_cli_contract import one_line
    from tests.pipeline.test_cli_contract import temper as console

    model = vad.parent / "vad.onnx"
    result = console("bench", model, "--batch-sizes", "1", "--duration", "0.05", "--warmup", "0",
                     "--value", f"sr={value}")
    assert result.returncode == 2, result.stderr
    line = one_line(result)
    assert line.startswith(f"error: {model}: --value: ") and f"sr={value}" in line and fragment in line, line
