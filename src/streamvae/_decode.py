"""Whole latents in, MP4s out: :func:`decode_to_mp4` and :func:`stream_mp4`.

Each checks its arguments on the event loop (shapes and options only), opens a session, and runs the
decode in the decode worker (``_decode_worker``): a worker thread that pushes each chunk into the session
with backpressure and ends by the protocol's failure rule when the caller is cancelled or the session
fails — at its next step boundary (single process) or at the boundary its ranks agree on (a distributed
decode, which never skips a collective). Only then does the caller see the outcome.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, NamedTuple, Unpack

import anyio
from torch import Tensor

from streamvae._checks import check_callable, check_int, check_limiter
from streamvae._decode_worker import (
    chunk_bridge,
    decode_limiter_or_own,
    outcome_told,
    run_decode,
    run_decode_worker,
)
from streamvae._options import SessionKeywords, SessionOptions, resolve_options
from streamvae._public import public
from streamvae._session import ChunkedVideoMP4Session
from streamvae._sinks import MP4ByteStream
from streamvae.models import ChunkedDecoder, as_decoder

__all__ = ["StreamedDecode", "decode_to_mp4", "open_decode", "stream_mp4"]


@public
async def decode_to_mp4(
    vae: Any,
    z: Tensor,
    *,
    decode_limiter: anyio.CapacityLimiter | None = None,
    on_session: Callable[[ChunkedVideoMP4Session], None] | None = None,
    options: SessionOptions | None = None,
    **session_options: Unpack[SessionKeywords],
) -> list[bytes]:
    """Decode latent ``z`` with ``vae`` and return one MP4 per batch entry, streaming as it decodes.

    ``vae`` is a :class:`SupportsChunkedVAEDecode` or a supported diffusers VAE (turned into its adapter by
    :func:`streamvae.models.as_decoder`; same module, nothing reloaded). ``session_options`` are the
    keywords of :class:`streamvae.SessionOptions` (``fps`` is required; ``value_range`` defaults to the
    decoder's), or pass one :class:`streamvae.SessionOptions` as ``options=``. Every argument is checked
    here, before any work (the batch against the options too).
    ``decode_limiter`` bounds concurrent decodes across calls (default: one limiter per call);
    ``on_session`` is called with the session once it is open (progress bars, statistics).

    Threads and streams: only shape checks run on the event loop. The latent's preparation (cast and
    device copy), its finiteness check and the decode run in a worker thread, a CUDA decode on a stream of
    its own on the latent's device. The caller's current CUDA device and stream do not reach the worker
    (both are per thread): put the VAE and the latent where the decode should run.

    Errors: a failing session stops publishing and its original error is raised once the decode has ended.
    Cancellation: a single-process decode returns at its next chunk boundary. A distributed decode stops
    where every rank has run the same collectives: every :class:`streamvae.distributed.ShardedDecoder`
    agrees on failure after each step, so the wait is bounded by the current step (a decoder that drains
    instead runs every remaining step: the wait is then bounded by the remaining decode), plus the process
    group's timeout if a peer died. The decode thread is never abandoned. Ranks that do not own the output
    decode and return ``[]``, or raise :class:`streamvae.distributed.PeerDecodeError` when the output rank
    stopped the decode, or its session failed after the last step (they return once it has ended).
    """
    owner = "decode_to_mp4"
    decoder = as_decoder(vae, owner=owner)
    decoder.check_latents(z, owner=owner)  # shapes only: on the loop
    limiter = decode_limiter_or_own(check_limiter("decode_limiter", decode_limiter, owner=owner))
    check_callable("on_session", on_session, owner=owner)
    if not decoder.is_output_rank:
        # Every rank checks the options before the first collective: a bad one raises here on every
        # rank at once, instead of on the output rank alone while its peers wait out the group timeout.
        # Output files are the output rank's (their directory may exist on its machine only).
        keywords = {name: value for name, value in session_options.items() if name != "output_files"}
        resolve_options(owner, options, keywords, **_defaults(decoder))
        async with outcome_told(decoder):  # the output rank may still fail after the last step
            await run_decode_worker(_decode_without_output, decoder, z, limiter=limiter)
        return []
    checked = resolve_options(owner, options, session_options, **_defaults(decoder))
    checked.check_batch(z.shape[0], owner=owner)
    _check_live_audio(checked, on_session, owner)
    # Told after the session, whatever ended it: its failure after the decode's last step reaches the peers.
    async with outcome_told(decoder), ChunkedVideoMP4Session(options=checked) as session:
        if on_session is not None:
            on_session(session)
        await run_decode_worker(run_decode, decoder, z, chunk_bridge(session, owner), owner, limiter=limiter)
        return await session.finish()


@public
def stream_mp4(
    vae: Any,
    z: Tensor,
    *,
    decode_limiter: anyio.CapacityLimiter | None = None,
    on_session: Callable[[ChunkedVideoMP4Session], None] | None = None,
    max_buffered: int = 4,
    options: SessionOptions | None = None,
    **session_options: Unpack[SessionKeywords],
) -> AbstractAsyncContextManager[list[MP4ByteStream]]:
    """Decode ``z`` in the background and give one fragmented-MP4 byte stream per batch entry.

    ``async with stream_mp4(vae, z, fps=16) as (video,): async for data in video: ...`` — bytes leave as
    soon as each fragment (one per chunk by default) is written, while the decode goes on. The batch size
    must be known up front, so it is ``z.shape[0]``. A slow reader backs pressure up into the decode.
    The entries share that pipeline: read them at once (:func:`streamvae.read_entries`, or a task per
    stream), not one after the other — a full, unread entry stops every entry, and the session then fails
    with :class:`streamvae.UnreadStreamError` rather than hang. Leaving the block early (a client that
    went away) cancels the decode as :func:`decode_to_mp4` does; a decode or encode error is raised by the
    stream and when the block ends. Not available on ranks that do not own the output (they have nothing
    to stream: use :func:`decode_to_mp4` there).

    Every argument is checked by the call itself, before the block is entered (shapes and options only:
    no decode step, no file written).
    """
    checked = _check_stream(vae, z, decode_limiter, on_session, max_buffered, options, session_options)
    _check_live_audio(checked.options, on_session, "stream_mp4")
    return _handed_on(_streamed(checked), on_session)


class StreamedDecode(NamedTuple):
    """A decode in flight: its session and one fragmented-MP4 byte stream per batch entry."""

    session: ChunkedVideoMP4Session
    streams: list[MP4ByteStream]


def open_decode(
    vae: Any, z: Tensor, *, decode_limiter: anyio.CapacityLimiter | None, options: SessionOptions
) -> AbstractAsyncContextManager[StreamedDecode]:
    """:func:`stream_mp4`'s checks and block for the server and the command line, which read the session
    (its statistics, its frames) themselves: the block yields it with the streams."""
    return _streamed(_check_stream(vae, z, decode_limiter, None, 4, options, {}))  # stream_mp4's default


class _CheckedStream(NamedTuple):
    decoder: ChunkedDecoder
    z: Tensor
    decode_limiter: anyio.CapacityLimiter | None
    max_buffered: int
    options: SessionOptions


def _check_stream(
    vae: Any,
    z: Tensor,
    decode_limiter: object,
    on_session: object,
    max_buffered: object,
    options: SessionOptions | None,
    session_options: Mapping[str, Any],
) -> _CheckedStream:
    """:func:`stream_mp4`'s arguments, checked in order (shapes and options only)."""
    owner = "stream_mp4"
    decoder = as_decoder(vae, owner=owner)
    decoder.check_latents(z, owner=owner)  # shapes only
    checked_limiter = check_limiter("decode_limiter", decode_limiter, owner=owner)
    check_callable("on_session", on_session, owner=owner)
    buffered = check_int("max_buffered", max_buffered, minimum=1, owner=owner)
    if not decoder.is_output_rank:
        raise ValueError(f"{owner}() on a rank that does not own the output: call decode_to_mp4() there")
    defaults = {**_defaults(decoder), "output": "fragmented"}
    checked = resolve_options(owner, options, session_options, **defaults)
    checked.check_batch(z.shape[0], owner=owner)
    return _CheckedStream(decoder, z, checked_limiter, buffered, checked)


