"""`temper capacity` against a real `temper serve` under real open-loop load from Triton's perf_analyzer: the
configuration it records is the one of the highest rate measured with p99 under the target, its knee is repeated
with an interval, the curve is drawn, and `temper serve` then runs the configuration chosen."""

from __future__ import annotations

import json

import pytest

from temper.artifacts.formats import capacity
from tests.artifacts.servers import Client, _bundle, _slow_model, _temper_serve
from tests.artifacts.test_perf_analyzer import perf_analyzer  # noqa: F401  (the fixture that installs it)

TARGET_MS = 60.0


@pytest.mark.slow
def test_capacity_records_the_highest_rate_measured_under_the_target(temper, perf_analyzer, tmp_path) -> None:  # noqa: F811
    source = _bundle(tmp_path / "slow", _slow_model(tmp_path / "slow.onnx"), "slow")
    result = temper("capacity", source, "--p99-ms", TARGET_MS, "--batch-sizes", "16,4", "--delays-ms", "10",
                    "--instances", "1", "--rounds", "1", "--seconds", "1", "--steps", "1", "--start-rate", "10",
                    "--perf-analyzer", perf_analyzer)
    assert result.code == 0, result.stderr
    record = capacity.read(source)
    assert record is not None and record.target_p99_ms == TARGET_MS

    searched = [p for p in record.points if p.round == 0]
    assert {p.choice.max_batch_size for p in searched} == {16, 4}  # both were offered load
    under = [p for p in searched if p.under]
    assert under and all(p.p99_ms is not None and p.p99_ms <= TARGET_MS and p.errors == 0 for p in under)
    best = max(p.rate for p in under)
    assert [p.choice for p in under if p.rate == best][0] == record.chosen  # the highest rate under the target
    assert all(p.p99_ms is None or p.p99_ms > TARGET_MS or p.errors or p.delayed_pct > 5
               for p in searched if not p.under)  # and nothing over it was counted

    assert record.knees[0] == best and len(record.knees) == 2  # the search's knee, then one repeat
    assert any(p.round == 1 and p.choice == record.chosen for p in record.points)
    assert record.interval[0] <= record.rate <= record.interval[1]
    assert record.tool.startswith("perf_analyzer 2.") and record.memory_bytes and record.memory_bytes > 0
    assert (source / capacity.PLOT).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"chosen: {record.chosen.label()}" in result.stdout

    with _temper_serve(str(source)) as (port, _):  # what was measured is what serves
        client = Client(port)
        status, _, body = client.call("GET", "/v2/models/slow/config")
        client.close()
    served = json.loads(body)
    assert status == 200 and served["max_batch_size"] == record.chosen.max_batch_size
    assert served["dynamic_batching"]["max_queue_delay_microseconds"] == round(record.chosen.max_delay_ms * 1000)


def test_capacity_without_perf_analyzer_is_an_environment_problem(temper, tmp_path) -> None:
    source = _bundle(tmp_path / "slow", _slow_model(tmp_path / "slow.onnx"), "slow")
    result = temper("capacity", source, "--p99-ms", "50", "--perf-analyzer", tmp_path / "missing")
    (line,) = result.stderr.strip().splitlines()[-1:]
    assert result.code == 3 and "--perf-analyzer" in line and "make perf-analyzer" in line, result.stderr
    assert not (source / capacity.CAPACITY).exists()
