"""The session settings search: on each engine, the few settings that matter, tried once per model and
host, kept only where the speed gates' own paired interval shows them faster than the default.

Session settings move a model's speed as much as its precision does (intra-op spinning changed the
same session's throughput 1.05-2.9x on a loaded 2-core host; onnxruntime#26992 reports ORT_ENABLE_ALL
7x slower than ORT_ENABLE_EXTENDED on one CPU family), and no setting wins everywhere. So, with
`validate.throughput.session_search`, each model is timed on its default settings and on each row of
table() for the engine (one setting changed at a time), in the interleaved rounds of validators/rounds.py
at every measured batch size (on the GPU rows, CUDA graphs off and on; a graph row whose graph path
answers differently from its plain run at some batch size is `rejected` untimed). A row is kept when its
speedup interval over the default (validators/speedup.py) lies above 1.0 at the ranking batch size (the
largest, where selection ranks) and below 1.0 at none; of those, the fastest at the ranking size.
Otherwise the default stays: a setting is never chosen on a point estimate, nor where its own interval
says it is slower anywhere.

The budget (`session_search_s`) bounds the search's wall time, building its sessions included: each batch
size gets an equal share of what is left when its turn comes, and no round starts that would end past it
(the first round at each size always runs). Slices are sized so that every round fits when calls are
short; a model whose calls are long gets fewer rounds, and rows the budget leaves undecided keep the
default. The record says where the budget cut the rounds short and about what budget would not have.

The kept session is then the one the speed gates measure, report.json's figures record (read back from
the session) and runtime.json serves: one session from search to server. The result is cached by the
pipeline (a record keyed by the model's bytes, the host profile, the table and the budget), so a second
run on the same host reuses it rather than searching again.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import numpy as np
from pydantic import BaseModel

from temper.artifacts import engines
from temper.artifacts.core.host import HostProfile
from temper.artifacts.core.layout import Layout
from temper.artifacts.core.onnx_io import load_structure
from temper.artifacts.engines.providers import Provider
from temper.validators.rounds import ROUNDS, Bench, Timing, interleave, replay_problems
from temper.validators.speedup import Speedup, estimate
from temper.validators.throughput import Session, batch_of, engine_defaults, session_for, tuned_session

MOST_ROUNDS = 2 * ROUNDS  # ROUNDS for every setting, then as many again while one is undecided
DEFAULT = "default"  # the name of the settings every row is compared with
Verdict = Literal["kept", "faster", "not faster", "slower", "rejected"]
Settings = TypeVar("Settings", bound=BaseModel)  # an engine's settings model (artifacts/engines/)


@dataclass(frozen=True)
class Row:
    """One setting to try: a name and the fields it changes in the engine's default settings."""

    name: str
    changes: dict[str, Any]

    def apply(self, default: Settings) -> Settings:
        """The default settings with this row's changes, validated as the engine's settings model."""
        return type(default).model_validate({**default.model_dump(), **self.changes})


def table(provider: Provider) -> tuple[Row, ...]:
    """The settings tried on `provider`, each against the default alone, as its runtime lists them
    (artifacts/engines/: ONNX Runtime's CPU tries one thread, spinning and extended graph optimization;
    OpenVINO one thread and two streams; GPU rows take no thread settings, so none)."""
    return tuple(Row(name, changes) for name, changes in engines.of(provider).search_rows(provider))


def rows_for(provider: Provider, default: BaseModel) -> tuple[Row, ...]:
    """The rows of table(provider) that change something on this host (one thread is the default
    on a one-core host)."""
    return tuple(row for row in table(provider) if row.apply(default) != default)


