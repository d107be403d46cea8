"""``MP4Response``: a Starlette response that streams one entry of a decode, and lives exactly as long as it.

The endpoint a user writes first is wrong: ``async with stream_mp4(...) as (video,): return
StreamingResponse(video)`` leaves the block — and so aborts the session — before the server sends a byte,
and the client gets a 200 with an empty body. :class:`MP4Response` takes the context manager before it is
entered and enters it when the server sends the response, so the decode starts with the response and ends
with it. On the way it keeps the promises a video endpoint owes its clients:

- the status line waits for the first bytes, so a decode that fails before them is an error status
  (500, or the status of a Starlette ``HTTPException`` the block raised: 503, 400, ...), never a 200;
- a failure after them aborts the body (the server closes the connection without its last message), so
  the client sees an incomplete response, never a 200 that looks complete;
- a client that disconnects cancels the decode, and so does a reader that accepts nothing for
  ``stall_timeout`` seconds: otherwise one stalled client would hold the accelerator as long as it likes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio
import anyio.lowlevel
from starlette.exceptions import HTTPException
from starlette.responses import PlainTextResponse, Response
from starlette.types import Message, Receive, Scope, Send

from streamvae._checks import check_int, check_seconds
from streamvae._errors import ReaderStalledError
from streamvae._sinks import MP4ByteStream, read_entries
from streamvae.server._broadcast import Broadcast
from streamvae.server._pacing import MediaTimePacer

__all__ = ["MP4Response"]

logger = logging.getLogger("streamvae.server")


class MP4Response(Response):
    """Stream one entry of a decode as ``video/mp4``: ``return MP4Response(stream_mp4(vae, z, fps=16))``.

    ``streams`` is the async context manager of the decode, *not yet entered*: :func:`streamvae.stream_mp4`,
    :func:`streamvae.pipelines.stream_generation`, or your own around :func:`streamvae.open_latent_stream`,
    yielding a sequence of :class:`streamvae.MP4ByteStream` or one stream. The response enters it when
    it is sent, so the decode lives exactly as long as the response; a response that is never sent never
    starts one. With several entries it sends the one whose ``MP4ByteStream.entry`` is ``entry`` and
    reads and discards the others meanwhile: the entries share one pipeline, which an unread entry would
    stop (a single stream is sent whatever its entry).

    - The status line (``status_code``, ``headers``) goes out with the first bytes, whose init segment
      names the codecs: the ``Content-Type`` is ``video/mp4; codecs="avc1.64001f, mp4a.40.2"`` with the
      RFC 6381 string of what was encoded (``av01.0.04M.08, opus`` where the ladder chose AV1 and Opus),
      so a client can ask ``MediaSource.isTypeSupported`` before it appends a byte; a ``content-type`` in
      ``headers`` is sent as given. An error before them
      is answered with a short plain-text status instead: a Starlette ``HTTPException`` raised by the
      block with its own status, detail and headers (how an app says 503 or 400), anything else a 500
      whose traceback is logged (logger ``streamvae.server``), never sent.
    - The response's last message goes out only once the block has ended cleanly (its session closed,
      every byte delivered). An error before that — after the first bytes — is raised, once the block has
      ended, without that message: the server closes the connection and the client sees an incomplete
      body.
    - An ``http.disconnect`` cancels the block (and so the decode); so does a send that does not complete
      within ``stall_timeout`` seconds, which raises :class:`streamvae.server.ReaderStalledError` into the
      block and is logged as a warning. Both end the response quietly: it is incomplete, and the server
      closes it.

    ``pacer``: a :class:`streamvae.server.MediaTimePacer` (opt-in) holds each piece until its media time
    (the first is never held, a slow decode never delayed); without one each piece leaves as soon as it
    is written.

    ``broadcast``: a :class:`streamvae.server.Broadcast` that gets each piece of the entry just before
    this client does (publishing never waits on a viewer), so any number of viewers watch what this
    response sends. This client owns the generation: when the response ends the broadcast ends too,
    with the decode's error if it failed, else cleanly (sent to the end, the client left or stalled),
    unless its owner ended it first.

    A Starlette ``Response`` subclass, so FastAPI passes it through unchanged; its ``background`` task,
    if any, runs after a response sent to the end. Every argument is checked here: a bad value is a
    ValueError, a ``streams`` that is no async context manager a TypeError, each naming MP4Response.
    """

    media_type = "video/mp4"

    def __init__(
        self,
        streams: AbstractAsyncContextManager[Sequence[MP4ByteStream] | MP4ByteStream],
        /,
        *,
        entry: int = 0,
        stall_timeout: float = 30.0,
        headers: Mapping[str, str] | None = None,
        status_code: int = 200,
        pacer: MediaTimePacer | None = None,
        broadcast: Broadcast | None = None,
    ) -> None:
        owner = "MP4Response"
        _check_streams(streams)
        check_int("entry", entry, minimum=0, owner=owner)
        check_seconds("stall_timeout", stall_timeout, owner=owner)
        check_int("status_code", status_code, minimum=200, maximum=299, owner=owner)
        _check_headers(headers)
        if pacer is not None and not isinstance(pacer, MediaTimePacer):
            raise TypeError(
                f"{owner}: pacer must be a streamvae.server.MediaTimePacer or None, got {pacer!r}"
            )
        if broadcast is not None and not isinstance(broadcast, Broadcast):
            raise TypeError(
                f"{owner}: broadcast must be a streamvae.server.Broadcast or None, got {broadcast!r}"
            )
        self.status_code = status_code
        self._pacer = pacer
        self._broadcast = broadcast
        self.background = None
        self.init_headers(headers)
        self._content_type_given = any(name.lower() == "content-type" for name in headers or {})
        self._streams = streams
        self._entry = entry
        self._stall_timeout = stall_timeout
        self._scope: anyio.CancelScope | None = None  # the response's, while it is being sent
        self._finishing = False  # the last message is on its way: a disconnect no longer cancels anything

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._scope is not None:
            raise RuntimeError("MP4Response: a response is sent once (it owns its decode)")
        failure: Exception | None = None
        complete = False
        try:
            async with anyio.create_task_group() as group:
                self._scope = group.cancel_scope
                group.start_soon(self._cancel_on_disconnect, receive)
                try:
                    complete = await self._respond(scope, send)
                except ReaderStalledError:
                    logger.warning("cut off a reader that accepted nothing for %s s", self._stall_timeout)
                except Exception as error:  # raised below: a task group would wrap it in a group
                    failure = error
                group.cancel_scope.cancel()  # the response is over: stop watching for a disconnect
        finally:
            if self._broadcast is not None and self._broadcast.state == "live":
                self._broadcast.end(failure)  # the owner's end is every viewer's, however it ends
        if failure is not None:
            raise failure
        if complete and self.background is not None:
            await self.background()

    async def _respond(self, scope: Scope, send: Send) -> bool:
        """Send the entry's MP4, or an error status if the block fails before its first bytes; True once
        the whole response is sent."""
        started = False
        try:
            async with self._streams as yielded:
                streams = _entry_streams(yielded, self._entry)
                async for entry, piece in read_entries(streams, pieces=True):
                    if entry != streams[0].entry:
                        continue  # another entry's bytes, read to keep the shared pipeline moving
                    if self._pacer is not None:
                        await self._pacer.wait(piece.frames)  # the frames the encoder counted in it
                    data = piece.data
                    if self._broadcast is not None:
                        self._broadcast.publish(piece)
                    if not started:
                        # Headers go with the first bytes, so a decode that fails at once is still an error
                        # (and the first piece holds the moov, which names the codecs).
                        await self._send(send, self._start(piece.codecs))
                        started = True
                    await self._send(send, {"type": "http.response.body", "body": data, "more_body": True})
        except ReaderStalledError:
            raise
        except Exception as error:
            if started:
                raise
            await self._error_response(error)(scope, _no_receive, self._guarded(send))
            return True
        # The block has ended cleanly — its session closed, nothing undelivered — before the body does:
        # a failure up to here leaves the body incomplete, and whoever owns the block has counted it.
        if not started:
            await self._send(send, self._start())
        self._finishing = True
        await self._send(send, {"type": "http.response.body", "body": b"", "more_body": False})
        return True

    def _start(self, codecs: str | None = None) -> Message:
        headers = self.raw_headers
        if codecs is not None and not self._content_type_given:
            typed = f'{self.media_type}; codecs="{codecs}"'.encode("latin-1")
            headers = [(name, typed if name == b"content-type" else value) for name, value in headers]
        return {"type": "http.response.start", "status": self.status_code, "headers": headers}

    @staticmethod
    def _error_response(error: Exception) -> Response:
        if isinstance(error, HTTPException):
            return PlainTextResponse(
                f"{error.detail}\n", status_code=error.status_code, headers=error.headers
            )
        logger.error("MP4Response: the decode failed before its first bytes", exc_info=error)
        return PlainTextResponse("the decode failed\n", status_code=500)

    def _guarded(self, send: Send) -> Send:
        async def guarded(message: Message) -> None:
            await self._send(send, message)

        return guarded

    async def _send(self, send: Send, message: Message) -> None:
        # A send waits while the client's TCP window is full: that wait is what a stalled reader costs.
        try:
            with anyio.fail_after(self._stall_timeout):
                await send(message)
        except TimeoutError:
            raise ReaderStalledError(
                f"the reader accepted nothing for {self._stall_timeout} s: cut off"
            ) from None
        except OSError:  # an ASGI 2.4 server's way to say that the client has gone: a disconnect
            assert self._scope is not None
            self._scope.cancel()
            await anyio.lowlevel.checkpoint()
            raise

    async def _cancel_on_disconnect(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass  # the request's body: not the response's to read
        if not self._finishing:
            assert self._scope is not None
            self._scope.cancel()


def _check_streams(streams: object) -> None:
    """A TypeError naming MP4Response unless ``streams`` is an async context manager (not yet entered)."""
    if isinstance(streams, AbstractAsyncContextManager):
        return
    shown = type(streams).__name__
    if isinstance(streams, MP4ByteStream) or (
        isinstance(streams, Sequence) and any(isinstance(item, MP4ByteStream) for item in streams)
    ):
        raise TypeError(
            f"MP4Response takes the context manager that yields the streams, before it is entered: "
            f"`return MP4Response(stream_mp4(vae, z, fps=16))`, not a {shown} from inside `async with` "
            f"(leaving the block ends the decode before the response is sent), got {shown}"
        )
    raise TypeError(
        f"MP4Response takes an async context manager that yields MP4 byte streams, before it is entered "
        f"(stream_mp4(...), stream_generation(...)), got {shown}"
    )


def _check_headers(headers: object) -> None:
    """A TypeError unless ``headers`` is None or a mapping; a ValueError unless it maps str to str (latin-1)
    and leaves the length out, which nobody knows before the MP4 is written."""
    if headers is None:
        return
    if not isinstance(headers, Mapping):
        raise TypeError(
            f"MP4Response: headers must be a mapping of str to str or None, got {type(headers).__name__}"
        )
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ValueError(f"MP4Response: headers must map str to str, got {name!r}: {value!r}")
        try:
            name.encode("latin-1"), value.encode("latin-1")
        except UnicodeEncodeError:
            raise ValueError(f"MP4Response: headers must be latin-1 text, got {name!r}: {value!r}") from None
        if name.lower() == "content-length":
            raise ValueError(
                "MP4Response: headers must not set content-length: the MP4's length is not known before it "
                "is written (the body is sent as it is)"
            )


def _entry_streams(yielded: Any, entry: int) -> list[MP4ByteStream]:
    """What the block yielded as the streams to read, the one to send first; a TypeError or ValueError
    naming MP4Response for anything else."""
    if isinstance(yielded, MP4ByteStream):
        return [yielded]
    if (
        not isinstance(yielded, Sequence)
        or not yielded
        or not all(isinstance(s, MP4ByteStream) for s in yielded)
    ):
        raise TypeError(
            f"MP4Response: the context manager must yield an MP4ByteStream or a sequence of them, got "
            f"{type(yielded).__name__}"
        )
    chosen = [stream for stream in yielded if stream.entry == entry]
    if not chosen:
        entries = [stream.entry for stream in yielded]
        raise ValueError(
            f"MP4Response: entry {entry}, but the block yielded the streams of entries {entries}"
        )
    return [chosen[0], *(stream for stream in yielded if stream is not chosen[0])]


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}
