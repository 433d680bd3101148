"""The quantize step's NVIDIA ModelOpt backend: quantizes for real where the `modelopt` extra is
installed (the dev set-up installs it), and says what to install where it is not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from temper.artifacts.core.errors import EnvironmentProblem
from temper.pipeline.quantize_backends import modelopt as quantize_modelopt
from tests.pipeline.steps.quantize_models import (
    activation_scales,
    conv_net,
    float_node,
    images,
    ops,
    outputs_close,
    quantize,
)


def test_modelopt_backend_without_modelopt_is_an_environment_problem(tmp_path: Path, monkeypatch) -> None:
    """A None entry in sys.modules makes `import modelopt...` fail as on a host without the package."""
    monkeypatch.setitem(sys.modules, "modelopt", None)
    src = conv_net(tmp_path / "net.onnx")
    with pytest.raises(EnvironmentProblem, match=r"pip install 'temper-ml\[modelopt\]'"):
        quantize(src, tmp_path, mode="static", backend="modelopt")


def _modelopt_imports() -> bool:
    try:
        quantize_modelopt.require()
    except EnvironmentProblem:
        return False
    return True


NO_MODELOPT = "NVIDIA ModelOpt is not installed (pip install 'temper-ml[modelopt]')"


@pytest.mark.skipif(not _modelopt_imports(), reason=NO_MODELOPT)
def test_modelopt_backend_quantizes_on_cpu(tmp_path: Path) -> None:
    src = conv_net(tmp_path / "net.onnx")
    model = quantize(src, tmp_path, mode="static", backend="modelopt", exclude_nodes=["conv2"])

    assert {"QuantizeLinear", "DequantizeLinear"} <= set(ops(model))
    assert float_node(model, "conv2", "Conv", "w2")
    assert outputs_close(src, model, tmp_path, images(99)) > 0.99


@pytest.mark.slow
@pytest.mark.skipif(not _modelopt_imports(), reason=NO_MODELOPT)
def test_an_ort_static_candidate_after_a_modelopt_one_calibrates_as_before(tmp_path: Path) -> None:
    """ModelOpt patches ONNX Runtime's calibrators process-wide; the step puts them back, so ORT candidates
    built later in the same run get the scales they get alone (they failed to calibrate before)."""
    src = conv_net(tmp_path / "net.onnx")

    def ort_scales(tag: str) -> dict[str, dict[str, float]]:
        return {method: activation_scales(quantize(src, tmp_path, name=f"{tag}-{method}", mode="static",
                                                   calibration=method))
                for method in ("minmax", "entropy")}

    def ort_graph(tag: str) -> list[str]:
        return ops(quantize(src, tmp_path, name=f"{tag}-graph", mode="static"))

    before, graph = ort_scales("before"), ort_graph("before")
    quantize(src, tmp_path, name="modelopt", mode="static", backend="modelopt")
    assert ort_scales("after") == before
    # ModelOpt also edits ORT's op registries in place (Relu, Concat, ... out of QDQRegistry): the same
    # ops must be quantized after it as before
    assert ort_graph("after") == graph
