"""Triton's system shared-memory extension on a real REST server and a real gRPC server sharing one
region namespace, driven by tritonclient.utils.shared_memory and tritonclient's HTTP and gRPC clients:
inputs read from and outputs written to client regions equal a plain ONNX Runtime run; status,
unregister, bounds checks, unknown names and the off switch answer in one line, and a normal client
is answered correctly afterwards."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

grpc = pytest.importorskip("grpc")
tritongrpc = pytest.importorskip("tritonclient.grpc")
import tritonclient.http as tritonhttp  # noqa: E402
import tritonclient.utils.shared_memory as shm  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from temper.artifacts.serving.client_shm import ClientRegions  # noqa: E402
from temper.artifacts.serving.grpc_server import GrpcServer  # noqa: E402
from temper.artifacts.serving.runtime import Runtime  # noqa: E402
from tests.artifacts.servers import MODEL, Served, _expected, _inputs  # noqa: E402

PROTOCOLS = ["http", "grpc"]
X_BYTES, IDS_BYTES, Y_BYTES, TOTAL_BYTES = 2 * 4 * 4, 2 * 3 * 8, 2 * 2 * 4, 2 * 1 * 8  # two rows of each


class Both:
    """The tiny model on REST and gRPC, one Runtime, one ClientRegions (allowed or not)."""

    def __init__(self, tiny: Path, allowed: bool) -> None:
        self.regions = ClientRegions(allowed)
        self.runtime = Runtime(tiny)
        self.rest = Served(self.runtime, regions=self.regions)
        self.grpc = GrpcServer(self.runtime, "127.0.0.1", 0, regions=self.regions)

    def __enter__(self) -> Both:
        self.rest.__enter__()  # its lifespan starts (warms) the runtime
        self.grpc_port = self.grpc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.grpc.stop(grace_s=1)
        self.rest.__exit__(*exc)
        self.regions.close()

    def client(self, protocol: str) -> Any:
        if protocol == "http":
            return tritonhttp.InferenceServerClient(f"127.0.0.1:{self.rest.port}")
        return tritongrpc.InferenceServerClient(f"127.0.0.1:{self.grpc_port}")


# `tiny` (the bundle) and `reference` (plain ONNX Runtime on it) are tests/artifacts/conftest.py's.


@pytest.fixture(scope="module")
def both(tiny: Path) -> Iterator[Both]:
    with Both(tiny, allowed=True) as served:
        yield served
    assert not served.regions  # released at shutdown


@pytest.fixture(scope="module")
def off(tiny: Path) -> Iterator[Both]:
    with Both(tiny, allowed=False) as served:
        yield served


@pytest.fixture
def regions(both: Both) -> Iterator[dict[str, Any]]:
    """An input object (x, then ids at offset X_BYTES) and an output object (y, then total), created by
    tritonclient.utils.shared_memory with unique keys; unregistered from the server and destroyed after."""
    tag = f"{os.getpid()}_{id(object())}"
    handles = {"in": shm.create_shared_memory_region(f"in_{tag}", f"/temper_in_{tag}", X_BYTES + IDS_BYTES),
               "out": shm.create_shared_memory_region(f"out_{tag}", f"/temper_out_{tag}", Y_BYTES + TOTAL_BYTES)}
    yield {"tag": tag, "in": handles["in"], "out": handles["out"],
           "keys": {"in": f"/temper_in_{tag}", "out": f"/temper_out_{tag}"}}
    both.regions.unregister()
    for handle in handles.values():
        shm.destroy_shared_memory_region(handle)


def _module(protocol: str) -> Any:
    return tritonhttp if protocol == "http" else tritongrpc


def _shm_request(protocol: str, name_in: str, name_out: str, in_offset: int = 0, out_bytes: int = Y_BYTES,
                 in_bytes: int = X_BYTES) -> tuple[list, list]:
    """Inputs x and ids from region name_in (x at in_offset), outputs y and total into region name_out."""
    m = _module(protocol)
    x, ids = m.InferInput("x", [2, 4], "FP32"), m.InferInput("ids", [2, 3], "INT64")
    x.set_shared_memory(name_in, in_bytes, offset=in_offset)
    ids.set_shared_memory(name_in, IDS_BYTES, offset=X_BYTES)
    y, total = m.InferRequestedOutput("y"), m.InferRequestedOutput("total")
    y.set_shared_memory(name_out, out_bytes)
    total.set_shared_memory(name_out, TOTAL_BYTES, offset=Y_BYTES)
    return [x, ids], [y, total]


def _plain_infer(client: Any, protocol: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    m = _module(protocol)
    items = []
    for name, array in inputs.items():
        item = m.InferInput(name, list(array.shape), {"float32": "FP32", "int64": "INT64"}[array.dtype.name])
        item.set_data_from_numpy(array)
        items.append(item)
    result = client.infer(MODEL, items)
    return {name: result.as_numpy(name) for name in ("y", "total")}


def _register(client: Any, name: str, key: str, byte_size: int, offset: int = 0) -> None:
    client.register_system_shared_memory(name, key, byte_size, offset=offset)


def _status(client: Any, protocol: str) -> dict[str, dict]:
    """Region name -> {name, key, offset, byte_size} as the server lists them."""
    if protocol == "http":
        return {r["name"]: r for r in client.get_system_shared_memory_status()}
    regions = client.get_system_shared_memory_status(as_json=True).get("regions", {})
    return {name: {k: int(v) if k in ("offset", "byte_size") else v for k, v in ({"offset": 0} | r).items()}
            for name, r in regions.items()}  # protobuf's JSON leaves out an offset of 0


def _held(path: str) -> tuple[int, int]:
    """This process's open descriptors of `path` and its mappings of it."""
    fds = sum(os.path.realpath(f"/proc/self/fd/{fd}") == path for fd in os.listdir("/proc/self/fd"))
    with open("/proc/self/maps") as maps:
        return fds, sum(line.rstrip().endswith(path) for line in maps)


