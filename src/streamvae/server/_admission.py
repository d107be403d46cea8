"""Admission: which requests decode now, which wait for a slot, which are turned away — and the counters.

At most ``max_concurrent`` requests hold a decode slot and at most ``max_queued`` wait for one, first come
first served; a request beyond both is turned away at once (the endpoint answers 503), because a client is
better off retrying later than holding a connection in a queue it cannot see. The counters of
:class:`ServerStats` change only here, so ``active + queued`` is always the number of admitted requests
that have not ended. An app's sessions reach them through ``_sessions`` (:class:`AdmittedSession`), which
adds each session's events and latency.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import anyio

#: how an admitted request or session ended: the whole response or generation sent (``completed``), the
#: client's ``session.stop`` (``stopped``, WebSocket only), a reader cut off (``stalled``), the client gone
#: before the end (``disconnected``), or an error (``failed``)
Outcome = Literal["completed", "stopped", "stalled", "disconnected", "failed"]


@dataclass
class ServerStats:
    """Counters of the video endpoints, ``/video.mp4`` and the WebSocket's sessions together (``GET /stats``
    returns them, with ``open_containers`` and ``latency``). Each admitted request ends counted under one
    outcome only."""

    #: decodes running now (each holds a slot)
    active: int = 0
    #: requests waiting for a slot
    queued: int = 0
    #: responses sent to the end, and WebSocket generations sent to their end
    completed: int = 0
    #: WebSocket sessions the client ended with ``session.stop``
    stopped: int = 0
    #: clients that went away before the end (queued or streaming)
    disconnected: int = 0
    #: readers cut off after ``stall_timeout`` seconds without accepting bytes (or, on the WebSocket, a
    #: client silent that long, or without a ``session.start`` in time)
    stalled: int = 0
    #: decodes that failed (the response is cut short, or a 500 before the first byte; on the WebSocket
    #: a refused start or a failed generation)
    failed: int = 0
    #: requests answered 503 because the slots and the queue were full
    rejected: int = 0


class Admission:
    """The slots and the queue of one app; :attr:`stats` counts what they did.

    The slots are made by the first :meth:`try_enter`, on the event loop that serves the app (the app may
    be built outside any loop, or in another one), as every loop-bound object of the app is: a
    ``cached_property``.
    """

    def __init__(self, *, max_concurrent: int, max_queued: int) -> None:
        self.max_concurrent = max_concurrent
        self.max_queued = max_queued
        self.stats = ServerStats()

    @cached_property
    def _slots(self) -> anyio.Semaphore:
        return anyio.Semaphore(self.max_concurrent)  # FIFO: the queue is served in order

    def try_enter(self) -> Ticket | None:
        """Queue a request and return its ticket, or None (counted as rejected) when every slot and queue
        place is taken. It never waits, so no other request can change the count it decided on."""
        if self.stats.active + self.stats.queued >= self.max_concurrent + self.max_queued:
            self.stats.rejected += 1
            return None
        self.stats.queued += 1
        return Ticket(self.stats, self._slots)


class Ticket:
    """One admitted request: queued until :meth:`start` returns, then holding a slot until :meth:`end`."""

    def __init__(self, stats: ServerStats, slots: anyio.Semaphore) -> None:
        self._stats = stats
        self._slots = slots
        self._started = False
        self._ended = False

    async def start(self) -> None:
        """Wait for a slot, in the order the requests came, and take it. Cancelled while waiting, the
        request is still queued and holds no slot."""
        await self._slots.acquire()
        self._started = True  # no await since the acquire: the slot and the counts change together
        self._stats.queued -= 1
        self._stats.active += 1

    def end(self, outcome: Outcome) -> None:
        """Leave the queue, or give the slot back, and count ``outcome``; once per ticket."""
        if self._ended:
            raise RuntimeError("this request has already ended")
        self._ended = True
        if self._started:
            self._stats.active -= 1
            self._slots.release()
        else:
            self._stats.queued -= 1
        setattr(self._stats, outcome, getattr(self._stats, outcome) + 1)
