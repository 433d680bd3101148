"""Triton ensembles in a model repository, on the Models both servers hold: answers equal to the two stages run one
after the other, the stages' own statistics, explicit load and unload of the composing models, no copy between
in-process stages and two per boundary with workers (counted), and each broken config refused in one line."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from temper.artifacts.core.errors import RequestError
from temper.artifacts.formats.repository import LoadFailed, ModelRepository
from temper.artifacts.serving.ensemble_runtime import Ensemble
from temper.artifacts.serving.models import Models
from temper.artifacts.serving.tensor_memory import Region
from tests.artifacts.ensembles import CNN, NORMALIZE, PIPELINE, Chained, make_pipeline_repository, pixels


@pytest.fixture(scope="module")
def pipeline_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pipeline_repository(tmp_path_factory.mktemp("ensemble"))


@pytest.fixture
def serving(pipeline_repo: Path) -> Iterator[Models]:
    models = Models(ModelRepository(pipeline_repo), "explicit", [PIPELINE])
    models.start()
    yield models
    models.stop()


def _states(models: Models) -> dict[str, str]:
    return {row["name"]: row.get("state", "") for row in models.index()}


def test_loading_the_ensemble_loads_its_stages_and_answers_as_chained(serving: Models, pipeline_repo: Path) -> None:
    assert _states(serving) == {CNN: "READY", PIPELINE: "READY", NORMALIZE: "READY"} and serving.ready
    chained = Chained(pipeline_repo)
    ensemble = serving.get(PIPELINE).runtime
    for seed, rows in ((0, 1), (1, 3), (2, 8)):
        x = pixels(seed, rows)
        np.testing.assert_allclose(ensemble.infer({"pixels": x})["logits"], chained(x), rtol=1e-5, atol=1e-5)
    # each stage counted the ensemble's requests in its own statistics; the ensemble its requests and rows
    for name in (NORMALIZE, CNN):
        m = serving.get(name).runtime.metrics.snapshot()
        assert m["request_success"] == 3 and m["inference_count"] == 12 and m["execution_count"] >= 3
    m = ensemble.metrics.snapshot()
    assert (m["request_success"], m["inference_count"], m["execution_count"]) == (3, 12, 0)
    with pytest.raises(RequestError, match="image"):
        ensemble.submit({"image": pixels(0)})
    with pytest.raises(RequestError, match="rows"):
        ensemble.submit({"pixels": pixels(0, 9)})  # over the ensemble's max_batch_size 8


def test_unloading_the_ensemble_unloads_the_stages_it_loaded(serving: Models) -> None:
    serving.load(CNN)  # asked for by name: it stays when the ensemble goes
    serving.unload(PIPELINE)
    assert _states(serving) == {CNN: "READY", PIPELINE: "UNAVAILABLE", NORMALIZE: "UNAVAILABLE"}
    serving.load(PIPELINE)
    assert _states(serving) == {CNN: "READY", PIPELINE: "READY", NORMALIZE: "READY"}
    serving.unload(NORMALIZE)  # a stage on its own: the ensemble stays, not ready, and says why
    ensemble = serving.get(PIPELINE).runtime
    assert not ensemble.ready and not serving.ready and "'normalize' is not loaded" in (ensemble.taken_out or "")
    assert serving.live  # cnn still serves
    serving.load(PIPELINE)  # loads the missing stage again
    assert ensemble.ready and serving.ready


def test_in_process_stages_hand_over_their_tensors_without_a_copy(serving: Models) -> None:
    """The array stage 2's session runs on is stage 1's answer itself (a view of its batch output)."""
    seen: dict[str, list] = {"out": [], "in": []}

    class Recording:
        def __init__(self, session, key: str) -> None:
            self.session, self.key = session, key

        def run(self, names, feed):
            if self.key == "in":
                seen["in"].append(feed["image"])
            answer = self.session.run(names, feed)
            if self.key == "out":
                seen["out"].append(answer[0])
            return answer

    first, second = serving.get(NORMALIZE).runtime, serving.get(CNN).runtime
    assert first.pool is None and second.pool is None and isinstance(serving.get(PIPELINE).runtime, Ensemble)
    first._session, second._session = Recording(first._session, "out"), Recording(second._session, "in")
    serving.get(PIPELINE).runtime.infer({"pixels": pixels(3, 4)})
    (given,), (taken,) = seen["out"], seen["in"]
    assert np.shares_memory(given, taken) and taken.shape == (4, 1, 8, 8)


def test_worker_stages_cost_two_copies_per_boundary(pipeline_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With each stage in a worker process, the gateway copies each stage's inputs into its instance's region and
    its outputs out of it: per ensemble request of two stages 2 writes and 2 copying reads, one of each at the
    boundary (counted here; the worker's own write of its outputs is in its process)."""
    models = Models(ModelRepository(pipeline_repo), "explicit", [PIPELINE], instances=1)
    models.start()
    try:
        assert models.get(NORMALIZE).runtime.pool is not None and models.get(CNN).runtime.pool is not None
        counted = {"write": 0, "copy": 0}
        write, read = Region.write, Region.read

        def counting_write(self, arrays):
            counted["write"] += 1
            return write(self, arrays)

        def counting_read(self, descriptor, size, copy):
            counted["copy"] += copy
            return read(self, descriptor, size, copy)

        monkeypatch.setattr(Region, "write", counting_write)
        monkeypatch.setattr(Region, "read", counting_read)
        x = pixels(4, 5)
        answer = models.get(PIPELINE).runtime.infer({"pixels": x})["logits"]
        np.testing.assert_allclose(answer, Chained(pipeline_repo)(x), rtol=1e-5, atol=1e-5)
        assert counted == {"write": 2, "copy": 2}
    finally:
        models.stop()


def _broken(repo: Path, tmp_path: Path, old: str, new: str) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(repo, copy)
    config = copy / PIPELINE / "config.pbtxt"
    text = config.read_text()
    assert old in text
    config.write_text(text.replace(old, new, 1))
    return copy


@pytest.mark.parametrize(("old", "new", "says"), [
    ('model_name: "cnn"', 'model_name: "resnet"', "step model 'resnet' is not in the repository"),
    ('input_map {\n      key: "image"', 'input_map {\n      key: "img"', "'cnn' has no input 'img'"),
    ('value: "logits"', 'value: "scores"', "no step gives its output 'logits'"),
    ('key: "pixels"\n      value: "pixels"', 'key: "pixels"\n      value: "logits"', "a cycle"),
    ("model_version: -1", "model_version: 3", "version 3 is not the one served (1"),
    ("data_type: TYPE_FP32", "data_type: TYPE_INT64", "'normalize' input 'pixels' is float32"),
    ('platform: "ensemble"', 'platform: "ensemble"\nmax_batch_size: [1]', "does not parse as Triton's ModelConfig"),
])
def test_a_broken_ensemble_is_refused_in_one_line(pipeline_repo: Path, tmp_path: Path, old: str, new: str,
                                                  says: str) -> None:
    repository = ModelRepository(_broken(pipeline_repo, tmp_path, old, new))
    with pytest.raises(LoadFailed) as caught:
        repository.locate(PIPELINE)
    assert says in str(caught.value) and "\n" not in str(caught.value), caught.value
    models = Models(repository, "explicit", [])
    models.start()
    with pytest.raises(LoadFailed, match="failed|not in|has no|no step|cycle|version|input|parse"):
        models.load(PIPELINE)
    assert not any(row.get("state") == "READY" for row in models.index())
    models.stop()
