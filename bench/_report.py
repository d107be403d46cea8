"""Shared by the benchmarks: write a section of docs/benchmarks.md between markers, keeping the others."""

from __future__ import annotations

from pathlib import Path

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
