"""One engine interface: every row of the provider table is answered by a runtime in artifacts/engines/ that
implements the protocol, and nothing outside that package tests which runtime a row is.

Each row is checked against its runtime on this host: the defaults are the runtime's settings model, they
survive runtime.json's union and come back as the same class, each search row changes only fields the
settings model has, the Triton fields name a platform or a backend, and where the row is available here,
a real session opened with the defaults reads back exactly those settings.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest
from pydantic import TypeAdapter

from temper.artifacts import engines
from temper.artifacts.core.errors import EnvironmentProblem
from temper.artifacts.engines import ENGINES, Settings
from temper.artifacts.engines.onnxruntime import SessionSettings, provider_chain
from temper.artifacts.engines.providers import CUDA, PROVIDERS, EngineName
from tests.artifacts.runtimes import linear_model
from tests.helpers import REPO

# the names that tell one runtime from another: only artifacts/engines/ may use them
RUNTIME_NAMES = {"is_openvino", "OpenVinoSession", "OpenVinoSettings", "OnnxRuntime", "OpenVino", "load_openvino"}


def test_every_runtime_of_the_table_is_registered_and_every_registered_runtime_runs_a_row():
    assert set(get_args(EngineName)) == set(ENGINES) == {info.engine for info in PROVIDERS.values()}
    assert all(engine.name == key for key, engine in ENGINES.items())
    assert set(get_args(Settings)) == {engine.settings for engine in ENGINES.values()}


@pytest.mark.parametrize("row", list(PROVIDERS))
def test_each_row_is_answered_by_its_runtime(row: str):
    engine = engines.of(row)
    assert engine is ENGINES[PROVIDERS[row].engine]
    defaults = engine.defaults(row)
    assert isinstance(defaults, engine.settings) and defaults.threads >= 1
    # runtime.json and report.json hold the union: a dump reads back as the same runtime's settings
    back = TypeAdapter(Settings).validate_python(defaults.model_dump())
    assert type(back) is engine.settings and back == defaults
    assert engines.parse(row, defaults.model_dump()) == defaults
    for name, changes in engine.search_rows(row):
        assert set(changes) <= set(engine.settings.model_fields), f"{row} row {name} changes an unknown field"
        assert engine.settings.model_validate({**defaults.model_dump(), **changes}) != defaults
    fields = engine.triton(row, defaults)
    assert ("platform" in fields) != ("backend" in fields)
    assert engine.triton_kind(row, "KIND_CPU") == "KIND_CPU"


def test_an_unknown_row_is_refused_naming_the_table():
    with pytest.raises(ValueError, match="unknown provider 'openvino-int4'; choose from cpu, cuda"):
        engines.of("openvino-int4")


@pytest.mark.parametrize("row", list(PROVIDERS))
def test_an_available_row_opens_a_session_that_reads_back_its_settings(tmp_path: Path, row: str):
    engine = engines.of(row)
    try:
        engine.available(row)
    except EnvironmentProblem as err:
        line = str(err)
        assert "\n" not in line and err.exit_code == 3
        pytest.skip(f"this host cannot run {row}: {line}")
    settings = engine.defaults(row).with_threads(1)
    session = engine.open(linear_model(tmp_path), row, settings)
    assert engine.settings_of(session) == settings
    assert [t.name for t in session.get_outputs()]


def test_the_cuda_arena_settings_reach_the_provider_chain():
    """The GPU memory settings are what the CUDA provider is given (checked on a GPU by the device script)."""
    settings = SessionSettings(intra_op_threads=1, gpu_mem_limit_mb=512, arena_extend_strategy="next_power_of_two")
    chain = provider_chain([CUDA, "CPUExecutionProvider"], settings)
    assert chain[0] == (CUDA, {"gpu_mem_limit": str(512 * 2**20), "arena_extend_strategy": "kNextPowerOfTwo"})
    default = SessionSettings(intra_op_threads=1)
    assert provider_chain([CUDA], default) == [(CUDA, {"arena_extend_strategy": "kSameAsRequested"})]
    # a CPU session's records keep their old keys; a GPU session's carry its arena
    assert "gpu_mem_limit_mb" not in default.model_dump() and settings.model_dump()["gpu_mem_limit_mb"] == 512


def test_the_triton_export_carries_the_cuda_arena_of_a_gpu_pick():
    settings = SessionSettings(intra_op_threads=1, gpu_mem_limit_mb=256)
    parameters = engines.of("cuda").triton("cuda", settings)["parameters"]
    assert parameters["gpu_mem_limit"] == str(256 * 2**20) and parameters["arena_extend_strategy"] == "1"
    assert "gpu_mem_limit" not in engines.of("cpu").triton("cpu", settings)["parameters"]


def test_no_module_outside_the_engines_package_tells_runtimes_apart():
    found = []
    for top in ("artifacts", "validators", "pipeline", "calibration", "benchmarks"):
        for path in sorted((REPO / top).rglob("*.py")):
            if path.is_relative_to(REPO / "artifacts" / "engines"):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom):
                    names = {alias.name for alias in node.names}
                elif isinstance(node, ast.Name | ast.Attribute):
                    names = {node.id if isinstance(node, ast.Name) else node.attr}
                else:
                    continue
                found += [f"{path.relative_to(REPO)}: {name}" for name in sorted(names & RUNTIME_NAMES)]
    assert found == []
