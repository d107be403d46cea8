"""Latents that arrive over time: each piece decoded as it comes, the causal cache carried by the stream.

:func:`open_latent_stream` opens a :class:`LatentStream` over a session. One worker thread per stream,
started at the first piece, decodes the pieces in order; it holds the stream's
:class:`~streamvae.models.DecodeState` (the decoder's caches: the stream's, never the module's) and runs on
that thread's own CUDA stream, so each piece continues the previous one's work on the same stream — their
order and the caching allocator's bookkeeping hold without cross-stream events. The decode limiter is taken
per piece, so streams that share one interleave piece by piece instead of waiting for each other's end.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal, Unpack

import anyio
import numpy as np
import torch
from torch import Tensor

from streamvae._checks import check_limiter
from streamvae._decode_worker import (
    call_on_loop,
    check_finite_latents,
    chunk_bridge,
    decode_limiter_or_own,
    decode_stream,
    outcome_told,
    run_decode_worker,
)
from streamvae._errors import SessionClosedError, describe_first_cause
from streamvae._options import SessionKeywords, SessionOptions, resolve_options
from streamvae._public import public
from streamvae._session import ChunkedVideoMP4Session
from streamvae._sinks import MP4ByteStream
from streamvae.models import ChunkedDecoder, DecodeState, as_decoder

__all__ = ["LatentStream", "LatentStreamStatistics", "open_latent_stream"]

_OWNER = "open_latent_stream"
_DIMS = ("batch", "channels", "height", "width")


@public
def open_latent_stream(
    vae: object,
    *,
    decode_limiter: anyio.CapacityLimiter | None = None,
    options: SessionOptions | None = None,
    **session_options: Unpack[SessionKeywords],
) -> AbstractAsyncContextManager[LatentStream]:
    """Decode a latent that arrives in pieces into one MP4 per batch entry, as the pieces come.

    ``async with open_latent_stream(vae, fps=16) as stream:``, then ``await stream.push_latents(z_step)``
    for each piece ``[B, C, t, H, W]`` (t ≥ 1 latent frames) in order and ``videos = await
    stream.finish()``. The frames are exactly those of decoding the concatenated latent
    (``vae.decode(torch.cat(pieces, dim=2)).sample``, tiled or sliced as the module is set when the first
    piece arrives). ``session_options`` are the keywords of :class:`streamvae.SessionOptions` (``fps`` is
    required; ``value_range`` defaults to the decoder's), or pass one :class:`streamvae.SessionOptions` as
    ``options=``; every argument is checked by the call itself, before the block is entered and before any
    work. ``decode_limiter`` (an :class:`anyio.CapacityLimiter`) bounds the decodes that run at once
    (default: one limiter per stream); share one between the streams of a module, because a module decodes
    one piece at a time whoever asks — streams then take turns piece by piece.

    ``vae`` is anything :func:`streamvae.models.as_decoder` takes whose decoder is causal across calls:
    the diffusers ``AutoencoderKLWan`` (2.1, 2.2), ``AutoencoderKLQwenImage`` and ``AutoencoderKLKVAEVideo``,
    or a decoder of your own.
    Any other raises TypeError here, naming those. Sharded across a process group: every rank opens a
    stream on its :func:`streamvae.distributed.sharded_decoder` of a Wan-family VAE and pushes the same
    pieces in the same order; the output rank's MP4 is the single process's, the others' ``finish()``
    returns ``[]`` (:class:`streamvae.distributed.ShardedWanDecoder` says how the ranks stop together).

    Your own causal decoder: subclass :class:`streamvae.models.ChunkedDecoder`, set ``takes_pieces =
    True`` and write three methods. ``start(batch, height, width) -> DecodeState`` begins a stream: return
    a fresh state (a :class:`~streamvae.models.DecodeState` subclass holding the caches, ``owner=self``),
    never module state, so streams on one module cannot see each other. ``piece_chunks(state, z)`` is a
    generator that decodes piece ``z`` and yields each chunk (BCTHW, in ``chunk_value_range``) as soon as
    no later latent can change it, adding each decoded latent frame to ``state.decoded``; the base's
    ``feed`` checks the piece against the state, runs the module's forward hook and turns autograd off
    before calling it. ``end_chunks(state)`` ends the stream: it frees the caches when called and returns
    the chunks it still held back (default: none). The base's ``iter_chunks`` then decodes whole latents
    as one piece; run :func:`streamvae.testing.check_chunked_decoder` on it.

    Threads: only shape checks run on the event loop. Each piece is prepared (cast, device copy), checked
    for NaN and ±inf and decoded in the stream's worker thread, a CUDA decode on that thread's own
    stream; the module's forward hook runs once per piece, as ``vae.decode`` would (offloading moves the
    weights back before each). Errors and cancellation follow :func:`streamvae.decode_to_mp4`: the worker
    thread is never abandoned (a cancelled stream waits for the current decoder step), nothing outlives
    the block, and the original error is raised. Leaving the block without :meth:`LatentStream.finish`
    (an error, a cancellation, a client gone) aborts the session and ends the stream's state, freeing its
    caches.
    """
    decoder = as_decoder(vae, owner=_OWNER, pieces=True)
    decoder.check_takes_pieces(owner=_OWNER)
    checked_limiter = check_limiter("decode_limiter", decode_limiter, owner=_OWNER)
    keywords: Mapping[str, object] = session_options
    if not decoder.is_output_rank:
        # Output files are the output rank's (their directory may exist on its machine only); the other
        # options are checked on every rank alike, before any collective (as decode_to_mp4 does).
        keywords = {name: value for name, value in session_options.items() if name != "output_files"}
    checked = resolve_options(_OWNER, options, keywords, value_range=decoder.chunk_value_range)
    return _opened(decoder, checked_limiter, checked)


@asynccontextmanager
async def _opened(
    decoder: ChunkedDecoder, decode_limiter: anyio.CapacityLimiter | None, checked: SessionOptions
) -> AsyncIterator[LatentStream]:
    """The block of :func:`open_latent_stream`, over the arguments it checked."""
    limiter = decode_limiter_or_own(decode_limiter)  # made on the loop
    # Told once the session has ended, if finish() did not: a stream that ended on every rank and whose
    # output then failed (the block left while finish() waited) still reaches the peers.
    async with outcome_told(decoder), ChunkedVideoMP4Session(options=checked) as session:
        stream = LatentStream(decoder, session, limiter)
        try:
            yield stream
        except BaseException as left_by:
            stream._leave(left_by)
            raise
        else:
            stream._leave(None)


@public
@dataclass(frozen=True)
class LatentStreamStatistics:
    """A snapshot of a :class:`LatentStream`'s counters (:meth:`LatentStream.statistics`)."""

    pieces_pushed: int  # pieces push_latents handed to the decode
    latent_frames_pushed: int  # latent frames in those pieces
    latent_frames_decoded: int  # latent frames decoded, their chunks handed to the session
    chunks_pushed: int  # chunks handed to the session


