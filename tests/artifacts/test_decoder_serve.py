"""`temper serve` on a decoder run's output (a tiny random Llama through `temper run`), in a real process: Triton's
generate extension answers what the greedy loop gives when run directly on the same folder, token for token;
generate_stream's events add up to it; concurrent clients are each answered right; bad requests are one-line
400s; /metrics has time to first token, tokens/s and the request counts. And the admission rule in-process: one
sequence per instance, a full queue refused."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from temper.artifacts.core.errors import Overloaded
from temper.artifacts.engines.decoder_session import DecoderSession
from tests.artifacts.servers import Client, _families, _temper_serve
from tests.helpers import REPO
from tests.pipeline.decoders.tiny import tiny_llama, write_recipe

pytestmark = pytest.mark.slow
PROMPTS = ["the movie was", "a long and winding", "café ☕ crème", "x", "what is it about", "one more prompt here",
           "Numbers 1 2 3", "the end"]


@pytest.fixture(scope="module")
def output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("decoder-serve")
    recipe = write_recipe(folder / "recipe.yaml", tiny_llama(folder / "hf"), candidates={
        "q8": {"weights": {"method": "matmul-nbits", "bits": 8, "block_size": 32}}})
    code = "import sys; from temper.pipeline.cli import main; sys.argv[0] = 'temper'; main()"
    done = subprocess.run([sys.executable, "-c", code, "run", str(recipe), "--output", str(folder / "out")],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return folder / "out"


def _expected(folder: Path, text: str, max_tokens: int) -> str:
    return _greedy(folder, text, max_tokens)[0]


def _greedy(folder: Path, text: str, max_tokens: int) -> tuple[str, int]:
    """Greedy decoding written out here on the model's own session (prefill, then one token per call): the text
    and the number of tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    session = DecoderSession(folder)
    logits, past = session.forward(np.asarray([tokenizer.encode(text, add_special_tokens=False).ids]),
                                   session.empty_cache())
    tokens: list[int] = []
    while len(tokens) < max_tokens:
        tokens.append(int(np.argmax(logits[0, -1])))
        if tokens[-1] in session.layout.eos:
            break
        logits, past = session.forward(np.asarray([[tokens[-1]]]), past)
    return tokenizer.decode(tokens, skip_special_tokens=True), len(tokens)


def _generate(client: Client, text: str, max_tokens: int, model: str = "tiny") -> dict:
    status, headers, body = client.call("POST", f"/v2/models/{model}/generate", json.dumps(
        {"text_input": text, "parameters": {"max_tokens": max_tokens}}).encode())
    assert status == 200 and headers["content-type"] == "application/json", body
    return json.loads(body)


def _stream(client: Client, text: str, max_tokens: int) -> list[dict]:
    status, headers, body = client.call("POST", "/v2/models/tiny/generate_stream", json.dumps(
        {"text_input": text, "parameters": {"max_tokens": max_tokens}}).encode())
    assert status == 200 and headers["content-type"].startswith("text/event-stream"), body
    events = body.decode().split("\n\n")
    assert events[-1] == ""
    assert all(event.startswith("data: ") for event in events[:-1]), body
    return [json.loads(event[len("data: "):]) for event in events[:-1]]