class Records(Protocol):
    """Where search results are kept between runs (pipeline.cache.RecordStore): keyed by what they depend on."""

    def get(self, parts: dict[str, Any]) -> dict[str, Any] | None: ...

    def put(self, parts: dict[str, Any], record: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Trial:
    """A row's speedup over the default at each batch size measured."""

    row: Row
    settings: dict[str, Any]
    speedups: dict[int, Speedup]
    problem: str | None = None  # where its outputs differed from the plain run's (then it was not timed)

    def verdict(self, ranking: int) -> Verdict:
        """slower: its interval lies below 1.0 at some batch size; faster: above 1.0 at the ranking size;
        rejected: its CUDA graph path answered differently from the plain run."""
        if self.problem is not None:
            return "rejected"
        if any(up.decide(1.0) == "fail" for up in self.speedups.values()):
            return "slower"
        return "faster" if self.speedups[ranking].decide(1.0) == "pass" else "not faster"


def choose(trials: list[Trial], ranking: int) -> Trial | None:
    """The fastest trial at the ranking batch size of those faster than the default there and slower at no
    batch size; None: keep the default."""
    faster = [t for t in trials if t.verdict(ranking) == "faster"]
    return max(faster, key=lambda t: t.speedups[ranking].ratio, default=None)


@dataclass(frozen=True)
class Plan:
    """What a search measures, and what its result depends on."""

    provider: Provider
    batch_sizes: list[int]
    confidence: float
    budget_s: float
    warmup_s: float
    host: HostProfile


@dataclass
class Found:
    session: Session  # built from the kept settings
    record: dict[str, Any]  # report_model.SessionSearch's fields


Progress = Callable[[str], None]


def search(path: Path, plan: Plan, sample: dict[str, np.ndarray], layout: Layout, name: str = "model",
           rows: tuple[Row, ...] | None = None, records: Records | None = None,
           progress: Progress = lambda _: None) -> Found:
    """The session `path` runs fastest with on plan.provider, by the rule above (`rows`: table()'s for the
    provider). A record of `records` for the same model, host, rows and budget is reused, not searched again."""
    default = engine_defaults(plan.provider)
    rows = rows_for(plan.provider, default) if rows is None else rows
    ranking = max(plan.batch_sizes)
    parts = _key(path, plan, default, rows, sample)
    stored = records.get(parts) if records is not None else None
    if stored is not None:
        progress(f"session search › {name} on {plan.provider}: {stored['kept']} (cached)")
        stored_settings = type(default).model_validate(stored["settings"])
        return Found(session_for(path, plan.provider, stored_settings), {**stored, "cached": True})
    began = time.perf_counter()
    settings = {DEFAULT: default, **{row.name: row.apply(default) for row in rows}}
    progress(f"session search › {name} on {plan.provider}: {', '.join(settings)}")
    sessions = {key: session_for(path, plan.provider, value) for key, value in settings.items()}
    rejected = _rejected(sessions, path, plan, sample, layout)
    for key in rejected:
        progress(f"session search › {name} on {plan.provider}: {key} rejected ({rejected[key]})")
        del sessions[key]
    built_s = time.perf_counter() - began
    # A slice is a warm-up and a timed stretch of slice_s each: MOST_ROUNDS of every setting then fit.
    slice_s = plan.budget_s / (2 * len(plan.batch_sizes) * len(sessions) * MOST_ROUNDS)
    paths = dict.fromkeys(sessions, (path, plan.provider))

    def undecided(bench: Bench, key: str) -> bool:
        return estimate(bench.ratios(key), plan.confidence).decide(1.0) == "undecided"

    benches = []
    for done, size in enumerate(plan.batch_sizes):
        now = time.perf_counter()
        share = (began + plan.budget_s - now) / (len(plan.batch_sizes) - done)
        timing = Timing(slice_s, min(plan.warmup_s, slice_s), MOST_ROUNDS, deadline=now + share)
        benches.append(interleave(Bench(size, DEFAULT, {key: {} for key in sessions}), sessions,
                                  paths, sample, layout, timing, undecided))
    cut = [b.batch_size for b in benches if b.cut_short]
    trials = [Trial(row, settings[row.name].model_dump(), {}, rejected[row.name]) if row.name in rejected else
              Trial(row, settings[row.name].model_dump(),
                    {b.batch_size: estimate(b.ratios(row.name), plan.confidence) for b in benches}) for row in rows]
    best = choose(trials, ranking)
    kept = DEFAULT if best is None else best.row.name
    record = {
        "provider": plan.provider, "default": default.model_dump(), "kept": kept,
        "settings": settings[kept].model_dump(), "ranking_batch_size": ranking, "confidence": plan.confidence,
        "budget_s": plan.budget_s, "seconds": round(time.perf_counter() - began, 3), "cached": False,
        "cut_short": cut, "enough_s": _enough_s(built_s, benches) if cut else None,
        "load": benches[-1].load.as_dict() if benches[-1].load else None,
        "trials": [_trial(t, ranking, t is best) for t in trials],
    }
    if records is not None:
        records.put(parts, record)
    progress(f"session search › {name} on {plan.provider}: kept {kept}" + (
        f" (the {plan.budget_s:g} s budget cut the rounds short at batch {', '.join(map(str, cut))}: "
        f"session_search_s: {record['enough_s']:g} would give every setting {ROUNDS} rounds)" if cut else ""))
    return Found(sessions[kept], record)


def _rejected(sessions: dict[str, Session], path: Path, plan: Plan, sample: dict[str, np.ndarray],
              layout: Layout) -> dict[str, str]:
    """The rows whose CUDA graph path answers differently from their plain run at some batch size, and where
    (validators/rounds.py's check, which the gates then repeat on the kept session)."""
    if not any(engines.uses_graphs(s) for s in sessions.values()):
        return {}
    graphs = {path: load_structure(path)}
    paths = dict.fromkeys(sessions, (path, plan.provider))
    found: dict[str, str] = {}
    for size in plan.batch_sizes:
        live = {key: s for key, s in sessions.items() if engines.uses_graphs(s) and key not in found}
        feeds = {key: batch_of(graphs[path], sample, size, layout) for key in live}
        found |= {key: f"batch {size}: {problem}"
                  for key, problem in replay_problems(live, feeds, graphs, paths, sample, size, layout).items()}
    return found


def _enough_s(built_s: float, benches: list[Bench]) -> float:
    """About the budget that gives every setting ROUNDS rounds at each batch size: the sessions' build and
    ROUNDS rounds as long as the ones measured, rounded up to whole seconds."""
    return float(np.ceil(built_s + sum(ROUNDS * float(np.mean(b.round_s)) for b in benches)))


def sessions_for(models: dict[str, Path], plan: Plan, enabled: bool, sample: dict[str, np.ndarray], layout: Layout,
                 records: Records | None, progress: Progress) -> tuple[dict[str, Session],
                                                                       dict[str, dict[str, Any]]]:
    """The session each model is gated with on plan.provider, and each search's record: searched when
    `enabled` and the engine has rows, else tuned_session's (the thread choice serving makes at start)."""
    if not (enabled and rows_for(plan.provider, engine_defaults(plan.provider))):
        return {name: tuned_session(path, plan.provider, sample, layout) for name, path in models.items()}, {}
    found = {name: search(path, plan, sample, layout, name, records=records, progress=progress)
             for name, path in models.items()}
    return {name: f.session for name, f in found.items()}, {name: f.record for name, f in found.items()}


def _trial(trial: Trial, ranking: int, kept: bool) -> dict[str, Any]:
    return {"name": trial.row.name, "changes": trial.row.changes, "settings": trial.settings,
            "verdict": "kept" if kept else trial.verdict(ranking),
            **({"problem": trial.problem} if trial.problem else {}),
            "speedups": [{"batch_size": size, "speedup": up.ratio, "rounds": up.rounds,
                          "interval": None if up.low is None or up.high is None else [up.low, up.high]}
                         for size, up in trial.speedups.items()]}


def _key(path: Path, plan: Plan, default: BaseModel, rows: tuple[Row, ...],
         sample: dict[str, np.ndarray]) -> dict[str, Any]:
    """Everything a search's result depends on: the model's bytes, the data timed, the host, the rows, the rule."""
    data = hashlib.sha256()
    for key in sorted(sample):
        array = np.ascontiguousarray(sample[key])
        data.update(f"{key}{array.dtype}{array.shape}".encode())
        data.update(array.tobytes())
    return {"kind": "session-search", "model": _file_sha256(path), "data": data.hexdigest(),
            "host": plan.host.model_dump(), "provider": plan.provider, "default": default.model_dump(),
            "rows": [[row.name, json.dumps(row.changes, sort_keys=True)] for row in rows],
            "batch_sizes": plan.batch_sizes, "confidence": plan.confidence, "budget_s": plan.budget_s,
            "rounds": [ROUNDS, MOST_ROUNDS]}


def _file_sha256(path: Path) -> str:
    """The model's bytes with any external data beside it (a large model's weights)."""
    digest = hashlib.sha256()
    for item in sorted(path.parent.glob(path.name + "*")):
        if item.is_file():
            with item.open("rb") as file:
                for block in iter(lambda: file.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()
