"""The progress bar: frames decoded and encoded, fps and ETA, drawn from a session's counters.

rich is optional: without it :func:`progress_reporter` returns None and the command prints only its
summary line.
"""

from __future__ import annotations

from typing import Any

import anyio

from streamvae import ChunkedVideoMP4Session


class ProgressReporter:
    """Draws the progress bar from a session's counters, a few times a second."""

    def __init__(self, progress: Any, decoded: Any, encoded: Any) -> None:
        self.progress = progress
        self.decoded = decoded
        self.encoded = encoded

    async def run(self, sessions: list[ChunkedVideoMP4Session]) -> None:
        """Redraw until cancelled; ``sessions`` is empty until the decode's session is open."""
        with self.progress:
            while True:
                if sessions:
                    self._update(sessions[0])
                await anyio.sleep(0.1)  # a refresh rate, not a wait for another task

    def _update(self, session: ChunkedVideoMP4Session) -> None:
        self.progress.update(self.decoded, completed=session.frames_pushed)
        self.progress.update(self.encoded, completed=session.frames_encoded)

    def stop(self, session: ChunkedVideoMP4Session) -> None:
        """Draw the final counts (the bar stays on screen)."""
        self._update(session)
        self.progress.refresh()


def progress_reporter(frames: int | None) -> ProgressReporter | None:
    """A bar for a decode of ``frames`` frames per entry (unknown: None), or None without rich."""
    try:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            ProgressColumn,
            Task,
            TextColumn,
            TimeRemainingColumn,
        )
        from rich.text import Text
    except ImportError:  # rich is optional: without it there is only the summary line
        return None

    class FpsColumn(ProgressColumn):
        def render(self, task: Task) -> Text:
            return Text("" if task.speed is None else f"{task.speed:5.1f} fps", style="progress.data.speed")

    progress = Progress(
        TextColumn("{task.description:>13}"),
        BarColumn(),
        MofNCompleteColumn(),
        FpsColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        auto_refresh=True,
        transient=False,
    )
    decoded = progress.add_task("frames decoded", total=frames)
    encoded = progress.add_task("frames encoded", total=frames)
    return ProgressReporter(progress, decoded, encoded)
