"""A load generator in Python (asyncio, keep-alive HTTP/1.1) for hosts without wrk: closed-loop connections, or an
open-loop schedule of request rates (a burst), each request's latency kept with the time it was sent.

Responses are read by their Content-Length; each request's latency runs from its write (open loop: from the
time the schedule said to send it, so a client held up by a slow server counts the wait, no coordinated
omission) to the end of its answer. The answers' `parameters` are not parsed here; `on_answer` may.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from benchmarks.serving_load import Body


@dataclass
class Sample:
    sent: float  # seconds since the load started
    latency_ms: float
    status: int
    body: bytes = b""


@dataclass
class Run:
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.status == 200]

    @property
    def rps(self) -> float:
        return len(self.ok) / self.seconds if self.seconds else 0.0

    def p(self, q: float, since: float = 0.0, until: float = float("inf")) -> float:
        """The q-th percentile (0-100) of latency, ms, of the answered requests sent in [since, until)."""
        values = sorted(s.latency_ms for s in self.ok if since <= s.sent < until)
        if not values:
            return float("nan")
        return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]

    def median_ms(self) -> float:
        return statistics.median(s.latency_ms for s in self.ok) if self.ok else float("nan")


def _request(port: int, body: Body) -> bytes:
    head = [f"POST {body.path} HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Content-Length: {len(body.payload)}",
            *(f"{k}: {v}" for k, v in body.headers.items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body.payload


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = next(int(v) for k, _, v in (line.partition(":") for line in lines[1:]) if k.lower() == "content-length")
    return status, await reader.readexactly(length)


async def _closed(port: int, body: Body, conns: int, duration: float, keep: bool) -> Run:
    run, wire = Run(), _request(port, body)
    began = time.perf_counter()
    end = began + duration

    async def client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while (now := time.perf_counter()) < end:
            writer.write(wire)
            status, data = await _answer(reader)
            run.samples.append(Sample(now - began, (time.perf_counter() - now) * 1000, status, data if keep else b""))
        writer.close()

    await asyncio.gather(*(client() for _ in range(conns)))
    run.seconds = time.perf_counter() - began
    return run


def closed(port: int, body: Body, conns: int, duration: float, keep: bool = False) -> Run:
    """`conns` connections each sending its next request when the last is answered, for `duration` s."""
    return asyncio.run(_closed(port, body, conns, duration, keep))


async def _open(port: int, body: Body, rate: Callable[[float], float], duration: float, conns: int,
                keep: bool) -> Run:
    run, wire = Run(), _request(port, body)
    idle: asyncio.Queue = asyncio.Queue()
    for _ in range(conns):
        idle.put_nowait(await asyncio.open_connection("127.0.0.1", port))
    began = time.perf_counter()
    pending = []

    async def one(due: float) -> None:
        reader, writer = await idle.get()
        writer.write(wire)
        status, data = await _answer(reader)
        idle.put_nowait((reader, writer))
        run.samples.append(Sample(due, (time.perf_counter() - began - due) * 1000, status, data if keep else b""))

    t = 0.0
    while t < duration:
        delay = began + t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        pending.append(asyncio.ensure_future(one(t)))
        t += 1.0 / rate(t)
    await asyncio.gather(*pending)
    run.seconds = time.perf_counter() - began
    while not idle.empty():
        idle.get_nowait()[1].close()
    return run


def open_loop(port: int, body: Body, rate: Callable[[float], float], duration: float, conns: int = 64,
              keep: bool = False) -> Run:
    """Requests sent at `rate(t)` per second for `duration` s, whatever the answers do (up to `conns` in flight at
    once; beyond that a request waits for a connection, and its latency counts the wait)."""
    return asyncio.run(_open(port, body, rate, duration, conns, keep))
