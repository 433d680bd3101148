"""A bundle's model is checked against the manifest it ships before pull, serve, export-triton or the
pyfunc model trust it; pull writes only into a folder of its own; serving warns when its libraries are
not the ones the bundle's gates ran on. Real bundles, a real sqlite MLflow store, real ONNX Runtime."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlflow
import pytest

from temper.artifacts.core import versions
from temper.artifacts.formats import bundle
from temper.artifacts.formats.integrity import Mismatch
from temper.artifacts.registry.pyfunc import log_bundle
from temper.artifacts.serving.runtime import Runtime
from tests.artifacts.servers import MODEL, _temper_serve
from tests.artifacts.test_server_cli import _refused, _run_output

OLD = {"onnxruntime": "1.20.1", "onnx": "1.16.0", "numpy": "1.26.4"}  # before ORT 1.21 changed quantized numerics


def _published(folder: Path, tiny: Path, **serving: object) -> Path:
    """A bundle as publishing writes it: the run's selected model (int8), runtime.json, report and manifest."""
    output = _run_output(folder / "out", tiny, "int8", None)
    model = output / "int8" / bundle.MODEL
    return bundle.write(folder / "bundle", model, bundle.config_for(model, MODEL, **serving),
                        [output / "report.json", output / "manifest.json"])


def _replace_model(folder: Path) -> None:
    """The int8 model's file swapped for the baseline's: same size, other weights."""
    shutil.copy2(folder.parent / "out" / "baseline" / bundle.MODEL, folder / bundle.MODEL)


@pytest.fixture
def store(tracking_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's private store as the global MLflow target (restored afterwards); its artifact folder."""
    from mlflow.tracking._model_registry import utils as registry
    from mlflow.tracking._tracking_service import utils as tracking

    monkeypatch.setattr(tracking, "_tracking_uri", tracking._tracking_uri)
    monkeypatch.setattr(registry, "_registry_uri", registry._registry_uri)
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", tracking_store)
    mlflow.set_tracking_uri(tracking_store)
    return tmp_path / "mlartifacts"


def _register(folder: Path, artifacts: Path) -> None:
    """Log `folder` as a pyfunc model and point models:/tiny@champion at it."""
    experiment = mlflow.create_experiment(f"trust-{folder.name}", artifact_location=artifacts.as_uri())
    with mlflow.start_run(experiment_id=experiment):
        info = log_bundle(folder, name="model")
    version = mlflow.register_model(info.model_uri, MODEL)
    mlflow.MlflowClient().set_registered_model_alias(MODEL, "champion", version.version)


def _one_line(stderr: str) -> str:
    (line,) = stderr.strip().splitlines()
    return line


def test_a_bundle_whose_model_was_replaced_is_refused(temper, tiny: Path, tmp_path: Path) -> None:
    folder = _published(tmp_path, tiny)
    exported = temper("export-triton", folder, "--dest", tmp_path / "ok-repo")
    assert exported.code == 0 and "warning" not in exported.stderr, exported.stderr  # it matches its manifest

    _replace_model(folder)
    result = temper("export-triton", folder, "--dest", tmp_path / "repo")
    line = _one_line(result.stderr)
    assert result.code == 2 and line.startswith(f"error: {folder}/model.onnx: is not the int8 model manifest.json "
                                                "records"), line
    assert "temper pull" in line and not (tmp_path / "repo").exists(), line
    code, stderr = _refused("serve", folder)
    assert code == 2 and _one_line(stderr) == line, stderr


def test_a_bundle_without_a_manifest_is_used_with_a_warning(temper, tiny: Path, tmp_path: Path) -> None:
    """Hand-made bundles (bundle.write, no manifest) cannot be checked: they are used, and the user is told."""
    result = temper("export-triton", tiny, "--dest", tmp_path / "repo")
    assert result.code == 0, result.stderr
    line = _one_line(result.stderr)
    assert line.startswith(f"warning: {tiny} has no manifest.json, so its model.onnx cannot be checked"), line


def test_pull_refuses_a_folder_it_did_not_write_and_replaces_its_own(temper, tiny: Path, tmp_path: Path,
                                                                    store: Path) -> None:
    _register(_published(tmp_path, tiny), store)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "manifest.json").write_text('{"mine": true}\n')
    result = temper("pull", f"models:/{MODEL}@champion", "--dest", mine)
    line = _one_line(result.stderr)
    assert result.code == 2 and line.startswith(f"error: {mine}: --dest: "), line
    assert "temper did not download into it" in line and "choose a new or empty folder" in line, line
    assert (mine / "manifest.json").read_text() == '{"mine": true}\n'

    pulled = tmp_path / "pulled"
    first = temper("pull", f"models:/{MODEL}@champion", "--dest", pulled)
    assert first.code == 0 and "warning" not in first.stderr, first.stderr
    assert {"model.onnx", "runtime.json", "report.json", "manifest.json"} <= {p.name for p in pulled.iterdir()}
    (pulled / "stale.onnx.data").write_text("left from an older bundle")
    again = temper("pull", f"models:/{MODEL}@champion", "--dest", pulled)
    assert again.code == 0, again.stderr
    assert not (pulled / "stale.onnx.data").exists()  # the pull's own folder is replaced whole