@public
class LatentStream:
    """Latent pieces in, MP4 bytes out: what :func:`open_latent_stream` yields.

    ``session`` is the :class:`streamvae.ChunkedVideoMP4Session` the chunks go to (its counters, its
    transfer statistics); ``decoder`` the :class:`~streamvae.models.ChunkedDecoder` that decodes them.
    """

    def __init__(
        self, decoder: ChunkedDecoder, session: ChunkedVideoMP4Session, limiter: anyio.CapacityLimiter
    ) -> None:
        #: the session the decoded chunks are pushed into
        self.session = session
        #: the decoder (its state for this stream is the stream's own)
        self.decoder = decoder
        self._limiter = limiter
        # No buffer: a piece changes hands only when the worker is ready to decode it (backpressure).
        self._pieces_send, self._pieces_receive = anyio.create_memory_object_stream[Tensor](0)
        self._phase: Literal["open", "finishing", "finished", "closed"] = "open"
        self._aborted = False  # the block was left before finish() was done
        self._busy = False  # a push or finish is in progress
        self._started = False  # the worker runs (from the first push)
        self._done = anyio.Event()  # the worker has ended
        self._error: Exception | None = None  # what the decode failed with, raised by push and finish
        self._streamed = False  # a byte stream was opened on the session
        self._left_by: BaseException | None = None  # what the block was left with before finish()
        self._shape: tuple[int, int, int, int] | None = None  # batch, channels, height, width
        self._pieces_pushed = 0
        self._latent_frames_pushed = 0
        self._latent_frames_decoded = 0  # written by the worker thread
        self._chunks_pushed = 0  # written by the worker thread

    def statistics(self) -> LatentStreamStatistics:
        """The stream's counters now; the session's are at :attr:`session`."""
        return LatentStreamStatistics(
            pieces_pushed=self._pieces_pushed,
            latent_frames_pushed=self._latent_frames_pushed,
            latent_frames_decoded=self._latent_frames_decoded,
            chunks_pushed=self._chunks_pushed,
        )

    async def push_latents(self, z: Tensor) -> None:
        """Hand the next piece ``z`` [B, C, t, H, W] (t ≥ 1) to the decode.

        Returns once the worker has taken the piece, which it does when the previous piece is decoded and
        its chunks are in the session: at most one piece decodes while the caller prepares the next, and
        a slow encoder or reader slows this call (backpressure). The decode reads ``z`` until the next
        ``push_latents`` or :meth:`finish` returns: do not write into it before then.

        Checked here, before any work, as a whole latent is (shapes and dtype only): a floating-point
        5-D tensor with the decoder's channel count and t ≥ 1, and the same batch, channels, height and
        width as the first piece (ValueError naming what changed; the stream goes on). The first piece's
        batch is checked against the options (a waveform and an output file per entry, streamed entries
        within it) before it is decoded. NaN and ±inf are checked in the worker: such a piece fails the
        stream with a ValueError, raised by the next ``push_latents`` or :meth:`finish`, and nothing after
        it is decoded. A failed decode or session raises its original error here.
        """
        self._raise_if_failed()
        if self._phase != "open":
            raise SessionClosedError(f"push_latents() on a latent stream that is {self._phase}")
        shape = self._check_piece(z)
        if self._busy:
            raise anyio.BusyResourceError("pushing latents to")
        if not self._started:
            self.session.start_producer(self._decode_pieces)
            self._started = True
        self._busy = True
        try:
            await self._pieces_send.send(z)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._raise_if_failed()
            raise SessionClosedError("push_latents() on a latent stream whose decode has ended") from None
        finally:
            self._busy = False
        self._shape = shape
        self._pieces_pushed += 1
        self._latent_frames_pushed += z.shape[2]

    def push_audio(self, waveform: Tensor | np.ndarray[Any, Any], *, entry: int = 0) -> None:
        """Append ``waveform`` to entry ``entry``'s live audio track (``audio_channels``); returns at once.

        What :meth:`streamvae.ChunkedVideoMP4Session.push_audio` does, and the same checks, errors and
        contract, once the latent stream is finishing too (:class:`streamvae.SessionClosedError`). Sync:
        push a piece's audio before :meth:`push_latents` of that piece, and every fragment holds audio
        within one video frame of its video.
        """
        if self._phase != "open":
            raise SessionClosedError(f"push_audio() on a latent stream that is {self._phase}")
        self.session.push_audio(waveform, entry=entry)

    async def finish(self) -> list[bytes]:
        """Decode what is left, end the stream's state (pushing any chunk it held back), then finish the
        session: one MP4 per batch entry, as :func:`streamvae.decode_to_mp4` returns them (``b""`` for an
        entry read through :meth:`open_stream`; ``[]`` on a rank of a sharded decode that does not own the
        output). Raises the decode's or the session's original error."""
        self._raise_if_failed()
        if self._phase != "open":
            raise SessionClosedError(f"finish() on a latent stream that is {self._phase}")
        if self._busy:
            raise anyio.BusyResourceError("pushing latents to")
        self._phase = "finishing"
        self._pieces_send.close()
        if self._started:
            await self._done.wait()
        self._raise_if_failed()
        # The ranks agreed after each step; the output rank's session may still fail at its end (a reader
        # that closed its stream, the encoder, the file): its peers hear how it ended before they return.
        async with outcome_told(self.decoder):
            if not self.decoder.is_output_rank:  # a distributed decode's other ranks publish nothing
                self.session.abort()
                self._phase = "finished"
                return []
            videos = await self.session.finish()
        self._phase = "finished"
        return videos

    def open_stream(self, entry: int = 0, *, max_buffered: int = 4) -> MP4ByteStream:
        """Deliver entry ``entry``'s bytes as they are written (see
        :meth:`streamvae.ChunkedVideoMP4Session.open_stream`); call it before the first push. With
        ``output="fragmented"`` fragments arrive while later pieces are still to come."""
        if self._started or self._phase != "open":
            raise SessionClosedError("open_stream() must be called before the first push_latents()")
        stream = self.session.open_stream(entry, max_buffered=max_buffered)
        self._streamed = True
        return stream

    # -- event loop side --

    def _check_piece(self, z: Tensor) -> tuple[int, int, int, int]:
        self.decoder.check_latents(z, owner="push_latents")  # a float 5-D tensor, the channels, t >= 1
        batch, channels, _, height, width = z.shape
        shape = (batch, channels, height, width)
        if self._shape is None:
            try:
                self.session.check_batch(batch, owner="push_latents")
            except ValueError as error:
                if self._streamed:  # the session failed with it, its readers told: so does the stream
                    self._error = error
                raise
        if self._shape is not None and shape != self._shape:
            changed = ", ".join(
                f"{name} {now} (the first piece's: {first})"
                for name, now, first in zip(_DIMS, shape, self._shape, strict=True)
                if now != first
            )
            raise ValueError(
                "push_latents: every piece must have the first piece's batch, channels, height and width "
                f"{list(self._shape)}; this one has {changed}"
            )
        return shape

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _leave(self, left_by: BaseException | None) -> None:
        """The block ends (``left_by`` the exception or cancellation it was left with): a worker waiting for
        a piece stops (without end chunks unless finishing), and names ``left_by`` to its peers."""
        if self._phase != "finished":
            self._aborted = True
            self._left_by = left_by
        self._phase = "closed"
        self._pieces_send.close()

    async def _decode_pieces(self) -> None:
        """The session's producer task: runs the worker thread from the first piece to the stream's end."""
        try:
            # A limiter of its own: the decode limiter is taken per piece, inside the worker.
            await run_decode_worker(self._work, limiter=anyio.CapacityLimiter(1))
        except Exception as error:
            if self._aborted:
                return  # the block was left: what the worker raised is the abort's consequence
            self._error = error
            raise  # the session fails with it: its streams and the block raise it too
        finally:
            self._pieces_receive.close()  # a push waiting for a worker that has ended raises
            self._done.set()

    # -- worker thread --

    def _work(self) -> None:
        """Decode each piece as it arrives, in order; at finish(), end the state and push what it gives."""
        decoder = self.decoder
        publish = self._counting(chunk_bridge(self.session, _OWNER))
        state: DecodeState | None = None
        device: torch.device | None = None
        ended = False
        reason: str | None = None
        try:
            for index in itertools.count():
                piece = self._next_piece()
                if piece is None:
                    break
                if state is None:  # first of all: a distributed decoder's peers hear of any later failure
                    state = decoder.start(piece.shape[0], piece.shape[3], piece.shape[4])
                with self._decode_turn():
                    z = decoder.prepare_latents(piece)
                    device = z.device
                    with decode_stream(device):
                        check_finite_latents(z, owner=f"push_latents (piece {index})")
                        decoder.feed_with_chunks(state, z, on_chunk=publish)
                self._latent_frames_decoded += z.shape[2]
                del piece, z  # held no longer than its decode (a prepared latent may be a device copy)
            if state is not None and device is not None and not self._aborted:
                ended = True
                with self._decode_turn(), decode_stream(device):
                    decoder.end_with_chunks(state, on_chunk=publish)
        except BaseException as error:
            reason = describe_first_cause(error)
            raise
        finally:
            if state is not None and not ended:  # after a failure or an abort: free the caches now
                if reason is None and self._left_by is not None:
                    reason = f"the stream was left before finish() by {describe_first_cause(self._left_by)}"
                decoder.abort(state, reason=reason or "the stream was left before finish()")
            self._left_by = None  # named to the peers: hold no traceback (and its frames) any longer

    def _counting(self, on_chunk: Callable[[Tensor], None]) -> Callable[[Tensor], None]:
        def publish(chunk: Tensor) -> None:
            on_chunk(chunk)
            self._chunks_pushed += 1

        return publish

    def _next_piece(self) -> Tensor | None:
        """The next piece, or None once the stream is closed (by finish() or by leaving the block)."""
        try:
            return call_on_loop(self._pieces_receive.receive, owner=_OWNER)
        except anyio.EndOfStream:
            return None

    @contextlib.contextmanager
    def _decode_turn(self) -> Iterator[None]:
        """Hold a token of the decode limiter, on the stream's behalf, for one piece."""
        call_on_loop(self._limiter.acquire_on_behalf_of, self, owner=_OWNER)
        try:
            yield
        finally:
            anyio.from_thread.run_sync(self._limiter.release_on_behalf_of, self)