def _refused(protocol: str, call: Any, *args: Any, **kwargs: Any) -> str:
    """The one-line message of a call the server refuses; its status is checked by the caller via the text."""
    with pytest.raises(InferenceServerException) as refused:
        call(*args, **kwargs)
    return str(refused.value)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_inputs_and_outputs_in_client_shared_memory_equal_onnx_runtime(
        both: Both, regions: dict[str, Any], reference: ort.InferenceSession, protocol: str) -> None:
    inputs = _inputs(7)
    shm.set_shared_memory_region(regions["in"], [inputs["x"], inputs["ids"]])
    client = both.client(protocol)
    _register(client, "in", regions["keys"]["in"], X_BYTES + IDS_BYTES)
    _register(client, "out", regions["keys"]["out"], Y_BYTES + TOTAL_BYTES)
    ins, outs = _shm_request(protocol, "in", "out")
    result = client.infer(MODEL, ins, outputs=outs)
    expected = _expected(reference, inputs)
    y = shm.get_contents_as_numpy(regions["out"], np.float32, [2, 2])
    total = shm.get_contents_as_numpy(regions["out"], np.int64, [2, 1], offset=Y_BYTES)
    np.testing.assert_allclose(y, expected["y"], rtol=1e-6)
    np.testing.assert_array_equal(total, expected["total"])
    # the answer lists each output's shape and carries none of them in its body (as Triton: no parameters,
    # which Triton's C++ client, perf_analyzer's, would read as binary data)
    response = result.get_response() if protocol == "http" else result.get_response(as_json=True)
    shapes = [(o["name"], [int(d) for d in o["shape"]]) for o in response["outputs"]]
    assert shapes == [("y", [2, 2]), ("total", [2, 1])], response
    assert all("data" not in o and "parameters" not in o and "contents" not in o for o in response["outputs"]), response
    if protocol == "grpc":
        assert list(result.get_response().raw_output_contents) == [b"", b""], response
    # new input values in the same region: the server reads the region at each request, not a copy
    again = _inputs(8)
    shm.set_shared_memory_region(regions["in"], [again["x"], again["ids"]])
    client.infer(MODEL, ins, outputs=outs)
    np.testing.assert_allclose(shm.get_contents_as_numpy(regions["out"], np.float32, [2, 2]),
                               _expected(reference, again)["y"], rtol=1e-6)
    client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_inputs_in_shared_memory_mix_with_outputs_in_the_answer(
        both: Both, regions: dict[str, Any], reference: ort.InferenceSession, protocol: str) -> None:
    """One input in a region and one in the request; outputs in the answer as usual."""
    inputs = _inputs(9)
    shm.set_shared_memory_region(regions["in"], [inputs["ids"]], offset=X_BYTES)
    client = both.client(protocol)
    _register(client, "in", regions["keys"]["in"], X_BYTES + IDS_BYTES)
    m = _module(protocol)
    ids, x = m.InferInput("ids", [2, 3], "INT64"), m.InferInput("x", [2, 4], "FP32")
    ids.set_shared_memory("in", IDS_BYTES, offset=X_BYTES)
    x.set_data_from_numpy(inputs["x"])
    result = client.infer(MODEL, [ids, x])
    expected = _expected(reference, inputs)
    np.testing.assert_allclose(result.as_numpy("y"), expected["y"], rtol=1e-6)
    np.testing.assert_array_equal(result.as_numpy("total"), expected["total"])
    client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_status_lists_regions_across_protocols_and_unregister_frees_them(
        both: Both, regions: dict[str, Any], protocol: str) -> None:
    client, other = both.client(protocol), both.client("grpc" if protocol == "http" else "http")
    key = regions["keys"]["in"]
    mapped = f"/dev/shm/{key[1:]}"
    clients_own = _held(mapped)  # this process is the client too: its handle's descriptor and mapping
    _register(client, "in", key, IDS_BYTES, offset=X_BYTES)
    _register(client, "out", regions["keys"]["out"], Y_BYTES)
    listed = {"in": {"name": "in", "key": key, "offset": X_BYTES, "byte_size": IDS_BYTES},
              "out": {"name": "out", "key": regions["keys"]["out"], "offset": 0, "byte_size": Y_BYTES}}
    assert _status(client, protocol) == listed
    assert _status(other, "grpc" if protocol == "http" else "http") == listed  # one namespace, as in Triton
    assert _held(mapped) > clients_own
    assert "already" in _refused(protocol, _register, client, "in", key, IDS_BYTES)

    client.unregister_system_shared_memory("in")
    assert set(_status(client, protocol)) == {"out"}
    assert _held(mapped) == clients_own  # the server's descriptor closed and its mapping gone
    ins, _ = _shm_request(protocol, "in", "out")
    assert "no shared memory region 'in' is registered" in _refused(protocol, client.infer, MODEL, ins)
    client.unregister_system_shared_memory()  # every region
    assert _status(client, protocol) == {}
    client.close()
    other.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_out_of_bounds_and_unknown_regions_are_refused_and_the_server_answers_on(
        both: Both, regions: dict[str, Any], reference: ort.InferenceSession, protocol: str) -> None:
    client = both.client(protocol)
    code = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    # registering past the end of the object
    message = _refused(protocol, _register, client, "in", regions["keys"]["in"], X_BYTES + IDS_BYTES, offset=8)
    assert code in message and "is past the end of the object behind key" in message, message
    for key in ("/../../etc/passwd", "/temper_no_such_key_at_all"):
        message = _refused(protocol, _register, client, "bad", key, 16)
        assert code in message and ("not a shared memory key" in message or "cannot open" in message), message
    _register(client, "in", regions["keys"]["in"], X_BYTES + IDS_BYTES)
    _register(client, "out", regions["keys"]["out"], Y_BYTES + TOTAL_BYTES)
    shm.set_shared_memory_region(regions["in"], [np.zeros((2, 4), np.float32), np.zeros((2, 3), np.int64)])
    cases = [
        (_shm_request(protocol, "in", "out", in_offset=IDS_BYTES + 8), "is past the end of region 'in'"),
        (_shm_request(protocol, "nowhere", "out"), "no shared memory region 'nowhere' is registered"),
        (_shm_request(protocol, "in", "elsewhere"), "no shared memory region 'elsewhere' is registered"),
        (_shm_request(protocol, "in", "out", in_bytes=X_BYTES - 4), "does not match its shape and datatype"),
        (_shm_request(protocol, "in", "out", out_bytes=Y_BYTES - 4), "is too small for the output"),
    ]
    before = both.runtime.metrics.snapshot()["execution_count"]
    for (ins, outs), expected_message in cases:
        message = _refused(protocol, client.infer, MODEL, ins, outputs=outs)
        assert code in message and expected_message in message, message
    # only the output that turned out too small was computed: the others were refused before the run
    assert both.runtime.metrics.snapshot()["execution_count"] <= before + 1
    inputs = _inputs(3)
    answered = _plain_infer(client, protocol, inputs)
    np.testing.assert_allclose(answered["y"], _expected(reference, inputs)["y"], rtol=1e-6)
    client.close()


