"""Accuracy metrics: values on hand-checkable arrays and against sklearn, direction and budgets,
`fits` refusing meaningless pairings, probe catching damage on real data, user callables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.metrics import f1_score, top_k_accuracy_score

from temper.artifacts.core.errors import RecipeError
from temper.validators.metrics import Metric, MetricData, allowed_drop, drop, resolve
from temper.validators.spec import AccuracyGate

SCORES = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
LABELS = np.array([1, 0, 0, 0])  # argmax 1, 0, 1, 0: three of four right


def _metric(name: str, tmp_path: Path = Path("."), **fields) -> Metric:
    return resolve(AccuracyGate(metric=name, max_drop=0.01, **fields), tmp_path, "r.yaml")


def _score(metric: Metric, outputs, labels=None, baseline=None) -> float:
    outputs = np.asarray(outputs, dtype=np.float32)
    baseline = outputs if baseline is None else np.asarray(baseline, dtype=np.float32)
    return metric.score(MetricData(outputs, labels, baseline, None, None))


def test_top1_and_topk_by_hand_and_against_sklearn() -> None:
    assert _score(_metric("top1"), SCORES, LABELS) == 0.75
    three = np.array([[0.5, 0.3, 0.2], [0.1, 0.2, 0.7], [0.2, 0.5, 0.3]])
    # true class ranks: 3rd, 2nd, 1st -> in the top 2 for rows 1 and 2 only
    assert _score(_metric("topk", k=2), three, np.array([2, 1, 1])) == pytest.approx(2 / 3)
    rng = np.random.default_rng(0)
    scores, labels = rng.standard_normal((200, 10)), rng.integers(0, 10, 200)
    for k in (1, 3, 5):
        expected = top_k_accuracy_score(labels, scores, k=k, labels=np.arange(10))
        assert _score(_metric("topk", k=k), scores, labels) == pytest.approx(expected)


def test_macro_f1_matches_sklearn() -> None:
    # predictions 1, 0, 1, 0 vs labels 1, 0, 0, 0: class 0 F1 = 0.8, class 1 F1 = 2/3
    assert _score(_metric("f1"), SCORES, LABELS) == pytest.approx((0.8 + 2 / 3) / 2)
    rng = np.random.default_rng(1)
    scores, labels = rng.standard_normal((300, 4)), rng.integers(0, 4, 300)
    expected = f1_score(labels, scores.argmax(1), average="macro")
    assert _score(_metric("f1"), scores, labels) == pytest.approx(expected)


def test_cosine_and_mse_against_the_baseline() -> None:
    baseline = [[1.0, 0.0], [1.0, 0.0], [0.0, 0.0]]
    candidate = [[3.0, 0.0], [0.0, 2.0], [0.0, 0.0]]  # same direction, orthogonal, both zero
    assert _score(_metric("cosine"), candidate, baseline=baseline) == pytest.approx((1 + 0 + 1) / 3)
    assert _score(_metric("mse"), [[1.0, 2.0]], baseline=[[1.0, 4.0]]) == 2.0
    # against itself: the baseline's own value, perfect agreement
    assert _score(_metric("cosine"), baseline) == 1.0 and _score(_metric("mse"), baseline) == 0.0


def test_drop_respects_direction_and_budgets_are_absolute() -> None:
    top1, mse = _metric("top1"), _metric("mse")
    assert top1.higher_is_better and not mse.higher_is_better
    assert drop(top1, 0.90, 0.85) == pytest.approx(0.05)  # accuracy fell: worse
    assert drop(top1, 0.90, 0.95) == pytest.approx(-0.05)  # improved: negative drop
    assert drop(mse, 0.0, 0.5) == 0.5  # error grew: a positive drop
    assert drop(mse, 0.5, 0.2) == pytest.approx(-0.3)
    assert allowed_drop(0.02, 0.9) == 0.02
    assert allowed_drop("1%", 0.9) == pytest.approx(0.009)
    assert allowed_drop("2.5 %", -4.0) == pytest.approx(0.1)  # a magnitude, whatever the sign


def test_fits_refuses_class_metrics_on_embeddings_and_missing_labels() -> None:
    embedding = np.random.default_rng(0).standard_normal((20, 384)).astype(np.float32)
    two_classes = np.arange(20) % 2
    for name in ("top1", "f1", "topk"):
        reason = _metric(name).fits(embedding, two_classes)
        assert reason and "384 columns" in reason and "2 classes" in reason
        assert "cosine" in reason and "probe" in reason
    assert _metric("top1").fits(SCORES, LABELS) is None
    assert _metric("top1").fits(SCORES, None) == "metric top1 needs labels: set data.evaluation.label"
    assert "data.evaluation.label" in _metric("probe").fits(embedding, None)
    assert "integer class ids" in _metric("top1").fits(SCORES, np.array(["a", "b", "a", "a"]))
    assert "2-D" in _metric("top1").fits(np.zeros((4, 2, 3)), LABELS)
    # labels and embeddings need no labels for cosine / mse
    assert _metric("cosine").fits(embedding, None) is None and _metric("mse").fits(embedding, None) is None
    assert "mse" in _metric("cosine").fits(np.zeros(20), None)


def test_topk_needs_k_below_the_class_count() -> None:
    reason = _metric("topk", k=2).fits(SCORES, LABELS)
    assert reason and "k=2" in reason
    assert _metric("topk", k=1).fits(SCORES, LABELS) is None


@pytest.mark.slow
def test_probe_on_digits_detects_damaged_features() -> None:
    digits = load_digits()
    pixels, labels = digits.data.astype(np.float32), digits.target
    train, held = slice(0, 1000), slice(1000, None)
    probe = _metric("probe")
    assert probe.needs_training and probe.fits(pixels[held], labels[held]) is None

    def accuracy(outputs: np.ndarray) -> float:
        return probe.score(MetricData(outputs, labels[held], pixels[held], pixels[train], labels[train]))

    clean = accuracy(pixels[held])
    noisy = accuracy(pixels[held] + np.random.default_rng(0).normal(0, 8, pixels[held].shape).astype(np.float32))
    assert clean > 0.9
    assert drop(probe, clean, noisy) > 0.2
    with pytest.raises(ValueError, match="data.calibration.label"):
        probe.score(MetricData(pixels[held], labels[held], pixels[held], None, None))


def test_callable_metric_is_loaded_and_its_direction_respected(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "import numpy as np\n"
        "def accuracy(outputs, labels, baseline):\n"
        "    return float((outputs.argmax(1) == labels).mean())\n"
        "def distance(outputs, labels, baseline):\n"
        "    return np.abs(outputs - baseline).max()\n"
    )
    accuracy = _metric("m.py:accuracy", tmp_path, higher_is_better=True)
    assert accuracy.higher_is_better and accuracy.fits(SCORES, None) is None
    assert _score(accuracy, SCORES, LABELS) == 0.75
    assert drop(accuracy, 0.75, 0.5) == 0.25
    distance = _metric("m.py:distance", tmp_path, higher_is_better=False)
    assert _score(distance, [[1.0, 2.0]], baseline=[[1.0, 1.5]]) == 0.5  # a numpy float is a number
    assert drop(distance, 0.0, 0.5) == 0.5


def test_callable_metric_must_return_a_finite_number(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(
        "def nan(outputs, labels, baseline):\n    return float('nan')\n"
        "def text(outputs, labels, baseline):\n    return 'high'\n"
        "def boom(outputs, labels, baseline):\n    raise KeyError('label')\n"
    )
    for name, message in (("nan", "finite"), ("text", "must return a number"), ("boom", "KeyError")):
        metric = _metric(f"bad.py:{name}", tmp_path, higher_is_better=True)
        with pytest.raises(RecipeError, match=message) as info:
            _score(metric, SCORES, LABELS)
        assert info.value.key == "validate.accuracy.metric"
    with pytest.raises(RecipeError) as info:
        _metric("missing.py:fn", tmp_path, higher_is_better=True)
    assert info.value.key == "validate.accuracy.metric"


def test_probe_counts_a_row_with_nan_or_inf_as_a_wrong_answer() -> None:
    """A candidate whose outputs hold NaN (MiniLM's static INT8 on OpenVINO) gets a score and fails its
    budget; before, LogisticRegression raised on it and the whole run exited 1 without a report."""
    rng = np.random.default_rng(0)
    labels = np.arange(40) % 2
    features = (labels[:, None] * 4.0 + rng.standard_normal((40, 3))).astype(np.float32)  # separable
    probe = _metric("probe")
    clean = probe.score(MetricData(features, labels, features, features, labels))
    broken = features.copy()
    broken[:10, 0], broken[10:20, 1] = np.nan, np.inf
    assert clean == 1.0
    assert probe.score(MetricData(broken, labels, features, features, labels)) == 0.5
    assert probe.score(MetricData(np.full_like(features, np.nan), labels, features, features, labels)) == 0.0
