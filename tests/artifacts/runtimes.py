"""Tiny real ONNX models for the serving runtime's tests, a runtime over each one's bundle, and the
answers a plain ONNX Runtime session gives, to compare with."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from temper.artifacts.formats.bundle import config_for, write
from temper.artifacts.serving.runtime import Runtime

WEIGHTS = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
EMBEDDINGS = np.random.default_rng(1).standard_normal((10, 3)).astype(np.float32)


def save(tmp_path: Path, name: str, nodes: list, inputs: list, outputs: list, initializers: list) -> Path:
    model = helper.make_model(
        helper.make_graph(nodes, name, inputs, outputs, initializers), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 9
    onnx.checker.check_model(model)
    path = tmp_path / name / f"{name}.onnx"
    path.parent.mkdir(parents=True)
    onnx.save(model, path)
    return path


def linear_model(tmp_path: Path) -> Path:
    """y = x @ W: each row's output identifies its input."""
    return save(
        tmp_path, "linear", [helper.make_node("MatMul", ["x", "W"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(WEIGHTS, "W")],
    )


def pooling_model(tmp_path: Path, embeddings: np.ndarray = EMBEDDINGS) -> Path:
    """Token embeddings [batch, seq, width] and their attention-masked mean [batch, width]: a tiny
    encoder's shape, with `embeddings` [vocab, width] as its table (10 x 3 by default)."""
    width = embeddings.shape[1]
    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["tokens"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "last"], ["mask3"]),
        helper.make_node("Mul", ["tokens", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "seq"], ["total"], keepdims=0),
        helper.make_node("ReduceSum", ["maskf", "seq"], ["count"], keepdims=1),
        helper.make_node("Div", ["total", "count"], ["pooled"]),
    ]
    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
           for n in ("input_ids", "attention_mask")]
    outputs = [
        helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", "seq", width]),
        helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", width]),
    ]
    constants = [
        numpy_helper.from_array(embeddings, "E"),
        numpy_helper.from_array(np.array([2], np.int64), "last"),
        numpy_helper.from_array(np.array([1], np.int64), "seq"),
    ]
    return save(tmp_path, "pooling", nodes, ids, outputs, constants)


def slow_model(tmp_path: Path) -> Path:
    """~10 ms per row on 2 cores (a 512x512 outer product squared): keeps the engine busy."""
    nodes = [
        helper.make_node("Unsqueeze", ["x", "two"], ["column"]),
        helper.make_node("Unsqueeze", ["x", "one"], ["row"]),
        helper.make_node("Mul", ["column", "row"], ["outer"]),
        helper.make_node("MatMul", ["outer", "outer"], ["square"]),
        helper.make_node("ReduceSum", ["square", "one"], ["partial"], keepdims=0),
        helper.make_node("ReduceSum", ["partial", "one"], ["y"], keepdims=1),
    ]
    return save(
        tmp_path, "slow", nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        [numpy_helper.from_array(np.array([1], np.int64), "one"),
         numpy_helper.from_array(np.array([2], np.int64), "two")],
    )


VAD_AUDIO, VAD_STATE = 64, 128


def vad_model(folder: Path, name: str = "vad") -> Path:
    """Silero VAD's structure: audio [batch, 64], a scalar int64 sample rate `sr` [], a recurrent state
    [2, batch, 128] with the batch on axis 1; outputs prob [batch, 1] and the new state stateN
    [2, batch, 128]. stateN = tanh(state @ Ws + tanh(audio @ Wa) * sr / 16000), prob = sigmoid(stateN[1] @ Wo)."""
    rng = np.random.default_rng(7)
    weights = {"Wa": rng.normal(0, 0.15, (VAD_AUDIO, VAD_STATE)), "Ws": rng.normal(0, 0.1, (VAD_STATE, VAD_STATE)),
               "Wo": rng.normal(0, 0.2, (VAD_STATE, 1)), "rate": np.array(16000.0)}
    nodes = [
        helper.make_node("MatMul", ["audio", "Wa"], ["heard"], name="audio_in"),
        helper.make_node("Tanh", ["heard"], ["h"]),
        helper.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["srf", "rate"], ["scale"]),
        helper.make_node("Mul", ["h", "scale"], ["drive"]),
        helper.make_node("MatMul", ["state", "Ws"], ["carried"], name="state_in"),
        helper.make_node("Add", ["carried", "drive"], ["mixed"]),
        helper.make_node("Tanh", ["mixed"], ["stateN"]),
        helper.make_node("Gather", ["stateN", "one"], ["last"], axis=0),
        helper.make_node("MatMul", ["last", "Wo"], ["logit"], name="head"),
        helper.make_node("Sigmoid", ["logit"], ["prob"]),
    ]
    inputs = [helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch", VAD_AUDIO]),
              helper.make_tensor_value_info("sr", TensorProto.INT64, []),
              helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", VAD_STATE])]
    outputs = [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["batch", 1]),
               helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, None, VAD_STATE])]  # unnamed: Silero
    initializers = [numpy_helper.from_array(w.astype(np.float32), k) for k, w in weights.items()]
    initializers.append(numpy_helper.from_array(np.array(1, np.int64), "one"))
    return save(folder, name, nodes, inputs, outputs, initializers)


def runtime_for(model: Path, tmp_path: Path, instances: int = 0, **serving: object) -> Runtime:
    """A Runtime on `model`, in this process (instances 0) or in that many worker processes."""
    config = config_for(model, model.stem, **serving)
    return Runtime(write(tmp_path / f"{model.stem}-bundle", model, config), instances=instances)


def plain(model: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))

