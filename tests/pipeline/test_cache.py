"""The content-addressed step cache on its own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import platformdirs
import pytest

from temper.pipeline.cache import RecordStore, StepCache, default_root, key_of
from tests.helpers import REPO


def _produce(tmp_path: Path, payload: bytes) -> Path:
    folder = tmp_path / f"out-{payload.hex()}"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(payload)
    return folder / "model.onnx"


def test_key_ignores_dict_order_but_not_values():
    assert key_of(step="q", options={"a": 1, "b": 2}) == key_of(options={"b": 2, "a": 1}, step="q")
    assert key_of(step="q", options={"a": 1}) != key_of(step="q", options={"a": 2})


def test_put_then_get_returns_stored_bytes_and_meta(tmp_path):
    cache = StepCache(tmp_path / "c")
    assert cache.get("ab" * 32) is None
    stored = cache.put("ab" * 32, _produce(tmp_path, b"\x01\x02"), {"seconds": 1.5})
    path, meta = cache.get("ab" * 32)
    assert path == stored and path.read_bytes() == b"\x01\x02" and meta["seconds"] == 1.5


def test_disabled_cache_misses_but_still_refreshes(tmp_path):
    StepCache(tmp_path / "c").put("cd" * 32, _produce(tmp_path, b"old"), {"seconds": 1})
    forced = StepCache(tmp_path / "c", enabled=False)
    assert forced.get("cd" * 32) is None
    forced.put("cd" * 32, _produce(tmp_path, b"new"), {"seconds": 2})
    path, _ = StepCache(tmp_path / "c").get("cd" * 32)
    assert path.read_bytes() == b"new"


def test_default_root_prefers_env_then_platform_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TEMPER_CACHE_DIR", str(tmp_path / "mine"))
    assert default_root() == tmp_path / "mine"
    monkeypatch.delenv("TEMPER_CACHE_DIR")
    assert default_root() == platformdirs.user_cache_path("temper", appauthor=False)
    if sys.platform.startswith("linux"):
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        assert default_root() == tmp_path / "xdg" / "temper"
        monkeypatch.delenv("XDG_CACHE_HOME")
        assert default_root() == Path.home() / ".cache" / "temper"


def test_put_keeps_a_result_another_job_stored_first(tmp_path):
    first = StepCache(tmp_path / "c").put("ef" * 32, _produce(tmp_path, b"first"), {"seconds": 1})
    produced = _produce(tmp_path, b"second")
    again = StepCache(tmp_path / "c").put("ef" * 32, produced, {"seconds": 2})
    assert again == first and first.read_bytes() == b"first" and not produced.parent.exists()
    assert StepCache(tmp_path / "c").get("ef" * 32)[1]["seconds"] == 1


def test_lock_is_reentrant_around_put(tmp_path):
    cache = StepCache(tmp_path / "c")
    with cache.lock("12" * 32):  # a caller holding it across get/build/put must not deadlock in put
        assert cache.get("12" * 32) is None
        cache.put("12" * 32, _produce(tmp_path, b"x"), {"seconds": 0})
    assert cache.get("12" * 32) is not None


_HAMMER = """
import os, random, shutil, sys, time
from pathlib import Path
from temper.pipeline.cache import StepCache

def slowed(real):  # widen every window between a check and the file operation that acts on it
    def call(*args, **kwargs):
        time.sleep(random.uniform(0, 0.004))
        return real(*args, **kwargs)
    return call

os.replace, shutil.rmtree, shutil.move = slowed(os.replace), slowed(shutil.rmtree), slowed(shutil.move)
root, scratch, writer, rounds, key = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
(scratch / f"ready-{writer}").touch()
while not (scratch / "go").exists():
    time.sleep(0.001)
for i in range(rounds):
    tag = f"{writer}:{i}".encode()
    out = scratch / f"{writer}-{i}"
    out.mkdir()
    (out / "model.onnx").write_bytes(tag * 4096)
    (out / "model.onnx.data").write_bytes(tag * 16384)  # external data: a folder of several files
    cache = StepCache(root, enabled=i % 2 == 1)  # even rounds refresh (--no-cache), odd ones keep a stored result
    cache.put(key, out / "model.onnx", {"writer": writer, "round": i})
    with cache.lock(key):
        path, meta = StepCache(root).get(key)
        want = f"{meta['writer']}:{meta['round']}".encode()
        assert path.read_bytes() == want * 4096 and (path.parent / "model.onnx.data").read_bytes() == want * 16384
