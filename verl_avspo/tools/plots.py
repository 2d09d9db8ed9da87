"""Metric curves over training steps for several runs, as PNG files.

Takes the DataFrames of :func:`verl_avspo.tools.logs.read_metrics` (index ``step``, one column per
metric), so it serves the CPU sandbox and logs of real verl runs alike. A run given as several
frames (one per seed) is drawn as the mean over seeds with a band of ± one standard deviation.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from verl_avspo.core.files import atomic_write

__all__ = ["seed_statistics", "plot_metrics", "save_png"]

_LINESTYLES = ("-", "--", ":", "-.")


def seed_statistics(frames: Sequence[pd.DataFrame], column: str) -> tuple[pd.Series, pd.Series]:
    """Mean and standard deviation (0 for a single frame) over frames of ``column`` per step,
    on the steps where it was logged."""
    series = [frame[column].dropna() for frame in frames if column in frame]
    if not series:
        return pd.Series(dtype=float), pd.Series(dtype=float)
    table = pd.concat(series, axis=1)
    std = table.std(axis=1, ddof=1) if table.shape[1] > 1 else pd.Series(0.0, index=table.index)
    return table.mean(axis=1), std.fillna(0.0)  # NaN where only one seed logged the step


def plot_metrics(
    frames: Mapping[str, pd.DataFrame | Sequence[pd.DataFrame]],
    columns: Sequence[str],
    path: str | Path,
    title: str,
    ylabel: str,
    smooth: int = 1,
    column_labels: Mapping[str, str] | None = None,
    band: bool = True,
) -> Path:
    """Plot ``columns`` of each run against the step and save a PNG.

    Args:
        frames: run name -> its metrics frame, or a list of frames (one per seed).
        columns: metric names to draw; every (run, metric) series gets its own colour (and each metric its
            own line style), the legend beside the axes, not on the data.
        path: where to write the PNG (parent folders are created; written through ``atomic_write``).
        title, ylabel: the figure's title and y-axis label (the x axis is the training step).
        smooth: centred rolling-mean window in steps (1 = raw values), for noisy per-step metrics.
        column_labels: legend names for the columns (default: the metric names).
        band: shade ± one standard deviation over seeds (runs given as several frames).

    Raises:
        ValueError: when none of ``columns`` occurs in any frame (names the missing columns).
    """
    if smooth < 1:
        raise ValueError(f"smooth={smooth} is invalid: expected a window of at least 1 step")
    column_labels = dict(column_labels or {})
    figure = Figure(figsize=(10, 4.5))  # fixed margins: a layout engine draws every figure twice
    axes = figure.add_subplot()
    colours = [f"C{i}" for i in range(10)] + ["black", "olive", "navy", "maroon", "teal", "gold"]
    drawn = 0
    points: list[float] = []
    for run, value in frames.items():
        seeds = [value] if isinstance(value, pd.DataFrame) else list(value)
        for column_index, column in enumerate(columns):
            mean, std = seed_statistics(seeds, column)
            if mean.empty:
                continue
            if smooth > 1:
                mean = mean.rolling(smooth, center=True, min_periods=1).mean()
                std = std.rolling(smooth, center=True, min_periods=1).mean()
            colour = colours[drawn % len(colours)]
            named = column_labels.get(column, column)
            label = run if len(columns) == 1 else named if len(frames) == 1 else f"{run}: {named}"
            # A single point draws no line: mark it.
            marker = "o" if len(mean) == 1 else None
            style = _LINESTYLES[column_index % len(_LINESTYLES)]
            axes.plot(mean.index, mean.values, style, color=colour, label=label, marker=marker)
            points += list(mean.values) + list(mean.index.astype(float))
            if band and len(seeds) > 1:
                axes.fill_between(mean.index, (mean - std).values, (mean + std).values, color=colour, alpha=0.15)
            drawn += 1
    if not drawn:
        raise ValueError(f"none of the columns {list(columns)} occurs in the metrics of runs {list(frames)}")
    axes.set_xlabel("training step")
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    if drawn == 1 and len(points) == 2:  # one point: a window around it, not matplotlib's ±0.04
        y, x = points
        axes.set_ylim(y - max(abs(y) * 0.5, 0.5), y + max(abs(y) * 0.5, 0.5))
        axes.set_xlim(x - max(x * 0.5, 1), x + max(x * 0.5, 1))
    legend = axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    # Room on the right for the legend: its handles and its longest label (about 0.0068 of the width a character).
    longest = max(len(text.get_text()) for text in legend.get_texts())
    left, right = 0.07, max(0.45, 0.9 - 0.0068 * longest)
    # The title is centred on the axes: wrapped to their width (about 110 characters of the figure's), it stays
    # inside the figure however wide the legend makes the right margin.
    lines = textwrap.wrap(title, width=int((right - left) * 110))
    axes.set_title("\n".join(lines), y=1.0)  # a fixed place (no ticks on top): matplotlib skips measuring the axes
    figure.subplots_adjust(left=left, bottom=0.12, top=0.91 - 0.05 * (len(lines) - 1), right=right)
    return save_png(figure, path, dpi=120)


def save_png(figure: Figure, path: str | os.PathLike, dpi: int) -> Path:
    """Write ``figure`` as a PNG to ``path`` through ``atomic_write`` (parent folders created), so that a reader
    never sees half a plot; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as temporary:
        figure.savefig(temporary, dpi=dpi, format="png")
    return path