def _check_live_audio(options: SessionOptions, on_session: object, owner: str) -> None:
    """A ValueError, before any work, for a live audio track nobody can feed: its samples come from the
    session's ``push_audio``, which only ``on_session`` reaches here (else the video would fail at its end
    for a soundtrack of 0 s)."""
    if options.audio_channels is not None and on_session is None:
        raise ValueError(
            f"{owner}: audio_channels is a live audio track, fed by the session's push_audio(): pass "
            "on_session= to push its samples, or give the whole sound as audio_waveforms="
        )


@asynccontextmanager
async def _handed_on(
    decode: AbstractAsyncContextManager[StreamedDecode],
    on_session: Callable[[ChunkedVideoMP4Session], None] | None,
) -> AsyncIterator[list[MP4ByteStream]]:
    """The block of :func:`stream_mp4`: the streams, the session handed to ``on_session`` first."""
    async with decode as (session, streams):
        if on_session is not None:
            on_session(session)
        yield streams


@asynccontextmanager
async def _streamed(checked: _CheckedStream) -> AsyncIterator[StreamedDecode]:
    """The decode of a checked :func:`stream_mp4` call, as the session's producer."""
    owner = "stream_mp4"
    decoder, z = checked.decoder, checked.z
    limiter = decode_limiter_or_own(checked.decode_limiter)
    session = ChunkedVideoMP4Session(options=checked.options)
    streams = [session.open_stream(entry, max_buffered=checked.max_buffered) for entry in range(z.shape[0])]
    on_chunk = chunk_bridge(session, owner)

    async def decode() -> None:
        await run_decode_worker(run_decode, decoder, z, on_chunk, owner, limiter=limiter)
        await session.finish()

    # The peers hear how the session ended (what leaves it: a reader that closed its stream mid-video, an
    # encoder's error at the end) once it has: not in decode(), which the block's end cancels once its
    # streams are read, a success. The decode's error reaches the streams and the block unwrapped.
    async with outcome_told(decoder), session, session.producing(decode, streams):
        yield StreamedDecode(session, streams)


def _defaults(decoder: ChunkedDecoder) -> dict[str, Any]:
    """What a decode's session options default to: the decoder's value range."""
    return {"value_range": decoder.chunk_value_range}


def _decode_without_output(decoder: ChunkedDecoder, z: Tensor) -> None:
    def on_chunk(chunk: Tensor) -> None:
        raise RuntimeError("a decoder that is not the output rank published a chunk")

    run_decode(decoder, z, on_chunk, "decode_to_mp4")
