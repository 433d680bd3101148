"""CUDA graphs on ONNX Runtime: the run path a session with `cuda_graph: true` answers every call through.

ONNX Runtime's CUDA provider (`enable_cuda_graph`) and TensorRT provider (`trt_cuda_graph_enable`) capture a
run's kernel launches once and replay them, which removes the per-kernel launch cost that dominates small
batches on a fast GPU. A replay reads and writes the device addresses it was captured with, so its inputs and
outputs must be bound with IO binding to buffers that never move, and one graph holds one set of shapes:
each batch size needs its own graph, chosen per run with the run config entry `gpu_graph_id` (-1: run without
a graph). A session that replays one size's graph for another's batch, or reads a buffer a request no longer
owns, answers with another request's numbers and no error: the known trap at batch >= 2
(tphakala/rust-birdnet-onnx#27). So here every input-shape signature gets its own pre-allocated input and
output buffers on the session's device and its own graph id; a call copies the request in, replays, and
copies the answer out; the graph is captured when a shape is first seen (serving's warm-up runs every batch
size the batcher forms, so no request pays for a capture). The gates time this path, `temper serve`, its
workers and the pyfunc model answer through it, and replay_problem() compares it with the plain run at every
gated batch size.

The path itself is provider-agnostic (on the CPU provider the same bound buffers run without a graph), which
is how it is tested on hosts without a GPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from temper.artifacts.core.errors import first_line

GRAPH_ID = "gpu_graph_id"  # ONNX Runtime's run config entry naming the graph a run captures or replays
SKIP = "-1"  # its value for a run without a graph
MOST_GRAPHS = 64  # a graph's buffers live as long as the session: shapes beyond these run the plain path
CAPTURE_RUNS = 2  # ONNX Runtime runs a new graph id once plainly (its allocations), then captures it
REPLAYS = 2  # the check's runs of its first batch: replays, after the capture at first use
Key = tuple[tuple[str, tuple[int, ...], str], ...]


class _Bound:
    """One input-shape signature: its buffers on the device, the binding to them and its graph id."""

    def __init__(self, session: ort.InferenceSession, device: str, feed: dict[str, np.ndarray],
                 outputs: dict[str, np.ndarray], graph_id: int) -> None:
        self.session, self.device = session, device
        self.inputs = {name: _buffer(array, device) for name, array in feed.items()}
        self.outputs = {name: _buffer(array, device) for name, array in outputs.items()}
        self.binding = session.io_binding()
        for name, value in self.inputs.items():
            self.binding.bind_ortvalue_input(name, value)
        for name, value in self.outputs.items():
            self.binding.bind_ortvalue_output(name, value)
        self.options = ort.RunOptions()
        self.options.add_run_config_entry(GRAPH_ID, str(graph_id))

    def load(self, feed: dict[str, np.ndarray]) -> None:
        """Copy a request into the bound input buffers (their addresses do not change)."""
        for name, array in feed.items():
            self.inputs[name].update_inplace(np.require(array, requirements="C"))

    def replay(self) -> None:
        self.session.run_with_iobinding(self.binding, self.options)

    def read(self, names: Sequence[str]) -> list[np.ndarray]:
        """The answer copied out of the bound output buffers (the next call overwrites them)."""
        return [np.array(self.outputs[name].numpy(), copy=True) for name in names]


def _buffer(like: np.ndarray, device: str) -> ort.OrtValue:
    return ort.OrtValue.ortvalue_from_shape_and_type(list(np.shape(like)), np.asarray(like).dtype, device, 0)


class GraphSession:
    """An ONNX Runtime session whose `run` goes through bound buffers and one CUDA graph per input shapes;
    everything else is the session's own (settings, providers, IO binding). One call at a time: the bound
    buffers are shared, so calls are serialized (a GPU session runs one batch at a time anyway)."""

    def __init__(self, session: ort.InferenceSession, device: str) -> None:
        self.session, self.device = session, device
        self._names = [o.name for o in session.get_outputs()]
        self._bound: dict[Key, _Bound] = {}
        self._lock = threading.Lock()
        self._plain = ort.RunOptions()
        self._plain.add_run_config_entry(GRAPH_ID, SKIP)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)

    def get_inputs(self) -> Any:
        return self.session.get_inputs()

    def get_outputs(self) -> Any:
        return self.session.get_outputs()

    def get_providers(self) -> list[str]:
        return list(self.session.get_providers())

    @property
    def graphs(self) -> int:
        """How many input-shape signatures have their own buffers and graph id."""
        return len(self._bound)

    def run(self, names: list[str] | None, feed: dict[str, np.ndarray], *_: Any) -> list[np.ndarray]:
        """The graph path: the request copied into its shapes' buffers, the graph replayed, the answer copied
        out; the plain path for shapes past MOST_GRAPHS or inputs no buffer can hold (strings)."""
        with self._lock:
            bound = self._for(feed)
            if bound is None:
                return self.plain(names, feed)
            bound.load(feed)
            bound.replay()
            return bound.read(names or self._names)

    def plain(self, names: list[str] | None, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """A run without a graph (gpu_graph_id -1) on the same session: what the graph path is checked against."""
        return list(self.session.run(names, feed, self._plain))

    def bound_call(self, feed: dict[str, np.ndarray]) -> Callable[[], None]:
        """One graph replay with `feed` already in its buffers: what the speed loop times."""
        with self._lock:
            bound = self._for(feed)
            if bound is None:
                return lambda: self._discard(self.plain(None, feed))
            bound.load(feed)
        return bound.replay

    @staticmethod
    def _discard(_: object) -> None:
        return None

    def _for(self, feed: dict[str, np.ndarray]) -> _Bound | None:
        """The buffers of `feed`'s shapes, made (and the output shapes learnt by one plain run) on first use."""
        key: Key = tuple((name, tuple(np.shape(a)), np.asarray(a).dtype.str) for name, a in sorted(feed.items()))
        found = self._bound.get(key)
        if found is not None or len(self._bound) >= MOST_GRAPHS:
            return found
        if any(np.asarray(a).dtype.kind in "OSU" for a in feed.values()):
            return None
        outputs = dict(zip(self._names, self.plain(self._names, feed)))
        if any(np.asarray(a).dtype.kind in "OSU" for a in outputs.values()):
            return None
        # graph ids from 1: 0 is what a run without the entry captures under
        bound = self._bound[key] = _Bound(self.session, self.device, feed, outputs, len(self._bound) + 1)
        bound.load(feed)
        for _ in range(CAPTURE_RUNS):  # captured now, so the first request of these shapes (warm-up's) replays
            bound.replay()
        return bound


