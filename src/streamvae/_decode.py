"""Decode: drive a chunked VAE decode in a worker thread into a session, with backpressure.

The decode runs in a worker thread under its own limiter; each published chunk crosses into the event loop
through a bridge that catches everything — trio's ``Cancelled`` included — and turns it into the
protocol's failure rule, so neither a cancelled caller nor a failed session unwinds the decode mid-step:
the decode ends at its next step boundary (single process) or at the step boundary its ranks agree on (a
distributed decode, which never skips a collective), and only then does the caller see the outcome.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import torch
from torch import Tensor

from streamvae._options import SessionOptions
from streamvae._session import ChunkedVideoMP4Session
from streamvae._sinks import MP4ByteStream
from streamvae.models import ChunkedDecoder, as_decoder

__all__ = ["as_chunked_decoder", "decode_to_mp4", "stream_mp4"]


class _DecodeAbandoned(Exception):
    """Raised inside ``on_chunk`` when the caller was cancelled, so the decode stops publishing."""


def as_chunked_decoder(vae: Any) -> ChunkedDecoder:
    """``vae`` as a :class:`streamvae.models.ChunkedDecoder`: itself, the adapter of a supported diffusers
    VAE, or a protocol-only decoder wrapped once (see :func:`streamvae.models.as_decoder`)."""
    return as_decoder(vae)


def _run_decode(decoder: ChunkedDecoder, z: Tensor, on_chunk: Callable[[Tensor], None], owner: str) -> None:
    """Worker thread: prepare ``z``, check it is finite, and decode it on a stream of the decode's own.

    Everything here may wait for the device — the latent's host → device copy, the finiteness check (a
    host synchronization) — so none of it runs on the event loop. What reaches this thread from the
    caller: ``z`` and the decoder, nothing else; the caller's current CUDA device and stream do not (they
    are per thread). A CUDA decode runs on its own stream on the latent's device, so concurrent decodes
    neither interleave on the legacy default stream nor make each other's chunks wait.
    """
    z = decoder.prepare_latents(z)
    with _own_stream(z.device):
        check_finite_latents(z, owner=owner)
        decoder.decode_with_chunks(z, on_chunk=on_chunk)


_decode_streams = threading.local()


@contextlib.contextmanager
def _own_stream(device: torch.device) -> Iterator[None]:
    """Make a stream of this worker thread current on ``device`` (CUDA), after what is queued so far.

    One stream per worker thread and device, reused: a thread runs one decode at a time, and the caching
    allocator keeps its blocks per stream, so a fresh stream per decode would strand freed memory.
    """
    if device.type != "cuda":
        yield
        return
    streams: dict[torch.device, Any] = _decode_streams.__dict__.setdefault("streams", {})
    stream = streams.get(device)
    if stream is None:
        stream = streams[device] = torch.cuda.Stream(device)
    # The latent was copied (or written by the caller) on another stream: start after it.
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.device(device), torch.cuda.stream(stream):
        yield


async def decode_to_mp4(
    vae: Any,
    z: Tensor,
    *,
    decode_limiter: anyio.CapacityLimiter | None = None,
    on_session: Callable[[ChunkedVideoMP4Session], None] | None = None,
    **session_options: Any,
) -> list[bytes]:
    """Decode latent ``z`` with ``vae`` and return one MP4 per batch entry, streaming as it decodes.

    ``vae`` is a :class:`SupportsChunkedVAEDecode` or a supported diffusers VAE (wrapped by
    :func:`streamvae.models.chunked_decoder`; same module, nothing reloaded). ``session_options`` go to
    :class:`ChunkedVideoMP4Session` (``fps`` is required; ``value_range`` defaults to the decoder's), or
    pass one checked :class:`streamvae.SessionOptions` as ``options=``.
    ``decode_limiter`` bounds concurrent decodes across calls (default: one limiter per call);
    ``on_session`` is called with the session once it is open (progress bars, statistics).

    Threads and streams: only shape checks run on the event loop. The latent's preparation (cast and
    device copy), its finiteness check and the decode run in a worker thread, a CUDA decode on a stream of
    its own on the latent's device. The caller's current CUDA device and stream do not reach the worker
    (both are per thread): put the VAE and the latent where the decode should run.

    Errors: a failing session stops publishing and its original error is raised once the decode has ended.
    Cancellation: a single-process decode returns at its next chunk boundary. A distributed decode stops
    where every rank has run the same collectives: :class:`streamvae.distributed.ShardedWanDecoder` agrees
    on failure after each latent frame, so the wait is bounded by the current step (a decoder that drains
    instead runs every remaining step: the wait is then bounded by the remaining decode), plus the process
    group's timeout if a peer died. The decode thread is never abandoned. Ranks that do not own the output
    decode and return ``[]``, or raise :class:`streamvae.distributed.PeerDecodeError` when the output rank
    stopped the decode.
    """
    decoder = as_decoder(vae)
    decoder.check_latents(z, owner="decode_to_mp4")  # shapes only: on the loop
    limiter = decode_limiter if decode_limiter is not None else anyio.CapacityLimiter(1)
    if not decoder.is_output_rank:
        # Every rank checks the options before the first collective: a bad one raises here on every
        # rank at once, instead of on the output rank alone while its peers wait out the group timeout.
        # Output files are the output rank's (their directory may exist on its machine only).
        _session_options(decoder, {**session_options, "output_files": None})
        await anyio.to_thread.run_sync(_decode_without_output, decoder, z, limiter=limiter)
        return []
    # The options are checked before the decode starts.
    session = ChunkedVideoMP4Session(options=_session_options(decoder, session_options))
    async with session:
        if on_session is not None:
            on_session(session)
        await _decode_into(decoder, z, session, limiter, "decode_to_mp4")
        return await session.finish()


@asynccontextmanager
async def stream_mp4(
    vae: Any,
    z: Tensor,
    *,
    decode_limiter: anyio.CapacityLimiter | None = None,
    on_session: Callable[[ChunkedVideoMP4Session], None] | None = None,
    max_buffered: int = 4,
    **session_options: Any,
) -> AsyncIterator[list[MP4ByteStream]]:
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
    """
    decoder = as_decoder(vae)
    decoder.check_latents(z, owner="stream_mp4")  # shapes only: on the loop
    if not decoder.is_output_rank:
        raise ValueError("stream_mp4() on a rank that does not own the output: call decode_to_mp4() there")
    limiter = decode_limiter if decode_limiter is not None else anyio.CapacityLimiter(1)
    session = ChunkedVideoMP4Session(options=_session_options(decoder, session_options, output="fragmented"))
    streams = [session.open_stream(entry, max_buffered=max_buffered) for entry in range(z.shape[0])]
    decode_scope = anyio.CancelScope()

    async def decode() -> None:
        with decode_scope:
            await _decode_into(decoder, z, session, limiter, "stream_mp4")
            await session.finish()

    async with session:
        if on_session is not None:
            on_session(session)
        # The decode is the session's producer: its error reaches the streams and the block unwrapped.
        session.start_producer(decode)
        try:
            yield streams
        finally:
            decode_scope.cancel()  # a no-op once the decode is done; stops it if the caller left early
            for stream in streams:
                await stream.aclose()


