"""The library's own errors, and the memory-object stream errors that mean "the other end is gone".

Every error streamvae defines is defined here, whichever subpackage users import it from, so one file shows
them all, as httpx's ``_exceptions.py`` does::

    StreamVAEError          streamvae: the base of every error streamvae defines
    ├── SessionClosedError  streamvae (RuntimeError): a session that takes no more chunks
    ├── RingAbortedError    streamvae (RuntimeError): the transfer ring aborted, no cause known
    ├── UnreadStreamError   streamvae (RuntimeError): a reader waits on another entry's unread stream
    ├── NoEncoderError      streamvae (RuntimeError): no rung of an encoder ladder opens
    ├── SigningError        streamvae (RuntimeError): a complete output's Content Credentials failed to sign
    ├── PeerDecodeError     streamvae.distributed (RuntimeError): a peer rank stopped the decode
    ├── ReaderStalledError  streamvae.server (TimeoutError): a reader took nothing for stall_timeout
    └── ViewerCutOffError   streamvae.server (RuntimeError): a broadcast's viewer fell behind its buffer

``except StreamVAEError`` catches what the library itself decided, and leaves PyAV's, torch's and the
operating system's errors to their own handlers. Each also derives from the built-in base that says what
kind of condition it is (``RuntimeError``, ``TimeoutError``). Bad arguments are plain ``ValueError`` /
``TypeError`` (see ``_checks``). ``DecodeAbandoned`` is internal: the decode worker's signal that its caller
was cancelled, never raised to a user. docs/failures.md has the same table, with when each is raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import anyio

from streamvae._public import public

__all__ = [
    "STREAM_ENDED",
    "DecodeAbandoned",
    "NoEncoderError",
    "PeerDecodeError",
    "ReaderStalledError",
    "RingAbortedError",
    "SessionClosedError",
    "SigningError",
    "StreamVAEError",
    "UnreadStreamError",
    "ViewerCutOffError",
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


@public
class NoEncoderError(StreamVAEError, RuntimeError):
    """No encoder of a ladder works on this machine: the error names every rung tried, and why each failed.

    ``kind`` is ``"video"`` (``video_codec="auto"``'s ladder) or ``"audio"`` (AAC, then Opus); ``tried``
    holds ``(encoder, why)`` per rung, in the order tried.
    """

    def __init__(self, kind: str, tried: Sequence[tuple[str, str]]) -> None:
        import av  # here, not at the top: importing the errors loads no PyAV (a command's --help)

        rungs = "; ".join(f"{codec}: {why}" for codec, why in tried)
        super().__init__(
            f"no {kind} encoder works in this PyAV build (FFmpeg {av.ffmpeg_version_info}): tried {rungs}"
        )
        #: ``"video"`` or ``"audio"``
        self.kind = kind
        #: ``(encoder, why it failed)`` per rung, in the order tried
        self.tried = tuple(tried)

    def __reduce__(self) -> tuple[type[NoEncoderError], tuple[str, tuple[tuple[str, str], ...]]]:
        return type(self), (self.kind, self.tried)


@public
class SigningError(StreamVAEError, RuntimeError):
    """A complete output could not be signed with its Content Credentials (``provenance=``): a KMS or HSM
    signer that failed, a certificate that expired since the options were checked.

    Chained to the cause (``__cause__``). Nothing unsigned is given out in its place: an output file keeps
    what its path held before (the signature is made before the file is put in place), and the session
    fails with this as its first cause.
    """


class ReaderStalledError(StreamVAEError, TimeoutError):
    """The reader accepted nothing for ``stall_timeout`` seconds: raised into the decode's block to end it.

    :class:`streamvae.server.MP4Response` and the app's routes catch it themselves (the response ends
    quietly, incomplete, with a warning logged); a block of your own around
    :func:`streamvae.open_latent_stream` sees it pass through, as the cancellation of a client gone, and can
    tell the two apart.
    """

    __module__ = "streamvae.server"  # where users import it from, as @public does for streamvae's names


class PeerDecodeError(StreamVAEError, RuntimeError):
    """Raised on a rank whose peer stopped the decode: every rank stopped at the same boundary.

    The output rank's ``on_chunk`` failed (a failed session, an encoder error), its caller was cancelled or
    its consumer stopped taking chunks; or, in a stream of latent pieces, a rank failed, was cancelled or
    left its stream before the others (then the output rank raises this too). The rank whose failure it
    was raises its own error.
    """

    __module__ = "streamvae.distributed"  # where users import it from, as @public does for streamvae's names

    def __init__(self, message: str, *, chunk: int, output_error: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.chunk = chunk  #: how many chunks had been published when the decode stopped
        self.output_error = output_error  #: "ErrorType: message" of the stopping rank's error (truncated)
        self.rank = rank  #: the group rank that stopped the decode (None: the output rank)


class ViewerCutOffError(StreamVAEError, RuntimeError):
    """A viewer of a :class:`streamvae.server.Broadcast` left more than its buffer of pieces unread, and was
    cut off: its iteration raises this, and the generation and the other viewers go on without it.

    A viewer that reads one continuous MP4 cannot skip ahead (a gap stalls a Media Source player), so a
    slow one ends cleanly instead of slowing everyone; a client can join again, at the newest keyframe.
    """

    __module__ = "streamvae.server"  # where users import it from, as @public does for streamvae's names

    def __init__(self, buffer: int) -> None:
        super().__init__(
            f"this viewer left more than its buffer of {buffer} pieces unread and was cut off; the "
            "generation went on without it"
        )
        self.buffer = buffer  #: the pieces the viewer could leave unread

    def __reduce__(self) -> tuple[type[ViewerCutOffError], tuple[int]]:
        return type(self), (self.buffer,)
