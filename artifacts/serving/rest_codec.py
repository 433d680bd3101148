"""Request bodies to input arrays and output arrays to response bodies, for the REST server.

The wire forms are KServe v2 JSON and Triton's binary tensor data extension (a JSON header of
Inference-Header-Content-Length bytes, then raw little-endian tensors), which keeps JSON down to
a short header for clients that care about speed. Decoding is pure (bytes in, arrays out), apart
from the event loop, so the server can run it on its worker thread for large bodies.

Bodies. JSON is decoded by orjson straight into numpy arrays; nothing returned keeps the parsed
JSON alive, so its Python lists are freed before the request queues. `Content-Encoding: gzip` or
`deflate` bodies are inflated up to the body limit.

Non-finite numbers: JSON (RFC 8259) has no NaN or Infinity. JSON float inputs that become them (null,
a number past FP32's range) are refused with 400; binary inputs are passed to the model as they are,
as Triton does (perf_analyzer's random data holds NaN bit patterns). An output
holding them cannot be written as JSON: the request fails with 500 saying so, unless it asked for
that output as binary data, which carries IEEE floats as they are.
"""

from __future__ import annotations

import math
import zlib
from typing import Any, NamedTuple

import numpy as np
import orjson

from temper.artifacts.core.errors import RequestError
from temper.artifacts.formats.bundle import ServingConfig, TensorSpec
from temper.artifacts.serving.client_shm import ClientRegions, ShmError, Target
from temper.artifacts.serving.protocol import DATATYPES, VERSION, WIRE
from temper.artifacts.serving.request_params import check_output, queue_timeout_s

BINARY_HEADER = b"inference-header-content-length"
JSON_TYPE = (b"content-type", b"application/json")
INFLATE = {b"gzip": 32 + 15, b"x-gzip": 32 + 15, b"deflate": 32 + 15}  # zlib wbits: gzip or zlib header, detected

Response = tuple[int, list[tuple[bytes, bytes]], bytes]  # status, headers, body


class Wanted(NamedTuple):
    """An output to answer with: as binary data, as JSON, or written to a client's shared memory region."""

    name: str
    binary: bool
    shm: Target | None = None

    @property
    def json(self) -> bool:
        return not self.binary and self.shm is None


# request id, inputs, wanted outputs, queue timeout in seconds (None: the bundle's)
Decoded = tuple[str | None, dict[str, np.ndarray], list[Wanted], float | None]


