"""The provider table is the one list: the recipe's `Provider` values, the rows every layer reads, and
the serving runtime's order of preference must name the same providers; and every row's pre-flight asks
the thing itself (onnxruntime's providers, OpenVINO's devices, the host profile's ISA flags)."""

from __future__ import annotations

import builtins
from typing import Any, get_args

import pytest

from temper.artifacts import engines
from temper.artifacts.core.errors import EnvironmentProblem
from temper.artifacts.core.host import HostProfile, profile
from temper.artifacts.engines.providers import BEST_FIRST, BF16_FLAGS, CPU, PROVIDERS, Provider, named
from temper.pipeline.recipe import Recipe
from temper.validators.throughput import require_available


def test_the_literal_and_the_table_name_the_same_providers():
    assert get_args(Provider) == tuple(PROVIDERS)
    onnxruntime_rows = [name for name, info in PROVIDERS.items() if info.engine == "onnxruntime"]
    assert sorted(BEST_FIRST) == sorted(onnxruntime_rows) and BEST_FIRST[-1] == "cpu"
    assert all(info.name == key for key, info in PROVIDERS.items())


def test_the_recipe_schema_offers_exactly_the_table():
    schema = Recipe.model_json_schema(by_alias=True)
    providers = schema["$defs"]["ThroughputSpec"]["properties"]["providers"]["items"]
    assert providers["enum"] == list(PROVIDERS)


@pytest.mark.parametrize("name", list(PROVIDERS))
def test_every_provider_a_host_may_lack_says_what_to_install(name):
    info = PROVIDERS[name]
    assert (info.gpu or info.engine != "onnxruntime") == bool(info.install), \
        "a provider this onnxruntime may lack says how to get it"
    if info.engine == "onnxruntime":
        assert named(info.ort) == name
    else:
        assert info.ort == "" and info.precision in ("f32", "bf16") and engines.of(name).name == "openvino"
        assert "temper-ml[openvino]" in info.install


def test_an_unknown_ort_provider_counts_as_cpu():
    assert named("SomeOtherExecutionProvider") == "cpu" and named(CPU) == "cpu" and named("") == "cpu"


def test_only_the_bf16_row_asks_the_host_for_native_bf16():
    assert PROVIDERS["openvino-bf16"].host_flags == BF16_FLAGS == ("avx512_bf16", "amx_bf16")
    assert all(not info.host_flags for name, info in PROVIDERS.items() if name != "openvino-bf16")


def _host(features: list[str], known: bool = True, cpu: str = "Intel(R) Xeon(R) Platinum 8480+") -> HostProfile:
    return profile().model_copy(update={"features": features, "features_known": known, "cpu": cpu})


def test_bf16_is_refused_by_the_flags_never_by_the_cpu_name():
    """A Sapphire Rapids name without the flags is refused; the flags alone are what counts."""
    with pytest.raises(EnvironmentProblem) as caught:
        require_available("openvino-bf16", _host(["avx2", "avx512f", "avx512_vnni"]))
    line = str(caught.value)
    assert "\n" not in line and line.startswith("validate.throughput.providers: 'openvino-bf16'")
    assert "avx512_bf16 or amx_bf16" in line and "reports avx2 avx512f avx512_vnni" in line
    with pytest.raises(EnvironmentProblem, match="reports unknown"):
        require_available("openvino-bf16", _host(["avx512_bf16"], known=False))
    for flag in BF16_FLAGS:  # either flag is enough, whatever the CPU is called
        require_available("openvino-bf16", _host([flag], cpu="Some CPU"))


def test_plain_openvino_needs_no_flag():
    require_available("openvino", _host([], known=False))


def test_openvino_absent_is_one_line_naming_the_key_and_the_extra(monkeypatch: pytest.MonkeyPatch):
    real = builtins.__import__

    def without_openvino(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "openvino" or name.startswith("openvino."):
            raise ImportError(f"No module named '{name}'")
        return real(name, *args, **kwargs)

    monkeypatch.delitem(__import__("sys").modules, "openvino", raising=False)
    monkeypatch.setattr(builtins, "__import__", without_openvino)
    for name in ("openvino", "openvino-bf16"):
        with pytest.raises(EnvironmentProblem) as caught:
            require_available(name, _host(list(BF16_FLAGS)))
        line = str(caught.value)
        assert "\n" not in line and caught.value.exit_code == 3
        assert line.startswith(f"validate.throughput.providers: '{name}' needs OpenVINO")
        assert "pip install 'temper-ml[openvino]'" in line


def test_an_unknown_provider_is_refused():
    with pytest.raises(ValueError, match="unknown provider 'openvino-int4'"):
        require_available("openvino-int4")
