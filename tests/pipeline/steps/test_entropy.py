"""temper's vectorized entropy threshold search gives ONNX Runtime's thresholds exactly: on histograms
ONNX Runtime's own collector built from real activations, and end to end as the ranges file."""

from __future__ import annotations

import numpy as np
import pytest
from onnxruntime.quantization.calibrate import CalibrationDataReader, CalibrationMethod, create_calibrator

from temper.pipeline.quantize_backends import OrtOptions, entropy, quantize_static
from tests.pipeline.steps.quantize_models import conv_net, heavy_tailed, images


class _Reader(CalibrationDataReader):
    def __init__(self, feeds: list[dict]) -> None:
        self.feeds = iter(feeds)

    def get_next(self) -> dict | None:
        return next(self.feeds, None)


@pytest.mark.parametrize("num_bins, symmetric", [  # the library's own search takes seconds at the default 2048
    pytest.param(2048, False, marks=pytest.mark.slow), (512, True), (1001, False)])
def test_each_threshold_equals_the_librarys(tmp_path, num_bins, symmetric):
    calibrator = create_calibrator(conv_net(tmp_path / "net.onnx"), augmented_model_path=str(tmp_path / "aug.onnx"),
                                   calibrate_method=CalibrationMethod.Entropy,
                                   extra_options={"num_bins": num_bins, "symmetric": symmetric})
    for seed in range(3):  # heavy tails: outliers on both sides of every window
        for feed in (heavy_tailed(seed, rows=8), images(seed)):
            calibrator.collect_data(_Reader([feed]))
    collector = calibrator.collector
    assert len(collector.histogram_dict) >= 5
    for histogram in collector.histogram_dict.values():
        ours = entropy.threshold(histogram, collector.num_quantized_bins)
        theirs = collector.get_entropy_threshold(histogram, collector.num_quantized_bins)
        assert [np.asarray(v).tobytes() for v in ours] == [np.asarray(v).tobytes() for v in theirs]
        assert [np.asarray(v).dtype for v in ours] == [np.asarray(v).dtype for v in theirs]


def test_the_ranges_file_is_the_one_the_library_writes(tmp_path, monkeypatch):
    feeds = [heavy_tailed(seed, rows=8) for seed in range(3)]
    options = OrtOptions(mode="static", calibration="entropy", preprocess=False, num_bins=512)
    model = conv_net(tmp_path / "net.onnx")
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    ours = quantize_static.prepare(model, options, feeds, tmp_path / "a", False).ranges.read_text()
    monkeypatch.setattr(entropy, "thresholds", lambda collector: collector_result(collector))
    theirs = quantize_static.prepare(model, options, feeds, tmp_path / "b", False).ranges.read_text()
    assert ours == theirs and "highest" in ours


def collector_result(collector):
    from onnxruntime.quantization.calibrate import TensorsData

    return TensorsData(CalibrationMethod.Entropy, collector.compute_collection_result())
