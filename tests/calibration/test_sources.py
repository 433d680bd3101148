"""Data sources: every supported format yields the same model-ready arrays; mistakes name the key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from temper.artifacts.core.errors import RecipeError
from temper.calibration.sources import Dataset, load
from temper.calibration.spec import DataSource

ROWS = np.arange(40, dtype=np.float32).reshape(10, 4)
LABELS = np.arange(10) % 3


def _load(tmp_path: Path, names=("x",), **fields) -> Dataset:
    return load(DataSource(**fields), tmp_path, "r.yaml", "data.calibration", list(names))


def test_npz_with_labels_and_seeded_sampling(tmp_path):
    np.savez(tmp_path / "d.npz", x=ROWS, y=LABELS)
    first = _load(tmp_path, path="d.npz", label="y", samples=6, seed=3)
    again = _load(tmp_path, path="d.npz", label="y", samples=6, seed=3)
    other = _load(tmp_path, path="d.npz", label="y", samples=6, seed=4)
    assert len(first) == 6 and set(first.features) == {"x"}
    np.testing.assert_array_equal(first.features["x"], again.features["x"])
    assert not np.array_equal(first.features["x"], other.features["x"])
    # rows and labels stay paired through the shuffle
    np.testing.assert_array_equal(first.labels, LABELS[(first.features["x"][:, 0] // 4).astype(int)])


def test_npy_fills_the_single_input(tmp_path):
    np.save(tmp_path / "d.npy", ROWS)
    data = _load(tmp_path, path="d.npy")
    np.testing.assert_array_equal(np.sort(data.features["x"], axis=0), ROWS)
    with pytest.raises(RecipeError, match="one array per input"):
        _load(tmp_path, names=("x", "z"), path="d.npy")


def test_csv_through_datasets_with_preprocess(tmp_path):
    (tmp_path / "t.csv").write_text("text,label,extra\nab,0,q\nabcd,1,q\nabc,1,q\n")
    (tmp_path / "prep.py").write_text(
        "import numpy as np\n"
        "def lengths(cols):\n"
        "    return {'x': np.array([[len(t)] for t in cols['text']], dtype=np.float32)}\n"
    )
    data = _load(tmp_path, path="t.csv", columns=["text"], label="label", preprocess="prep.py:lengths")
    pairs = sorted(zip(data.features["x"][:, 0].tolist(), data.labels.tolist()))
    assert pairs == [(2.0, 0), (3.0, 1), (4.0, 1)]


def test_save_to_disk_folder_needs_a_split(tmp_path):
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"x": ROWS.tolist()})}).save_to_disk(str(tmp_path / "ds"))
    data = _load(tmp_path, path="ds", split="train")
    assert data.features["x"].shape == (10, 4)
    with pytest.raises(RecipeError) as info:
        _load(tmp_path, path="ds")
    assert info.value.key == "data.calibration.split" and "train" in info.value.message


def test_callable_source_and_full_batches(tmp_path):
    (tmp_path / "src.py").write_text("import numpy as np\ndef make():\n"
                                     "    return {'x': np.ones((70, 2), np.float32)}\n")
    data = _load(tmp_path, callable="src.py:make")
    batches = data.batches(32)
    assert [b["x"].shape[0] for b in batches] == [32, 32]  # the short remainder (6) is dropped


@pytest.mark.parametrize(
    ("setup", "fields", "key", "fragment"),
    [
        (None, {"path": "missing.csv"}, "data.calibration.path", "not found"),
        ("empty", {"path": "e.npz"}, "data.calibration", "empty"),
        ("csv", {"path": "t.csv", "columns": ["txt"]}, "data.calibration.columns", "no column 'txt'"),
        ("csv", {"path": "t.csv"}, "data.calibration", "no data for model input 'x'"),
        ("raises", {"callable": "bad.py:make"}, "data.calibration.callable", "make() raised RuntimeError: boom"),
        ("raises", {"callable": "bad.py:nothing"}, "data.calibration.callable", "no function 'nothing'"),
        (None, {"path": "d.txt"}, "data.calibration.path", "not found"),
    ],
)
def test_bad_sources_name_the_key(tmp_path, setup, fields, key, fragment):
    if setup == "empty":
        np.savez(tmp_path / "e.npz", x=np.zeros((0, 4), np.float32))
    if setup == "csv":
        (tmp_path / "t.csv").write_text("text\nhello\n")
    if setup == "raises":
        (tmp_path / "bad.py").write_text("def make():\n    raise RuntimeError('boom')\n")
    with pytest.raises(RecipeError) as info:
        _load(tmp_path, **fields)
    assert info.value.key == key and fragment in info.value.message, info.value
