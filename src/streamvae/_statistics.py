"""A session's latency numbers: counters the session and its encode stage update, a frozen snapshot out.

A chunk has *left* once, for every batch entry, the bytes holding its last frame were handed to the
entry's sink (kept for ``finish``, sent to its :class:`streamvae.MP4ByteStream`, written to its file).
That is what a viewer waits for; bytes that hold no frame yet (a header) show nothing.
"""

from __future__ import annotations

import statistics
import time
from array import array
from collections import deque
from dataclasses import dataclass

from streamvae._public import public

__all__ = ["LatencyRecorder", "SessionStatistics"]


@public
@dataclass(frozen=True)
class SessionStatistics:
    """A snapshot of :meth:`streamvae.ChunkedVideoMP4Session.statistics`: what the session has done and
    how long its frames took to leave. Times are seconds of ``time.perf_counter``.

    For ``output="fragmented"`` a chunk leaves when the fragment holding its last frame is written (no
    later than the next chunk's first frame is encoded, with the default ``fragment_frames``); a plain MP4
    leaves whole at ``finish``.
    """

    #: seconds from entering the session to the first push (None before it)
    time_to_first_push: float | None
    #: seconds from entering the session to the first bytes holding a frame (a fragmented MP4's first
    #: ``moof``, a plain MP4's whole file) handed on for every entry (None before)
    time_to_first_fragment: float | None
    #: chunks pushed
    chunks_pushed: int
    #: chunks that have left (every entry has handed on the bytes of their last frame)
    chunks_out: int
    #: median seconds from a chunk's push to its leaving, over the chunks that have left (None before)
    chunk_latency_median: float | None
    #: the longest such time (None before any chunk has left)
    chunk_latency_max: float | None
    #: frames (per entry) pushed
    frames_pushed: int
    #: frames every entry's encoder has taken
    frames_encoded: int
    #: MP4 bytes produced, all entries together
    bytes_out: int
    #: the FFmpeg name of the video encoder every entry opened (``"libx264"``; under ``video_codec="auto"``
    #: the rung that opened: ``"libsvtav1"``, ...), once the first push's encoder opened (None before)
    encoder_name: str | None = None


class LatencyRecorder:
    """The mutable side: the session records entering and each push, the encode stage each handing-on.

    Used on the event loop's thread only. One float a chunk is kept (the median needs them all): 8 bytes,
    115 KB an hour of 4-frame chunks at 16 fps.
    """

    def __init__(self) -> None:
        self._entered: float | None = None
        self._first_push: float | None = None
        self._first_out: float | None = None
        self._frames_pushed = 0
        self._chunks_pushed = 0
        self._waiting: deque[tuple[int, float]] = deque()  # (frames through the chunk, its push time)
        self._out: list[int] = []  # frames handed on, per entry
        self._latencies = array("d")

    def entered(self) -> None:
        self._entered = time.perf_counter()

    def pushed(self, frames: int) -> None:
        """A chunk of ``frames`` frames was pushed (called once it is checked, before it is queued)."""
        now = time.perf_counter()
        if self._first_push is None:
            self._first_push = now
        self._frames_pushed += frames
        self._chunks_pushed += 1
        self._waiting.append((self._frames_pushed, now))

    def started(self, entries: int) -> None:
        self._out = [0] * entries

    def handed_on(self, entry: int, frames_out: int) -> None:
        """Entry ``entry``'s sink now holds bytes with its first ``frames_out`` frames."""
        self._out[entry] = frames_out
        out = min(self._out)
        if not out:
            return
        now = time.perf_counter()
        if self._first_out is None:
            self._first_out = now
        while self._waiting and self._waiting[0][0] <= out:
            self._latencies.append(now - self._waiting.popleft()[1])

    def snapshot(
        self, *, frames_pushed: int, frames_encoded: int, bytes_out: int, encoder_name: str | None
    ) -> SessionStatistics:
        latencies = self._latencies
        return SessionStatistics(
            time_to_first_push=self._since_entered(self._first_push),
            time_to_first_fragment=self._since_entered(self._first_out),
            chunks_pushed=self._chunks_pushed,
            chunks_out=len(latencies),
            chunk_latency_median=statistics.median(latencies) if latencies else None,
            chunk_latency_max=max(latencies) if latencies else None,
            frames_pushed=frames_pushed,
            frames_encoded=frames_encoded,
            bytes_out=bytes_out,
            encoder_name=encoder_name,
        )

    def _since_entered(self, moment: float | None) -> float | None:
        if moment is None or self._entered is None:
            return None
        return moment - self._entered
