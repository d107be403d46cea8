"""Spatial-shard decode over ``torch.distributed``: every rank decodes a strip of every frame.

When one accelerator cannot decode a long high-resolution video fast enough (or at all), the ranks of a
process group split each latent frame's height (or width) into strips; each rank runs the Wan decoder on its
strip, with the neighbours' boundary rows ("halos") passed to every convolution that mixes space and the
whole frame gathered for the per-frame mid-block attention, so the strips join into the single-rank decode
(the same operations on the same values). The rank that owns the output gathers each chunk and publishes
it; the others publish nothing.

The guarantee (see docs/distributed.md): every rank runs the same collectives in the same order, whatever
its strip, and none skips one because the owner's consumer failed or its caller was cancelled. After each
latent frame the owner tells every rank whether publishing failed; if it did, all ranks stop at that same
boundary, the owner raises the original error and every other rank raises :class:`PeerDecodeError`.
That agreement runs over gloo with host tensors (over the decode group itself when it is gloo, else over a
gloo group on the same ranks), so it never waits for a GPU stream, where an NCCL collective with a dead
peer may never finish; each of its waits is bounded by the collective timeout, in a worker thread that
:func:`streamvae.decode_to_mp4` never abandons.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist
from diffusers.models.autoencoders.autoencoder_kl_qwenimage import QwenImageAttentionBlock
from diffusers.models.autoencoders.autoencoder_kl_wan import WanAttentionBlock
from torch import Tensor, nn

from streamvae._errors import StreamVAEError
from streamvae.models.wan import WanChunkedDecoder, WanFamilyVAE
from streamvae.protocol import ChunkPublisher

__all__ = [
    "PeerDecodeError",
    "ShardAxis",
    "ShardedDecodeStats",
    "ShardedWanDecoder",
    "init_distributed",
]

ShardAxis = Literal["height", "width"]
"""The latent axis split across the ranks."""

_AXIS_DIM: dict[str, int] = {"height": -2, "width": -1}  # the same for BCTHW activations and (B·T)CHW ones
_ATTENTION_BLOCKS = (WanAttentionBlock, QwenImageAttentionBlock)
_VECTOR_ROUNDED = (nn.SiLU,)  # elementwise layers whose CPU vector and scalar code round differently
_CPU_VECTOR_STEP = 64  # a whole number of vector-loop steps for AVX2 (16 floats) and AVX-512 (32)
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


@dataclass
class ShardedDecodeStats:
    """What one rank did in its latest decode (reset when a decode starts)."""

    #: latent frames this rank decoded
    steps: int = 0
    #: collective calls this rank made; equal on every rank of a decode
    collectives: int = 0
    #: halo exchanges (one a spatial convolution call)
    halo_exchanges: int = 0
    #: whole-frame gathers for the mid-block attention
    attention_gathers: int = 0
    #: chunk index at which the output rank stopped the decode, or None if it ran to the end
    stopped_at: int | None = None


class ShardedWanDecoder:
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
    rank before any collective.
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
        if shard not in _AXIS_DIM:
            raise ValueError(f"shard must be 'height' or 'width', got {shard!r}")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "ShardedWanDecoder needs an initialized torch.distributed process group "
                "(torch.distributed.init_process_group; under torchrun, "
                "streamvae.distributed.init_distributed)"
            )
        self._chunked = WanChunkedDecoder(vae)  # raises TypeError for any other class
        self.vae = vae
        self.shard: ShardAxis = shard
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if not 0 <= output_rank < self.world_size:
            raise ValueError(
                f"output_rank must be a rank of the group (0..{self.world_size - 1}), got {output_rank}"
            )
        self.output_rank = output_rank
        self.latent_channels = self._chunked.latent_channels
        #: how long any wait of this decoder's agreement lasts before it raises (a peer died or stalled)
        self.collective_timeout: timedelta = _collective_timeout(group, collective_timeout)
        self.stats = ShardedDecodeStats()
        self._output_global_rank = _global_rank(group, output_rank)
        self._axis = _AXIS_DIM[shard]
        self._lock = threading.Lock()
        _check_shardable(vae.decoder, self._axis)
        _install_hooks(vae.decoder)
        # Last: under NCCL it may be a rendezvous, which a decoder refused above must not leave half done.
        self._agreement_group = _agreement_group(group, self.collective_timeout)

    @property
    def is_output_rank(self) -> bool:
        """True on the rank that gathers the output and calls ``on_chunk``."""
        return self.rank == self.output_rank

    def prepare_latents(self, z: Tensor) -> Tensor:
        """Validate a de-normalized latent and cast it to the VAE's dtype and device (as the Wan pipeline)."""
        return self._chunked.prepare_latents(z)

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
        layout = _Layout.plan(z.shape[self._axis], self.world_size, self.rank, self._axis)
        comm = _Collectives(self.group, _comm_device(self.group, z.device), stats)
        agreement = _Agreement(self._agreement_group, self.collective_timeout, stats)
        self._check_same_latent(agreement, z)
        publisher = ChunkPublisher(on_chunk, drain=True)
        start, stop = layout.bounds[layout.strip]
        chunks = self._chunked.iter_chunks(z.narrow(self._axis, start, stop - start).contiguous())
        context = _ShardContext(self.vae.decoder, layout, comm)
        verdict: _Verdict | None = None
        try:
            for index in range(z.shape[2]):
                with _active(context):
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
        vae = self.vae
        ratio = int(vae.spatial_compression_ratio or 1)
        height, width = z.shape[-2:]
        if vae.use_tiling and (
            height > int(vae.tile_sample_min_height) // ratio
            or width > int(vae.tile_sample_min_width) // ratio
        ):
            raise ValueError(
                "ShardedWanDecoder decodes untiled strips, but vae.use_tiling would tile this latent: "
                "call vae.disable_tiling() (sharding is what cuts the memory here)"
            )

    def _check_same_latent(self, agreement: _Agreement, z: Tensor) -> None:
        mine = torch.tensor([*z.shape, self._axis, self.output_rank], dtype=torch.int64)
        everyone = agreement.all_gather(mine, "the latent's shape")
        if any(not torch.equal(theirs, mine) for theirs in everyone):
            shapes = [tuple(t.tolist()) for t in everyone]
            raise ValueError(
                "every rank must decode the same latent shape with the same shard axis and output rank; "
                f"got (B, C, T, H, W, axis, output_rank) = {shapes}"
            )

    def _gather_chunk(self, comm: _Collectives, layout: _Layout, strip_chunk: Tensor) -> Tensor | None:
        """The whole chunk on the output rank (None elsewhere), from every rank's strip of it."""
        scale = layout.scale_of(strip_chunk)
        padded = layout.pad(strip_chunk, scale)
        pieces = comm.gather(padded, self.output_rank)
        if pieces is None:
            return None
        return layout.join(pieces, scale).to(strip_chunk.device)

    def _agree(self, agreement: _Agreement, publisher: ChunkPublisher, index: int) -> _Verdict | None:
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


