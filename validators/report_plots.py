"""report.md's PNG plots (throughput by batch size per engine, accuracy against speed, a fallback's
sensitivity ranking), apart from the text reports: matplotlib is imported only when one is drawn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from temper.artifacts.formats.capacity import Capacity
from temper.validators.report_model import Report, Tuning


def _pyplot() -> Any:
    """matplotlib.pyplot, imported when a plot is drawn: commands that only read reports skip its import."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never a display
    import matplotlib.pyplot as plt

    return plt


def throughput_plot(report: Report, path: Path) -> Path:
    fig = _throughput_figure(report)
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)
    return path


def _throughput_figure(report: Report) -> Any:
    """samples/s against batch size: log x (sizes double), linear y from 0 with plain tick labels, and
    each model's round-to-round spread as an error bar. The Figure, laid out and not yet saved."""
    plt = _pyplot()
    series = {"baseline": report.baseline.throughput} | {n: c.throughput for n, c in report.candidates.items()}
    providers = sorted({m.provider for ms in series.values() for m in ms})
    fig, axes = plt.subplots(1, len(providers), figsize=(6 * len(providers), 4), squeeze=False)
    for ax, provider in zip(axes[0], providers):
        for name, ms in series.items():
            points = sorted((m.batch_size, m.samples_per_s, m.spread_pct or 0.0) for m in ms if m.provider == provider)
            if points:
                sizes, speeds, spreads = zip(*points)
                half = [v * p / 200 for v, p in zip(speeds, spreads)]
                label = f"{name} (selected)" if name == report.selected_pair and report.passed else name
                ax.errorbar(sizes, speeds, yerr=half, marker="o", capsize=3, label=label,
                            linestyle="--" if name == "baseline" else "-")
        batch_sizes = sorted({m.batch_size for ms in series.values() for m in ms})
        computes = sorted({p for c in report.candidates.values()
                           if c.engine == provider and (p := c.engine_precision) is not None})
        title = f"{report.recipe} on {provider}" + (f" (computes in {', '.join(computes)})" if computes else "")
        ax.set(xscale="log", xlabel="batch size", ylabel="samples/s", title=title)
        ax.set_xticks(batch_sizes, [str(b) for b in batch_sizes])
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(_plain_ticks())
        ax.legend()
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def _plain_ticks() -> Any:
    """Tick labels with thousands separators and the decimals the tick spacing needs: `12,000` for a
    fast model, `0.5, 1.0, 1.5` for one under 3 samples/s (whole numbers alone read `0, 0, 1, 1`)."""
    from matplotlib.ticker import FuncFormatter

    formatter = FuncFormatter(lambda value, _: f"{value:,.{_tick_decimals(formatter.locs)}f}")
    return formatter


def _tick_decimals(ticks: Any) -> int:
    """The fewest decimals (up to 6) that write every tick exactly enough to tell them apart."""
    values = [float(t) for t in ticks]
    for decimals in range(7):
        if all(abs(round(v, decimals) - v) < 1e-9 * max(1.0, abs(v)) for v in values):
            return decimals
    return 6


def tradeoff_plot(report: Report, path: Path) -> Path:
    """Accuracy drop against speedup at the largest batch size, with the speedup's confidence
    interval as a horizontal error bar and both budgets as lines."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, c in report.candidates.items():
        if c.drop is None or not c.throughput:
            continue
        best = max(c.throughput, key=lambda m: m.batch_size)
        low, high = best.speedup_interval or (best.speedup, best.speedup)
        ax.errorbar(best.speedup, c.drop, xerr=[[best.speedup - low], [high - best.speedup]], fmt="o",
                    capsize=4, color="tab:green" if c.passed else "tab:red")
        ax.annotate(name, (best.speedup, c.drop), textcoords="offset points", xytext=(5, 5))
    ax.axhline(report.allowed_drop, color="gray", linestyle="--", label="allowed drop")
    ax.axvline(1.0, color="gray", linestyle=":", label="baseline speed")
    policy = report.speed_policy
    if policy and policy.min_speedup is not None:
        ax.axvline(policy.min_speedup, color="tab:orange", linestyle="--", label=f"min_speedup {policy.min_speedup:g}")
    ax.set(xlabel="speedup over baseline (largest batch; bar: confidence interval)", ylabel=f"{report.metric} drop",
           title=f"{report.recipe}: accuracy vs speed")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def sensitivity_plot(name: str, tuning: Tuning, path: Path) -> Path:
    top = tuning.ranking[:20]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(top) + 1.5))
    labels = [r.node if len(r.node) <= 60 else "…" + r.node[-59:] for r in top]
    ax.barh(range(len(top)), [r.sqnr_db for r in top], color="tab:red")
    ax.set_yticks(range(len(top)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="SQNR of the quantized tensors it touches (dB; lower = more harmful)",
           title=f"{name}: top {len(top)} nodes by quantization sensitivity")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def capacity_plot(capacity: Capacity, path: Path) -> Path:
    """`temper capacity`'s curve: p99 against the offered rate (log x), one line per configuration searched, the
    chosen one's repeats as points, the target as a dashed line and the capacity with its interval shaded."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    choices = list(dict.fromkeys(p.choice for p in capacity.points))
    for choice in choices:
        measured = sorted((p.rate, p.p99_ms) for p in capacity.points
                          if p.choice == choice and p.round == 0 and p.p99_ms is not None)
        if measured:
            rates, p99s = zip(*measured)
            chosen = choice == capacity.chosen
            ax.plot(rates, p99s, marker="o", linewidth=2.5 if chosen else 1, alpha=1 if chosen else 0.6,
                    label=f"{choice.label()}{' (chosen)' if chosen else ''}")
    repeats = [(p.rate, p.p99_ms) for p in capacity.points if p.round > 0 and p.p99_ms is not None]
    if repeats:
        ax.scatter(*zip(*repeats), marker="x", color="black", label="chosen, repeated rounds", zorder=3)
    ax.axhline(capacity.target_p99_ms, linestyle="--", color="red", label=f"target p99 {capacity.target_p99_ms:g} ms")
    ax.axvspan(*capacity.interval, color="green", alpha=0.15,
               label=f"capacity {capacity.rate:,.0f} req/s (95% interval)")
    ax.set(xscale="log", yscale="log", xlabel="offered requests/s (open loop, Poisson)", ylabel="p99 latency, ms",
           title=f"capacity under p99 {capacity.target_p99_ms:g} ms ({capacity.tool}, {capacity.protocol})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
