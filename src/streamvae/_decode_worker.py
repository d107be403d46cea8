"""The decode worker: a VAE decode in a worker thread that pushes its chunks into a session.

Both ways in — whole latents (``decode_to_mp4``, ``stream_mp4``) and latents that arrive in pieces
(``open_latent_stream``) — decode the same way, with the pieces here:

- **its thread**: the decode runs in a worker thread under a decode limiter (never on the event loop, never
  on anyio's default limiter), and that thread is never abandoned: a cancelled caller waits for the
  decoder's current step (:func:`run_decode_worker`), so no decode outlives the block that started it;
- **its CUDA stream**: each worker thread decodes on a stream of its own on the latent's device
  (:func:`decode_stream`), so concurrent decodes neither interleave on the legacy default stream nor make
  each other's chunks wait;
- **the latent check**: NaN and ±inf are refused before the first decoder step (a host synchronization
  for a CUDA latent, so it runs here and not on the loop; and before a sharded decode's first collective,
  on every rank alike);
- **calls into the loop and the abandon rule**: the worker reaches the event loop only through
  :func:`call_on_loop` and the chunk bridge (:func:`chunk_bridge`). A cancellation of the caller reaches
  the thread as trio's ``Cancelled`` or asyncio's ``CancelledError`` (BaseExceptions); both become
  :class:`DecodeAbandoned`, an ordinary exception, so the decoder ends by the protocol's failure rule —
  at its next step boundary, or at the boundary its ranks agree on — instead of unwinding mid-step.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.lowlevel
import torch
from torch import Tensor

from streamvae._errors import DecodeAbandoned

if TYPE_CHECKING:
    from streamvae._session import ChunkedVideoMP4Session
    from streamvae.models import ChunkedDecoder

__all__ = [
    "DecodeAbandoned",
    "call_on_loop",
    "check_abandoned",
    "check_finite_latents",
    "chunk_bridge",
    "decode_limiter_or_own",
    "decode_stream",
    "outcome_told",
    "run_decode",
    "run_decode_worker",
]

_T = TypeVar("_T")


# -- the worker's thread --


async def run_decode_worker(func: Callable[..., None], *args: Any, limiter: anyio.CapacityLimiter) -> None:
    """Run ``func(*args)`` in a worker thread under ``limiter`` and wait for it, even when cancelled.

    The thread is never abandoned (it may hold the VAE's caches or a collective's turn). When it ended
    because the caller was cancelled, the caller sees its cancellation, not the :class:`DecodeAbandoned`
    the interrupted bridge raised.
    """
    try:
        await anyio.to_thread.run_sync(func, *args, limiter=limiter)
    except BaseException:
        await anyio.lowlevel.checkpoint_if_cancelled()
        raise


@contextlib.asynccontextmanager
async def outcome_told(decoder: ChunkedDecoder) -> AsyncIterator[None]:
    """Around a decode and the end of its session: then tell the decoder how the output's end went.

    What leaves the block (None: nothing) is passed to :meth:`streamvae.models.ChunkedDecoder.settle`, in
    a worker thread shielded from cancellation (a distributed decoder's wait is bounded by its collective
    timeout): a sharded decode's peers hear of an output rank that failed after the decode's last step.
    Where the block fails already, that failure stays the one raised; what telling the peers raised is
    noted on it.
    """
    try:
        yield
    except BaseException as failure:
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(decoder.settle, failure)
            except Exception as also:
                failure.add_note(f"streamvae: telling the peers how the output ended failed too: {also}")
        raise
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(decoder.settle, None)


def decode_limiter_or_own(limiter: anyio.CapacityLimiter | None) -> anyio.CapacityLimiter:
    """The ``decode_limiter`` a caller gave (checked already), or one token of the call's own: without a
    shared limiter a call's decodes run one at a time but never wait for another call's. Make it on the
    event loop of the call."""
    return limiter if limiter is not None else anyio.CapacityLimiter(1)


def run_decode(decoder: ChunkedDecoder, z: Tensor, on_chunk: Callable[[Tensor], None], owner: str) -> None:
    """Worker thread: prepare ``z``, check it is finite, and decode it on the worker's CUDA stream.

    Everything here may wait for the device — the latent's host → device copy, the finiteness check — so
    none of it runs on the event loop. What reaches this thread from the caller is ``z`` and the decoder,
    nothing else: the caller's current CUDA device and stream are per thread and do not.
    """
    z = decoder.prepare_latents(z)
    with decode_stream(z.device):
        check_finite_latents(z, owner=owner)
        decoder.decode_with_chunks(z, on_chunk=on_chunk)


# -- its CUDA stream --

_decode_streams = threading.local()


@contextlib.contextmanager
def decode_stream(device: torch.device) -> Iterator[None]:
    """Make this worker thread's decode stream current on ``device`` (CUDA), after what is queued so far.

    One stream per worker thread and device, reused: a thread runs one decode at a time, and the caching
    allocator keeps its blocks per stream, so a fresh stream per decode would strand freed memory.

    The ordering, both ways: the decode stream starts after what the caller's current stream has queued
    (the latent's copy, the pipeline's denoising), and when the block exits — returned or raised — the
    caller's current stream waits for everything queued on the decode stream. So whatever the caller does
    next with the decoded frames on its own stream (a pipeline's ``torch.cat`` of a call's chunks, the
    frames it reads back, a keeper's frames pushed after the decode) runs after they are written, with no
    host wait. (Chunks published inside the block are ordered by the session's ready events instead.)
    """
    if device.type != "cuda":
        yield
        return
    streams: dict[torch.device, Any] = _decode_streams.__dict__.setdefault("streams", {})
    stream = streams.get(device)
    if stream is None:
        stream = streams[device] = torch.cuda.Stream(device)
    caller = torch.cuda.current_stream(device)
    # The latent was copied (or written by the caller) on another stream: start after it.
    stream.wait_stream(caller)
    try:
        with torch.cuda.device(device), torch.cuda.stream(stream):
            yield
    finally:
        # The decoded frames are the caller's next: its stream starts after the decode's work.
        caller.wait_stream(stream)


# -- the latent check --


def check_finite_latents(z: Tensor, *, owner: str) -> None:
    """Raise ValueError if ``z`` holds NaN or ±inf: such a latent decodes to a black or garbage video."""
    finite = torch.isfinite(z)
    if bool(finite.all()):
        return
    nan = int(torch.isnan(z).sum())
    inf = z.numel() - int(finite.sum()) - nan
    raise ValueError(
        f"{owner}: z must be finite, but {nan} of its {z.numel()} values are NaN and {inf} are ±inf "
        "(a diverged sampler, or a float16 overflow before the decode); nothing was decoded"
    )


# -- calls into the loop, and the abandon rule --


@contextlib.contextmanager
def _abandoned_on_cancel(owner: str) -> Iterator[None]:
    """Worker thread: the caller's cancellation inside this block becomes :class:`DecodeAbandoned`.

    A failed session's own error (an ordinary exception) passes as it is: the decoder stops and re-raises
    it, and a distributed decode's peers hear of it.
    """
    try:
        anyio.from_thread.check_cancelled()
        yield
    except Exception:
        raise
    except BaseException as cancelled:  # trio's Cancelled / asyncio's CancelledError
        raise DecodeAbandoned(f"the caller of {owner} was cancelled") from cancelled


def check_abandoned(owner: str) -> None:
    """Worker thread: raise :class:`DecodeAbandoned` now if the caller was cancelled (a step boundary of
    work that does not call into the loop, such as a diffusion pipeline's denoising loop)."""
    with _abandoned_on_cancel(owner):
        pass


def call_on_loop(func: Callable[..., Coroutine[Any, Any, _T]], *args: Any, owner: str) -> _T:
    """Worker thread: run ``func(*args)`` on the event loop and return its result (the abandon rule)."""
    with _abandoned_on_cancel(owner):
        return anyio.from_thread.run(func, *args)


def chunk_bridge(session: ChunkedVideoMP4Session, owner: str) -> Callable[[Tensor], None]:
    """The ``on_chunk`` of a decode worker: push each chunk into ``session``, blocking while the pipeline
    is full (backpressure), under the abandon rule."""

    def on_chunk(chunk: Tensor) -> None:
        with _abandoned_on_cancel(owner):
            session.push_from_thread(chunk)

    return on_chunk
