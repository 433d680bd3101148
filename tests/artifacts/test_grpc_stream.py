"""ModelStreamInfer, Triton's bidirectional stream (what perf_analyzer --streaming uses), driven by tritonclient.grpc's
start_stream/async_stream_infer and by the raw stub: each request answered on the stream, through the batcher as
ModelInfer's are, errors as `error_message` with the stream going on, and a bound on the streams open at once."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

grpc = pytest.importorskip("grpc")
tritongrpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import service_pb2 as pb  # noqa: E402

from temper.artifacts.serving.runtime import Runtime  # noqa: E402
from tests.artifacts import grpc_servers  # noqa: E402
from tests.artifacts.grpc_servers import GrpcServed, _correct, _triton_inputs, _typed_request  # noqa: E402
from tests.artifacts.servers import MODEL, _bundle, _expected, _inputs, _tiny_model  # noqa: E402

tiny, served = grpc_servers.tiny, grpc_servers.served


@pytest.fixture(scope="module")
def reference(tiny: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(tiny / "model.onnx"), providers=["CPUExecutionProvider"])


def _stream(served: GrpcServed) -> tuple[tritongrpc.InferenceServerClient, queue.Queue]:
    """A tritonclient with a stream started; its answers arrive on the queue as (result, error)."""
    c = served.client()
    answers: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    return c, answers


def test_every_request_is_answered_on_the_stream_in_batches(served: GrpcServed, reference: ort.InferenceSession):
    """64 requests of 1-4 rows sent without waiting on one stream: each answer is its own request's (by id), as ONNX
    Runtime computes it, and the batcher joined them (fewer executions than requests)."""
    m = served.runtime.metrics.snapshot()
    before = m["request_success"], m["execution_count"]
    c, answers = _stream(served)
    sent = {str(i): _inputs(7000 + i, rows=1 + i % 4) for i in range(64)}
    for request_id, inputs in sent.items():
        c.async_stream_infer(MODEL, _triton_inputs(inputs), request_id=request_id)
    got = {}
    for _ in sent:
        result, error = answers.get(timeout=60)
        assert error is None, error
        got[result.get_response().id] = result
    c.stop_stream()
    c.close()
    assert got.keys() == sent.keys()
    assert all(_correct(got[i], _expected(reference, inputs), atol=1e-5) for i, inputs in sent.items())
    m = served.runtime.metrics.snapshot()
    requests, executions = m["request_success"] - before[0], m["execution_count"] - before[1]
    assert requests == 64 and executions < requests, (requests, executions)


def test_a_failed_request_answers_error_message_and_the_stream_goes_on(served: GrpcServed,
                                                                      reference: ort.InferenceSession):
    """A request with an unknown input, then one for an unknown model, then a good one, on one stream: two
    error_messages naming what is wrong, then the good answer; the failed ones count as failures."""
    failed = served.runtime.metrics.snapshot()["request_failure"]
    good = _inputs(11, rows=2)
    requests = [_typed_request(good, id="0"), _typed_request(good, id="1", model_name="nobody"),
                _typed_request(good, id="2")]
    requests[0].inputs[1].name = "nope"
    answers = list(served.stub.ModelStreamInfer(iter(requests), timeout=60))
    assert [a.infer_response.id for a in answers] == ["0", "1", "2"]
    assert "unknown input 'nope'" in answers[0].error_message, answers[0]
    assert "nobody" in answers[1].error_message, answers[1]
    assert answers[2].error_message == "" and len(answers[2].infer_response.outputs) == 2
    want = _expected(reference, good)["y"]
    got = np.frombuffer(answers[2].infer_response.raw_output_contents[0], dtype=np.float32).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert served.runtime.metrics.snapshot()["request_failure"] == failed + 1  # the unknown input; no model: none


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServed]:
    """A model holding 2 requests (queue 1, batch 1): 10 RPCs in flight, so 5 streams at once."""
    root = tmp_path_factory.mktemp("small")
    folder = _bundle(root / "bundle", _tiny_model(root / "tiny.onnx"), MODEL, max_batch_size=1, max_queue=1)
    with GrpcServed(Runtime(folder)) as s:
        yield s


class _Held:
    """A raw stream whose requests the test sends one at a time (the stream stays open until close())."""

    def __init__(self, served: GrpcServed) -> None:
        self.requests: queue.Queue = queue.Queue()
        self.answers = served.stub.ModelStreamInfer(iter(self.requests.get, None), timeout=60)

    def ask(self, request_id: str) -> pb.ModelStreamInferResponse:
        self.requests.put(_typed_request(_inputs(3, rows=1), id=request_id))
        return next(self.answers)

    def close(self) -> None:
        self.requests.put(None)
        assert list(self.answers) == []


def _open(small: GrpcServed) -> _Held:
    """A stream the server holds open (a refused one holds no place: retried until a place is free, up to 5 s)."""
    for _ in range(100):
        held = _Held(small)
        try:
            assert held.ask("open").error_message == ""
            return held
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
            threading.Event().wait(0.05)
    raise AssertionError("no stream's place came free")


def test_streams_past_the_bound_are_refused_and_a_closed_one_frees_its_place(small: GrpcServed):
    held = [_open(small) for _ in range(5)]
    extra = _Held(small)
    with pytest.raises(grpc.RpcError) as refused:
        extra.ask("x")
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
    assert "5 ModelStreamInfer streams are open already" in refused.value.details(), refused.value
    held.pop().close()  # a stream the client closes frees its place
    held.append(_open(small))
    held.pop().answers.cancel()  # so does a client that goes away
    held.append(_open(small))
    assert all(h.ask("again").error_message == "" for h in held)  # the others still answer
    for h in held:
        h.close()
