"""The latency numbers of the video endpoint: a log line per request, and their summary in ``/stats``.

Each request's session reports its :class:`streamvae.SessionStatistics` when the response ends; the
completed ones of the last :data:`WINDOW` requests are summarized, so ``/stats`` shows what viewers wait
for now, not an average since the server started. WebSocket sessions also report their control-to-photon
latencies: from each interaction the server read to the first binary frame that reflects it; the last
:data:`INTERACTION_WINDOW` are summarized.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from collections.abc import Sequence
from typing import Any

from streamvae._statistics import SessionStatistics

__all__ = ["INTERACTION_WINDOW", "WINDOW", "LatencyWindow"]

logger = logging.getLogger("streamvae.server")

#: completed requests whose latency ``/stats`` summarizes
WINDOW = 100
#: interactions whose control-to-photon latency ``/stats`` summarizes
INTERACTION_WINDOW = 1000


class LatencyWindow:
    """The statistics of the last :data:`WINDOW` completed requests."""

    def __init__(self, size: int = WINDOW) -> None:
        self._recent: deque[SessionStatistics] = deque(maxlen=size)
        self._control: deque[float] = deque(maxlen=INTERACTION_WINDOW)

    def record(
        self,
        number: int,
        request: object,
        outcome: str,
        stats: SessionStatistics | None,
        control_to_photon: Sequence[float] = (),
    ) -> None:
        """Log one request's numbers (info) and keep them if its response was sent to the end (or its
        WebSocket session ran until the client stopped it); keep its control-to-photon latencies."""
        self._control.extend(control_to_photon)
        if stats is None:  # it ended before its session began
            logger.info("request %d %s %s before its decode began", number, request, outcome)
            return
        logger.info(
            "request %d %s %s: first push after %s, first fragment after %s, chunk latency median %s max %s "
            "over %d of %d chunks, %d frames, %d bytes, control to photon %s",
            number,
            request,
            outcome,
            _seconds(stats.time_to_first_push),
            _seconds(stats.time_to_first_fragment),
            _seconds(stats.chunk_latency_median),
            _seconds(stats.chunk_latency_max),
            stats.chunks_out,
            stats.chunks_pushed,
            stats.frames_encoded,
            stats.bytes_out,
            ", ".join(_seconds(value) for value in control_to_photon) or "-",
        )
        if outcome in ("completed", "stopped"):
            self._recent.append(stats)

    def summary(self) -> dict[str, Any]:
        """``/stats``' ``latency``: seconds, medians and maxima over the requests kept (None without any)."""
        first = [s.time_to_first_fragment for s in self._recent if s.time_to_first_fragment is not None]
        medians = [s.chunk_latency_median for s in self._recent if s.chunk_latency_median is not None]
        longest = [s.chunk_latency_max for s in self._recent if s.chunk_latency_max is not None]
        return {
            "requests": len(self._recent),
            "first_fragment_median": statistics.median(first) if first else None,
            "first_fragment_max": max(first, default=None),
            "chunk_latency_median": statistics.median(medians) if medians else None,
            "chunk_latency_max": max(longest, default=None),
        }

    def control_to_photon(self) -> dict[str, Any]:
        """``/stats``' ``control_to_photon_seconds``: the median and longest over the interactions kept
        (None without any), and how many."""
        return {
            "median": statistics.median(self._control) if self._control else None,
            "max": max(self._control, default=None),
            "interactions": len(self._control),
        }


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"
