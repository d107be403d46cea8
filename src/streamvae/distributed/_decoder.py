"""The sharded decoder: one Wan-family decode split into strips across a process group.

Owns the step loop every rank runs in the same order — decode this rank's strip of a latent frame, gather
the chunk on the output rank, publish it there, agree on the output rank's verdict — and the failure rule
built on it: every rank stops at the same boundary, the output rank raising its own error and the others
:class:`PeerDecodeError`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

from streamvae._errors import StreamVAEError
from streamvae._protocol import ChunkPublisher
from streamvae.distributed._collectives import (
    Agreement,
    Collectives,
    agreement_group,
    comm_device,
    global_rank,
)
from streamvae.distributed._halo import ShardContext, active, check_shardable, install_hooks
from streamvae.distributed._launch import resolve_collective_timeout
from streamvae.distributed._layout import AXIS_DIM, ShardAxis, StripLayout
from streamvae.distributed._stats import ShardedDecodeStats
from streamvae.models import ChunkedDecoder
from streamvae.models._common import uses_spatial_tiling
from streamvae.models.wan import WanChunkedDecoder, WanFamilyVAE

_STATUS_BYTES = 256  # the owner's per-step verdict: a flag byte, then the error's text (UTF-8, truncated)


class PeerDecodeError(StreamVAEError, RuntimeError):
    """Raised on a rank that does not own the output when the output rank stopped the decode.

    The output rank's ``on_chunk`` failed (a failed session, an encoder error) or its caller was cancelled;
    every rank stopped at the same latent-frame boundary, after the same collectives. The output rank
    itself raises the original error.
    """

    def __init__(self, message: str, *, chunk: int, output_error: str) -> None:
        super().__init__(message)
        self.chunk = chunk  #: index of the chunk whose publishing failed on the output rank
        self.output_error = output_error  #: "ErrorType: message" of the output rank's error (truncated)


@dataclass(frozen=True)
class _Verdict:
    """The output rank's word that publishing chunk ``chunk`` failed, with its error's text."""

    chunk: int
    error: str


class ShardedWanDecoder(ChunkedDecoder):
    """Decodes an ``AutoencoderKLWan`` (2.1 or 2.2) or ``AutoencoderKLQwenImage`` across a process group.

    Implements :class:`streamvae.SupportsChunkedVAEDecode`: create one on every rank of ``group`` (default:
    the whole world) with the same VAE weights and ``shard``, and call ``decode_to_mp4(decoder, z, ...)``
    (or :meth:`decode_with_chunks`) on every rank with the same latent. Each rank decodes the strip
    ``shard`` assigns it — its activations are a strip's, not a frame's (docs/distributed.md measures it) —
    and only the ``output_rank`` (a rank of ``group``) calls ``on_chunk``; ``decode_to_mp4`` returns ``[]``
    on the others. Chunks are the single-rank decode's (``vae.decode`` with tiling off): the same
    operations on the same values, so they match it to float rounding (bit-exact where the convolution
    backend sums the same way for a taller or shorter input; see docs/distributed.md for measurements).

    When a latent has fewer rows (columns) than ranks, strips are one row each and the ranks beyond the
    row count decode a copy of an existing strip: every rank still runs every collective and completes.

    Failure rule (agreement): after each latent frame the output rank broadcasts whether publishing
    failed. If it did, every rank stops at that boundary — no rank skips a collective, none keeps
    decoding — and the output rank raises the original error (a cancelled caller sees its cancellation,
    as ``decode_to_mp4`` arranges), every other rank :class:`PeerDecodeError`. A rank whose own decode
    step raises (out of memory, a bug) cannot finish that step's collectives: its peers wait in a
    collective until the process group's timeout and then raise the backend's error.

    The agreement (the latent's shape before the first step, the verdict after each) is the only place
    where the host waits for its peers under NCCL, whose other collectives are queued on the GPU. It runs
    over gloo with host tensors — no device copy, so no wait for a GPU stream that holds a collective with
    a dead peer — and each wait raises after ``collective_timeout`` (default: the decode group's own
    timeout, as given to :func:`init_distributed` or ``init_process_group``/``new_group``). When the decode
    group's host tensors do not go through gloo (NCCL), the first decoder of a group creates a gloo group
    over the same ranks, once per group and timeout: under NCCL, construct decoders on every rank of the
    group in the same order.

    The hooks that pass halos are registered on the VAE's decoder layers once and act only inside a
    sharded decode, in that decode's thread: a single-process decode of the same module in another
    thread is unaffected (create the adapter before such threads start: registering a hook while the
    module runs a forward elsewhere is not safe). Decodes through one adapter are serialized; ranks must
    run their sharded decodes of one group in the same order. ``vae.use_tiling`` must not apply to the
    latent (sharding is the way to cut memory here); a latent that would tile raises ValueError on every
    rank before any collective. It decodes whole latents only: latents that arrive in pieces
    (:func:`streamvae.open_latent_stream`) raise TypeError.
    """

    chunk_value_range: tuple[float, float] = (-1.0, 1.0)

    def __init__(
        self,
        vae: WanFamilyVAE,
        *,
        shard: ShardAxis = "height",
        group: dist.ProcessGroup | None = None,
        output_rank: int = 0,
        collective_timeout: timedelta | None = None,
    ) -> None:
        if shard not in AXIS_DIM:
            raise ValueError(f"shard must be 'height' or 'width', got {shard!r}")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "ShardedWanDecoder needs an initialized torch.distributed process group "
                "(torch.distributed.init_process_group; under torchrun, "
                "streamvae.distributed.init_distributed)"
            )
        self._chunked = WanChunkedDecoder(vae)  # raises TypeError for any other class
        # A distributed decode drains: its peers wait on this rank in collectives until the agreed stop.
        super().__init__(vae, latent_channels=self._chunked.latent_channels, drain=True)
        self.shard: ShardAxis = shard
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if not 0 <= output_rank < self.world_size:
            raise ValueError(
                f"output_rank must be a rank of the group (0..{self.world_size - 1}), got {output_rank}"
            )
        self.output_rank = output_rank
        #: how long any wait of this decoder's agreement lasts before it raises (a peer died or stalled)
        self.collective_timeout: timedelta = resolve_collective_timeout(group, collective_timeout)
        self.stats = ShardedDecodeStats()
        self._output_global_rank = global_rank(group, output_rank)
        self._axis = AXIS_DIM[shard]
        self._lock = threading.Lock()
        check_shardable(vae.decoder, self._axis)
        install_hooks(vae.decoder)
        # Last: under NCCL it may be a rendezvous, which a decoder refused above must not leave half done.
        self._agreement_group = agreement_group(group, self.collective_timeout)

    @property
    def is_output_rank(self) -> bool:
        """True on the rank that gathers the output and calls ``on_chunk``."""
        return self.rank == self.output_rank

    def prepare_latents(self, z: Tensor) -> Tensor:
        """Validate a de-normalized latent and cast it to the VAE's dtype and device (as the Wan pipeline)."""
        return self._chunked.prepare_latents(z)

    def iter_chunks(self, z: Tensor) -> Generator[Tensor, None, None]:
        """Not available: each step is a collective that every rank runs in lockstep with its peers, so
        the decode is driven by :meth:`decode_with_chunks` on every rank, never by one rank's consumer."""
        raise TypeError(
            "ShardedWanDecoder decodes in lockstep with its peers: call decode_with_chunks on every rank"
        )

    def check_takes_pieces(self, *, owner: str | None = None) -> None:
        """Always raises TypeError: a sharded decode takes whole latents only (see :meth:`iter_chunks`)."""
        prefix = "" if owner is None else f"{owner}: "
        raise TypeError(
            f"{prefix}ShardedWanDecoder decodes whole latents only: every step is a collective its ranks run "
            "in lockstep on the same latent, so it cannot take latents that arrive in pieces. Decode the "
            "pieces on one process (open_latent_stream(vae) with the diffusers VAE itself), or pass the "
            "whole latent to decode_to_mp4 on every rank"
        )

    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        """Decode ``z`` [B, z_dim, T, H, W], the same on every rank; the output rank publishes each chunk.

        The output rank's ``on_chunk`` is called T times with whole BCTHW chunks unless it raises; then
        every rank stops after that latent frame, the output rank re-raises the error (no chunk retained)
        and the others raise :class:`PeerDecodeError`. Ranks whose latents differ in shape all raise
        ValueError after the first collective.
        """
        # The current CUDA device is per thread, and this runs in a worker thread, not the one that set it.
        on_device = torch.cuda.device(z.device) if z.device.type == "cuda" else contextlib.nullcontext()
        with self._lock, on_device:
            self._decode(z, on_chunk)

    def _decode(self, z: Tensor, on_chunk: Callable[[Tensor], None]) -> None:
        self.stats = stats = ShardedDecodeStats()
        self._check_untiled(z)
        layout = StripLayout.plan(z.shape[self._axis], self.world_size, self.rank, self._axis)
        comm = Collectives(self.group, comm_device(self.group, z.device), stats)
        agreement = Agreement(self._agreement_group, self.collective_timeout, stats)
        self._check_same_latent(agreement, z)
        publisher = ChunkPublisher(on_chunk, drain=True)
        start, stop = layout.bounds[layout.strip]
        chunks = self._chunked.iter_chunks(z.narrow(self._axis, start, stop - start).contiguous())
        context = ShardContext(self.vae.decoder, layout, comm)
        verdict: _Verdict | None = None
        try:
            for index in range(z.shape[2]):
                with active(context):
                    strip_chunk = next(chunks)
                stats.steps += 1
                chunk = self._gather_chunk(comm, layout, strip_chunk)
                del strip_chunk
                if chunk is not None:
                    publisher.publish(chunk)
                    del chunk  # a failed decode's traceback holds this frame: it must not hold a chunk
                verdict = self._agree(agreement, publisher, index)
                if verdict is not None:
                    stats.stopped_at = index
                    break
        finally:
            chunks.close()  # frees the decoder caches now
        publisher.raise_if_failed()
        if verdict is not None:
            raise PeerDecodeError(
                f"output rank {self.output_rank} stopped the decode at chunk {verdict.chunk}: "
                f"{verdict.error}",
                chunk=verdict.chunk,
                output_error=verdict.error,
            )

    def _check_untiled(self, z: Tensor) -> None:
        # Decided on the whole latent, so every rank decides alike before its first collective.
        if uses_spatial_tiling(self.vae, z.shape[-2], z.shape[-1]):
            raise ValueError(
                "ShardedWanDecoder decodes untiled strips, but vae.use_tiling would tile this latent: "
                "call vae.disable_tiling() (sharding is what cuts the memory here)"
            )

    def _check_same_latent(self, agreement: Agreement, z: Tensor) -> None:
        mine = torch.tensor([*z.shape, self._axis, self.output_rank], dtype=torch.int64)
        everyone = agreement.all_gather(mine, "the latent's shape")
        if any(not torch.equal(theirs, mine) for theirs in everyone):
            shapes = [tuple(t.tolist()) for t in everyone]
            raise ValueError(
                "every rank must decode the same latent shape with the same shard axis and output rank; "
                f"got (B, C, T, H, W, axis, output_rank) = {shapes}"
            )

    def _gather_chunk(self, comm: Collectives, layout: StripLayout, strip_chunk: Tensor) -> Tensor | None:
        """The whole chunk on the output rank (None elsewhere), from every rank's strip of it."""
        scale = layout.scale_of(strip_chunk)
        padded = layout.pad(strip_chunk, scale)
        pieces = comm.gather(padded, self.output_rank)
        if pieces is None:
            return None
        return layout.join(pieces, scale).to(strip_chunk.device)

    def _agree(self, agreement: Agreement, publisher: ChunkPublisher, index: int) -> _Verdict | None:
        """Broadcast the output rank's verdict on chunk ``index``; None while publishing succeeds."""
        status = torch.zeros(_STATUS_BYTES, dtype=torch.uint8)
        if self.is_output_rank and publisher.error is not None:
            told = f"{type(publisher.error).__name__}: {publisher.error}".encode()[: _STATUS_BYTES - 1]
            status[0] = 1
            status[1 : 1 + len(told)] = torch.frombuffer(bytearray(told), dtype=torch.uint8)
        agreement.broadcast(status, self._output_global_rank, f"the output rank's verdict on chunk {index}")
        if int(status[0]) == 0:
            return None
        text = bytes(status[1:].tolist()).rstrip(b"\0").decode(errors="replace")
        return _Verdict(chunk=index, error=text)