class HttpError(Exception):
    """A request the server answers with `status` and the message, before or after the Runtime."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class RestCodec:
    """One model's inference requests and responses in KServe v2 JSON and binary tensor data.

    Bad requests raise RequestError (400); bodies over `max_body_bytes` once inflated and unknown
    encodings raise HttpError (413, 415); JSON outputs holding NaN or Inf raise HttpError (500), an
    output that no longer fits its shared memory region HttpError (400). Inputs and outputs in shared
    memory go through `regions` (none registered and refused when None).
    """

    def __init__(self, config: ServingConfig, max_body_bytes: int, regions: ClientRegions | None = None,
                 version: str = VERSION) -> None:
        self.name, self.version = config.name, version
        self.regions = regions if regions is not None else ClientRegions()
        self.max_body_bytes = max_body_bytes
        self.config, self.max_rows = config, config.max_rows()
        self.inputs = {spec.name: spec for spec in config.inputs}
        self.outputs = [spec.name for spec in config.outputs]
        self.timeout_s = config.timeout_s

    def decode(self, body: bytes | bytearray, headers: dict[bytes, bytes]) -> Decoded:
        """The request's id, input arrays and wanted outputs; on the worker thread for large bodies.
        Returns no part of the parsed JSON, so its Python lists are freed before the request queues."""
        encoding = headers.get(b"content-encoding", b"identity").strip().lower()
        if encoding != b"identity":
            body = _inflate(body, encoding, self.max_body_bytes)
        request, binary = _split(body, headers.get(BINARY_HEADER))
        request_id = request.get("id")
        if request_id is not None and not isinstance(request_id, str):
            raise RequestError('"id" must be a string')
        timeout_s = queue_timeout_s(request.get("parameters"), self.timeout_s)
        return request_id, self._decode_inputs(request, binary), self._wanted_outputs(request), timeout_s

    def _decode_inputs(self, request: dict, binary: memoryview) -> dict[str, np.ndarray]:
        items = request.get("inputs")
        if not isinstance(items, list):
            raise RequestError('the request needs an "inputs" list')
        inputs: dict[str, np.ndarray] = {}
        offset = 0
        for item in items:
            if not isinstance(item, dict):
                raise RequestError("each input must be an object with name, shape, datatype and data")
            name = item.get("name")
            spec = self.inputs.get(name) if isinstance(name, str) else None
            if spec is None or not isinstance(name, str):
                raise RequestError(f"unknown input {name!r}; the model takes {', '.join(self.inputs)}")
            if name in inputs:
                raise RequestError(f"input '{name}' is given twice")
            target = self.regions.target(f"input '{name}'", item.get("parameters"))
            datatype, shape = item.get("datatype"), item.get("shape")
            if datatype != DATATYPES[spec.dtype]:
                raise RequestError(f"input '{name}': datatype {datatype!r} does not match the model's "
                                   f"{DATATYPES[spec.dtype]}")
            if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
                raise RequestError(f"input '{name}': shape must be a list of non-negative integers, got {shape!r}")
            dtype, count = WIRE[datatype], math.prod(shape)
            size = _binary_size(item)
            if target is not None:
                if size is not None or "data" in item:
                    raise RequestError(f"input '{name}' names a shared memory region and also carries data; "
                                       "send one or the other")
                self.config.check_shape(name, shape, self.max_rows)  # before a byte of the region is read
                array = self.regions.read(f"input '{name}'", target, dtype, count)
            elif size is None:
                if "data" not in item:
                    raise RequestError(f"input '{name}' has neither data nor parameters.binary_data_size")
                try:
                    array = _json_data(item["data"], dtype)
                except (ValueError, TypeError, OverflowError) as exc:
                    raise RequestError(f"input '{name}': data is not {datatype}: {exc}") from None
                if array.size != count:
                    raise RequestError(f"input '{name}': {array.size} data elements for shape {shape} "
                                       f"({count} elements)")
                if array.dtype.kind == "f" and not np.isfinite(array).all():  # null, or past the dtype's range
                    raise RequestError(f"input '{name}' holds NaN or infinite values (null, or a number past "
                                       f"{datatype}'s range); send such values as binary data")
            else:
                if size != count * dtype.itemsize:
                    raise RequestError(f"input '{name}': binary_data_size {size} for shape {shape} of {datatype} "
                                       f"({count * dtype.itemsize} bytes)")
                if offset + size > len(binary):
                    raise RequestError(f"input '{name}': the body ends {offset + size - len(binary)} bytes before "
                                       "its binary data does")
                array = np.frombuffer(binary, dtype=dtype, count=count, offset=offset)
                offset += size
            inputs[name] = array.reshape(shape)
        if offset != len(binary):
            raise RequestError(f"{len(binary) - offset} bytes of binary data follow the JSON that no input claims")
        return inputs

    def _wanted_outputs(self, request: dict) -> list[Wanted]:
        """The outputs in the order the response lists them; a shared memory target checked now, so
        that a request which cannot be answered is not computed."""
        default = _flag(request.get("parameters"), "binary_data_output", False, "parameters")
        asked = request.get("outputs")
        if asked is None:
            return [Wanted(name, default) for name in self.outputs]
        if not isinstance(asked, list):
            raise RequestError('"outputs" must be a list of objects with a name')
        wanted = []
        for index, item in enumerate(asked):
            name = item.get("name") if isinstance(item, dict) else None
            if name not in self.outputs:
                raise RequestError(f"unknown output {name!r}; the model gives {', '.join(self.outputs)}")
            params = item.get("parameters")
            check_output(name, params)
            target = self.regions.target(f"output '{name}'", params)
            if target is not None:
                self.regions.check(f"output '{name}'", target)
            wanted.append(Wanted(name, _flag(params, "binary_data", default, f"outputs[{index}].parameters"), target))
        return wanted

    def encode(self, request_id: str | None, results: dict[str, np.ndarray],
               wanted: list[Wanted], parameters: dict[str, str] | None = None) -> Response:
        """The 200 response carrying `wanted` of `results`: JSON, or a JSON header and binary data
        when any output is asked for as binary; outputs asked for in shared memory are written there
        and listed without data."""
        outputs, blobs = [], []
        for name, as_binary, target in wanted:
            array = results[name]
            entry: dict[str, Any] = {"name": name, "datatype": DATATYPES[array.dtype.name], "shape": list(array.shape)}
            if target is not None:
                try:  # listed without data or parameters, as Triton does (its C++ client reads parameters
                    self.regions.write(f"output '{name}'", target, array)  # as binary_data_size)
                except ShmError as exc:  # unregistered meanwhile, or the output is larger than the space given
                    raise HttpError(400, str(exc)) from None
            elif as_binary:
                blob = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
                entry["parameters"] = {"binary_data_size": len(blob)}
                blobs.append(blob)
            elif array.dtype.kind == "f" and not np.isfinite(array).all():
                raise HttpError(500, f"output '{name}' holds NaN or infinite values, which JSON cannot carry; "
                                     "ask for it as binary data to receive them")
            else:
                entry["data"] = array.ravel()  # orjson writes a contiguous array without a Python list
            outputs.append(entry)
        reply: dict[str, Any] = {"model_name": self.name, "model_version": self.version, "outputs": outputs}
        if request_id is not None:
            reply["id"] = request_id
        if parameters:
            reply["parameters"] = parameters
        head = encode_json(reply)
        if not blobs:
            return 200, [JSON_TYPE], head
        headers = [(b"content-type", b"application/octet-stream"), (BINARY_HEADER, str(len(head)).encode())]
        return 200, headers, b"".join([head, *blobs])


def tensor_metadata(specs: list[TensorSpec]) -> list[dict[str, Any]]:
    """Tensors as model metadata lists them: name, KServe datatype, shape (-1 = any)."""
    return [{"name": s.name, "datatype": DATATYPES[s.dtype], "shape": s.shape} for s in specs]


def encode_json(value: Any) -> bytes:
    """JSON bytes, numpy arrays written directly by orjson."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


