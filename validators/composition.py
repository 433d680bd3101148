"""Batch composition: does a row's answer depend on the rows served in the same batch with it?

The gates' fidelity is measured on fixed evaluation batches, but a server's dynamic batcher joins whatever
requests arrive together. Most kernels compute each row on its own, but ONNX Runtime's dynamic INT8
(DynamicQuantizeLinear) computes one activation scale over the whole batch tensor: a loud row, or padding to
a longer neighbour's length, coarsens every other row's scale, so one client's data changes another's answer.

So each probe row (PROBES of the evaluation set, evenly spaced) is run the way the server can run it:
- `alone`: a batch of one, cut to its own length on the padded inputs (what a lone request computes);
- `random`: inside a batch of `batch_size` rows with others drawn at random, padded to the longest;
- `loudest`: with the rows of the largest inputs (float inputs' largest magnitude; padded token inputs:
  the longest sequences), padded to the longest, the composition that moves a shared scale most.
Each composition's answers for the probes are compared with the baseline's answers for them alone (the gated
reference) and with the model's own answers alone (the dependence). The worst composition (the lowest cosine of
one probe to the baseline) is gated: each output finite, and its lowest per-probe cosine at least the recipe's
`fidelity.cosine_min` (`fidelity.batched.<output>.*`; per probe, since a request gets its own row's answer and
a whole-output cosine is dominated by the loudest rows). And a model whose in-batch answers move from its
alone answers by more than DEPENDENT_REL_L2 is marked batch-dependent (report.json, then runtime.json, where
temper serve keeps its requests from sharing a batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from temper.artifacts.core.host import usable_cores
from temper.artifacts.core.layout import Layout
from temper.artifacts.core.onnx_io import dims, fit_batch, fixed_batch, load_structure
from temper.artifacts.engines.onnxruntime import SessionSettings, open_session
from temper.artifacts.engines.providers import CPU, Provider
from temper.validators.fidelity import compare_outputs
from temper.validators.gates import Gate, at_least
from temper.validators.report_model import BatchComposition, CompositionFigure
from temper.validators.spec import ValidateSpec
from temper.validators.throughput import session_for

PROBES = 16  # rows measured alone and in every composition
DEPENDENT_REL_L2 = 1e-4  # a row's in-batch answer this far from its answer alone (||b - a|| / ||a||): dependent
SEED = 37
Arrays = dict[str, np.ndarray]
WHAT = {"alone": "each probe alone (a batch of one)",
        "random": "each probe with {n} rows drawn at random",
        "loudest": "each probe with the {n} rows of the largest inputs"}


@dataclass
class Measured:
    """One model's answers for the probes, per composition (alone included); outputs rows-first."""

    batch_size: int
    padded: list[str]
    answers: dict[str, Arrays]


def measure(path: Path, provider: Provider, features: Arrays, layout: Layout, pad: dict[str, int | float],
            batch_size: int) -> Measured | None:
    """Run the probes alone and inside each composition on `provider`; None for a model with a fixed batch dim (it
    never runs a row alone) or an evaluation set of fewer than two rows."""
    model = load_structure(path)
    rows = len(next(iter(features.values())))
    if fixed_batch(model, layout) is not None or rows < 2:
        return None
    sess = (open_session(path, SessionSettings(intra_op_threads=usable_cores()), [CPU]) if provider == "cpu"
            else session_for(path, provider))
    names = [o.name for o in sess.get_outputs()]
    shapes = dims(model)
    trimmed = [n for n in pad if n in features and not isinstance((shapes.get(n) or [0, 0])[1], int)]
    lengths = _lengths(features, {n: pad[n] for n in pad if n in features})
    size = max(2, min(batch_size, rows))
    probes = np.unique(np.linspace(0, rows - 1, min(PROBES, rows)).astype(int))
    loud = _loudness(features, lengths, set(pad))
    order = np.argsort(-loud, kind="stable")
    rng = np.random.default_rng(SEED)

    def run(indexes: list[int]) -> Arrays:
        longest = max(int(lengths[i]) for i in indexes)
        batch = {k: np.stack([_cut(v[i], longest) if k in trimmed else v[i] for i in indexes])
                 for k, v in features.items()}
        out = dict(zip(names, sess.run(names, fit_batch(model, layout.feed(batch), layout))))
        return {k: np.asarray(v, dtype=np.float32) for k, v in layout.samples(out).items()}

    answers: dict[str, list[Arrays]] = {"alone": [], "random": [], "loudest": []}
    for p in probes:
        p = int(p)
        answers["alone"].append(run([p]))
        others = [int(i) for i in rng.choice([i for i in range(rows) if i != p], size - 1, replace=rows - 1 < size - 1)]
        answers["random"].append(_own(run([p, *others]), answers["alone"][-1]))
        answers["loudest"].append(_own(run([p, *[int(i) for i in order if i != p][: size - 1]]), answers["alone"][-1]))
    joined = {c: {n: np.concatenate([a[n] for a in parts]) for n in names} for c, parts in answers.items()}
    return Measured(size, sorted(trimmed), joined)