def test_generate_and_stream_answer_the_greedy_loop_of_the_selected_model(output: Path) -> None:
    report = json.loads((output / "report.json").read_text())
    selected = output / report["selected"]
    with _temper_serve(str(output)) as (port, printed):
        client = Client(port)
        answer = _generate(client, PROMPTS[0], 24)
        assert answer == {"model_name": "tiny", "model_version": "1",
                          "text_output": _expected(selected, PROMPTS[0], 24)}
        counts = []
        for text in PROMPTS[1:4]:
            expected = _expected(selected, text, 12)
            assert _generate(client, text, 12)["text_output"] == expected
            events = _stream(client, text, 12)
            assert {e["model_name"] for e in events} == {"tiny"}
            assert "".join(e["text_output"] for e in events) == expected
            counts.append(len(events))
        assert max(counts) > 1  # streamed piece by piece, not in one event
        status, _, body = client.call("POST", "/v2/models/tiny/versions/1/generate", json.dumps(
            {"text_input": PROMPTS[0], "max_tokens": 5}).encode())  # max_tokens as an input, as TensorRT-LLM's take it
        assert status == 200 and json.loads(body)["text_output"] == _expected(selected, PROMPTS[0], 5)
        status, _, body = client.call("GET", "/v2/models/tiny")
        assert status == 200 and json.loads(body)["outputs"][0]["name"] == "text_output"
        assert client.call("GET", "/v2/models/tiny/ready")[0] == 200
        assert "generate" in json.loads(client.call("GET", "/v2")[2])["extensions"]
        assert client.call("GET", "/v2/models/other/generate")[0] == 404
        client.close()
    assert f"({report['selected']}, the run's selection)" in printed["stdout"]


def test_eight_concurrent_clients_each_get_their_own_answer(output: Path) -> None:
    greedy = {text: _greedy(output / "q8", text, 16) for text in PROMPTS}
    expected = {text: found[0] for text, found in greedy.items()}
    answers: dict[str, list[str]] = {text: [] for text in PROMPTS}

    def ask(port: int, text: str) -> None:
        client = Client(port)
        for _ in range(3):
            answers[text].append(_generate(client, text, 16)["text_output"])
        client.close()

    with _temper_serve(str(output / "q8"), args=("--instances", "2")) as (port, printed):
        threads = [threading.Thread(target=ask, args=(port, text)) for text in PROMPTS]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        client = Client(port)
        families = _families(client)
        client.close()
    assert answers == {text: [expected[text]] * 3 for text in PROMPTS}
    assert "tiny (q8)" in printed["stdout"] and "2 sequence(s) at a time" in printed["stdout"]
    requests = {s.labels["outcome"]: s.value for s in families["temper_generate_requests"].samples
                if s.name == "temper_generate_requests_total"}
    assert requests == {"success": 24.0}
    ttft = {s.name: s.value for s in families["temper_time_to_first_token_seconds"].samples}
    assert ttft["temper_time_to_first_token_seconds_count"] == 24 and ttft["temper_time_to_first_token_seconds_sum"] > 0
    rate = {s.name: s.value for s in families["temper_decode_tokens_per_second"].samples}
    assert rate["temper_decode_tokens_per_second_count"] == 3 * sum(n > 1 for _, n in greedy.values())
    tokens = [s.value for s in families["temper_generated_tokens"].samples if s.name.endswith("_total")]
    assert tokens == [3 * sum(n for _, n in greedy.values())]


def test_bad_requests_are_one_line_400s_and_counted(output: Path) -> None:
    bad = {b"not json": "not JSON", b'{"parameters": {"max_tokens": 4}}': "text_input",
           b'{"text_input": "hi", "parameters": {"max_tokens": 0}}': "positive integer",
           b'{"text_input": "hi", "parameters": {"max_tokens": "4"}}': "positive integer",
           b'{"text_input": "hi", "parameters": {"max_tokens": true}}': "positive integer",
           b'{"text_input": "hi", "parameters": {"max_tokens": 4000}}': "context of 256 tokens",
           b'{"text_input": "hi", "temperature": 1}': "unknown field",
           b'{"text_input": "hi", "parameters": {"temperature": 0.7}}': "unknown parameter",
           b'{"text_input": "hi", "max_tokens": 2, "parameters": {"max_tokens": 2}}': "given twice"}
    with _temper_serve(str(output)) as (port, _):
        client = Client(port)
        for body, says in bad.items():
            for route in ("generate", "generate_stream"):
                status, _, answer = client.call("POST", f"/v2/models/tiny/{route}", body)
                error = json.loads(answer)["error"]
                assert status == 400 and says in error and "\n" not in error, (body, answer)
        assert client.call("GET", "/v2/models/tiny/generate")[0] == 405
        families = _families(client)
        client.close()
    requests = {s.labels["outcome"]: s.value for s in families["temper_generate_requests"].samples
                if s.name == "temper_generate_requests_total"}
    assert requests == {"bad_request": 2.0 * len(bad)}