def uses_graphs(session: object) -> bool:
    """Whether `session` answers through the graph path (so replay_problem has something to check)."""
    return isinstance(session, GraphSession)


def replay_problem(session: object, feeds: Sequence[dict[str, np.ndarray]]) -> str | None:
    """Where a GraphSession's graph path answers differently from its plain run on `feeds` (each replayed
    after capture, the last with data the graph was not captured with): "output 'y' differs by up to 0.31 from
    the plain run", or how the graph path failed (an output whose shape the inputs' do not fix cannot be
    bound); None when they agree, or for any other session."""
    if not isinstance(session, GraphSession):
        return None
    for number, feed in enumerate(feeds):
        try:
            for _ in range(REPLAYS if number == 0 else 1):
                got = session.run(None, feed)
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime's own failure of the bound run, as one line
            return f"the graph path failed ({first_line(exc)})"
        want = session.plain(None, feed)
        for name, left, right in zip(session._names, got, want):
            problem = _differs(np.asarray(left), np.asarray(right))
            if problem:
                return f"output '{name}' {problem} from the plain run"
    return None


def _differs(graph: np.ndarray, plain: np.ndarray) -> str | None:
    """How a graph replay's output differs from the plain run's: shape, or values beyond float round-off
    (kernels may differ between capture and a plain run by the last bits; a replay bug is whole rows wrong)."""
    if graph.shape != plain.shape:
        return f"has shape {graph.shape} against {plain.shape}"
    if plain.dtype.kind != "f":
        return None if np.array_equal(graph, plain) else "differs"
    both = np.isnan(graph) & np.isnan(plain)
    scale = max(1.0, float(np.nanmax(np.abs(plain))) if plain.size and not np.isnan(plain).all() else 1.0)
    gap = np.where(both, 0.0, np.abs(graph.astype(np.float64) - plain.astype(np.float64)))
    worst = float(np.nanmax(gap)) if gap.size else 0.0
    if np.isnan(gap).any() or worst > 1e-3 * scale:
        return f"differs by up to {worst:.3g}"
    return None