@dataclass(frozen=True)
class _Verdict:
    chunk: int
    error: str


# ---------------------------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class _Layout:
    """Which latent rows (or columns) each rank decodes; the same plan on every rank."""

    axis: int
    bounds: tuple[tuple[int, int], ...]  # [start, stop) of each strip, in order
    rank: int

    @classmethod
    def plan(cls, rows: int, world_size: int, rank: int, axis: int) -> _Layout:
        # With fewer rows than ranks, strips are one row each and rank r decodes strip r % len(strips).
        count = min(rows, world_size)
        base, extra = divmod(rows, count)
        bounds, start = [], 0
        for s in range(count):
            size = base + (1 if s < extra else 0)
            bounds.append((start, start + size))
            start += size
        return cls(axis=axis, bounds=tuple(bounds), rank=rank)

    @property
    def strip(self) -> int:
        return self.rank % len(self.bounds)

    @property
    def rows(self) -> int:
        start, stop = self.bounds[self.strip]
        return stop - start

    @property
    def max_rows(self) -> int:
        return max(stop - start for start, stop in self.bounds)

    def scale_of(self, activation: Tensor) -> int:
        """How many activation rows this layer has per latent row (the decoder upsamples by whole factors)."""
        scale, remainder = divmod(activation.shape[self.axis], self.rows)
        if remainder:
            raise RuntimeError(
                f"a decoder layer has {activation.shape[self.axis]} rows for a {self.rows}-row latent strip: "
                "not a whole upsampling factor"
            )
        return scale

    def pad(self, strip: Tensor, scale: int) -> Tensor:
        """``strip`` padded with zeros to the tallest strip, so every rank sends the same shape."""
        missing = (self.max_rows - self.rows) * scale
        if missing == 0:
            return strip.contiguous()
        shape = list(strip.shape)
        shape[self.axis] = missing
        return torch.cat([strip, strip.new_zeros(shape)], dim=self.axis)

    def join(self, pieces: list[Tensor], scale: int) -> Tensor:
        """The whole frame from every rank's padded strip (rank s holds strip s; copies are ignored)."""
        parts = [
            pieces[s].narrow(self.axis, 0, (stop - start) * scale)
            for s, (start, stop) in enumerate(self.bounds)
        ]
        return torch.cat(parts, dim=self.axis)

    def neighbours(self) -> tuple[int | None, int | None]:
        """The ranks holding the strips before and after this rank's (None at the frame's edges)."""
        s = self.strip
        return (s - 1 if s > 0 else None), (s + 1 if s + 1 < len(self.bounds) else None)