def figures(mine: Measured, reference: Measured, spec: ValidateSpec) -> tuple[BatchComposition, list[Gate]]:
    """Each composition's agreement with the model's own answers alone and with the reference's (the baseline's
    alone), the worst composition (the lowest cosine of one probe to the reference), and its gates (none when
    `mine` is the reference): per output, every value finite, and the recipe's cosine_min on the lowest per-probe
    cosine, since a request is a row and gets that row's answer."""
    base = reference.answers["alone"]
    found: list[CompositionFigure] = []
    worst_rows: dict[str, dict[str, float]] = {}
    for composition, answer in mine.answers.items():
        whole = compare_outputs(base, answer, spec)
        to_alone = [_per_row(mine.answers["alone"][n], answer[n]) for n in answer]
        worst_rows[composition] = {n: float(_per_row(base[n], answer[n])[0].min()) for n in answer}
        cosines = np.min([c for c, _ in to_alone], axis=0)
        found.append(CompositionFigure(
            name=composition, detail=WHAT[composition].format(n=mine.batch_size - 1),
            cosine_to_alone_min=float(cosines.min()), cosine_to_alone_median=float(np.median(cosines)),
            rel_l2_to_alone_max=float(max(r.max() for _, r in to_alone)),
            cosine_to_baseline=min(c.cosine for c in whole),
            row_cosine_to_baseline_min=min(worst_rows[composition].values())))
    worst = min(reversed(found), key=lambda f: (f.row_cosine_to_baseline_min, f.cosine_to_baseline))
    dependent = max(f.rel_l2_to_alone_max for f in found) > DEPENDENT_REL_L2
    record = BatchComposition(batch_size=mine.batch_size, probes=len(next(iter(base.values()))), padded=mine.padded,
                              compositions=found, worst=worst.name, dependent=dependent,
                              dependent_above=DEPENDENT_REL_L2)
    if mine is reference:
        return record, []
    where = f"in its worst batch composition '{worst.name}' ({worst.detail})"
    gates = []
    for name, values in mine.answers[worst.name].items():
        bad = int(np.size(values) - np.count_nonzero(np.isfinite(values)))
        gates.append(Gate(f"fidelity.batched.{name}.finite", bad == 0, float(bad), 0.0,
                          f"{bad} NaN/Inf values {where}" if bad else f"all values finite {where}", kind="fidelity"))
        if spec.fidelity is not None and spec.fidelity.cosine_min is not None:
            gates.append(at_least("fidelity", f"fidelity.batched.{name}.cosine", worst_rows[worst.name][name],
                                  spec.fidelity.cosine_min,
                                  f"lowest cosine of one probe to the baseline alone, {where}"))
    return record, gates


def _per_row(reference: np.ndarray, answer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row cosine and relative L2 of `answer` to `reference` (rows first, flattened per row)."""
    a = np.asarray(reference, dtype=np.float64).reshape(len(reference), -1)
    b = np.asarray(answer, dtype=np.float64).reshape(len(answer), -1)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where(na * nb > 0, np.sum(a * b, axis=1) / np.where(na * nb > 0, na * nb, 1.0),
                       np.all(a == b, axis=1).astype(float))
        rel = np.where(na > 0, np.linalg.norm(b - a, axis=1) / np.where(na > 0, na, 1.0), (b != 0).any(axis=1))
    return np.nan_to_num(cos, nan=0.0), np.nan_to_num(rel, nan=np.inf)


def _own(batch: Arrays, alone: Arrays) -> Arrays:
    """The probe's row (the first) of a batch's outputs, cut back on axis 1 to its answer alone's length (as the
    batcher cuts a padded request's outputs back)."""
    out = {}
    for name, array in batch.items():
        row = array[:1]
        if row.ndim > 1 and row.shape[1] != alone[name].shape[1]:
            row = row[:, : alone[name].shape[1]]
        out[name] = row
    return out


def _lengths(features: Arrays, pad: dict[str, int | float]) -> np.ndarray:
    """Each row's own length on axis 1 of the padded inputs: one past its last position holding anything but the
    pad value (at least 1); the full length without padded inputs."""
    rows = len(next(iter(features.values())))
    if not pad:
        return np.full(rows, 1)
    length = np.ones(rows, dtype=int)
    for name, value in pad.items():
        array = features[name].reshape(rows, features[name].shape[1], -1)
        used = (array != value).any(axis=2)
        last = np.where(used.any(axis=1), used.shape[1] - np.argmax(used[:, ::-1], axis=1), 1)
        length = np.maximum(length, last)
    return length


def _cut(row: np.ndarray, length: int) -> np.ndarray:
    return row[:length]


def _loudness(features: Arrays, lengths: np.ndarray, padded: set[str]) -> np.ndarray:
    """Rows ranked for the `loudest` composition: the largest magnitude of their float inputs, then their length."""
    rows = len(lengths)
    loud = np.zeros(rows)
    for name, array in features.items():
        if name not in padded and array.dtype.kind == "f":
            loud = np.maximum(loud, np.abs(array.reshape(rows, -1)).max(axis=1))
    return loud * 1e6 + lengths


class Composer:
    """Measures each (model, provider) once and compares it with the reference (the baseline on the first provider)."""

    def __init__(self, features: Arrays, layout: Layout, pad: dict[str, int | float], batch_size: int,
                 spec: ValidateSpec, reference: Path, provider: Provider) -> None:
        self._args = (features, layout, pad, batch_size)
        self._spec = spec
        self._measured: dict[tuple[str, str], Measured | None] = {}
        self._reference = self._measure(reference, provider)

    def _measure(self, path: Path, provider: Provider) -> Measured | None:
        if (str(path), provider) not in self._measured:
            self._measured[str(path), provider] = measure(path, provider, *self._args)
        return self._measured[str(path), provider]

    def of(self, path: Path, provider: Provider) -> tuple[BatchComposition | None, list[Gate]]:
        """The model's batch-composition record and its fidelity.batched gates (none for the reference itself, or
        a model that could not be measured)."""
        mine = self._measure(path, provider)
        if mine is None or self._reference is None:
            return None, []
        return figures(mine, self._reference, self._spec)
