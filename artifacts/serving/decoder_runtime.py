"""A decoder LLM served: greedy generation through artifacts/engines/decoder_session.py's loop (the one the
generation and speed gates ran, so what was gated is what serves), the tokenizer from the model folder, and the
generate extension's admission rules.

Batching: none across requests. Each instance (one ONNX Runtime session) decodes one sequence at a time, its KV
cache that sequence's alone; `instances` sessions decode that many sequences at once, each on its own thread.
Requests beyond them wait in a bounded queue (`max_queue`); one more is refused (Overloaded: 503), as the tensor
server refuses a full queue. Decode state is per sequence, so batching sequences of different lengths would need
padding and per-row cache positions the builder's graph does not take with a plain attention mask.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from temper.artifacts.core.errors import Overloaded, RequestError, Stopped
from temper.artifacts.engines.decoder_session import DecoderSession

TOKENIZER = "tokenizer.json"
DEFAULT_MAX_TOKENS = 16  # what a request without parameters.max_tokens gets
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
RATE_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0)


@dataclass
class Request:
    """One generate request, checked: the prompt's token ids and how many tokens to generate at most."""

    text: str
    prompt: list[int]
    max_tokens: int
    cancelled: threading.Event = field(default_factory=threading.Event)


class Metrics:
    """The generate extension's /metrics series, per model: requests by outcome, time to first token, decode
    tokens/s, tokens generated, sequences decoding now."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model", "version"]
        self.requests = Counter("temper_generate_requests", "Generate requests by outcome: success, bad_request "
                                "(400), overloaded (503), failure (500), cancelled (client gone)",
                                [*labels, "outcome"], registry=self.registry)
        self.ttft = Histogram("temper_time_to_first_token_seconds", "From a generate request's admission (queue "
                              "wait included) to its first token chosen", labels, buckets=TTFT_BUCKETS,
                              registry=self.registry)
        self.rate = Histogram("temper_decode_tokens_per_second", "Per request of two tokens or more: tokens after "
                              "the first over the seconds after the first", labels, buckets=RATE_BUCKETS,
                              registry=self.registry)
        self.tokens = Counter("temper_generated_tokens", "Tokens generated", labels, registry=self.registry)
        self.active = Gauge("temper_generate_sequences", "Sequences decoding now (one per busy instance)", labels,
                            registry=self.registry)
        self.waiting = Gauge("temper_generate_queue", "Generate requests waiting for an instance", labels,
                             registry=self.registry)


class DecoderModel:
    """A builder folder served under `name`: `instances` sessions, each decoding one sequence at a time."""

    platform = "onnxruntime_onnx"

    def __init__(self, folder: Path, name: str, version: str = "1", instances: int = 1, max_queue: int = 16,
                 metrics: Metrics | None = None) -> None:
        from tokenizers import Tokenizer

        if not (folder / TOKENIZER).is_file():
            raise RequestError(f"{folder} has no {TOKENIZER}: serving text needs the model's tokenizer")
        self.folder, self.name, self.version = folder, name, version
        self.instances, self.max_queue = max(1, instances), max_queue
        self.tokenizer = Tokenizer.from_file(str(folder / TOKENIZER))
        threads = max(1, (os.cpu_count() or 1) // self.instances)
        self.sessions: queue.SimpleQueue[DecoderSession] = queue.SimpleQueue()
        for _ in range(self.instances):
            self.sessions.put(DecoderSession(folder, threads=threads))
        first = self.sessions.get()
        self.context_length, self.eos = first.layout.context_length, first.layout.eos
        self.sessions.put(first)
        self.metrics = metrics or Metrics()
        self.labels = {"model": name, "version": version}
        self.admitted = 0  # running and waiting; event loop only
        self.slots: asyncio.Semaphore | None = None  # made on the serving loop
        self.ready = False
        self.stopped = False

    def warm_up(self) -> None:
        """One short generation on every instance before the server says ready (ONNX Runtime's first run of a
        shape allocates; a first request should not pay for it)."""
        taken = [self.sessions.get() for _ in range(self.instances)]
        for session in taken:
            list(session.greedy(self.tokenizer.encode("warm up", add_special_tokens=False).ids[:4] or [0], 2))
        for session in taken:
            self.sessions.put(session)
        self.ready = True

    def request(self, body: Any) -> Request:
        """The generate request's JSON object checked; RequestError (400) saying what is wrong."""
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object with text_input")
        text = body.get("text_input")
        if not isinstance(text, str) or not text:
            raise RequestError("text_input must be a non-empty string")
        parameters = body.get("parameters", {})
        if not isinstance(parameters, dict):
            raise RequestError("parameters must be a JSON object")
        unknown = sorted(set(body) - {"text_input", "max_tokens", "parameters", "id"})
        if unknown:
            raise RequestError(f"unknown field(s) {', '.join(unknown)}: a request takes text_input, max_tokens "
                               "and parameters")
        unknown = sorted(set(parameters) - {"max_tokens"})
        if unknown:  # sampling options ignored would answer other text than asked for
            raise RequestError(f"unknown parameter(s) {', '.join(unknown)}: decoding is greedy, and max_tokens "
                               "is the one parameter")
        if "max_tokens" in body and "max_tokens" in parameters:
            raise RequestError("max_tokens is given twice, as an input and in parameters: give it once")
        max_tokens = body.get("max_tokens", parameters.get("max_tokens", DEFAULT_MAX_TOKENS))
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise RequestError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        prompt = self.tokenizer.encode(text, add_special_tokens=False).ids
        if not prompt:
            raise RequestError("text_input encodes to no tokens")
        if len(prompt) + max_tokens > self.context_length:
            raise RequestError(f"the prompt's {len(prompt)} tokens plus max_tokens {max_tokens} are over the "
                               f"model's context of {self.context_length} tokens")
        return Request(text, prompt, max_tokens)

    def count(self, outcome: str) -> None:
        self.metrics.requests.labels(**self.labels, outcome=outcome).inc()

    async def stream(self, request: Request) -> AsyncGenerator[str, None]:
        """The new text of each token as it is chosen (text held back while it ends inside a character), after
        a wait for a free instance; Overloaded when the queue is full, Stopped once the server stops."""
        if self.stopped:
            raise Stopped("the server is shutting down")
        if self.admitted >= self.instances + self.max_queue:
            self.count("overloaded")
            raise Overloaded(f"model '{self.name}' is overloaded: {self.instances} sequence(s) decoding and "
                             f"{self.max_queue} waiting")
        if self.slots is None:
            self.slots = asyncio.Semaphore(self.instances)
        self.admitted += 1
        begin = time.perf_counter()
        waiting = self.metrics.waiting.labels(**self.labels)
        try:
            waiting.inc()
            try:
                await self.slots.acquire()
            finally:
                waiting.dec()
            try:
                async for piece in self._decode(request, begin):
                    yield piece
            finally:
                self.slots.release()
        finally:
            self.admitted -= 1

    async def _decode(self, request: Request, begin: float) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue[int | BaseException | None] = asyncio.Queue()
        session = self.sessions.get()  # never blocks: the semaphore admits one per free session
        thread = threading.Thread(target=self._run, args=(session, request, loop, tokens), daemon=True,
                                  name=f"temper-generate-{self.name}")
        active = self.metrics.active.labels(**self.labels)
        active.inc()
        thread.start()
        chosen: list[int] = []
        text, first_at = "", 0.0
        try:
            while True:
                item = await tokens.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                if not chosen:
                    first_at = time.perf_counter()
                    self.metrics.ttft.labels(**self.labels).observe(first_at - begin)
                chosen.append(item)
                now = self.tokenizer.decode(chosen, skip_special_tokens=True)
                if now.endswith("\ufffd"):  # a character's bytes not all chosen yet
                    continue
                piece, text = now[len(text):] if now.startswith(text) else now, now
                if piece:
                    yield piece
            final = self.tokenizer.decode(chosen, skip_special_tokens=True)
            if final != text:
                yield final[len(text):] if final.startswith(text) else final
            if len(chosen) > 1:
                elapsed = time.perf_counter() - first_at
                if elapsed > 0:
                    self.metrics.rate.labels(**self.labels).observe((len(chosen) - 1) / elapsed)
            self.metrics.tokens.labels(**self.labels).inc(len(chosen))
        finally:
            request.cancelled.set()  # a client gone mid-stream: the thread stops at its next token
            await asyncio.to_thread(thread.join)
            self.sessions.put(session)
            active.dec()

    def _run(self, session: DecoderSession, request: Request, loop: asyncio.AbstractEventLoop,
             tokens: asyncio.Queue[int | BaseException | None]) -> None:
        """The greedy loop on this thread, each token handed to the event loop as it is chosen."""
        try:
            for token in self._greedy(session, request):
                loop.call_soon_threadsafe(tokens.put_nowait, token)
            loop.call_soon_threadsafe(tokens.put_nowait, None)
        except Exception as exc:  # noqa: BLE001 - the engine's failure is the request's 500
            loop.call_soon_threadsafe(tokens.put_nowait, exc)

    @staticmethod
    def _greedy(session: DecoderSession, request: Request) -> Iterator[int]:
        for token in session.greedy(request.prompt, request.max_tokens):
            if request.cancelled.is_set():
                return
            yield token

    def stop(self) -> None:
        self.stopped, self.ready = True, False
