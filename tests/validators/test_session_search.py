"""The session settings search on real ONNX Runtime sessions: what it keeps follows its own recorded
intervals, a setting no faster than the default is not kept, and a second search of the same model on
this host reuses the first one's record. Timings are never compared with numbers (2 noisy cores)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from temper.artifacts.core.host import profile
from temper.artifacts.core.layout import AXIS0
from temper.artifacts.engines.onnxruntime import settings_of
from temper.pipeline.cache import RecordStore
from temper.validators import session_search
from temper.validators.report_model import SessionSearch
from temper.validators.session_search import DEFAULT, Plan, Row, rows_for, search
from temper.validators.throughput import default_settings, engine_defaults
from tests.helpers import edit_recipe
from tests.unit.reports import read_report
from tests.validators.test_throughput import WIDTH, _mlp


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _mlp(tmp_path_factory.mktemp("models") / "mlp.onnx", "batch")


SAMPLE = {"x": np.random.default_rng(1).standard_normal((8, WIDTH)).astype(np.float32)}


def _plan(confidence: float = 0.95, budget_s: float = 1.0) -> Plan:
    return Plan("cpu", [1, 8], confidence, budget_s, 0.0, profile())


def _consistent(record: dict) -> None:
    """Each trial's verdict is what its recorded intervals say, and the kept row is the fastest of the faster."""
    ranking = record["ranking_batch_size"]
    faster = {}
    for trial in record["trials"]:
        ups = {s["batch_size"]: s for s in trial["speedups"]}
        slower = any(s["interval"] is not None and s["interval"][1] < 1.0 for s in ups.values())
        above = ups[ranking]["interval"] is not None and ups[ranking]["interval"][0] >= 1.0
        expected = "slower" if slower else "faster" if above else "not faster"
        if trial["verdict"] == "kept":
            assert expected == "faster", trial
            faster[trial["name"]] = ups[ranking]["speedup"]
        else:
            assert trial["verdict"] == expected, trial
            if expected == "faster":
                faster[trial["name"]] = ups[ranking]["speedup"]
    assert record["kept"] == (max(faster, key=faster.__getitem__) if faster else DEFAULT)
    kept = next((t for t in record["trials"] if t["name"] == record["kept"]), None)
    assert record["settings"] == (record["default"] if kept is None else kept["settings"])


def test_the_search_tries_every_row_keeps_by_its_intervals_and_returns_the_kept_session(mlp: Path) -> None:
    found = search(mlp, _plan(), SAMPLE, AXIS0, "mlp")
    record = found.record
    SessionSearch.model_validate(record)  # the report.json contract
    assert [t["name"] for t in record["trials"]] == [r.name for r in rows_for("cpu", default_settings())]
    assert record["default"] == default_settings().model_dump() and not record["cached"]
    assert all([s["batch_size"] for s in t["speedups"]] == [1, 8] for t in record["trials"])
    assert all(s["rounds"] >= session_search.ROUNDS for t in record["trials"] for s in t["speedups"])
    _consistent(record)
    assert settings_of(found.session).model_dump() == record["settings"]  # read back from the session itself


def test_on_openvino_the_search_tries_its_own_rows_and_keeps_what_the_compiled_model_reports(mlp: Path) -> None:
    """OpenVINO's rows (threads, streams and hint) against its default, by the same rule; no row changes the
    precision (f32 and bf16 are engines of their own), and the kept session runs the kept settings."""
    pytest.importorskip("openvino", reason="the openvino extra is not installed")
    found = search(mlp, Plan("openvino", [1, 8], 0.95, 1.0, 0.0, profile()), SAMPLE, AXIS0, "mlp")
    record = found.record
    SessionSearch.model_validate(record)
    default = engine_defaults("openvino")
    assert record["default"] == default.model_dump() and record["default"]["inference_precision"] == "f32"
    assert [t["name"] for t in record["trials"]] == [r.name for r in rows_for("openvino", default)]
    assert [t["name"] for t in record["trials"]][-1] == "two-streams"  # every host has it; one-thread needs 2 cores
    assert all(t["settings"]["inference_precision"] == "f32" for t in record["trials"])
    _consistent(record)
    assert found.session.settings.model_dump() == record["settings"]  # read back from the compiled model


