"""On a GPU, INT8 must beat FP16, not only FP32: the gate that keeps a slower INT8 from being selected.

On a CPU, INT8 is the fast path and FP16 rarely is; on a GPU, FP16 runs on tensor cores and an INT8 graph
can be slower than the FP16 one (NVIDIA/Model-Optimizer#80: H100, FP16 8.34 ms, ModelOpt QDQ INT8 slower)
while still clearing the speed gate over the FP32 baseline. So on a GPU row each INT8 candidate is also
compared with the FP16 candidate on the same row, at the ranking batch size (the largest), on the paired
per-round ratios the speed gates use; it passes only where the whole interval lies above 1.0.
"""

from __future__ import annotations

from collections.abc import Sequence

from temper.artifacts.engines.providers import PROVIDERS
from temper.validators.gates import Gate
from temper.validators.pairs import Pair
from temper.validators.rounds import Bench
from temper.validators.speedup import estimate


def int8_over_fp16(candidates: Sequence[tuple[str, Pair]], precisions: dict[str, str], benches: Sequence[Bench],
                   confidence: float) -> dict[str, Gate]:
    """The gate for each INT8 pair (its timed key and pair) on a GPU row that has a timed FP16 pair: key -> Gate."""
    if not benches:
        return {}
    bench = max(benches, key=lambda b: b.batch_size)
    timed = set(bench.slices)
    fp16 = {pair.provider: key for key, pair in candidates
            if precisions.get(pair.model) == "fp16" and key in timed}
    gates = {}
    for key, pair in candidates:
        engine = pair.provider
        if not (PROVIDERS[engine].gpu and precisions.get(pair.model, "").startswith("int8")):
            continue
        if key not in timed or engine not in fp16:
            continue
        up = estimate(bench.ratios(key, over=fp16[engine]), confidence)
        interval = (up.low, up.high) if up.low is not None and up.high is not None else None
        faster = up.decide(1.0) == "pass"
        detail = (f"{'faster' if faster else 'not faster'} than {fp16[engine]} at batch {bench.batch_size}: "
                  f"{up.shown()} ({confidence:.0%}, {up.rounds} rounds)"
                  + ("" if faster else ": on a GPU an INT8 model must beat FP16 on its interval to be selected"))
        gates[key] = Gate(f"throughput.{engine}.b{bench.batch_size}.over-fp16", faster, up.ratio, 1.0, detail,
                          interval=interval, kind="precision", provider=engine, batch_size=bench.batch_size)
    return gates
