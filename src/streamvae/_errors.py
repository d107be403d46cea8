"""The library's own errors, and the one check for integer arguments.

Every error streamvae defines derives from :class:`StreamVAEError`, so ``except StreamVAEError`` catches what
the library itself decided, and leaves PyAV's, torch's and the operating system's errors to their own
handlers. Each also keeps the built-in base it always had (``RuntimeError``), so existing handlers keep
working. A wrong *type* is :class:`ArgumentTypeError`: a ``TypeError`` that is also a ``ValueError``, as
PyAV's own argument errors are, because several checks raised ValueError for a wrong type before.
"""

from __future__ import annotations

__all__ = [
    "ArgumentTypeError",
    "RingAbortedError",
    "SessionClosedError",
    "StreamVAEError",
    "UnreadStreamError",
    "check_int",
]


class StreamVAEError(Exception):
    """Base of every error streamvae defines."""


class ArgumentTypeError(StreamVAEError, TypeError, ValueError):
    """An argument of the wrong type: a TypeError, and a ValueError for code written for older releases."""


class SessionClosedError(StreamVAEError, RuntimeError):
    """The session no longer accepts chunks (finished, aborted, or not entered)."""


class RingAbortedError(StreamVAEError, RuntimeError):
    """The transfer ring was aborted without a more specific error."""


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


def check_int(name: str, value: object, *, minimum: int) -> int:
    """``value`` if it is an int (not a bool) ``>= minimum``, else an error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be an int >= {minimum}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value
