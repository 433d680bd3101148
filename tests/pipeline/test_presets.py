"""`preset: auto` on the hosts temper meets: decided by the CPU's INT8 features, never by its name.
Host profiles here are data (what artifacts.core.host reads from /proc/cpuinfo on those machines)."""

from __future__ import annotations

import pytest

from temper.artifacts.core.host import HostProfile, profile
from temper.pipeline import presets
from temper.pipeline.quantize_backends import quantize_options


def _host(cpu: str, arch: str, features: list[str], known: bool = True) -> HostProfile:
    return HostProfile(cpu=cpu, arch=arch, features=features, features_known=known, usable_cores=2, logical_cpus=2,
                       memory_gib=24.0, onnxruntime="1.32.0", providers=["CPUExecutionProvider"], gpus=[])


XEON_NO_VNNI = _host("Intel Xeon Processor (Skylake, IBRS)", "x86_64", ["avx2", "fma", "f16c", "avx512f", "avx512bw"])
EPYC_VNNI = _host("AMD EPYC", "x86_64", ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"])
ALDER_LAKE = _host("12th Gen Intel Core i7", "x86_64", ["avx2", "fma", "f16c", "avx_vnni"])
GRAVITON = _host("arm64 (implementer 0x41)", "aarch64", ["asimd", "dotprod", "i8mm", "bf16"])


def test_x86_without_vnni_never_gets_the_saturating_u8s8_configuration():
    choice = presets.choose(host=XEON_NO_VNNI)
    assert choice.preset == "avx2" and "no VNNI" in choice.reason and "AVX-512" in choice.reason
    for mode in ("static", "dynamic"):
        options = quantize_options({"mode": mode}, context={"preset_choice": choice})
        assert options.weight_type == "uint8", "u8 activations x s8 weights saturate in vpmaddubsw"
        if mode == "static":
            assert options.activation_type == "uint8"


@pytest.mark.parametrize("host, feature", [(EPYC_VNNI, "avx512_vnni"), (ALDER_LAKE, "avx_vnni")])
def test_vnni_hosts_get_u8_activations_and_s8_weights(host, feature):
    choice = presets.choose(host=host)
    assert choice.preset == "avx512_vnni" and feature in choice.reason
    options = quantize_options({"mode": "static"}, context={"preset_choice": choice})
    assert (options.activation_type, options.weight_type) == ("uint8", "int8")


def test_arm64_and_unknown_hosts():
    assert presets.choose(host=GRAVITON).preset == "arm64"
    unknown = presets.choose(host=_host("", "riscv64", []))
    assert unknown.preset is None and "defaults apply" in unknown.reason
    blind = presets.choose(host=_host("Intel Xeon", "x86_64", [], known=False))  # no feature list: no guess
    assert blind.preset is None


def test_a_named_target_wins_over_the_host():
    choice = presets.choose("avx2", host=EPYC_VNNI)
    assert choice.preset == "avx2" and "target is avx2" in choice.reason


def test_a_step_s_own_settings_and_an_explicit_preset_beat_auto():
    choice = presets.choose(host=XEON_NO_VNNI)
    own = quantize_options({"mode": "static", "weight_type": "int8", "reduce_range": True},
                                         context={"preset_choice": choice})
    assert own.preset == "avx2" and own.weight_type == "int8" and own.reduce_range
    named = quantize_options({"mode": "static", "preset": "arm64"}, context={"preset_choice": choice})
    assert named.preset == "arm64" and named.weight_type == "int8"
    plain = quantize_options({"mode": "static", "preset": None}, context={"preset_choice": choice})
    assert plain.preset is None and plain.activation_type == "int8"  # null: ONNX Runtime's own defaults


def test_modelopt_steps_are_left_to_modelopt():
    choice = presets.choose(host=EPYC_VNNI)
    options = quantize_options({"mode": "static", "backend": "modelopt"},
                                             context={"preset_choice": choice})
    assert options.preset is None and options.activation_type == "int8"


def test_this_host_resolves_without_error():
    choice = presets.choose()
    host = profile()
    if host.x86 and host.features_known:
        assert choice.preset == ("avx512_vnni" if host.vnni else "avx2")
    assert choice.reason