# ------------------------------------------------------------------------------------------ collectives


def _comm_device(group: dist.ProcessGroup | None, device: torch.device) -> torch.device:
    """Where collective buffers live: the decode's GPU for NCCL, host memory for gloo (and the rest)."""
    backend = str(dist.get_backend(group)).lower()
    if device.type == "cuda" and "nccl" in backend:
        return device
    return torch.device("cpu")


# One gather into one buffer (NCCL and gloo); torch 2.13 renamed it, older torch has the old name only.
_all_gather_single: Callable[..., Any] = (
    getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
)


class _Collectives:
    """The decode group's collectives (halos, whole frames, chunks), counted; one instance per decode.

    Under NCCL they are queued on the GPU and never block the host; under gloo each blocks the host at most
    the group's timeout.
    """

    def __init__(
        self, group: dist.ProcessGroup | None, device: torch.device, stats: ShardedDecodeStats
    ) -> None:
        self.group = group
        self.device = device
        self.stats = stats

    def all_gather(self, tensor: Tensor) -> list[Tensor]:
        """Every rank's ``tensor`` (one shape on every rank), in rank order: views of one buffer."""
        self.stats.collectives += 1
        tensor = tensor.to(self.device).contiguous()
        world = dist.get_world_size(self.group)
        # One output buffer: a list of outputs makes NCCL gather into a flat buffer and copy each out.
        gathered = tensor.new_empty((world * tensor.shape[0], *tensor.shape[1:]))
        _all_gather_single(gathered, tensor, group=self.group)
        return list(gathered.chunk(world))

    def gather(self, tensor: Tensor, dst: int) -> list[Tensor] | None:
        """Every rank's ``tensor`` on group rank ``dst`` (None elsewhere): only ``dst`` holds the whole."""
        self.stats.collectives += 1
        tensor = tensor.to(self.device).contiguous()
        mine = dist.get_rank(self.group) == dst
        pieces = [torch.empty_like(tensor) for _ in range(dist.get_world_size(self.group))] if mine else None
        dist.gather(tensor, pieces, dst=_global_rank(self.group, dst), group=self.group)
        return pieces


