"""The producer side of streamvae: what a chunked VAE decoder promises, and the failure rule it follows.

A chunked decoder publishes each temporal chunk of its output (BCTHW, in ``chunk_value_range``) as soon as
no later step can change it. Publishing is the only way frames leave the decoder, so the consumer can start
quantizing, copying and encoding while later chunks are still being decoded.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from torch import Tensor

from streamvae._public import public

if TYPE_CHECKING:
    from streamvae._quantize import ValueRange

__all__ = ["ChunkPublisher", "SupportsChunkedVAEDecode", "publish_chunks"]


@public
@runtime_checkable
class SupportsChunkedVAEDecode(Protocol):
    """A VAE decoder that publishes its output one final temporal chunk at a time.

    All ranks of a distributed decoder call :meth:`decode_with_chunks`; ``on_chunk`` runs only on the rank
    that owns the output. Each published chunk is a BCTHW tensor whose frames are final: they are never
    published twice or changed afterwards, and concatenating the chunks along T gives the whole video.

    Failure rule: publishing ends at the first ``on_chunk`` that raises (it is not called again and no chunk
    is retained); decoding ends as early as the collectives allow — a single-process decode at the next
    step boundary, a distributed one never by skipping a collective: either after every remaining step (a
    drain, ``ChunkPublisher(drain=True)``) or at a step boundary all ranks agree on
    (every :class:`streamvae.distributed.ShardedDecoder` does this) — and then the first error is re-raised.

    :class:`streamvae.models.ChunkedDecoder` implements it and completes it (latent checks and casts, the
    step API, the accelerate hook); :func:`streamvae.models.as_decoder` wraps any other implementation in a
    :class:`streamvae.models.ProtocolDecoder`, which uses these optional attributes when present:
    ``latent_channels`` (int), ``is_output_rank`` (bool, default True), and ``prepare_latents(z) ->
    Tensor``, which validates a latent and casts it to the decoder's dtype and device. Check an
    implementation with :func:`streamvae.testing.check_chunked_decoder`.
    """

    #: the range of the chunks' values: (low, high), or a PerChannelRange for normalized pixels
    chunk_value_range: ValueRange

    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        """Decode latent ``z`` (BCTHW), calling ``on_chunk`` with each final chunk in order, under the
        failure rule above; return once the decode has ended."""


@public
class ChunkPublisher:
    """Applies the protocol's failure rule around an ``on_chunk`` callback.

    Adapters call :meth:`publish` for every final chunk, stop stepping once :attr:`stopped` is true (a
    single-process decode) or keep stepping until the end (a distributed one: ``drain=True``), and call
    :meth:`raise_if_failed` once the decode is over.
    """

    def __init__(self, on_chunk: Callable[[Tensor], None], *, drain: bool = False) -> None:
        self._on_chunk = on_chunk
        self._drain = drain
        self.error: BaseException | None = None
        self.published_chunks = 0

    @property
    def stopped(self) -> bool:
        """True once publishing failed and the decoder may stop at the next step boundary."""
        return self.error is not None and not self._drain

    def publish(self, chunk: Tensor) -> None:
        """Hand ``chunk`` to ``on_chunk``, unless an earlier call failed (then drop it)."""
        if self.error is not None:
            return
        try:
            self._on_chunk(chunk)
        except BaseException as error:  # trio's Cancelled and KeyboardInterrupt follow the same rule
            self.error = error
        else:
            self.published_chunks += 1

    def raise_if_failed(self) -> None:
        """Re-raise the first ``on_chunk`` error, its traceback frames cleared so no chunk stays alive."""
        error, self.error = self.error, None
        if error is not None:
            # Frames in a traceback keep their locals (the chunk among them) alive as long as the error.
            _clear_plain_frames(error.__traceback__)
            raise error


# Frames of generators and coroutines: clearing a suspended one closes it, and an error that the event
# loop raised too (a session's failure, handed to every producer) can carry a caller's suspended frames.
_SUSPENDABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE
_SUSPENDABLE |= inspect.CO_ASYNC_GENERATOR


def _clear_plain_frames(tb: TracebackType | None) -> None:
    """``traceback.clear_frames`` for the plain function frames of ``tb`` only."""
    while tb is not None:
        if not tb.tb_frame.f_code.co_flags & _SUSPENDABLE:
            with contextlib.suppress(RuntimeError):  # a frame still executing keeps its locals
                tb.tb_frame.clear()
        tb = tb.tb_next


@public
def publish_chunks(
    chunks: Iterator[Tensor], on_chunk: Callable[[Tensor], None], *, drain: bool = False
) -> None:
    """Drive a step-by-step decode (an iterator of final chunks) into ``on_chunk`` under the failure rule.

    Each ``next(chunks)`` is one step. Once ``on_chunk`` fails, stepping stops (or, with ``drain=True``, goes
    on to the end unpublished); the iterator is closed (freeing its caches) and the first error re-raised —
    also when a later step fails while draining.
    """
    publisher = ChunkPublisher(on_chunk, drain=drain)
    try:
        for chunk in chunks:
            publisher.publish(chunk)
            del chunk  # a failed decode's traceback holds this frame: it must not hold a chunk
            if publisher.stopped:
                break
    except BaseException:
        publisher.raise_if_failed()
        raise
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    publisher.raise_if_failed()
