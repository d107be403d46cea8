"""Shared by the benchmarks: write a section of docs/benchmarks.md between markers, keeping the others; the
head of the markdown tables in it, and the stacked bars and labelled panels of the plots beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent.parent / "docs"
BENCHMARKS = DOCS / "benchmarks.md"
_HEADER = (
    "# Benchmarks\n\n"
    "Each section is written by a script under `bench/` (the command is in the section). Timings on the\n"
    "2-core CPU development machines are noisy, so the figures that matter are ratios measured side by\n"
    "side in one run.\n"
)


def write_section(name: str, body: str) -> Path:
    """Replace (or append) the section ``name`` of docs/benchmarks.md with ``body``."""
    DOCS.mkdir(exist_ok=True)
    text = BENCHMARKS.read_text() if BENCHMARKS.exists() else _HEADER
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    block = f"{begin}\n{body.strip()}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    BENCHMARKS.write_text(text)
    return BENCHMARKS


def table_head(columns: str) -> list[str]:
    """A markdown table's first two lines: ``columns`` (their names between " | "), then the line that makes
    it a table."""
    return [f"| {columns} |", "|" + "---|" * len(columns.split(" | "))]


def stacked_bars(
    ax: Any,
    xs: list[float],
    base: list[float],
    top: list[float],
    width: float,
    labels: list[str],
    **style: Any,
) -> None:
    """On matplotlib's ``ax``: pale bars up to ``base``, then bars from ``base`` up to ``top`` in ``style``
    (its ``color`` and ``label``), each labelled with ``labels``."""
    ax.bar(xs, base, width, color=style["color"], alpha=0.35)
    bars = ax.bar(xs, [t - b for t, b in zip(top, base, strict=True)], width, bottom=base, **style)
    ax.bar_label(bars, labels=labels, fontsize=7)


def label_panel(ax: Any, ylabel: str, title: str, ticks: list[str]) -> None:
    """Name a panel of bars, one a case (``ticks``), and grid it as every benchmark plot does."""
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_xticks(range(len(ticks)), ticks, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