class _Agreement:
    """What the ranks of a sharded decode agree on at step boundaries: host tensors over a gloo group.

    These are the waits in which the host waits for its peers, so each is bounded: a peer that died or
    stalled makes them raise after ``timeout`` (gloo sees a closed connection sooner), never hang. Host
    tensors over gloo need no device copy, so they never wait for a GPU stream, where an NCCL collective
    with a dead peer may never complete.
    """

    def __init__(
        self, group: dist.ProcessGroup | None, timeout: timedelta, stats: ShardedDecodeStats
    ) -> None:
        self.group = group
        self.timeout = timeout
        self.stats = stats

    def all_gather(self, tensor: Tensor, what: str) -> list[Tensor]:
        """Every rank's host ``tensor`` (``what`` it is, for errors), in the agreement group's rank order."""
        assert tensor.device.type == "cpu"
        self.stats.collectives += 1
        pieces = [torch.empty_like(tensor) for _ in range(dist.get_world_size(self.group))]
        self._wait(dist.all_gather(pieces, tensor, group=self.group, async_op=True), what)
        return pieces

    def broadcast(self, tensor: Tensor, src: int, what: str) -> None:
        """Overwrite host ``tensor`` with global rank ``src``'s (``what`` it is, for errors)."""
        assert tensor.device.type == "cpu"
        self.stats.collectives += 1
        self._wait(dist.broadcast(tensor, src=src, group=self.group, async_op=True), what)

    def _wait(self, work: dist.Work | None, what: str) -> None:
        assert work is not None
        try:
            work.wait(timeout=self.timeout)  # raises once it has passed, or at once if a peer is gone
        except RuntimeError as error:  # the backend's own type stays: a note says where it happened
            error.add_note(
                f"streamvae: the ranks of a sharded decode were agreeing on {what} (collective timeout "
                f"{self.timeout}): a peer died, stalled, or ran other collectives"
            )
            raise


def _global_rank(group: dist.ProcessGroup | None, group_rank: int) -> int:
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def _runs_on_host(group: dist.ProcessGroup | None) -> bool:
    """Whether ``group`` sends host tensors through gloo: plain gloo, or a ``cpu:gloo,cuda:nccl`` group."""
    backend = str(dist.get_backend(group)).lower()
    return backend == "gloo" or "cpu:gloo" in backend


# decode group -> timeout -> its gloo agreement group; forgotten with the decode group
_agreement_groups: weakref.WeakKeyDictionary[dist.ProcessGroup, dict[timedelta, dist.ProcessGroup]] = (
    weakref.WeakKeyDictionary()
)
_agreement_lock = threading.Lock()


def _agreement_group(group: dist.ProcessGroup | None, timeout: timedelta) -> dist.ProcessGroup | None:
    """The group the agreement runs over: ``group`` itself when its host tensors go through gloo.

    Otherwise (NCCL) a gloo group over the same ranks with ``timeout``, created on first use for each group
    and timeout and then shared, so constructing more decoders costs no new group. Creating it is a
    rendezvous of the group's ranks (the group's alone: the other processes need not take part).
    """
    if _runs_on_host(group):
        return group  # no second group: gloo already waits on the host, in order, within its timeout
    whole = dist.group.WORLD if group is None else group
    assert whole is not None
    with _agreement_lock:
        by_timeout = _agreement_groups.setdefault(whole, {})
        side = by_timeout.get(timeout)
        if side is None:
            if not dist.is_gloo_available():
                raise RuntimeError(
                    "ShardedWanDecoder needs torch.distributed's gloo backend for its agreement"
                )
            ranks = dist.get_process_group_ranks(whole)
            every = len(ranks) == dist.get_world_size()
            created = dist.new_group(
                ranks=None if every else ranks,
                backend="gloo",
                timeout=timeout,
                use_local_synchronization=not every,  # a subgroup's ranks alone create it
            )
            assert isinstance(created, dist.ProcessGroup)
            side = by_timeout[timeout] = created
    return side


def _group_timeout(group: dist.ProcessGroup | None) -> timedelta | None:
    """The timeout ``group`` was created with, as its backend reports it (None where torch does not say)."""
    whole = dist.group.WORLD if group is None else group
    if whole is None:
        return None
    try:
        for device in whole._device_types:
            timeout: timedelta = whole._get_backend(device).options._timeout
            return timeout
    except (AttributeError, RuntimeError):  # private API: absent or changed in this torch
        return None
    return None


_init_timeout: timedelta | None = None  # the timeout init_distributed created the default group with


