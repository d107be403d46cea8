"""The app's sessions, ``/video.mp4`` requests and WebSocket sessions alike: what each asked for, and one
object per admitted session that owns its admission, its outcome, its events and its latency.

:class:`Sessions` is what an app keeps of all of them: the admission (slots, queue, counters), the latency
window and the ``on_event`` callback. :meth:`Sessions.enter` numbers a new session and queues it, or turns
it away; the :class:`AdmittedSession` it returns then takes a slot (:meth:`AdmittedSession.start`) and, once
its decode has stopped, counts its one outcome, records its latency and sends its last event
(:meth:`AdmittedSession.end`). The two transports differ only in what they tell the client.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from streamvae._statistics import SessionStatistics
from streamvae.server._admission import Admission, Outcome, Ticket
from streamvae.server._latency import LatencyWindow

__all__ = ["AdmittedSession", "EventKind", "ServerEvent", "Sessions", "VideoRequest"]


@dataclass(frozen=True)
class VideoRequest:
    """What a client asked for in ``/video.mp4``'s query string."""

    frames: int
    size: int
    seed: int
    #: feed the latent to the decode one latent frame a step, as an autoregressive model would
    realtime: bool = False
    #: seconds each real-time step takes (0 … 2)
    delay: float = 0.0
    #: real-time mode: ask the generator for its sound too (the stand-in's tone)
    audio: bool = False


EventKind = Literal[
    "queued", "started", "completed", "stopped", "disconnected", "stalled", "failed", "rejected"
]


@dataclass(frozen=True)
class ServerEvent:
    """One step of one request's or WebSocket session's life, for ``on_event`` (metrics, logs, tests).

    ``queued`` → ``started`` (it holds a slot) → exactly one of ``completed``, ``stopped`` (the client's
    ``session.stop``), ``disconnected``, ``stalled``, ``failed``; or ``rejected`` alone. An ending event is
    sent once the request's decode has stopped and its session is closed.
    """

    kind: EventKind
    #: what ``/video.mp4`` was asked for; None for a WebSocket session
    request: VideoRequest | None
    #: the request's number, counted from 1 per app (``/video.mp4`` and WebSocket sessions together)
    number: int
    #: the WebSocket session's ``request_id`` (None for ``/video.mp4``)
    request_id: str | None = None


class Sessions:
    """What one app keeps of its sessions: :attr:`admission` (with its counters), :attr:`latency`, the
    sessions' numbers and ``on_event``."""

    def __init__(
        self,
        *,
        max_concurrent: int,
        max_queued: int,
        retry_after: int,
        on_event: Callable[[ServerEvent], None] | None,
    ) -> None:
        self.admission = Admission(max_concurrent=max_concurrent, max_queued=max_queued)
        self.latency = LatencyWindow()
        #: seconds a refused client is told to wait (``Retry-After``)
        self.retry_after = retry_after
        self._on_event = on_event
        self._entered = 0  # sessions numbered so far

    def enter(self, request: VideoRequest | None, request_id: str | None = None) -> AdmittedSession | None:
        """Number a new session and queue it, or None (counted and told as rejected) when every slot and
        queue place is taken."""
        self._entered += 1
        ticket = self.admission.try_enter()
        if ticket is None:
            self.emit(ServerEvent("rejected", request, self._entered, request_id))
            return None
        session = AdmittedSession(self, ticket, self._entered, request, request_id)
        session.emit("queued")
        return session

    def emit(self, event: ServerEvent) -> None:
        """Hand ``event`` to ``on_event``, if the app was given one."""
        if self._on_event is not None:
            self._on_event(event)


@dataclass(eq=False)
class AdmittedSession:
    """One admitted session: queued, then holding a slot from :meth:`start`, until :meth:`end`."""

    _sessions: Sessions
    _ticket: Ticket
    #: its number, counted from 1 per app
    number: int
    #: what ``/video.mp4`` was asked for; None for a WebSocket session
    request: VideoRequest | None
    #: the WebSocket session's ``request_id`` (None for ``/video.mp4``)
    request_id: str | None

    async def start(self) -> None:
        """Wait for a decode slot, in the order the sessions came, and take it."""
        await self._ticket.start()
        self.emit("started")

    def end(
        self,
        outcome: Outcome,
        statistics: SessionStatistics | None,
        control_to_photon: Sequence[float] = (),
    ) -> None:
        """The session has ended, its decode stopped and its MP4 session closed: count ``outcome``, record
        the latency numbers and send the ending event; once."""
        self._ticket.end(outcome)
        described = self.request if self.request is not None else self.request_id
        self._sessions.latency.record(self.number, described, outcome, statistics, control_to_photon)
        self.emit(outcome)

    def emit(self, kind: EventKind) -> None:
        """Tell the app's ``on_event`` this session's step ``kind``."""
        self._sessions.emit(ServerEvent(kind, self.request, self.number, self.request_id))
