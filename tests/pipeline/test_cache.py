"""The content-addressed step cache on its own."""

from __future__ import annotations

from pathlib import Path

from pipeline.cache import StepCache, key_of


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
