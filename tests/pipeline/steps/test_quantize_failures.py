"""ONNX Runtime's quantization tools failing on small real models, each as one line naming the stage, the
node and the way out; `preprocess: false` as that way out; and the dynamic path pre-processing like the
static one, which quantizes a weight only constant folding makes an initializer."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from temper.artifacts.core import onnx_io
from temper.artifacts.core.errors import StepFailed
from temper.pipeline.quantize_backends import OrtOptions
from temper.validators.census import census
from tests.pipeline.steps.quantize_models import (
    constant_weight_conv,
    context,
    cosine,
    ops,
    quantize,
    runtime_axes_model,
)


def _rows(shape: tuple[int, ...], seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).normal(0, 1, shape).astype(np.float32)}


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_symbolic_shape_inference_failing_names_its_stage_node_and_the_option_that_skips_it(tmp_path, mode):
    src = runtime_axes_model(tmp_path / "axes.onnx")
    ctx = context(tmp_path, [_rows((8, 16), seed) for seed in range(2)])
    with pytest.raises(StepFailed) as err:
        quantize(src, tmp_path, ctx, mode=mode, preset=None)
    message = str(err.value)
    # ORT's own text is a bare AssertionError; the line says where it stopped and what to do
    assert message.startswith("quantize: quant_pre_process (symbolic shape inference) failed at ReduceSum node "
                              "'sum_runtime_axes': AssertionError; set preprocess: false on this quantize step "
                              ), message
    assert "the cost: no fused ops and no inferred shapes" in message and "\n" not in message
    assert err.value.kind == "error"  # a library raised: a build error, not a verdict on the model


def test_without_pre_processing_that_model_quantizes(tmp_path):
    src = runtime_axes_model(tmp_path / "axes.onnx")
    batches = [_rows((8, 16), seed) for seed in range(2)]
    model = quantize(src, tmp_path, context(tmp_path, batches), mode="static", preset=None, preprocess=False)
    assert census(model).quantized == 1  # the MatMul
    out = tmp_path / "check.onnx"
    out.write_bytes(model.SerializeToString())
    assert cosine(onnx_io.run(src, batches[0])[0], onnx_io.run(out, batches[0])[0]) > 0.99


def test_the_dynamic_path_pre_processes_so_a_weight_a_constant_node_makes_quantizes(tmp_path):
    src = constant_weight_conv(tmp_path / "conv.onnx")
    ctx = context(tmp_path, [_rows((4, 1, 8, 8), 0)])
    model = quantize(src, tmp_path, ctx, mode="dynamic", preset=None)
    assert "ConvInteger" in ops(model) and census(model).quantized == 1

    with pytest.raises(StepFailed) as err:  # as the graph is, ONNX Runtime's dynamic quantizer gives up
        quantize(src, tmp_path, ctx, name="plain", mode="dynamic", preset=None, preprocess=False)
    assert str(err.value) == (
        "quantize: quantize_dynamic failed at Conv node 'conv': ValueError: Expected w to be an initializer; "
        "keep this node float with exclude_nodes: [conv] (it then runs in FP32); or set preprocess: true, which "
        "folds Constant and shape nodes into the initializers the quantizer needs")


def test_preprocess_is_for_onnx_runtime_only():
    """ModelOpt's options model has no `preprocess` (pydantic refuses the key); the loader words it at the key."""
    from temper.pipeline.loading import describe
    from temper.pipeline.recipe import StepSpec

    data = {"quantize": {"mode": "static", "backend": "modelopt", "preprocess": False}}
    with pytest.raises(ValidationError) as err:
        StepSpec.model_validate(data)
    key, message = describe(err.value.errors()[0], data)
    assert key == "quantize.preprocess" and message.startswith("ModelOpt prepares the graph itself")
    assert OrtOptions(mode="dynamic", preprocess=False).preprocess is False


def test_the_node_to_keep_float_is_named_as_the_step_s_input_graph_has_it():
    from onnx import helper

    from temper.pipeline.quantize_backends.failures import user_name

    fused = helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc/MatMulAddFusion")  # quant_pre_process's rename
    assert user_name(fused) == "fc"
    exported = helper.make_node("Conv", ["x", "w"], ["y"], name="/decoder/Conv")  # a torch export's own slashes
    assert user_name(exported) == "/decoder/Conv"
