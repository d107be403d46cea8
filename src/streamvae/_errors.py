"""The library's own errors, and the memory-object stream errors that mean "the other end is gone".

Every error streamvae defines derives from :class:`StreamVAEError`, so ``except StreamVAEError`` catches what
the library itself decided, and leaves PyAV's, torch's and the operating system's errors to their own
handlers. Each also derives from the built-in base that says what kind of condition it is
(``RuntimeError``). Bad arguments are plain ``ValueError`` / ``TypeError`` (see ``_checks``).
"""

from __future__ import annotations

import asyncio

import anyio

from streamvae._public import public

__all__ = [
    "STREAM_ENDED",
    "DecodeAbandoned",
    "RingAbortedError",
    "SessionClosedError",
    "StreamVAEError",
    "UnreadStreamError",
    "describe_first_cause",
]


def describe_first_cause(error: BaseException) -> str:
    """``"Type: message"`` of what started ``error``: a :class:`SessionClosedError` raised because its
    session was closed by another error (the caller's own exception leaving the block, a cancellation), or
    a decode abandoned because its caller was cancelled, names that error, never itself — the secondary
    error is not the one to report."""
    while isinstance(error, SessionClosedError | DecodeAbandoned) and error.__cause__ is not None:
        error = error.__cause__
    if _is_cancellation(error):  # trio's says nothing, asyncio's a cancel scope's id: say what it was
        return f"{type(error).__name__}: cancelled"
    return f"{type(error).__name__}: {error}"


def _is_cancellation(error: BaseException) -> bool:
    """Whether ``error`` is asyncio's or trio's cancellation (read off a worker thread: no backend call)."""
    if isinstance(error, asyncio.CancelledError):
        return True
    cls = type(error)
    return cls.__module__.split(".")[0] == "trio" and cls.__name__ == "Cancelled"


#: What a memory-object stream raises once its other end is gone: a neighbouring stage (or a reader, or
#: the producer) ended first. Whatever made it end is recorded where it happened, or was no failure at all.
STREAM_ENDED = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)


class DecodeAbandoned(Exception):
    """Raised in the decode worker when its caller was cancelled, so the decode stops publishing (chained
    to the cancellation: ``__cause__``)."""


@public
class StreamVAEError(Exception):
    """Base of every error streamvae defines."""


@public
class SessionClosedError(StreamVAEError, RuntimeError):
    """The session no longer accepts chunks (finished, aborted, or not entered)."""


@public
class RingAbortedError(StreamVAEError, RuntimeError):
    """The transfer ring was aborted without a more specific error."""


@public
class UnreadStreamError(StreamVAEError, RuntimeError):
    """A reader waits for an entry's bytes that cannot come, because another entry's stream is unread.

    The entries of a session share one pipeline: while one entry's bounded buffer is full and nobody reads
    it, no entry gets new frames. Read every entry at once — with :func:`streamvae.read_entries`, or one
    task per stream — instead of one after the other.
    """

    def __init__(self, waiting: int, unread: int) -> None:
        super().__init__(
            f"entry {waiting}'s reader waits for bytes that cannot come: entry {unread}'s stream is full and "
            f"nobody has read it, which stops the pipeline every entry shares. Read the entries at once, "
            f"with `async for entry, data in streamvae.read_entries(streams)` or one task per stream"
        )
        #: the entry whose reader was waiting
        self.waiting = waiting
        #: the entry whose full, unread stream stopped the pipeline
        self.unread = unread

    def __reduce__(self) -> tuple[type[UnreadStreamError], tuple[int, int]]:
        return type(self), (self.waiting, self.unread)