def test_flags_a_decoder_does_not_take_and_a_folder_not_of_the_run_are_refused(output: Path, tmp_path: Path) -> None:
    code = "import sys; from temper.pipeline.cli import main; sys.argv[0] = 'temper'; main()"
    done = subprocess.run([sys.executable, "-c", code, "serve", str(output), "--grpc-port", "18999"], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 2 and "--grpc-port" in done.stderr and "decoder" in done.stderr, done.stderr
    stray = output / "stray"
    stray.mkdir(exist_ok=True)
    (stray / "genai_config.json").write_text((output / "q8" / "genai_config.json").read_text())
    try:
        done = subprocess.run([sys.executable, "-c", code, "serve", str(stray)], cwd=REPO, capture_output=True,
                              text=True)
    finally:
        (stray / "genai_config.json").unlink()
        stray.rmdir()
    assert done.returncode == 2 and "not the baseline or a candidate" in done.stderr, done.stderr


def test_one_sequence_per_instance_and_a_full_queue_is_refused(output: Path) -> None:
    from temper.artifacts.serving.decoder_runtime import DecoderModel

    model = DecoderModel(output / "q8", "tiny", instances=1, max_queue=1)
    model.warm_up()

    async def scenario() -> tuple[str, str, str]:
        first = model.stream(model.request({"text_input": "hold it", "parameters": {"max_tokens": 8}}))
        held = await anext(first)  # decoding: the one instance is taken
        waiting = asyncio.create_task(_collect(model.stream(model.request({"text_input": "next"}))))
        await asyncio.sleep(0.05)
        assert model.admitted == 2 and not waiting.done()  # queued behind the first, not decoding beside it
        with pytest.raises(Overloaded):
            await anext(model.stream(model.request({"text_input": "one too many"})))
        rest = "".join([piece async for piece in first])
        return held + rest, await waiting, _expected(output / "q8", "next", 16)

    first, second, expected = asyncio.run(scenario())
    assert first == _expected(output / "q8", "hold it", 8) and second == expected
    assert model.admitted == 0


async def _collect(stream: object) -> str:
    return "".join([piece async for piece in stream])  # type: ignore[attr-defined]


def test_a_client_that_goes_away_mid_stream_stops_its_generation(output: Path) -> None:
    selected = output / json.loads((output / "report.json").read_text())["selected"]
    assert _greedy(selected, "a", 250)[1] == 250  # no end-of-sequence token before: only a stop ends it early
    body = json.dumps({"text_input": "a", "parameters": {"max_tokens": 250}}).encode()
    with _temper_serve(str(output)) as (port, _):
        with socket.create_connection(("127.0.0.1", port)) as raw:
            raw.sendall(b"POST /v2/models/tiny/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                        b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            assert raw.recv(4096).startswith(b"HTTP/1.1 200")  # the head and a first event or so: then gone
        client = Client(port)
        deadline = time.monotonic() + 30
        while True:  # the watcher notices, the decode thread stops at its next token, then the request is counted
            families = _families(client)
            outcomes = {s.labels["outcome"]: s.value for s in families["temper_generate_requests"].samples
                        if s.name == "temper_generate_requests_total"}
            if outcomes or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert _generate(client, "after", 4)["text_output"] == _expected(selected, "after", 4)
        client.close()
    assert outcomes == {"cancelled": 1.0}
    tokens = [s.value for s in families["temper_generated_tokens"].samples if s.name.endswith("_total")]
    assert tokens and tokens[0] < 250  # stopped early, not decoded to max_tokens for no one
