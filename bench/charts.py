"""Charts for ``make bench``, drawn with matplotlib (a development dependency, never a runtime one).

:func:`line_plot` and :func:`bar_groups` render one chart to PNG bytes with the Agg backend on its own figure (no pyplot, no
global state, no display needed). Guarantee: the same data gives byte-identical files — the PNG carries no
timestamp and no software-version metadata, so regenerating the charts only changes them when the numbers
change.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

#: Output size in pixels (width, height) at :data:`_DPI`.
_SIZE = (720, 440)
_DPI = 100


@dataclass(frozen=True)
class Series:
    """One line: ``(x, y)`` points in x order, drawn dashed when ``dashed``."""

    label: str
    points: Sequence[tuple[float, float]]
    dashed: bool = False


def line_plot(
    title: str,
    x_label: str,
    y_label: str,
    series: Sequence[Series],
    *,
    log_x: bool = False,
    log_y: bool = False,
    y_min: float | None = None,
) -> bytes:
    """A PNG line chart of ``series`` (x values > 0 when ``log_x``, y values > 0 when ``log_y``)."""
    figure = Figure(figsize=(_SIZE[0] / _DPI, _SIZE[1] / _DPI), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(figure)  # attaches itself to the figure: savefig renders through Agg
    axes = figure.add_subplot()
    for one in series:
        axes.plot(
            [x for x, _ in one.points],
            [y for _, y in one.points],
            marker="o",
            markersize=4,
            linewidth=2,
            linestyle="--" if one.dashed else "-",
            label=one.label,
        )
    if log_x:
        axes.set_xscale("log")
    if log_y:
        axes.set_yscale("log")
    if y_min is not None:
        axes.set_ylim(bottom=y_min)
    axes.set_title(title)
    axes.set_xlabel(x_label)
    axes.set_ylabel(y_label)
    axes.grid(True, which="major", color="#c8c8c8", linewidth=0.8)
    axes.legend(fontsize="small")
    out = io.BytesIO()
    # No "Software" entry (it names the matplotlib version) and no timestamp: reproducible bytes.
    figure.savefig(out, format="png", metadata={"Software": None})
    return out.getvalue()


def bar_groups(title: str, y_label: str, groups: Sequence[tuple[str, Sequence[tuple[str, float]]]]) -> bytes:
    """A PNG chart of labelled bars in groups (``(group, [(bar label, value), ...])``), each bar labelled
    with its value; a bar label names the same colour in every group."""
    figure = Figure(figsize=(_SIZE[0] / _DPI, _SIZE[1] / _DPI), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    labels = list(dict.fromkeys(label for _, bars in groups for label, _ in bars))
    width = 0.8 / max(1, len(labels))
    for index, label in enumerate(labels):
        xs, ys = [], []
        for position, (_, bars) in enumerate(groups):
            for bar_label, value in bars:
                if bar_label == label:
                    xs.append(position + (index - (len(labels) - 1) / 2) * width)
                    ys.append(value)
        drawn = axes.bar(xs, ys, width * 0.95, label=label)
        axes.bar_label(drawn, fmt="%.0f", fontsize="small")
    axes.set_xticks(range(len(groups)), [group for group, _ in groups])
    axes.set_title(title)
    axes.set_ylabel(y_label)
    axes.grid(True, axis="y", color="#c8c8c8", linewidth=0.8)
    axes.legend(fontsize="small")
    out = io.BytesIO()
    figure.savefig(out, format="png", metadata={"Software": None})
    return out.getvalue()