def _collective_timeout(group: dist.ProcessGroup | None, given: timedelta | None) -> timedelta:
    """``given``, else the decode group's own timeout, else torch's default for its backend."""
    if given is not None:
        return given
    own = _group_timeout(group)
    if own is not None:
        return own
    if _init_timeout is not None and (group is None or group is dist.group.WORLD):
        return _init_timeout
    nccl = "nccl" in str(dist.get_backend(group)).lower()
    default = dist.constants.default_pg_nccl_timeout if nccl else None
    return default or dist.constants.default_pg_timeout


# ------------------------------------------------------------------------------------------------ hooks


@dataclass
class _ShardContext:
    """The sharded decode running in this thread: what the decoder's hooks need."""

    decoder: nn.Module
    layout: _Layout
    comm: _Collectives
    crops: dict[int, tuple[int, int]] = field(default_factory=dict)  # id(layer) -> rows to drop
    shapes: dict[int, torch.Size] = field(default_factory=dict)  # id(activation) -> shape before padding

    def extend(self, activations: list[Tensor], halo: int) -> tuple[list[Tensor], int, int]:
        """Each of ``activations`` with ``halo`` neighbour rows on each side that has a neighbour.

        Returns them and how many rows were added before and after. One all_gather carries the first and
        last ``halo`` rows of all of them — a fixed size whatever this rank's strip — so every rank makes
        the same collective even at the frame's edges, where nothing is added and the layer's own zero
        padding applies.
        """
        axis = self.layout.axis
        edges = [a.narrow(axis, 0, halo) for a in activations]
        edges += [a.narrow(axis, a.shape[axis] - halo, halo) for a in activations]
        sizes = [edge.numel() for edge in edges]
        pieces = self.comm.all_gather(torch.cat([edge.reshape(-1) for edge in edges]))
        self.comm.stats.halo_exchanges += 1

        def rows_of(rank: int, index: int) -> Tensor:
            rows: Tensor = pieces[rank].split(sizes)[index].view(edges[index].shape)
            return rows.to(activations[0].device)

        before, after = self.layout.neighbours()
        count = len(activations)
        extended = []
        for i, activation in enumerate(activations):
            parts = [activation]
            if before is not None:
                parts.insert(0, rows_of(before, count + i))  # the last rows of the strip before
            if after is not None:
                parts.append(rows_of(after, i))  # the first rows of the strip after
            extended.append(torch.cat(parts, dim=axis) if len(parts) > 1 else activation)
        return extended, halo if before is not None else 0, halo if after is not None else 0

    def whole_frame(self, activation: Tensor) -> tuple[Tensor, int, int]:
        """Every rank's strip of ``activation`` joined, and where this rank's rows sit in it."""
        layout = self.layout
        scale = layout.scale_of(activation)
        pieces = self.comm.all_gather(layout.pad(activation, scale))
        self.comm.stats.attention_gathers += 1
        start = layout.bounds[layout.strip][0] * scale
        return layout.join(pieces, scale).to(activation.device), start, layout.rows * scale


_local = threading.local()


@contextmanager
def _active(context: _ShardContext) -> Iterator[None]:
    """Make ``context`` the sharded decode of this thread while the block runs."""
    _local.context = context
    try:
        yield
    finally:
        _local.context = None
        context.crops.clear()
        context.shapes.clear()


def _context_for(decoder: nn.Module) -> _ShardContext | None:
    context: _ShardContext | None = getattr(_local, "context", None)
    if context is None or context.decoder is not decoder:
        return None
    return context