def _session_options(decoder: ChunkedDecoder, keywords: dict[str, Any], **defaults: Any) -> SessionOptions:
    """``options=`` as given, or the session keywords over ``defaults`` and the decoder's value range."""
    options = keywords.get("options")
    if options is None:
        keywords = {key: value for key, value in keywords.items() if key != "options"}
        return SessionOptions(**{"value_range": decoder.chunk_value_range, **defaults, **keywords})
    others = sorted(key for key, value in keywords.items() if key != "options" and value is not None)
    if others:
        raise TypeError(f"pass the session options as options= or as keywords, not both (got {others})")
    if not isinstance(options, SessionOptions):
        raise TypeError(f"options must be a streamvae.SessionOptions, got {type(options).__name__}")
    return options


async def _decode_into(
    decoder: ChunkedDecoder,
    z: Tensor,
    session: ChunkedVideoMP4Session,
    limiter: anyio.CapacityLimiter,
    owner: str,
) -> None:
    """Run the decode in a worker thread, pushing each chunk into ``session`` with backpressure."""
    on_chunk = _chunk_bridge(session, owner)
    try:
        await anyio.to_thread.run_sync(_run_decode, decoder, z, on_chunk, owner, limiter=limiter)
    except BaseException:
        # The decode has ended (the thread is never abandoned); a cancelled caller sees its cancellation
        # rather than what the interrupted bridge raised.
        await anyio.lowlevel.checkpoint_if_cancelled()
        raise


def _chunk_bridge(session: ChunkedVideoMP4Session, owner: str) -> Callable[[Tensor], None]:
    """The ``on_chunk`` of a decode worker: push each chunk into ``session`` (blocking: backpressure).

    A failed session's own error is raised as it is (the decoder stops and re-raises it); the caller's
    cancellation, which reaches the worker thread as trio's ``Cancelled`` or asyncio's ``CancelledError``,
    becomes an ordinary exception, so the decode ends by the failure rule instead of unwinding mid-step.
    """

    def on_chunk(chunk: Tensor) -> None:
        try:
            anyio.from_thread.check_cancelled()
            session.push_from_thread(chunk)
        except Exception:
            raise  # a failed session's own error: the decoder stops and re-raises it, peers hear of it
        except BaseException as cancelled:  # trio's Cancelled / asyncio's CancelledError
            raise _DecodeAbandoned(f"the caller of {owner} was cancelled") from cancelled

    return on_chunk


def _decode_without_output(decoder: ChunkedDecoder, z: Tensor) -> None:
    def on_chunk(chunk: Tensor) -> None:
        raise RuntimeError("a decoder that is not the output rank published a chunk")

    _run_decode(decoder, z, on_chunk, "decode_to_mp4")


def check_finite_latents(z: Tensor, *, owner: str) -> None:
    """Raise ValueError if ``z`` holds NaN or ±inf: such a latent decodes to a black or garbage video.

    Runs in the decode worker, before the first decoder step (and so before a sharded decode's first
    collective, on every rank alike): for a CUDA latent it is a host synchronization, which must not
    stall the event loop.
    """
    finite = torch.isfinite(z)
    if bool(finite.all()):
        return
    nan = int(torch.isnan(z).sum())
    inf = z.numel() - int(finite.sum()) - nan
    raise ValueError(
        f"{owner}: z must be finite, but {nan} of its {z.numel()} values are NaN and {inf} are ±inf "
        "(a diverged sampler, or a float16 overflow before the decode); nothing was decoded"
    )
