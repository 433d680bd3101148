"""A decoder candidate from NNCF's `compress_weights` (ONNX backend): 4-bit weights in groups with NNCF's mixed
precision (`ratio`), AWQ and scale estimation, which ONNX Runtime's own quantizer does not offer.

On the builder's graphs (opset 21 and up) NNCF writes each compressed weight as a low-bit initializer and a
`DequantizeLinear` (blocked for int4) feeding the original MatMul, not MatMulNBits; ONNX Runtime fuses the 4-bit
blocked ones into MatMulNBits when it loads the model, and the census counts the stored pattern. The weights stay
external data: the graph is read without them and NNCF reads each from the baseline's folder.

The embedding (a Gather) is left out: NNCF 3.4's ONNX backend blocks a 4-bit embedding on the wrong axis
(DequantizeLinear axis 0 of [vocab, hidden], scales per hidden group), which ONNX Runtime refuses to run, and on a
tied embedding (SmolLM2: a Transpose of the LM head's weight) it fails outright. A tied one still reads the LM
head's compressed weight; the census counts MatMul weights only either way.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from pathlib import Path

from temper.pipeline.decoders.spec import WeightOptions


def compress(base: Path, name: str, options: WeightOptions, kept: list[str], out: Path,
             calibration: Sequence[Sequence[int]]) -> None:
    """`out/name`: the baseline's weights compressed by NNCF as `options` says, the `kept` MatMuls left float."""
    import onnx

    from temper.pipeline.decoders.calibration import prefill_feeds
    from temper.pipeline.quantize_backends.base import quiet_logger
    from temper.pipeline.quantize_backends.nncf import require

    nncf = require()  # with its telemetry off, as for the CNN/encoder quantize backend
    from nncf.common.logging import nncf_logger  # a bit-width table per call on stdout otherwise
    from nncf.onnx.quantization.backend_parameters import BackendParameters
    from nncf.quantization.advanced_parameters import AdvancedCompressionParameters

    model = onnx.load(str(base / name), load_external_data=False)
    advanced = AdvancedCompressionParameters(backend_params={BackendParameters.EXTERNAL_DATA_DIR: str(base)})
    mode = nncf.CompressWeightsMode(options.mode)
    int4 = options.mode.startswith("int4")
    dataset = nncf.Dataset(prefill_feeds(base, calibration)) if options.calibrates else None
    with quiet_logger(nncf_logger), contextlib.redirect_stdout(io.StringIO()):  # and rich progress bars
        compressed = nncf.compress_weights(
            model, mode=mode, dataset=dataset, subset_size=len(calibration) or 1, advanced_parameters=advanced,
            ignored_scope=nncf.IgnoredScope(names=kept, types=["Gather"],
                                            validate=False),
            **({"group_size": options.group_size, "ratio": options.ratio, "all_layers": options.all_layers,
                "awq": options.awq, "scale_estimation": options.scale_estimation} if int4 else {}))
    onnx.save_model(compressed, str(out / name), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=f"{name}.data", size_threshold=1024)
