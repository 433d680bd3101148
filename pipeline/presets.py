"""Quantization presets per target, in the spirit of Optimum's AutoQuantizationConfig.

A preset only fills the quantize options a recipe leaves unset, so `preset: avx2` plus
`per_channel: false` means "avx2, but per-tensor". Each setting says why it suits the target.
"""

from __future__ import annotations

from typing import Any

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


def fill(options: dict[str, Any]) -> dict[str, Any]:
    """`options` with the named preset's values for every key it does not set itself."""
    name = options.get("preset")
    if name not in PRESETS:  # absent, or unknown: the schema refuses it with its key path
        return options
    static = options.get("mode") == "static"
    if name in NEEDS_STATIC and not static:
        raise ValueError(f"preset {name} writes Q/DQ graphs: it needs mode: static")
    defaults = {k: v for k, v in PRESETS[name].items() if static or k not in STATIC_ONLY}
    return {**defaults, **options}
