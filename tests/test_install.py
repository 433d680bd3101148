"""temper installs beside anything: everything it installs and ships imports under `temper.`, so a
user's own `pipeline` package, PyPI's `validators` and a serving application's `artifacts` module
each keep their name (the pyfunc side is in tests/artifacts/test_pyfunc.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO

TEMPER = Path(sys.executable).with_name("temper")
FOLDERS = ("pipeline", "calibration", "validators", "artifacts")
PYPI_VALIDATORS = "validators==0.36.0"  # "Python Data Validation for Humans": the name temper once took

USER_PIPELINE = '''
"""The user's own package named `pipeline`, as ML projects often have."""
from digits_model import build


def build_net():
    return build()
'''


def test_pyproject_installs_every_package_folder_under_temper() -> None:
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {".".join(("temper", *p.parent.relative_to(REPO).parts))
               for top in FOLDERS for p in (REPO / top).rglob("__init__.py")}
    assert set(setuptools["packages"]) == folders
    assert setuptools["package-dir"] == {f"temper.{top}": top for top in FOLDERS}


@pytest.mark.slow
def test_a_factory_imports_the_users_own_pipeline_package(digits_dir: Path, tmp_path: Path) -> None:
    """The installed console script, run where a user runs it: the recipe folder holds a package
    named `pipeline`, and the factory's `from pipeline import build_net` gets the user's."""
    (digits_dir / "pipeline").mkdir()
    (digits_dir / "pipeline" / "__init__.py").write_text(USER_PIPELINE)
    (digits_dir / "user_model.py").write_text("from pipeline import build_net\n\n\ndef make():\n"
                                              "    return build_net()\n")
    recipe = digits_dir / "digits-cnn.yaml"
    data = yaml.safe_load(recipe.read_text())
    data["model"]["factory"] = "user_model.py:make"
    data.pop("validate"), data.pop("publish")
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    done = subprocess.run([str(TEMPER), "check", str(recipe)], capture_output=True, text=True, cwd=tmp_path,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok" in done.stdout


def test_pypi_validators_and_temper_import_side_by_side_here(tmp_path: Path) -> None:
    """The dev environment has both installed (pyproject's dev extra): one process imports each by its name."""
    code = ("import validators, temper.validators.gates as g; assert validators.email('a@example.com'); "
            "assert g.__name__ == 'temper.validators.gates'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """temper-ml's wheel, built from this checkout, and PyPI's validators wheel."""
    folder = tmp_path_factory.mktemp("wheels")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    build = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(folder), str(REPO)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    fetch = subprocess.run([*pip, "download", "--no-deps", "-d", str(folder), PYPI_VALIDATORS],
                           capture_output=True, text=True, timeout=600)
    # the dev install already took validators from the same registry: a failure here is a real one
    assert fetch.returncode == 0, f"pip download {PYPI_VALIDATORS} failed: {fetch.stderr.strip()[-300:]}"
    return {"temper": next(folder.glob("temper_ml-*.whl")), "validators": next(folder.glob("validators-*.whl"))}


@pytest.mark.slow
def test_the_wheel_holds_nothing_outside_temper(wheels: dict[str, Path]) -> None:
    names = zipfile.ZipFile(wheels["temper"]).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"temper"}
    assert "temper/validators/report.schema.json" in names
    assert "temper/validators/decoder_report.schema.json" in names and "temper/pipeline/decoders/flow.py" in names
    assert not [n for n in names if n.startswith("temper/") and n.count("/") == 1]  # temper/ is a namespace


def test_installs_and_uninstalls_beside_pypi_validators(wheels: dict[str, Path], tmp_path: Path) -> None:
    """Both wheels in one fresh environment (no dependencies: only the files matter), either uninstalled
    first: the other's files stay, and `validators` is PyPI's while temper's is `temper.validators`."""
    for first in ("temper", "validators"):
        env = tmp_path / f"env-{first}"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
        python = env / "bin" / "python"
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", str(python)]
        subprocess.run([*pip, "install", "--no-deps", "--no-index", str(wheels["temper"]), str(wheels["validators"])],
                       check=True, capture_output=True, timeout=300)
        probe = ("import validators, importlib.util as u; assert validators.email('a@example.com'); "
                 "spec = u.find_spec('temper.validators.gates'); assert spec and spec.origin, spec; print(spec.origin)")
        both = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert both.returncode == 0, both.stderr
        assert str(env) in both.stdout
        subprocess.run([*pip, "uninstall", "-y", "temper-ml" if first == "temper" else "validators"],
                       check=True, capture_output=True, timeout=300)
        site = next(env.glob("lib/python*/site-packages"))
        if first == "temper":
            assert not [p for p in site.glob("temper/**/*") if p.is_file()]  # pip may leave the empty folder
            kept = subprocess.run([str(python), "-c", "import validators; assert validators.url('https://a.example')"],
                                  capture_output=True, text=True, timeout=120, cwd=tmp_path)
            assert kept.returncode == 0, kept.stderr
        else:
            assert not (site / "validators").exists()
            assert (site / "temper" / "validators" / "gates.py").is_file()
        shutil.rmtree(env)
