"""The Open Inference Protocol (KServe v2) names both servers share: the model version and datatypes.

numpy only, so that the gRPC server (artifacts/grpc_server.py) can use them without the REST
server's packages (uvicorn, orjson), and the two can never disagree on a datatype name.
"""

from __future__ import annotations

import numpy as np

VERSION = "1"  # the one version of the one model a server serves
# numpy dtype name -> KServe v2 datatype name
DATATYPES = {"float32": "FP32", "float16": "FP16", "int64": "INT64", "int32": "INT32", "int8": "INT8",
             "uint8": "UINT8", "bool": "BOOL"}
WIRE = {kserve: np.dtype(name).newbyteorder("<") for name, kserve in DATATYPES.items()}  # binary data is little-endian
