"""The models benchmarks/serving.py serves, and (c): what one in-process ONNX Runtime session does with them.

Each model carries its input in two forms (float32 array, 4-decimal nested list) so the binary and
JSON bodies send the same values and every server's answer can be checked against `reference`.
The ceiling is the denominator of every ratio the tables print.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.serving_host import BIN, ROOT, child_env, log

DIGITS_RECIPE = ROOT / "recipes" / "digits-cnn.yaml"
CEILING_BATCHES = (1, 8, 16, 32)
SEED = 0
HEAVY_WIDTH = 32  # channels of the heavy CNN's first stage: ~3 ms per batch-1 inference on a quiet 2-core EPYC VM


@dataclass
class Model:
    key: str
    path: Path
    input_name: str
    sample: np.ndarray  # one row, float32, batch dim 1
    json_values: list  # the same values as the nested list a JSON client sends (4 decimals)
    note: str = ""
    batch1_ms: float | None = None


def rounded_sample(shape: tuple[int, ...], scale: float) -> tuple[np.ndarray, list]:
    """Seeded random input with 4 decimals, so the JSON and binary bodies carry the same values."""
    values = np.round(np.random.default_rng(SEED).random(shape) * scale, 4)
    return values.astype(np.float32), values.tolist()


def build_digits(base: Path) -> Model:
    out = base / "digits"
    model = out / "baseline" / "model.onnx"
    if not model.is_file():
        log(f"=== building the digits CNN: temper run {DIGITS_RECIPE} --output {out}")
        env = child_env(TEMPER_CACHE_DIR=str(base / "cache"),
                        MLFLOW_TRACKING_URI=f"sqlite:///{base / 'temper-run-mlflow.db'}")
        rc = subprocess.run([str(BIN / "temper"), "run", str(DIGITS_RECIPE), "--output", str(out)], cwd=base, env=env,
                            stdout=sys.stderr, stderr=sys.stderr, check=False).returncode
        if not model.is_file():
            raise SystemExit(f"error: temper run exited {rc} without {model}")
    sample, values = rounded_sample((1, 1, 8, 8), 16.0)
    return Model("digits", model, _input_name(model), sample, values,
                 "digits CNN (recipes/digits-cnn.yaml FP32 baseline), 1x1x8x8")


def build_heavy(base: Path) -> Model:
    """A seeded ResNet-ish CNN (4 residual stages, widths 32-256) at 1x3x64x64, batch dim symbolic."""
    w = HEAVY_WIDTH
    path = base / f"heavy-w{w}" / "model.onnx"
    if not path.is_file():
        import torch
        from torch import nn

        class Block(nn.Module):
            def __init__(self, cin: int, cout: int, stride: int) -> None:
                super().__init__()
                self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
                self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
                self.skip = (nn.Identity() if stride == 1 and cin == cout
                             else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + self.skip(x))

        torch.manual_seed(SEED)
        net = nn.Sequential(nn.Conv2d(3, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
                            Block(w, w, 1), Block(w, 2 * w, 2), Block(2 * w, 4 * w, 2), Block(4 * w, 8 * w, 2),
                            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * w, 10)).eval()
        path.parent.mkdir(parents=True, exist_ok=True)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(net, torch.zeros(1, 3, 64, 64), str(path), input_names=["image"],
                              output_names=["logits"], dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
                              opset_version=17, dynamo=False)
    sample, values = rounded_sample((1, 3, 64, 64), 1.0)
    return Model("heavy", path, "image", sample, values,
                 f"ResNet-ish CNN, 4 residual stages ({w}-{8 * w} channels), 1x3x64x64, seeded random weights")


def _input_name(path: Path) -> str:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    return next(v.name for v in graph.input if v.name not in initializers)


def make_bundle(model: Model, dest: Path, max_batch: int, max_delay_ms: float) -> Path:
    from temper.artifacts.formats import bundle

    if dest.exists():
        shutil.rmtree(dest)
    config = bundle.config_for(model.path, model.key, max_batch_size=max_batch, max_delay_ms=max_delay_ms)
    return bundle.write(dest, model.path, config)


# -- (c): the raw ONNX Runtime ceiling -------------------------------------------------------


def ceiling(model: Model, duration: float, batches: tuple[int, ...] = CEILING_BATCHES) -> dict[str, dict[int, float]]:
    """Samples/s of one in-process session (intra_op threads = cores) per batch size, with ORT's default
    spinning intra-op threads ("spin") and with spinning off as temper's runtime sets it ("no spin")."""
    import onnxruntime as ort

    result: dict[str, dict[int, float]] = {}
    for label, spinning in (("spin", "1"), ("no spin", "0")):
        options = ort.SessionOptions()
        options.intra_op_num_threads = len(os.sched_getaffinity(0))
        options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
        session = ort.InferenceSession(str(model.path), options, providers=["CPUExecutionProvider"])
        result[label] = {}
        for batch in batches:
            feed = {model.input_name: np.repeat(model.sample, batch, axis=0)}
            for _ in range(5):
                session.run(None, feed)
            runs, began = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - began) < duration:
                session.run(None, feed)
                runs += 1
            result[label][batch] = runs * batch / elapsed
        del session
    return result


def best(measures: list[dict[str, dict[int, float]]]) -> dict[int, float]:
    return {b: max(m[label][b] for m in measures for label in m) for b in CEILING_BATCHES}


def reference(model: Model) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model.path), providers=["CPUExecutionProvider"])
    return session.run(None, {model.input_name: model.sample})[0]
