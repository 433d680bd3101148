"""Turn a recipe's `DataSource` into model-ready arrays (and labels), whatever the file format."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from temper.artifacts.core.callables import call_user, load_callable
from temper.artifacts.core.errors import RecipeError, first_line
from temper.calibration.spec import DataSource

TABLE_FORMATS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


@dataclass(frozen=True)
class Dataset:
    """Features keyed by model input name (leading dim = samples, whatever axis the model holds them on:
    a batch is laid out for the model when it is formed) and optional labels. Inputs with a constant
    value in the recipe have no features: they are not data."""

    features: dict[str, np.ndarray]
    labels: np.ndarray | None

    def __len__(self) -> int:
        return len(next(iter(self.features.values())))

    def batches(self, size: int) -> list[dict[str, np.ndarray]]:
        """Full-size batches only: a short last batch would skew calibration statistics."""
        count = len(self) // size
        return [{k: v[i * size : (i + 1) * size] for k, v in self.features.items()} for i in range(count)]


def load(source: DataSource, base: Path, recipe_file: str, key: str, input_names: list[str],
         axes: Mapping[str, int | None] | None = None) -> Dataset:
    """Load, select columns, sample (seeded), split off labels, preprocess; every failure names `key`.
    `axes` (each input's batch axis in the model) only words the error for data laid out like the model."""
    columns = _read(source, base, recipe_file, key, input_names)
    if source.columns is not None:
        missing = [c for c in source.columns if c not in columns]
        if missing:
            raise RecipeError(recipe_file, f"{key}.columns",
                              f"no column {missing[0]!r}; the data has: {', '.join(columns)}")
        keep = set(source.columns) | ({source.label} if source.label else set())
        columns = {k: v for k, v in columns.items() if k in keep}
    count = _length(columns, recipe_file, key, axes or {})
    if count == 0:
        raise RecipeError(recipe_file, key, "the data set is empty")
    order = np.random.default_rng(source.seed).permutation(count)[: source.samples or count]
    columns = {k: _take(v, order) for k, v in columns.items()}
    labels = None
    if source.label is not None:
        if source.label not in columns:
            raise RecipeError(recipe_file, f"{key}.label",
                              f"no column {source.label!r}; the data has: {', '.join(columns)}")
        labels = np.asarray(columns.pop(source.label))
    if source.preprocess is not None:
        fn = load_callable(source.preprocess, base, recipe_file, f"{key}.preprocess")
        columns = call_user(fn, recipe_file, f"{key}.preprocess", columns)
        if not isinstance(columns, dict):
            raise RecipeError(recipe_file, f"{key}.preprocess",
                              f"must return a dict of arrays, got {type(columns).__name__}")
    features = {k: np.asarray(v) for k, v in columns.items() if k in input_names}
    missing = [n for n in input_names if n not in features]
    if missing:
        raise RecipeError(
            recipe_file, key,
            f"no data for model input {missing[0]!r} (the data has: {', '.join(columns)}); "
            "name the column after the input or add a 'preprocess' callable",
        )
    if any(len(v) != len(order) for v in features.values()):
        raise RecipeError(recipe_file, key, "every input must have one row per sample")
    return Dataset(features, labels)


def _read(source: DataSource, base: Path, recipe_file: str, key: str, input_names: list[str]) -> dict[str, Any]:
    if source.callable is not None:
        fn = load_callable(source.callable, base, recipe_file, f"{key}.callable")
        result = call_user(fn, recipe_file, f"{key}.callable")
        return _columns_of(result, recipe_file, f"{key}.callable")
    assert source.path is not None  # DataSource holds a callable or a path
    path = (base / source.path).resolve()
    if not path.exists():
        raise RecipeError(recipe_file, f"{key}.path", f"'{path}' not found (paths are relative to the recipe's folder)")
    try:
        if path.suffix == ".npy":
            if len(input_names) != 1:
                raise RecipeError(recipe_file, f"{key}.path",
                                  "a .npy file holds one array; use .npz (one array per input)")
            return {input_names[0]: np.load(path)}
        if path.suffix == ".npz":
            with np.load(path) as archive:
                return {name: archive[name] for name in archive.files}
        import datasets  # heavy import, only for table files

        datasets.disable_progress_bars()  # temper shows its own progress; a bar per split is noise

        if path.is_dir():
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                if source.split not in loaded:
                    raise RecipeError(recipe_file, f"{key}.split", f"choose a split: {', '.join(loaded)}")
                loaded = loaded[source.split]
            return _columns_of(loaded, recipe_file, key)
        if path.suffix not in TABLE_FORMATS:
            raise RecipeError(recipe_file, f"{key}.path",
                              f"unsupported file type '{path.suffix}' "
                              f"(use {', '.join([*TABLE_FORMATS, '.npy', '.npz'])} or a save_to_disk folder)")
        _has_rows(path, recipe_file, key)
        table = datasets.load_dataset(TABLE_FORMATS[path.suffix], data_files=str(path), split="train")
        return _columns_of(table, recipe_file, key)
    except RecipeError:
        raise
    except Exception as exc:  # unreadable file: say which and why
        raise RecipeError(recipe_file, f"{key}.path", f"cannot read '{path.name}': {first_line(exc)}") from exc


def _has_rows(path: Path, recipe_file: str, key: str) -> None:
    """An empty or header-only text table has no rows: say so, before the table reader's own puzzle."""
    if path.suffix == ".parquet":
        return
    with path.open("rb") as fh:
        lines = [line for _, line in zip(range(2), (raw for raw in fh if raw.strip()))]
    if not lines:
        raise RecipeError(recipe_file, f"{key}.path", f"'{path.name}' is empty: it needs a header and at least one row")
    if len(lines) == 1 and path.suffix == ".csv":
        raise RecipeError(recipe_file, f"{key}.path", f"'{path.name}' has a header but no rows")


def _columns_of(result: Any, recipe_file: str, key: str) -> dict[str, Any]:
    if isinstance(result, dict):
        return dict(result)
    if hasattr(result, "column_names") and callable(getattr(result, "to_dict", None)):  # a datasets.Dataset
        return dict(result.to_dict())
    raise RecipeError(recipe_file, key, f"expected a dict of arrays or a datasets.Dataset, got {type(result).__name__}")


def _length(columns: dict[str, Any], recipe_file: str, key: str, axes: Mapping[str, int | None]) -> int:
    lengths = {len(v) for v in columns.values()}
    if len(lengths) > 1:
        raise RecipeError(recipe_file, key, f"columns have different lengths: {sorted(lengths)}"
                                            f"{_layout_hint(columns, axes)}")
    return lengths.pop() if lengths else 0


def _layout_hint(columns: dict[str, Any], axes: Mapping[str, int | None]) -> str:
    """Why, when an input's samples lie on its batch axis (the model's layout) instead of first."""
    for name, axis in axes.items():
        shape = np.shape(columns[name]) if name in columns else ()
        others = {len(v) for k, v in columns.items() if k != name}
        if axis and len(shape) > axis and others == {shape[axis]}:
            return (f"; '{name}' {list(shape)} holds its {shape[axis]} samples on axis {axis}, as the model does: "
                    f"data holds one row per sample, samples first, and temper moves them to batch_axis {axis} "
                    f"itself: store np.moveaxis({name}, {axis}, 0)")
    return ""


def _take(values: Any, order: np.ndarray) -> Any:
    if isinstance(values, np.ndarray):
        return values[order]
    return [values[i] for i in order]
