"""Interleaved throughput of every (model, engine) pair, paired round by round with the reference.

For each batch size every pair takes its turn in slices of duration_s / ROUNDS on sessions created
once, in an order that rotates every round (validators/rounds.py), so noise from other processes hits
every pair alike and each round's ratio (pair over reference, the baseline on the first engine) is a
paired sample. After ROUNDS rounds, the pairs still undecided (a speed gate, or at the ranking batch
size whether they beat the reference at all) go on, round by round, until each is decided or the
budget is spent. Each pair's session is the one serving would run: the session settings search's
pick with validate.throughput.session_search (each setting, threads included, chosen on paired intervals
against the default), else one thread count for every pair: the choice serving makes at start for the
reference pair (the baseline on the first engine; all usable cores or one, by a batch-1 timing), so that no
speedup compares sessions on different thread counts (a per-model choice follows the moment's load: PP-OCRv4
det's baseline was timed on 2 threads and its fp16 on 1). GPU rows keep their engine's defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from temper.artifacts import engines as runtimes
from temper.artifacts.core.host import HostProfile
from temper.artifacts.core.layout import Layout
from temper.artifacts.engines.providers import PROVIDERS
from temper.validators.pairs import Pair
from temper.validators.rounds import ROUNDS, Bench, Timing, interleave
from temper.validators.session_search import Plan, Records, sessions_for
from temper.validators.spec import ThroughputSpec
from temper.validators.speedup import Speedup, estimate
from temper.validators.throughput import Session, engine_defaults, session_for, tuned_session

Progress = Callable[[str], None]


def one_thread_count(pairs: dict[str, tuple[Pair, Path]], reference: str, sample: dict[str, np.ndarray],
                     layout: Layout) -> tuple[int, Session]:
    """The thread count every pair is timed on, and the reference pair's session on it: tuned_session's choice
    for the reference pair, made as serving makes it at start."""
    pair, path = pairs[reference]
    session = tuned_session(path, pair.provider, sample, layout)
    return runtimes.of(pair.provider).settings_of(session).threads, session


def sessions(spec: ThroughputSpec, pairs: dict[str, tuple[Pair, Path]], sample: dict[str, np.ndarray],
             layout: Layout, host: HostProfile, records: Records | None, progress: Progress, reference: str = "",
             ) -> tuple[dict[str, Session], dict[str, list[dict[str, Any]]]]:
    """Each pair's session (the module's rule), and the session searches' records by model."""
    engines = list(dict.fromkeys(pair.provider for pair, _ in pairs.values()))
    if not spec.session_search and reference in pairs:
        count, first = one_thread_count(pairs, reference, sample, layout)
        progress(f"throughput › sessions on {count} thread{'s' if count > 1 else ''} for every pair")
        shared: dict[str, Session] = {reference: first}
        for key, (pair, path) in pairs.items():
            if key != reference:
                default = engine_defaults(pair.provider)
                gpu = PROVIDERS[pair.provider].gpu
                shared[key] = session_for(path, pair.provider, default if gpu else default.with_threads(count))
        return shared, {}
    opened: dict[str, Session] = {}
    searches: dict[str, list[dict[str, Any]]] = {}
    for engine in engines:
        mine = {key: (pair.model, path) for key, (pair, path) in pairs.items() if pair.provider == engine}
        progress(f"throughput › {engine}: sessions for {', '.join(mine)}")
        plan = Plan(engine, spec.batch_sizes, spec.confidence, spec.session_search_s, spec.warmup_s, host)
        found, records_of = sessions_for({key: path for key, (_, path) in mine.items()}, plan, spec.session_search,
                                         sample, layout, records, progress)
        opened |= found
        for key, record in records_of.items():
            searches.setdefault(mine[key][0], []).append(record)
    return opened, searches


def bench_all(spec: ThroughputSpec | None, pairs: dict[str, tuple[Pair, Path]], reference: str,
              sample: dict[str, np.ndarray], progress: Progress, layout: Layout, host: HostProfile,
              records: Records | None, log: Progress = lambda _: None,
              ) -> tuple[list[Bench], dict[str, list[dict[str, Any]]]]:
    """Throughput of every pair at every batch size (the module's rule), the reference pair first; and
    the session searches' records by model (none unless validate.throughput.session_search). `log` hears
    each pair once it is timed at a batch size: its samples/s and its speedup over the reference."""
    if spec is None:
        return [], {}
    opened, searches = sessions(spec, pairs, sample, layout, host, records, progress, reference)
    slice_s = spec.duration_s / ROUNDS
    timing = Timing(slice_s, spec.warmup_s, max(ROUNDS, round(spec.budget_s / slice_s)))
    paths = {key: (path, pair.provider) for key, (pair, path) in pairs.items()}
    ordered = {reference: opened[reference], **opened}

    def undecided(bench: Bench, key: str) -> bool:
        return undecided_at(estimate(bench.ratios(key), spec.confidence), bench.batch_size, spec)

    def more(bench: Bench, round_: int, keys: list[str]) -> None:
        progress(f"throughput › batch {bench.batch_size}: more rounds for {', '.join(keys)} (round {round_})")

    benches = []
    for size in spec.batch_sizes:
        progress(f"throughput › batch {size}: {', '.join(pairs)}")
        benches.append(interleave(Bench(size, reference, {key: {} for key in ordered}), ordered, paths, sample,
                                  layout, timing, undecided, more))
        for key in ordered:
            log(measured(benches[-1], key, spec.confidence))
    return benches, searches


def measured(bench: Bench, key: str, confidence: float) -> str:
    """One pair at one batch size, once timed: `throughput › batch 32: fp16@cpu 1,234 samples/s, 1.40x [1.36,
    1.44] over baseline@cpu (5 rounds)`."""
    figure = bench.figure(key)
    head = f"throughput › batch {bench.batch_size}: {key} {figure.samples_per_s:,.0f} samples/s"
    if key == bench.reference:
        return f"{head} (the reference, {figure.rounds} rounds)"
    return f"{head}, {estimate(bench.ratios(key), confidence).shown()} over {bench.reference} ({figure.rounds} rounds)"


def undecided_at(up: Speedup, size: int, spec: ThroughputSpec) -> bool:
    """Whether more rounds could settle something: a speed gate at `size`, or, at the ranking batch
    size, whether the pair is faster than the reference at all (selection's rule)."""
    gate = (spec.min_speedup is not None and size in spec.gated_sizes
            and up.decide(spec.min_speedup) == "undecided")
    ranking = size == max(spec.batch_sizes) and up.decide(1.0) == "undecided"
    return gate or ranking
