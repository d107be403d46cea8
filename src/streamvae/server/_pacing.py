"""Media-time pacing: each fragment leaves when its viewer is about to play it, not as soon as it is made.

A generation faster than real time would otherwise run ahead of the viewer: the viewer watches second 4
while the generator is at second 10, and an input the client sends now (a new prompt, a stop) lands six
seconds of finished video too late. :class:`MediaTimePacer` holds each fragment until its media time, so
the gap never opens; a generation slower than real time is never held, so pacing costs a struggling
session nothing. The rules are those of vllm-omni's ``MediaTimePacer``, whose clients expect them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from fractions import Fraction

import anyio

from streamvae._checks import check_callable, check_fps, check_int, check_seconds

__all__ = ["MediaTimePacer", "PacerStatistics"]

_OWNER = "MediaTimePacer"


@dataclass(frozen=True)
class PacerStatistics:
    """A snapshot of a :class:`MediaTimePacer`'s counters (:meth:`MediaTimePacer.statistics`)."""

    fragments: int  # fragments scheduled (every call of delay_for or wait)
    frames: int  # frames in those fragments
    held: int  # fragments that were given a wait (they were early)
    seconds_held: float  # the waits given, added up
    rebases: int  # times the schedule was re-based after falling behind by more than max_lag


class MediaTimePacer:
    """The release schedule of one stream's fragments, on the timeline a viewer plays them at.

    Call :meth:`wait` (or :meth:`delay_for`, and sleep yourself) once per fragment, just before sending
    it, with the frames the fragment holds. The rules:

    - The first fragment is never held: the viewer's clock starts when it gets something to watch, not
      when the generation was asked for. It is the schedule's origin.
    - A later fragment leaves no earlier than its media time (the frames sent before it, since the
      origin, divided by ``fps``, after the origin was sent) minus ``lead`` seconds. ``lead`` 0 sends each
      fragment just in time, so a client's buffer runs down between arrivals; a client without its own
      jitter buffer wants a fragment or two of lead.
    - A fragment that is already late leaves at once: a generation slower than real time is never
      delayed.
    - A fragment late by more than ``max_lag`` seconds becomes the new origin. Without it a session that
      stalled would owe a debt against the old origin and pay it back as a burst of fragments, which is
      what pacing exists to prevent; within ``max_lag`` the schedule keeps its origin, so a short hiccup
      is caught up. ``math.inf`` never re-bases.

    ``clock`` (seconds, monotonic) and ``sleep`` are injectable for tests; they default to
    :func:`time.monotonic` and :func:`anyio.sleep`. A pacer holds one stream's origin: make one per
    stream, and call it from one task. ``wait`` is a cancellation point; a cancelled wait has already
    counted its fragment (the schedule of later fragments stays right whether or not it is sent).
    """

    def __init__(
        self,
        fps: float | Fraction,
        *,
        lead: float = 0.0,
        max_lag: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = anyio.sleep,
    ) -> None:
        #: frames per second of the media the fragments hold
        self.fps = check_fps(fps, owner=_OWNER)
        #: seconds before its media time that a fragment may leave
        self.lead = check_seconds("lead", lead, owner=_OWNER, zero=True)
        #: seconds behind schedule after which the schedule is re-based
        self.max_lag = check_seconds("max_lag", max_lag, owner=_OWNER, zero=True, infinite=True)
        for name, function in (("clock", clock), ("sleep", sleep)):
            if function is None:
                raise TypeError(f"{_OWNER}: {name} must be a callable, got None")
            check_callable(name, function, owner=_OWNER)
        self._clock = clock
        self._sleep = sleep
        self._seconds_per_frame = 1 / float(self.fps)
        self._origin: float | None = None  # clock time the origin fragment was released
        self._frames = 0  # frames released since (and including) the origin fragment
        self._fragments = self._held = self._rebases = self._frames_total = 0
        self._seconds_held = 0.0

    def statistics(self) -> PacerStatistics:
        """The pacer's counters now."""
        counts = (self._fragments, self._frames_total, self._held, self._seconds_held, self._rebases)
        return PacerStatistics(*counts)  # in the order of its fields

    def delay_for(self, frames: int) -> float:
        """Seconds to hold the next fragment, of ``frames`` frames (≥ 0), before sending it.

        Counts the fragment as released at the end of that delay: call it once per fragment, right
        before the wait. A caller that does not honour the delay still gets a right schedule for the
        fragments after it (they are timed against the media, not against when this one left).
        """
        check_int("frames", frames, minimum=0, owner=f"{_OWNER}.delay_for")
        now = self._clock()
        delay = 0.0
        if self._origin is None:
            self._origin, self._frames = now, frames
        else:
            due = self._origin + self._frames * self._seconds_per_frame - self.lead
            if due > now:
                delay = due - now
            elif now - due > self.max_lag:
                # This fragment becomes the origin: the debt is written off instead of paid in a burst.
                self._origin, self._frames = now, 0
                self._rebases += 1
            self._frames += frames
        self._fragments += 1
        self._frames_total += frames
        if delay > 0:
            self._held += 1
            self._seconds_held += delay
        return delay

    async def wait(self, frames: int) -> None:
        """Wait until the next fragment, of ``frames`` frames, may be sent (see :meth:`delay_for`)."""
        delay = self.delay_for(frames)
        if delay > 0:
            await self._sleep(delay)
