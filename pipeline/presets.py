"""Quantization presets per target, in the spirit of Optimum's AutoQuantizationConfig.

A preset only fills the quantize options a recipe leaves unset, so `preset: avx2` plus
`per_channel: false` means "avx2, but per-tensor". Each setting says why it suits the target.
`preset: auto` (the default when a step names none) picks the preset for the recipe's `target`,
which is this host unless the recipe names another machine: an INT8 configuration that is exact
and fast on one CPU can saturate on another.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from temper.artifacts.core.host import HostProfile, profile

# option -> value, for both modes unless listed in STATIC_ONLY
PRESETS: dict[str, dict[str, Any]] = {
    # VNNI's vpdpbusd multiplies u8 x s8 with 32-bit accumulation and no saturation, so the
    # fast u8-activation / s8-weight pair is exact; symmetric per-channel weights keep
    # accuracy without a weight zero point to correct for.
    "avx512_vnni": {"format": "qdq", "activation_type": "uint8", "weight_type": "int8", "per_channel": True,
                    "symmetric_weights": True, "symmetric_activations": False, "reduce_range": False},
    # AVX2 has no VNNI: its u8 x s8 instruction (vpmaddubsw) saturates 16-bit pair sums, so
    # weights go u8 as well, the pairing Optimum ships for AVX2.
    "avx2": {"format": "qdq", "activation_type": "uint8", "weight_type": "uint8", "per_channel": True,
             "symmetric_weights": True, "symmetric_activations": False, "reduce_range": False},
    # ARM64's sdot/udot kernels in ONNX Runtime take u8 activations with s8 weights; u8/s8 is
    # faster than u8/u8 on small cores and equal on big ones.
    "arm64": {"format": "qdq", "activation_type": "uint8", "weight_type": "int8", "per_channel": True,
              "symmetric_weights": True, "symmetric_activations": False, "reduce_range": False},
    # TensorRT reads precision from explicit Q/DQ pairs: symmetric int8 on both sides (it has
    # no zero points), per-channel weights, and a dedicated Q/DQ pair per consumer and on
    # every weight so it can fuse each layer on its own.
    "tensorrt": {"format": "qdq", "activation_type": "int8", "weight_type": "int8", "per_channel": True,
                 "symmetric_weights": True, "symmetric_activations": True, "reduce_range": False,
                 "dedicated_qdq_pairs": True},
}
STATIC_ONLY = {"format", "activation_type", "symmetric_activations", "dedicated_qdq_pairs"}
NEEDS_STATIC = {"tensorrt"}  # TensorRT consumes Q/DQ graphs, which dynamic quantization does not write
AUTO = "auto"
HOST = "host"
TARGETS = (HOST, *PRESETS)  # what a recipe's `target:` may name


@dataclass(frozen=True)
class Choice:
    """What `preset: auto` resolves to for a target, and why (shown in report.md)."""

    target: str  # "host" or a preset name the recipe gave as its target
    preset: str | None  # None: no preset suits; ONNX Runtime's own defaults apply
    reason: str


def choose(target: str = HOST, host: HostProfile | None = None) -> Choice:
    """The preset for `target`: a named machine maps to its own preset; `host` is decided by the
    CPU's INT8 features (VNNI or not, x86 or arm64), never by its name."""
    if target != HOST:
        return Choice(target, target, f"the recipe's target is {target}, not the machine building it")
    host = host or _this_host()
    if host.arm64:
        return Choice(target, "arm64",
                      f"this host ({host.cpu}) is arm64: ONNX Runtime's sdot/udot kernels take u8 x s8")
    if not host.x86 or not host.features_known:
        return Choice(target, None, f"this host ({host.cpu}, {host.arch}) has no known INT8 kernel profile: "
                                    "ONNX Runtime's defaults apply")
    vnni = [f for f in host.features if f in ("avx512_vnni", "avx_vnni", "amx_int8")]
    if vnni:
        return Choice(target, "avx512_vnni", f"this host ({host.cpu}) has {', '.join(vnni)}: u8 x s8 dot products "
                                             "accumulate in 32 bits without saturating")
    widest = "AVX-512" if "avx512f" in host.features else "AVX2" if "avx2" in host.features else "no AVX2"
    return Choice(target, "avx2", f"this host ({host.cpu}) has {widest} but no VNNI: its u8 x s8 instruction "
                                  "(vpmaddubsw) saturates 16-bit sums, so weights go u8 as well")


@functools.cache
def _this_host() -> HostProfile:
    return profile()


def fill(options: dict[str, Any], choice: Choice | None = None) -> dict[str, Any]:
    """`options` with the preset's values for every key it does not set itself.

    `preset: auto` takes `choice` (this host's when not given). A recipe's step without a `preset`
    is auto too: the loader passes its `choice`; only options built directly in Python, with no
    choice, keep ONNX Runtime's defaults, as does an explicit `preset: null`. The preset written
    back is the resolved one, so the cache key and the manifest say what was really built.
    """
    name = options.get("preset", AUTO if choice else None)
    if options.get("backend", "ort") != "ort":  # ModelOpt and NNCF configure their own quantizers: their steps
        # drop auto, and a preset they refuse by name fills none of ONNX Runtime's keys the user never wrote
        return {k: v for k, v in options.items() if k != "preset"} if name == AUTO else options
    if name == AUTO:
        choice = choice or choose()
        name = choice.preset
        if name in NEEDS_STATIC and options.get("mode") != "static":
            raise ValueError(f"preset auto resolves to {name} for target {choice.target}, which needs Q/DQ graphs: "
                             "use mode: static, or name another preset for this step")
        options = {**options, "preset": name}
    # None, an unknown name, a mapping or a list: the schema refuses all but None with its key path. `in PRESETS`
    # on a mapping or a list would raise TypeError, which pydantic passes through as a traceback.
    if not isinstance(name, str) or name not in PRESETS:
        return options
    static = options.get("mode") == "static"
    if name in NEEDS_STATIC and not static:
        raise ValueError(f"preset {name} writes Q/DQ graphs: it needs mode: static")
    defaults = {k: v for k, v in PRESETS[name].items() if static or k not in STATIC_ONLY}
    return {**defaults, **options}
