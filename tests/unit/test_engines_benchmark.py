"""benchmarks/engines.py's engine list comes from the host profile's ISA flags (the profile temper's own
pre-flight reads), never the CPU's name: openvino-bf16 only where avx512_bf16 or amx_bf16 is reported, and
the generated recipe names it as a recipe does (validate.throughput.providers), so temper accepts it."""

from __future__ import annotations

import pytest

from benchmarks import engines
from temper.artifacts.core.host import HostProfile
from temper.pipeline.recipe import Recipe


def _host(features: list[str], known: bool = True, cpu: str = "AMD EPYC") -> HostProfile:
    return HostProfile(cpu=cpu, arch="x86_64", features=features, features_known=known, usable_cores=2,
                       logical_cpus=2, memory_gib=24.0, onnxruntime="1.32.0", providers=["CPUExecutionProvider"],
                       gpus=[], openvino="2026.4.1")


@pytest.mark.parametrize(("features", "known", "expected"), [
    (["avx2", "fma", "f16c"], True, ["cpu", "openvino"]),
    (["avx2", "avx512f", "avx512_vnni"], True, ["cpu", "openvino"]),  # VNNI alone is no BF16
    (["avx2", "avx512f", "avx512_vnni", "avx512_bf16"], True, ["cpu", "openvino", "openvino-bf16"]),
    (["avx2", "amx_tile", "amx_bf16"], True, ["cpu", "openvino", "openvino-bf16"]),
    ([], False, ["cpu", "openvino"]),  # no feature list: absence means nothing, so no BF16 engine is assumed
])
def test_engines_follow_the_profiles_flags(features, known, expected):
    assert engines.engines(_host(features, known)) == expected


def test_a_bf16_sounding_name_adds_no_engine():
    assert engines.engines(_host(["avx2"], cpu="Intel Xeon Sapphire Rapids (AMX BF16)")) == ["cpu", "openvino"]


@pytest.mark.parametrize("model", ["digits", "resnet18"])
def test_the_generated_recipe_names_openvino_bf16_as_a_recipe_does(model):
    bf16 = _host(["avx2", "avx512f", "avx512_bf16"])
    generated = engines.recipe_for(model, bf16)
    assert generated["validate"]["throughput"]["providers"] == ["cpu", "openvino", "openvino-bf16"]
    checked = Recipe.model_validate(generated)  # the schema temper run loads it with
    assert checked.validation is not None and checked.validation.throughput is not None
    assert checked.validation.throughput.providers == ["cpu", "openvino", "openvino-bf16"]
    assert engines.recipe_for(model, _host(["avx2"]))["validate"]["throughput"]["providers"] == ["cpu", "openvino"]


def test_the_host_line_says_what_the_profile_reports():
    line = engines.host_line(_host(["avx2", "avx512_vnni", "avx512_bf16"]))
    assert "(VNNI, BF16)" in line and "engines cpu, openvino, openvino-bf16" in line
    line = engines.host_line(_host(["avx2", "fma"]))
    assert "(no VNNI, no BF16)" in line and "engines cpu, openvino;" in line