@pytest.mark.slow
def test_a_changed_registry_copy_is_refused_by_pull_serve_and_the_pyfunc_model(temper, tiny: Path, tmp_path: Path,
                                                                              store: Path) -> None:
    _register(_published(tmp_path, tiny), store)
    (logged,) = [p for p in store.rglob(bundle.MODEL) if p.parent.name == "bundle"]
    shutil.copy2(tmp_path / "out" / "baseline" / bundle.MODEL, logged)

    result = temper("pull", f"models:/{MODEL}@champion", "--dest", tmp_path / "pulled")
    line = _one_line(result.stderr)
    assert result.code == 2 and line.startswith(f"error: models:/{MODEL}/1/model.onnx: is not the int8 model "), line
    assert "publish it again with `temper run`" in line and not (tmp_path / "pulled").exists(), line
    code, stderr = _refused("serve", f"models:/{MODEL}@champion")
    assert code == 2 and _one_line(stderr) == line, stderr
    with pytest.raises(Mismatch, match=r"model\.onnx: is not the int8 model manifest\.json records"):
        mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")


def test_the_runtime_says_when_its_libraries_are_not_the_ones_the_gates_ran_on(tiny: Path, tmp_path: Path) -> None:
    drifted = _published(tmp_path / "old", tiny, gated_with=OLD)
    warning = Runtime(drifted).drift_warning
    assert warning is not None
    now = versions.current()
    for library, then in OLD.items():
        assert f"{library} {now[library]} (gated on {then})" in warning, warning
    assert "temper validate" in warning and "\n" not in warning
    assert Runtime(_published(tmp_path / "same", tiny, gated_with=now)).drift_warning is None
    assert Runtime(tiny).drift_warning is None  # nothing recorded: nothing to compare


def test_temper_serve_warns_in_one_line_when_the_runtime_drifted(tiny: Path, tmp_path: Path) -> None:
    drifted = _published(tmp_path, tiny, gated_with=OLD)
    assert json.loads((drifted / "runtime.json").read_text())["gated_with"] == OLD
    with _temper_serve(str(drifted)) as (_, output):
        pass
    warnings = [line for line in output["stderr"].splitlines() if line.startswith("warning: this runtime differs")]
    assert len(warnings) == 1 and f"onnxruntime {versions.current()['onnxruntime']} (gated on 1.20.1)" in warnings[0]


def test_the_pyfunc_model_warns_when_the_runtime_drifted(tiny: Path, tmp_path: Path, store: Path) -> None:
    _register(_published(tmp_path, tiny, gated_with=OLD), store)
    with pytest.warns(RuntimeWarning, match=r"this runtime differs .*onnxruntime \S+ \(gated on 1\.20\.1\)"):
        mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")


def test_a_run_s_selected_model_exported_to_a_repository_stays_checkable(temper, tiny: Path, tmp_path: Path) -> None:
    """export-triton OUTPUT carries the run's manifest and report into the version folder, so serving the
    repository checks the model's sha256 (a file swapped there is refused); another candidate of the run has
    no report naming it: exported without them, and served with the unchecked warning."""
    from temper.artifacts.formats.integrity import check_bundle

    output = _run_output(tmp_path / "run", tiny, "int8", None)
    assert temper("export-triton", output, "--dest", tmp_path / "repo").code == 0
    (version,) = [p for p in (tmp_path / "repo").glob("*/1")]
    assert (version / "manifest.json").read_bytes() == (output / "manifest.json").read_bytes()
    assert (version / "report.json").read_bytes() == (output / "report.json").read_bytes()
    assert check_bundle(version, "export it again") is None  # checked, and it matches
    shutil.copy2(output / "baseline" / bundle.MODEL, version / bundle.MODEL)
    with pytest.raises(Mismatch, match="is not the int8 model manifest.json records"):
        check_bundle(version, "export it again")

    assert temper("export-triton", output / "baseline", "--dest", tmp_path / "other").code == 0
    (other,) = [p for p in (tmp_path / "other").glob("*/1")]
    assert not (other / "manifest.json").exists() and not (other / "report.json").exists()
    assert "cannot be checked" in (check_bundle(other, "export it again") or "")