"""


def test_two_processes_putting_one_key_never_corrupt_it(tmp_path):
    """Two real processes race put/get on one key: both finish cleanly and the stored folder is one writer's."""
    root, scratch, key = tmp_path / "c", tmp_path / "scratch", "5a" * 32
    scratch.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-c", _HAMMER, str(root), str(scratch), name, "25", key],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO) for name in ("a", "b")]
    deadline = time.monotonic() + 60
    while not all((scratch / f"ready-{n}").exists() for n in ("a", "b")) and time.monotonic() < deadline:
        time.sleep(0.01)
    (scratch / "go").touch()
    errors = [p.communicate(timeout=120)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors

    path, meta = StepCache(root).get(key)
    tag = f"{meta['writer']}:{meta['round']}".encode()
    assert path.read_bytes() == tag * 4096 and (path.parent / "model.onnx.data").read_bytes() == tag * 16384
    assert sorted(p.name for p in path.parent.iterdir()) == ["meta.json", "model.onnx", "model.onnx.data"]
    assert not [p for p in path.parent.parent.iterdir() if p.name.startswith((".incoming-", ".outgoing-"))]


def test_a_record_reads_back_under_the_same_parts_only(tmp_path):
    records = RecordStore(tmp_path / "records")
    parts = {"model": "abc", "host": {"cpu": "x", "cores": 2}, "budget_s": 4.0}
    assert records.get(parts) is None
    records.put(parts, {"kept": "one-thread"})
    assert records.get({"budget_s": 4.0, "host": {"cores": 2, "cpu": "x"}, "model": "abc"}) == {"kept": "one-thread"}
    assert records.get({**parts, "host": {"cpu": "x", "cores": 4}}) is None  # another host is another search
    records.put(parts, {"kept": "default"})  # a refresh replaces the record whole
    assert records.get(parts) == {"kept": "default"}
    assert [p.name for p in (tmp_path / "records").rglob("*") if p.is_file() and p.suffix == ".json"] == [
        next((tmp_path / "records").rglob("*.json")).name]  # nothing staged left behind


def test_disabled_records_miss_but_still_refresh(tmp_path):
    """--no-cache searches again and stores what it found, as steps rebuild and refresh."""
    steps = StepCache(tmp_path, enabled=False)
    records = RecordStore.beside(steps)
    assert records.root == (tmp_path / "records").resolve()
    records.put({"k": 1}, {"kept": "spinning"})
    assert records.get({"k": 1}) is None
    assert RecordStore.beside(StepCache(tmp_path)).get({"k": 1}) == {"kept": "spinning"}


def test_kept_outputs_read_back_under_the_same_parts_only(tmp_path):
    import numpy as np

    from temper.pipeline.cache import OutputStore

    store = OutputStore(tmp_path / "outputs")
    outputs = {"logits/0": np.arange(6, dtype=np.float32).reshape(2, 3), "ids": np.array([1, 2], np.int64)}
    assert store.get({"model": "a"}) is None
    store.put({"model": "a"}, outputs)
    back = store.get({"model": "a"})
    assert back is not None and list(back) == list(outputs)  # names with '/' and their order kept
    for name, value in outputs.items():
        assert back[name].dtype == value.dtype and (back[name] == value).all()
    assert store.get({"model": "b"}) is None
    assert OutputStore(tmp_path / "outputs", enabled=False).get({"model": "a"}) is None  # --no-cache reads nothing


def test_a_damaged_kept_file_is_a_miss_and_big_outputs_are_not_kept(tmp_path, monkeypatch):
    import numpy as np

    from temper.pipeline.cache import OutputStore

    store = OutputStore.beside(StepCache(tmp_path))
    assert store.root == tmp_path / "outputs"
    store.put({"model": "a"}, {"y": np.ones(1000, np.float32)})
    (stored,) = store.root.rglob("*.npz")
    stored.write_bytes(stored.read_bytes()[:100])  # cut short, as by a full disk
    assert store.get({"model": "a"}) is None
    monkeypatch.setattr(OutputStore, "MAX_BYTES", 3999)
    store.put({"model": "b"}, {"y": np.ones(1000, np.float32)})  # 4000 bytes
    assert store.get({"model": "b"}) is None


@pytest.mark.slow
def test_check_then_run_then_validate_evaluate_the_baseline_once(temper, digits_dir, isolated_cache, tmp_path):
    """The baseline's outputs over the evaluation set are read by check, the run's gates and validate:
    kept in the cache's outputs/ by content, each process after the first reads them back."""
    import json

    from tests.helpers import edit_recipe

    recipe = digits_dir / "digits-cnn.yaml"

    def one_candidate(d: dict) -> None:
        d["candidates"] = {"int8-dynamic": d["candidates"]["int8-dynamic"]}
        del d["validate"]["throughput"], d["publish"]

    edit_recipe(recipe, one_candidate)
    kept = isolated_cache / "outputs"
    assert temper("check", recipe).code == 0
    (baseline,) = kept.rglob("*.npz")  # the baseline's, over the evaluation set
    written = baseline.stat().st_ino  # a computed result is written aside and renamed over: a new file
    out = tmp_path / "out"
    assert temper("run", recipe, "--output", out).code == 0
    assert len(list(kept.rglob("*.npz"))) == 2  # and the candidate's
    assert baseline.stat().st_ino == written  # the baseline's was read back, not computed again
    ran = json.loads((out / "report.json").read_text())
    candidate = next(f for f in kept.rglob("*.npz") if f != baseline).stat().st_ino
    assert temper("validate", recipe, "--output", out).code == 0
    assert len(list(kept.rglob("*.npz"))) == 2 and baseline.stat().st_ino == written
    assert next(f for f in kept.rglob("*.npz") if f != baseline).stat().st_ino == candidate
    again = json.loads((out / "report.json").read_text())
    assert again["baseline"] == ran["baseline"]
    assert again["candidates"]["int8-dynamic"]["drop"] == ran["candidates"]["int8-dynamic"]["drop"]


def test_kept_ranges_read_back_whole_under_the_same_parts_only(tmp_path):
    from temper.pipeline.cache import RangeStore

    store = RangeStore.beside(StepCache(tmp_path))
    assert store.root == tmp_path / "ranges"
    ranges = tmp_path / "ranges.json"
    ranges.write_text('{"x": {"lowest": -1.0, "highest": 2.0}}')
    assert store.get({"model": "a"}) is None
    store.put({"model": "a"}, ranges)
    assert store.get({"model": "a"}) == ranges.read_text() and store.get({"model": "b"}) is None
    assert RangeStore(store.root, enabled=False).get({"model": "a"}) is None  # --no-cache reads nothing
    (stored,) = store.root.rglob("*.json")
    stored.write_text('{"x": {"lowe')  # cut short
    assert store.get({"model": "a"}) is None


@pytest.mark.slow
def test_candidates_that_differ_in_weight_settings_share_one_calibration(temper, digits_dir, isolated_cache, tmp_path):
    """Activation ranges depend on the model, the calibration options and data, never on weight settings:
    a second candidate differing only in per_channel reads the first one's ranges back (`ranges/`), and
    another calibration method is a calibration of its own."""
    from tests.helpers import edit_recipe

    recipe = digits_dir / "digits-cnn.yaml"
    static = {"mode": "static", "format": "qdq", "calibration": "minmax"}

    def candidates(*variants: dict) -> None:
        def change(d: dict) -> None:
            d["candidates"] = {f"int8-{i}": {"steps": [{"quantize": {**static, **v}}]} for i, v in enumerate(variants)}
            d.pop("publish", None)
            d["validate"].pop("throughput", None)
        edit_recipe(recipe, change)

    kept = isolated_cache / "ranges"
    candidates({"per_channel": False})
    assert temper("run", recipe, "--output", tmp_path / "a").code == 0
    (first,) = kept.rglob("*.json")
    written = first.stat().st_ino  # a calibration is written aside and renamed over: a new file
    candidates({"per_channel": False}, {"per_channel": True}, {"per_channel": True, "calibration": "entropy"})
    assert temper("run", recipe, "--output", tmp_path / "b").code == 0
    assert first.stat().st_ino == written  # per_channel's candidate read the minmax ranges back
    assert len(list(kept.rglob("*.json"))) == 2  # entropy calibrated on its own


@pytest.mark.slow
def test_the_gates_read_the_fallback_trials_outputs_back(temper, digits_dir, isolated_cache, tmp_path):
    """The fallback's scorer keeps each trial's outputs by the trial model's bytes: the kept model is the
    best trial rewritten (the same bytes), and a plain twin candidate is the plain trial, so the gates
    evaluate neither again."""
    from tests.helpers import edit_recipe

    recipe = digits_dir / "digits-cnn.yaml"
    static = {"mode": "static", "format": "qdq", "per_channel": True}

    def change(d: dict) -> None:
        d["validate"] = {"accuracy": {"metric": "mse", "max_drop": 0.0}}  # no trial meets it: every trial is scored
        d["candidates"] = {"plain": {"steps": [{"quantize": static}]},
                           "tuned": {"steps": [{"quantize": {**static, "fallback": {"max_trials": 3,
                                                                                   "configurations": False}}}]}}
        d.pop("publish", None)

    edit_recipe(recipe, change)
    out = tmp_path / "out"
    assert temper("run", recipe, "--output", out).code == 0
    import json

    trials = json.loads((out / "tuned" / "tuning.json").read_text())["trials"]
    assert len(trials) == 3 and len({tuple(t["float_nodes"]) for t in trials}) == 3
    # the baseline's outputs and the three trials' (more than the gates' two models could leave), and the
    # gates' evaluations added none: they read a trial's back
    assert len(list((isolated_cache / "outputs").rglob("*.npz"))) == 1 + len(trials)


def test_every_key_holds_temper_own_source_not_only_its_version(tmp_path, monkeypatch):
    """An install from a git commit keeps the last release's version number: a changed step must still
    miss the results its old code cached. Bytecode and other files do not count."""
    from temper.pipeline.cache import cache_versions, source_digest

    package = tmp_path / "fakepkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "step.py").write_text("RULE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = source_digest(("fakepkg",))
    (package / "sub" / "step.pyc").write_bytes(b"\0")
    (package / "notes.txt").write_text("not code")
    source_digest.cache_clear()
    assert source_digest(("fakepkg",)) == before
    (package / "sub" / "step.py").write_text("RULE = 2\n")
    source_digest.cache_clear()
    assert source_digest(("fakepkg",)) != before
    assert cache_versions()["temper-ml source"] == source_digest()  # the installed temper's


@pytest.mark.slow
def test_a_step_built_by_other_temper_source_is_built_again(temper, digits_dir, isolated_cache, monkeypatch):
    import temper.pipeline.cache as cache

    def steps() -> int:
        return len(list(isolated_cache.glob("*/*/meta.json")))  # one folder per step key

    recipe = digits_dir / "digits-cnn.yaml"
    assert temper("check", recipe).code == 0  # builds the baseline's steps
    built = steps()
    assert built and temper("check", recipe).code == 0 and steps() == built  # the same source: cached
    monkeypatch.setattr(cache, "source_digest", lambda: "another commit's source")
    assert temper("check", recipe).code == 0 and steps() == 2 * built  # every step built again


def test_every_quantize_backend_is_in_the_cache_key():
    """Issue 33.5: nvidia-modelopt was missing, so upgrading ModelOpt served stale INT8 models from the cache.
    Every registered backend's libraries are rows of the one distributions table and in every step's key."""
    from temper.artifacts.core import distributions
    from temper.pipeline.cache import LIBRARIES, library_versions
    from temper.pipeline.quantize_backends import BACKENDS

    assert set(BACKENDS) == {"ort", "modelopt", "nncf"}
    for backend in BACKENDS.values():
        assert backend.libraries, backend.name
        for library in backend.libraries:
            assert library in distributions.LIBRARIES, (backend.name, library)
            assert library in LIBRARIES and library in library_versions(), (backend.name, library)
    assert {"nvidia-modelopt", "nncf", "onnxruntime"} <= set(LIBRARIES)
