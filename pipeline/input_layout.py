"""The recipe's model inputs as a Layout (artifacts/core/layout.py): the one place a recipe's `batch_axis`
and `value` become the batch axes and constants every batch temper forms is laid out by."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from temper.artifacts.core.layout import Layout, default_axes
from temper.pipeline.recipe import InputSpec


def layout_of(inputs: Sequence[InputSpec]) -> Layout:
    """The recipe's inputs as a Layout: their batch axes (a recipe's ModelSpec resolves them as it loads;
    the same rule here for inputs given alone) and constants."""
    given = {i.name: i.batch_axis for i in inputs if i.batch_axis is not None or i.value is not None}
    return Layout(default_axes({i.name: i.shape for i in inputs}, given),
                  constants={i.name: np.asarray(i.value, dtype=i.dtype) for i in inputs if i.value is not None})