def _halo(layer: nn.Module, axis: int) -> int:
    """Rows a convolution reads beyond each output row along ``axis`` (0: it mixes nothing there).

    Raises ValueError for a convolution whose rows do not map one to one (stride, dilation, padding other
    than kernel // 2), which a halo cannot make exact.
    """
    assert isinstance(layer, (nn.Conv2d, nn.Conv3d))
    kernel, stride, dilation = layer.kernel_size[axis], layer.stride[axis], layer.dilation[axis]
    if isinstance(layer, nn.Conv3d):
        # Wan's causal conv zeroes ``padding`` and pads in forward from ``_padding`` (W, W, H, H, T, 0).
        causal = getattr(layer, "_padding", None)
        padding = causal[0 if axis == -1 else 2] if causal is not None else layer.padding[axis]
    else:
        padding = layer.padding[axis]
    if kernel == 1 and padding == 0:
        return 0
    if stride != 1 or dilation != 1 or padding != kernel // 2 or kernel % 2 == 0 or kernel // 2 > 1:
        raise ValueError(
            f"cannot shard {type(layer).__name__}(kernel={layer.kernel_size}, stride={layer.stride}, "
            f"padding={padding}): only stride-1 'same' convolutions with kernel 3 are supported"
        )
    return int(kernel // 2)


def _check_shardable(decoder: nn.Module, axis: int) -> None:
    """Raise ValueError unless every layer of ``decoder`` that mixes space can be sharded along ``axis``."""
    for layer in decoder.modules():
        if isinstance(layer, (nn.Conv2d, nn.Conv3d)):
            _halo(layer, axis)
        elif isinstance(layer, nn.Upsample):
            scale = layer.scale_factor
            factors = scale if isinstance(scale, tuple) else (scale,)
            if layer.mode not in ("nearest", "nearest-exact") or any(
                f is None or float(f) != int(f) for f in factors
            ):
                # Nearest upsampling by a whole factor maps each input row to its own output rows.
                raise ValueError(f"cannot shard a decoder with {layer!r}: only whole nearest upsampling is")


_hooked: weakref.WeakSet[nn.Module] = weakref.WeakSet()
_install_lock = threading.Lock()


def _install_hooks(decoder: nn.Module) -> None:
    """Register the halo and gather hooks on ``decoder``'s spatial layers, once per module.

    They stay registered and do nothing outside a sharded decode of ``decoder`` in the calling thread.
    """
    with _install_lock:
        if decoder in _hooked:
            return
        for layer in decoder.modules():
            spatial = isinstance(layer, (nn.Conv2d, nn.Conv3d)) and any(k > 1 for k in layer.kernel_size[-2:])
            if spatial:
                layer.register_forward_pre_hook(_conv_pre_hook(decoder), with_kwargs=True)
            elif isinstance(layer, _ATTENTION_BLOCKS):
                layer.register_forward_pre_hook(_attention_pre_hook(decoder))
            if spatial or isinstance(layer, _ATTENTION_BLOCKS):
                layer.register_forward_hook(_crop_hook(decoder))
            if isinstance(layer, _VECTOR_ROUNDED):
                layer.register_forward_pre_hook(_align_pre_hook(decoder))
                layer.register_forward_hook(_unalign_hook(decoder))
        _hooked.add(decoder)


PreHook = Callable[
    [nn.Module, tuple[Any, ...], dict[str, Any]], tuple[tuple[Any, ...], dict[str, Any]] | None
]


def _conv_pre_hook(decoder: nn.Module) -> PreHook:
    def hook(
        layer: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        context = _context_for(decoder)
        if context is None:
            return None
        halo = _halo(layer, context.layout.axis)
        x: Tensor = args[0]
        cache = args[1] if len(args) > 1 else kwargs.get("cache_x")
        causal = getattr(layer, "_padding", None)
        if halo == 0:
            top = bottom = 0
        elif isinstance(cache, Tensor) and causal is not None and causal[4] > 0:
            # The causal conv prepends the cache along time before padding: both need the same halo rows.
            (x, cache), top, bottom = context.extend([x, cache.to(x.device)], halo)
            args = (x, cache, *args[2:])
            kwargs = {k: v for k, v in kwargs.items() if k != "cache_x"}
        else:
            (x,), top, bottom = context.extend([x], halo)
            args = (x, *args[1:])
        context.crops[id(layer)] = (top, bottom)
        return args, kwargs

    return hook


def _attention_pre_hook(decoder: nn.Module) -> Callable[[nn.Module, tuple[Any, ...]], tuple[Any, ...] | None]:
    def hook(layer: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        context = _context_for(decoder)
        if context is None:
            return None
        # Attention mixes the whole frame: run it on the whole frame, then keep this rank's rows.
        frame, start, rows = context.whole_frame(args[0])
        total = frame.shape[context.layout.axis]
        context.crops[id(layer)] = (start, total - start - rows)
        return (frame, *args[1:])

    return hook


def _align_pre_hook(decoder: nn.Module) -> Callable[[nn.Module, tuple[Any, ...]], tuple[Any, ...] | None]:
    def hook(layer: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        context = _context_for(decoder)
        x = args[0]
        if context is None or x.device.type != "cpu" or x.numel() % _CPU_VECTOR_STEP == 0:
            return None
        # CPU kernels compute a tensor's last numel % step elements with scalar code, whose exp rounds
        # differently from the vector code; a strip's tail is not the whole frame's, so run it all vectorized.
        context.shapes[id(layer)] = x.shape
        flat = x.reshape(-1)
        return (torch.cat([flat, flat.new_zeros(-flat.numel() % _CPU_VECTOR_STEP)]), *args[1:])

    return hook


def _unalign_hook(decoder: nn.Module) -> Callable[[nn.Module, tuple[Any, ...], Tensor], Tensor | None]:
    def hook(layer: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor | None:
        context = _context_for(decoder)
        shape = context.shapes.pop(id(layer), None) if context is not None else None
        if shape is None:
            return None
        return output[: shape.numel()].view(shape)

    return hook


def _crop_hook(decoder: nn.Module) -> Callable[[nn.Module, tuple[Any, ...], Tensor], Tensor | None]:
    def hook(layer: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor | None:
        context = _context_for(decoder)
        if context is None:
            return None
        top, bottom = context.crops.pop(id(layer))
        axis = context.layout.axis
        return output.narrow(axis, top, output.shape[axis] - top - bottom)

    return hook


# ----------------------------------------------------------------------------------------------- launch


def init_distributed(
    *, backend: str | None = None, timeout: timedelta = timedelta(minutes=10)
) -> torch.device:
    """Join the process group ``torchrun`` describes and return this rank's device.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` (env://); run
    without torchrun it forms a group of one. On a machine with CUDA the backend defaults to NCCL and
    each rank takes a GPU of its own (``torch.cuda.set_device``): ``cuda:0`` when the process sees one
    GPU (a launcher that gives each process its own, as SLURM's GPU binding or a Kubernetes device plugin
    do), ``cuda:LOCAL_RANK`` when it sees more, and ValueError when ``LOCAL_RANK`` is not below the count
    it sees — never two ranks on one GPU by accident (NCCL also refuses ranks that share one). Without
    CUDA the backend defaults to gloo on the CPU.

    ``timeout`` bounds every collective wait: it is how long a rank waits for a dead or stuck peer before
    its decode raises, and :class:`ShardedWanDecoder` takes it as its ``collective_timeout``. Under NCCL
    it is also when PyTorch's watchdog acts on a stuck collective (by default it ends the process; see
    docs/distributed.md). Does nothing but pick and return the device if a default group already exists.
    """
    global _init_timeout
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        index = _cuda_device_for(
            local_rank, torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES")
        )
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if dist.is_initialized():
        return device
    if "WORLD_SIZE" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    dist.init_process_group(backend, timeout=timeout, device_id=device if backend == "nccl" else None)
    _init_timeout = timeout
    return device


def _cuda_device_for(local_rank: int, visible: int, visible_devices: str | None = None) -> int:
    """The index of this rank's GPU among the ``visible`` ones (``visible_devices``: CUDA_VISIBLE_DEVICES).

    One visible GPU is this process's own (the launcher hid the others); with more, ``LOCAL_RANK`` picks
    one. A ``LOCAL_RANK`` without a GPU of its own raises ValueError rather than share another rank's.
    """
    if visible == 1 and local_rank >= 0:
        return 0
    if 0 <= local_rank < visible:
        return local_rank
    raise ValueError(
        f"LOCAL_RANK={local_rank} has no GPU of its own: this process sees {visible} GPU(s) "
        f"(CUDA_VISIBLE_DEVICES={visible_devices!r}); start at most one process per visible GPU, "
        "or give each process its own GPU"
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
