"""`temper export-ensemble` and artifacts/triton/ensemble.py: the ensemble config.pbtxt read back with Triton's own
ModelConfig schema (steps, maps, batching), stages that cannot be chained refused before anything is written, and
the command's one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from temper.artifacts.formats.repository import LoadFailed
from temper.artifacts.triton.ensemble import CannotChain, export_ensemble
from tests.artifacts.ensembles import CNN, NORMALIZE, PIPELINE, make_pipeline_repository


@pytest.fixture(scope="module")
def pipeline_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pipeline_repository(tmp_path_factory.mktemp("ensemble"))


def test_the_written_ensemble_is_tritons_config(pipeline_repo: Path) -> None:
    config = text_format.Parse((pipeline_repo / PIPELINE / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert config.platform == "ensemble" and config.max_batch_size == 8  # the smaller stage's, as Triton requires
    assert [(i.name, list(i.dims)) for i in config.input] == [("pixels", [1, 8, 8])]
    assert [(o.name, list(o.dims)) for o in config.output] == [("logits", [10])]
    steps = config.ensemble_scheduling.step
    assert [(s.model_name, s.model_version) for s in steps] == [(NORMALIZE, -1), (CNN, -1)]
    assert dict(steps[0].input_map) == {"pixels": "pixels"} and dict(steps[1].output_map) == {"logits": "logits"}
    assert dict(steps[0].output_map) == {"image": "normalize.image"} == dict(steps[1].input_map)
    assert (pipeline_repo / PIPELINE / "1").is_dir()  # Triton needs the version folder


def test_stages_that_cannot_be_chained_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    repo = make_pipeline_repository(tmp_path, ensemble=False)
    with pytest.raises(CannotChain, match="would be one ensemble tensor"):  # cnn's logits never feed normalize
        export_ensemble(repo, "backwards", [CNN, NORMALIZE])
    with pytest.raises(LoadFailed, match="no model 'nothing'"):
        export_ensemble(repo, "missing", [NORMALIZE, "nothing"])
    with pytest.raises(CannotChain, match="two stages or more"):
        export_ensemble(repo, "alone", [NORMALIZE])
    assert sorted(p.name for p in repo.iterdir()) == [CNN, NORMALIZE]


def test_the_command_writes_the_ensemble_and_refuses_in_one_line(temper, tmp_path: Path) -> None:
    repo = make_pipeline_repository(tmp_path, ensemble=False)
    result = temper("export-ensemble", f"{PIPELINE}={NORMALIZE},{CNN}", "--dest", repo, "--version", "3")
    assert result.code == 0 and f"{NORMALIZE} -> {CNN}" in result.stdout, result
    assert (repo / PIPELINE / "config.pbtxt").is_file() and (repo / PIPELINE / "3").is_dir()
    for args, says in (((PIPELINE, "--dest", repo), "give the ensemble's name, '='"),
                       ((f"x={CNN},{NORMALIZE}", "--dest", repo), "would be one ensemble tensor"),
                       ((f"x={NORMALIZE},{CNN}", "--dest", tmp_path), "is not a model repository")):
        result = temper("export-ensemble", *args)
        (line,) = result.stderr.strip().splitlines()
        assert result.code == 2 and says in line and "Error" not in line, line