def test_a_setting_identical_to_the_default_is_not_kept(mlp: Path) -> None:
    """The same settings under another name: nothing but noise separates the two sessions, so its interval
    (at 99.9%, so that noise alone almost never clears 1.0) does not show it faster, and the default stays."""
    same = Row("same-as-default", {"spinning": False})
    assert same.apply(default_settings()) == default_settings()
    found = search(mlp, _plan(confidence=0.999), SAMPLE, AXIS0, rows=(same,))
    (trial,) = found.record["trials"]
    assert trial["verdict"] in ("not faster", "slower")
    low = next(s for s in trial["speedups"] if s["batch_size"] == 8)["interval"][0]
    assert low < 1.0
    assert found.record["kept"] == DEFAULT and found.record["settings"] == default_settings().model_dump()
    assert settings_of(found.session) == default_settings()


def test_a_budget_too_small_for_the_rounds_cuts_them_short_keeps_the_default_and_says_what_would_do(
        mlp: Path) -> None:
    """A budget that one round at each batch size already spends: the rounds stop there (not at ROUNDS or
    more), no row is kept on what little was timed, and the record names the batch sizes cut short and a
    budget larger than the one given that would have let every row have its rounds."""
    found = search(mlp, _plan(budget_s=1e-3), SAMPLE, AXIS0)
    record = found.record
    SessionSearch.model_validate(record)
    assert record["cut_short"] == [1, 8]
    assert all(s["rounds"] == 1 and s["interval"] is None for t in record["trials"] for s in t["speedups"])
    assert record["kept"] == DEFAULT and all(t["verdict"] == "not faster" for t in record["trials"])
    assert record["enough_s"] is not None and record["enough_s"] > record["budget_s"]
    assert settings_of(found.session) == default_settings()


def test_a_budget_the_rounds_fit_in_is_not_cut_short(mlp: Path) -> None:
    record = search(mlp, _plan(budget_s=5.0), SAMPLE, AXIS0).record
    assert record["cut_short"] == [] and record["enough_s"] is None
    assert all(s["rounds"] >= session_search.ROUNDS for t in record["trials"] for s in t["speedups"])


def test_a_second_search_on_this_host_reuses_the_record_and_times_nothing(mlp: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    records = RecordStore(tmp_path / "records")
    first = search(mlp, _plan(), SAMPLE, AXIS0, records=records).record
    assert not first["cached"] and len(list((tmp_path / "records").rglob("*.json"))) == 1

    def timed(*_: object, **__: object) -> None:
        raise AssertionError("a cached search timed a session")

    monkeypatch.setattr(session_search, "interleave", timed)
    again = search(mlp, _plan(), SAMPLE, AXIS0, records=records)
    assert again.record["cached"]
    assert {k: v for k, v in again.record.items() if k != "cached"} == {k: v for k, v in first.items() if k != "cached"}
    assert settings_of(again.session).model_dump() == first["settings"]
    with pytest.raises(AssertionError, match="timed a session"):  # another budget is another search
        search(mlp, _plan(budget_s=2.0), SAMPLE, AXIS0, records=records)
    with pytest.raises(AssertionError, match="timed a session"):  # so is --no-cache
        search(mlp, _plan(), SAMPLE, AXIS0, records=RecordStore(tmp_path / "records", enabled=False))


@pytest.mark.slow
def test_digits_run_searches_every_model_and_gates_and_serves_the_kept_settings(temper, gated_digits: Path,
                                                                                 tmp_path: Path) -> None:
    """The digits recipe end to end with the search on: each model searched on cpu, each searched model's
    figures measured with its kept settings, and the selected model's runtime.json naming them."""
    from temper.pipeline.outputs import servable

    edit_recipe(gated_digits, lambda d: (d["validate"]["throughput"].update(session_search=True, session_search_s=3.0),
                                         d.pop("publish")))
    out = tmp_path / "out"
    result = temper("run", gated_digits, "--output", out)
    assert result.code == 0, result.stderr
    report = read_report(out)
    searches = report["session_searches"]
    assert set(searches) == {"baseline", *report["candidates"]}
    for name, (record,) in searches.items():
        _consistent(record)
        figures = report["baseline" if name == "baseline" else "candidates"]
        figures = (figures if name == "baseline" else figures[name])["throughput"]
        assert {json.dumps(m["session"], sort_keys=True) for m in figures} == {
            json.dumps(record["settings"], sort_keys=True)}, name
    _, config = servable(out)
    assert config is not None and config.session is not None
    assert config.session.model_dump() == searches[report["selected"]][0]["settings"]
    print({name: (r[0]["kept"], [(t["name"], t["verdict"], [(s["batch_size"], round(s["speedup"], 2), s["interval"])
                                                           for s in t["speedups"]]) for t in r[0]["trials"]])
           for name, r in searches.items()})
