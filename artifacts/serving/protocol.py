"""The Open Inference Protocol (KServe v2) names both servers share: the model version and datatypes.

numpy only, so that the gRPC server (artifacts/serving/grpc_server.py) can use them without the REST
server's packages (uvicorn, orjson), and the two can never disagree on a datatype name.
"""

from __future__ import annotations

import numpy as np

VERSION = "1"  # the one version of the one model a server serves
# numpy dtype name -> KServe v2 datatype name
DATATYPES = {"float32": "FP32", "float16": "FP16", "int64": "INT64", "int32": "INT32", "int8": "INT8",
             "uint8": "UINT8", "bool": "BOOL"}
WIRE = {kserve: np.dtype(name).newbyteorder("<") for name, kserve in DATATYPES.items()}  # binary data is little-endian


def unroutable(name: str) -> str | None:
    """Why a model named `name` cannot be reached at /v2/models/NAME/..., or None when it can.

    A '/' splits the name across path segments, '.' and '..' are path steps clients and proxies
    collapse, and control characters are not allowed in a request line at all: a server for such
    a model would say ready while every route of it answers 404."""
    if not name:
        return "is empty"
    if "/" in name:
        return f"{name!r} holds a '/', which splits it across the URL's path segments"
    if name in (".", ".."):
        return f"{name!r} is a path step that clients and proxies collapse"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return f"{name!r} holds a control character, which no request line may carry"
    return None
