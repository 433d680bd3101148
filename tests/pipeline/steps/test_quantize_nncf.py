"""The quantize step's Intel NNCF backend: quantizes for real where the `nncf` extra is installed (the dev
set-up installs it), through the step and through `temper run`/`temper check` on the digits recipe, and says
what to install where it is not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from temper.artifacts.core.errors import EnvironmentProblem
from temper.pipeline.quantize_backends import nncf as quantize_nncf
from temper.validators.census import census
from tests.helpers import edit_recipe
from tests.pipeline.steps.quantize_models import (
    context,
    conv_net,
    float_node,
    images,
    initializers,
    ops,
    outputs_close,
    producers,
    quantize,
)
from tests.unit.reports import read_report


def test_nncf_backend_without_nncf_is_an_environment_problem(tmp_path: Path, monkeypatch) -> None:
    """A None entry in sys.modules makes `import nncf` fail as on a host without the package."""
    monkeypatch.setitem(sys.modules, "nncf", None)
    src = conv_net(tmp_path / "net.onnx")
    with pytest.raises(EnvironmentProblem, match=r"pip install 'temper-ml\[nncf\]'"):
        quantize(src, tmp_path, mode="static", backend="nncf")


def _nncf_imports() -> bool:
    try:
        quantize_nncf.require()
    except EnvironmentProblem:
        return False
    return True


pytestmark = pytest.mark.skipif(not _nncf_imports(), reason="Intel NNCF is not installed (pip install "
                                                             "'temper-ml[nncf]')")


def test_nncf_is_imported_with_its_telemetry_off(tmp_path: Path) -> None:
    """Outside pytest (which nncf itself detects) a plain `import nncf` writes ~/intel/openvino_ga_cid and
    reports each quantize call; temper's import loads no telemetry and writes no client id."""
    code = ("import sys; from temper.pipeline.quantize_backends import nncf; nncf.require(); "
            "from nncf.telemetry import wrapper; "
            "print(type(wrapper.telemetry).__name__, 'openvino_telemetry' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "NNCF_CI", "NNCF_DEV")}  # each turns it off too
    env["HOME"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["MagicMock", "False"]  # nncf's own no-op stub
    assert not (tmp_path / "intel").exists()


def test_nncf_quantizes_the_conv_net_honouring_exclusions_and_per_channel(tmp_path: Path) -> None:
    src = conv_net(tmp_path / "net.onnx")
    plain = quantize(src, tmp_path, name="plain", mode="static", backend="nncf")
    assert census(plain).quantized == 3 and census(plain).precision() == "int8-static"
    assert outputs_close(src, plain, tmp_path, images(99)) > 0.99
    weight_scales = {init.name: init.dims for init in plain.graph.initializer if "scale" in init.name}
    assert any(dims == [8] for dims in weight_scales.values())  # NNCF's default: per-channel weights

    kept = quantize(src, tmp_path, name="kept", mode="static", backend="nncf", exclude_nodes=["conv2"])
    assert float_node(kept, "conv2", "Conv", "w2") and census(kept).quantized == 2
    typed = quantize(src, tmp_path, name="typed", mode="static", backend="nncf", exclude_op_types=["Conv"])
    assert census(typed).by_op["Conv"].quantized == 0 and census(typed).by_op["MatMul"].quantized == 1

    per_tensor = quantize(src, tmp_path, name="per-tensor", mode="static", backend="nncf", per_channel=False)
    dequantized = [node for node in per_tensor.graph.node if node.op_type == "DequantizeLinear"]
    scales = initializers(per_tensor)
    assert dequantized and all(scales[node.input[1]].ndim == 0 for node in dequantized)


def test_nncf_reads_a_model_with_external_data(tiny_cnn_path: Path, tmp_path: Path, external_data_copy) -> None:
    src = external_data_copy(tiny_cnn_path)
    batches = [{"pixels": np.random.default_rng(s).normal(0, 1, (8, 1, 8, 8)).astype(np.float32)} for s in range(3)]
    model = quantize(src, tmp_path, context(tmp_path, batches), mode="static", backend="nncf")
    assert census(model).quantized == census(model).eligible == 2


def _attention(src: Path, tmp_path: Path, name: str, **options: object) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    batches = [{"hidden": rng.normal(0, 1, (4, 5, 16)).astype(np.float32)} for _ in range(6)]
    return quantize(src, tmp_path, context(tmp_path, batches), name=name, mode="static", backend="nncf", **options)


def _softmax_feed(model: onnx.ModelProto) -> str:
    """The op that hands attention's weights @ V MatMul the Softmax output: Softmax itself when that MatMul stays
    float, DequantizeLinear when NNCF quantized its input."""
    made = producers(model)
    for node in model.graph.node:
        first = made.get(node.input[0]) if node.op_type == "MatMul" else None
        source = first
        while source is not None and source.op_type in ("QuantizeLinear", "DequantizeLinear"):
            source = made.get(source.input[0])
        if first is not None and source is not None and source.op_type == "Softmax":
            return first.op_type
    raise AssertionError("no MatMul reads the Softmax output")


def test_model_type_transformer_keeps_attention_out_of_int8(tiny_multihead_path: Path, tmp_path: Path) -> None:
    default = _attention(tiny_multihead_path, tmp_path, "default")
    transformer = _attention(tiny_multihead_path, tmp_path, "transformer", model_type="transformer")
    assert census(default).by_op["MatMul"].quantized == 6
    assert census(transformer).by_op["MatMul"].quantized < census(default).by_op["MatMul"].quantized
    assert census(transformer).by_op["MatMul"].fp32 == 1
    assert (_softmax_feed(default), _softmax_feed(transformer)) == ("DequantizeLinear", "Softmax")
    assert ops(transformer).count("QuantizeLinear") < ops(default).count("QuantizeLinear")


def _smoothing(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """SmoothQuant's per-channel scales: the Mul nodes NNCF inserts, by name."""
    inits = initializers(model)
    return {node.name: next(inits[name] for name in node.input if name in inits)
            for node in model.graph.node if node.op_type == "Mul" and "smooth_quant" in node.name}


def test_smooth_quant_alpha_reaches_nncf_and_false_turns_it_off(tiny_multihead_path: Path, tmp_path: Path) -> None:
    default = _smoothing(_attention(tiny_multihead_path, tmp_path, "sq-default", model_type="transformer"))
    half = _smoothing(_attention(tiny_multihead_path, tmp_path, "sq-half", model_type="transformer",
                                 smooth_quant_alpha=0.5))
    off = _smoothing(_attention(tiny_multihead_path, tmp_path, "sq-off", model_type="transformer",
                                smooth_quant_alpha=False))
    assert default and half.keys() == default.keys() and off == {}
    assert any(not np.allclose(half[name], default[name]) for name in default)  # 0.5, not NNCF's 0.95


# -- through the CLI, on the digits recipe ---------------------------------------------------------------


def _nncf_candidate(recipe: Path, **options: object) -> None:
    def change(d: dict) -> None:
        d["candidates"] = {"int8-nncf": {"steps": [{"quantize": {"mode": "static", "backend": "nncf", **options}}]}}
        d.pop("publish")

    edit_recipe(recipe, change)


@pytest.mark.slow
def test_an_nncf_candidate_builds_is_gated_and_counted_int8(temper, gated_digits: Path, tmp_path: Path) -> None:
    _nncf_candidate(gated_digits)
    out = tmp_path / "out"
    result = temper("run", gated_digits, "--output", out)
    assert result.code == 0, result.stderr
    assert "Statistics collection" not in result.stdout and "INFO:nncf" not in result.stdout  # NNCF kept quiet
    entry = read_report(out)["candidates"]["int8-nncf"]
    assert entry["precision"] == entry["intended_precision"] == "int8-static"
    assert entry["census"]["quantized"] == entry["census"]["eligible"] == 5  # through the MaxPools too
    gates = {gate["name"] for gate in entry["gates"]}
    assert {"build", "accuracy", "fidelity.logits.cosine", "throughput.cpu.b32"} <= gates
    assert {"QuantizeLinear", "DequantizeLinear"} <= set(ops(onnx.load(str(out / "int8-nncf" / "model.onnx"))))


def _assert_one_line(result, recipe: Path, key: str, *fragments: str) -> None:
    assert result.code == 2, (result.code, result.stdout, result.stderr)
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, result.stderr
    assert line.startswith(f"error: {recipe}: {key}: "), line
    for fragment in fragments:
        assert fragment in line, line


STEP = "candidates.int8-nncf.steps[0].quantize"


@pytest.mark.parametrize(("options", "key", "fragment"), [
    ({"calibration": "entropy"}, "calibration", "use backend: ort for entropy"),
    ({"activation_type": "uint8"}, "activation_type", "by its preset"),
    ({"symmetric_activations": True}, "symmetric_activations", "by its preset"),
    ({"weight_type": "uint8"}, "weight_type", "symmetric int8 only"),
    ({"dedicated_qdq_pairs": True}, "dedicated_qdq_pairs", "places its own Q/DQ pairs"),
    ({"percentile": 99.9}, "percentile", "no histogram calibration"),
    ({"preset": "avx2"}, "preset", "backend: nncf takes NNCF's presets, performance or mixed"),
    ({"smooth_quant_alpha": 0.5}, "smooth_quant_alpha", "only with model_type: transformer"),
    ({"model_type": "transformer", "smooth_quant_alpha": -1}, "smooth_quant_alpha", "or false to turn SmoothQuant"),
    ({"fallback": {}}, "fallback", "it needs backend: ort"),
    ({"format": "qoperator"}, "format", "backend: nncf writes QDQ graphs only"),
    ({"backend": "ort", "model_type": "transformer"}, "model_type", "it needs backend: nncf"),
    ({"backend": "ort", "preset": "mixed"}, "preset", "mixed is NNCF's preset: it needs backend: nncf"),
])
def test_what_nncf_cannot_honour_is_one_line_at_check(temper, gated_digits: Path, options, key, fragment) -> None:
    _nncf_candidate(gated_digits, **options)
    _assert_one_line(temper("check", gated_digits), gated_digits, f"{STEP}.{key}".rstrip("."), fragment)


def test_nncf_options_are_searchable(temper, gated_digits: Path) -> None:
    from temper.pipeline.loading import load_recipe

    _nncf_candidate(gated_digits, model_type="transformer", smooth_quant_alpha=[False, 0.5], preset=["mixed"])
    loaded = load_recipe(gated_digits)
    trials = loaded.searches["int8-nncf"].trials
    assert trials == ["int8-nncf.preset-mixed.smooth_quant_alpha-false",
                      "int8-nncf.preset-mixed.smooth_quant_alpha-0.5"]
    alphas = [loaded.recipe.candidates[name].steps[0].options.smooth_quant_alpha for name in trials]
    assert alphas == [False, 0.5]
