"""On a GPU row an INT8 candidate is gated against the FP16 candidate on the same row, on the paired
per-round ratios of the largest batch size; on the CPU, and without an FP16 candidate, nothing changes.
The rounds are built as the speed gates record them (validators.rounds.Bench of Measurements)."""

from __future__ import annotations

from temper.validators.gpu_precision import int8_over_fp16
from temper.validators.pairs import Pair
from temper.validators.rounds import Bench
from temper.validators.throughput import Measurement

PRECISIONS = {"baseline": "fp32", "fp16": "fp16", "int8": "int8-static"}


def _slice(provider: str, rate: float, batch: int) -> Measurement:
    return Measurement(provider=provider, batch_size=batch, runs=10, samples=10 * batch, seconds=10 * batch / rate,
                       samples_per_s=rate, latency_ms={"p50": 1.0}, peak_rss_mb=1.0, gpu_mem_mb=None)


def _bench(engine: str, rates: dict[str, list[float]], batch: int = 256) -> Bench:
    keys = {model: model if engine == "cpu" else f"{model}@{engine}" for model in rates}
    slices = {keys[m]: {r: _slice(engine, rate, batch) for r, rate in enumerate(seq)} for m, seq in rates.items()}
    return Bench(batch_size=batch, reference=keys["baseline"], slices=slices)


def _candidates(engine: str) -> list[tuple[str, Pair]]:
    return [(m if engine == "cpu" else f"{m}@{engine}", Pair(m, engine)) for m in ("fp16", "int8")]


def test_an_int8_no_faster_than_fp16_on_a_gpu_fails_even_when_it_beats_fp32():
    bench = _bench("cuda", {"baseline": [100, 101, 99, 100, 100], "fp16": [300, 310, 290, 305, 300],
                            "int8": [295, 315, 300, 290, 310]})
    gates = int8_over_fp16(_candidates("cuda"), PRECISIONS, [_bench("cuda", {"baseline": [1], "fp16": [1],
                                                                              "int8": [1]}, 1), bench], 0.95)
    gate = gates["int8@cuda"]
    assert not gate.passed and gate.kind == "precision" and gate.provider == "cuda" and gate.batch_size == 256
    assert gate.name == "throughput.cuda.b256.over-fp16" and "not faster than fp16@cuda at batch 256" in gate.detail
    assert gate.interval is not None and gate.interval[0] < 1.0 < gate.interval[1]
    assert set(gates) == {"int8@cuda"}  # the FP16 candidate itself gets no such gate


def test_an_int8_faster_than_fp16_on_its_interval_passes():
    bench = _bench("tensorrt", {"baseline": [100] * 5, "fp16": [300, 310, 290, 305, 300],
                                "int8": [450, 470, 440, 460, 455]})
    gate = int8_over_fp16(_candidates("tensorrt"), PRECISIONS, [bench], 0.95)["int8@tensorrt"]
    assert gate.passed and gate.measured is not None and 1.4 < gate.measured < 1.6
    assert gate.interval is not None and gate.interval[0] > 1.0


def test_on_the_cpu_or_without_an_fp16_candidate_there_is_no_such_gate():
    bench = _bench("cpu", {"baseline": [100] * 5, "fp16": [300] * 5, "int8": [200] * 5})
    assert int8_over_fp16(_candidates("cpu"), PRECISIONS, [bench], 0.95) == {}
    gpu = _bench("cuda", {"baseline": [100] * 5, "int8": [200] * 5})
    assert int8_over_fp16([("int8@cuda", Pair("int8", "cuda"))], PRECISIONS, [gpu], 0.95) == {}