def error_response(status: int, message: str) -> Response:
    """`status` with the body {"error": message}, the form every failure is answered in."""
    return status, [JSON_TYPE], encode_json({"error": message})


def _inflate(body: bytes | bytearray, encoding: bytes, limit: int) -> bytes:
    """A gzip or deflate body inflated, refused (413) as soon as it passes `limit` bytes."""
    wbits = INFLATE.get(encoding)
    if wbits is None:
        raise HttpError(415, f"Content-Encoding {encoding.decode(errors='replace')!r} is not supported; "
                             "send gzip, deflate or identity")
    inflater = zlib.decompressobj(wbits)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise RequestError(f"corrupt {encoding.decode()} body: {exc}") from None
    if len(data) > limit:
        raise HttpError(413, f"request body inflates to more than the limit of {limit:,} bytes")
    if not inflater.eof:
        raise RequestError(f"truncated {encoding.decode()} body")
    return data


def _split(body: bytes | bytearray, header_length: bytes | None) -> tuple[dict, memoryview]:
    """The JSON request header and the binary tensor data after it (Triton's binary data extension)."""
    view = memoryview(body)
    end = len(body)
    if header_length is not None:  # digits no longer than the body's length has, before int() (which refuses 4,301)
        digits = header_length.lstrip(b"0") or b"0"  # leading zeros count toward int()'s limit: a valid length's too
        if not header_length.isdigit() or len(digits) > len(str(len(body))) or int(digits) > len(body):
            shown = header_length[:24].decode(errors="replace") + ("..." if len(header_length) > 24 else "")
            raise RequestError(f"Inference-Header-Content-Length {shown!r} ({len(header_length):,} characters) "
                               f"is not a length within the {len(body)}-byte body")
        end = int(digits)
    try:
        request = orjson.loads(view[:end])
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"malformed JSON: {exc}") from None
    if not isinstance(request, dict):
        raise RequestError("the request must be a JSON object")
    return request, view[end:]


def _flag(params: object, key: str, default: bool, where: str) -> bool:
    """A true/false request parameter. Only a JSON boolean counts, as in Triton: `"false"` is a
    non-empty string, which Python's bool() would read as true."""
    if not isinstance(params, dict) or key not in params:
        return default
    value = params[key]
    if type(value) is not bool:
        raise RequestError(f"{where}.{key} must be true or false (a JSON boolean), got {value!r}")
    return value


def _binary_size(item: dict) -> int | None:
    params = item.get("parameters")
    if not isinstance(params, dict) or "binary_data_size" not in params:
        return None
    size = params["binary_data_size"]
    if type(size) is not int or size < 0:
        raise RequestError(f"input '{item['name']}': binary_data_size must be a non-negative integer, got {size!r}")
    return size


_TAKES = {"f": "iuf", "i": "iu", "u": "iu", "b": "b"}  # what JSON values each datatype's kind takes, as Triton
_JSON = {"b": "true/false", "U": "strings", "S": "strings", "f": "fractional numbers", "i": "integers",
         "u": "integers", "O": "values of mixed kinds"}


def _json_data(data: object, dtype: np.dtype) -> np.ndarray:
    """JSON `data` as `dtype`, refused (ValueError) unless its values are of the datatype's kind: numbers for
    FP32 (not true/false, not "0.5"), integers in range for the integer types, true/false for BOOL."""
    given = np.asarray(data)
    if given.dtype.kind == "O" and dtype.kind == "f" and all(v is None or type(v) in (int, float) for v in given.flat):
        given = given.astype(np.float64)  # null among numbers: NaN, refused by the caller as JSON cannot carry it
    if given.size and given.dtype.kind not in _TAKES[dtype.kind]:
        raise ValueError(f"JSON {_JSON.get(given.dtype.kind, given.dtype.name)} given")
    if given.size and dtype.kind in "iu":
        info = np.iinfo(dtype)
        if given.min() < info.min or given.max() > info.max:
            raise ValueError(f"a value past its range [{info.min}, {info.max}]")
    with np.errstate(over="ignore"):  # a float past its dtype's range: Inf, refused by the caller
        return given.astype(dtype, copy=False)
