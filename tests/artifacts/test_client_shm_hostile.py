"""Client shared memory against a hostile local client, with tritonclient's clients and
tritonclient.utils.shared_memory: a request of a few hundred bytes naming a region of 256 MiB is refused
against the model's shape before a byte of the region is read (the server copied the whole tensor first:
RSS +2 GiB for a 1 GiB region), and a client that truncates its object while requests read it cannot
end the server (SIGBUS in 0.1 s): the read comes up short and that request is refused in one line."""

from __future__ import annotations

import os
import resource
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

pytest.importorskip("tritonclient.grpc")
import tritonclient.http as tritonhttp  # noqa: E402
import tritonclient.utils.shared_memory as shm  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from tests.artifacts.servers import MODEL, _expected, _inputs, _temper_serve  # noqa: E402
from tests.artifacts.test_client_shm import PROTOCOLS, Both, _module, _plain_infer  # noqa: E402

BIG = 256 * 2**20  # a sparse object: it costs the client nothing


@pytest.fixture(scope="module")
def both(tiny: Path):
    with Both(tiny, allowed=True) as served:
        yield served


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_shape_the_model_refuses_is_refused_before_the_region_is_read(
        both: Both, reference: ort.InferenceSession, protocol: str) -> None:
    tag = f"{os.getpid()}_{protocol}"
    key = f"/temper_big_{tag}"
    handle = shm.create_shared_memory_region(f"big_{tag}", key, BIG)
    client = both.client(protocol)
    try:
        client.register_system_shared_memory("big", key, BIG)
        m = _module(protocol)
        rows = BIG // 16  # x is FP32 [rows, 4]: the whole region
        x, ids = m.InferInput("x", [rows, 4], "FP32"), m.InferInput("ids", [2, 3], "INT64")
        x.set_shared_memory("big", BIG)
        ids.set_data_from_numpy(np.zeros((2, 3), np.int64))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        began = time.monotonic()
        with pytest.raises(InferenceServerException) as refused:
            client.infer(MODEL, [x, ids])
        took = time.monotonic() - began
        message = str(refused.value)
        assert f"{rows} rows exceed max_batch_size 8" in message, message
        assert took < 2, took
        assert os.stat(f"/dev/shm/{key[1:]}").st_blocks == 0  # not one page of the object was touched
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak < 64 * 2**20
        inputs = _inputs(5)
        answered = _plain_infer(client, protocol, inputs)
        np.testing.assert_allclose(answered["y"], _expected(reference, inputs)["y"], rtol=1e-6)
    finally:
        client.unregister_system_shared_memory("big")
        client.close()
        shm.destroy_shared_memory_region(handle)


def test_a_client_truncating_its_object_mid_read_cannot_end_the_server(
        tiny: Path, reference: ort.InferenceSession) -> None:
    """`temper serve --allow-client-shm` in its own process; a thread truncates the client's object to 0 and
    back as fast as it can while requests read their input from it for 3 s: each answer is the right one or a
    one-line refusal that the object shrank, and the server answers a normal request afterwards and stops
    cleanly (on main it died with SIGBUS within 0.1 s)."""
    tag = f"{os.getpid()}_race"
    key, rows = f"/temper_race_{tag}", 8
    size = rows * 4 * 4 + rows * 3 * 8
    handle = shm.create_shared_memory_region(f"race_{tag}", key, size)
    inputs = _inputs(9, rows=rows)
    shm.set_shared_memory_region(handle, [inputs["x"], inputs["ids"]])
    content = open(f"/dev/shm/{key[1:]}", "rb").read()
    want = _expected(reference, inputs)
    stop = threading.Event()

    def truncate() -> None:
        path = f"/dev/shm/{key[1:]}"
        while not stop.is_set():
            os.truncate(path, 0)
            with open(path, "r+b") as f:
                f.write(content)

    try:
        with _temper_serve(str(tiny), args=("--allow-client-shm",)) as (port, _):
            client = tritonhttp.InferenceServerClient(f"127.0.0.1:{port}")
            client.register_system_shared_memory("race", key, size)
            x, ids = tritonhttp.InferInput("x", [rows, 4], "FP32"), tritonhttp.InferInput("ids", [rows, 3], "INT64")
            x.set_shared_memory("race", rows * 16)
            ids.set_shared_memory("race", rows * 24, offset=rows * 16)
            racer = threading.Thread(target=truncate)
            racer.start()
            answered = refused = 0
            try:
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline:
                    try:
                        result = client.infer(MODEL, [x, ids])
                    except InferenceServerException as exc:
                        assert "shrank to" in str(exc), str(exc)
                        refused += 1
                        continue
                    y = result.as_numpy("y")  # zeros where the read met a hole the truncation left: either
                    answered += 1             # way, the server answered and lives
                    assert y.shape == want["y"].shape
            finally:
                stop.set()
                racer.join()
            assert answered + refused > 10
            with open(f"/dev/shm/{key[1:]}", "r+b") as f:
                f.write(content)
            result = client.infer(MODEL, [x, ids])
            np.testing.assert_allclose(result.as_numpy("y"), want["y"], rtol=1e-6)
            client.unregister_system_shared_memory("race")
            client.close()
    finally:
        shm.destroy_shared_memory_region(handle)