def test_a_region_whose_object_shrank_is_refused_not_a_crash(both: Both, regions: dict[str, Any]) -> None:
    client = both.client("http")
    _register(client, "in", regions["keys"]["in"], X_BYTES + IDS_BYTES)
    _register(client, "out", regions["keys"]["out"], Y_BYTES + TOTAL_BYTES)
    os.truncate(f"/dev/shm/{regions['keys']['in'][1:]}", 0)  # reading the mapped pages now would be SIGBUS
    ins, outs = _shm_request("http", "in", "out")
    message = _refused("http", client.infer, MODEL, ins, outputs=outs)
    assert "400" in message and "shrank to 0 bytes" in message, message
    client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_client_shared_memory_is_refused_while_off(off: Both, tmp_path: Path, protocol: str) -> None:
    client = off.client(protocol)
    handle = shm.create_shared_memory_region("off", f"/temper_off_{os.getpid()}", 64)
    try:
        message = _refused(protocol, _register, client, "off", f"/temper_off_{os.getpid()}", 64)
        assert ("403" if protocol == "http" else "PERMISSION_DENIED") in message, message
        assert "--allow-client-shm" in message, message
        assert "--allow-client-shm" in _refused(protocol, client.get_system_shared_memory_status)
        ins, outs = _shm_request(protocol, "off", "off")
        message = _refused(protocol, client.infer, MODEL, ins, outputs=outs)
        assert ("400" if protocol == "http" else "INVALID_ARGUMENT") in message, message
        assert "client shared memory is off" in message, message
        assert not off.regions
    finally:
        shm.destroy_shared_memory_region(handle)
    client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cuda_shared_memory_lists_none_and_refuses_to_register(both: Both, protocol: str) -> None:
    client = both.client(protocol)
    status = client.get_cuda_shared_memory_status()
    assert (status == []) if protocol == "http" else not status.regions
    client.unregister_cuda_shared_memory()  # what perf_analyzer does first: nothing to release, no error
    with pytest.raises(InferenceServerException) as refused:
        client.register_cuda_shared_memory("gpu", base64.b64encode(b"handle"), 0, 16)
    assert "CUDA shared memory is not supported" in str(refused.value)
    client.close()
