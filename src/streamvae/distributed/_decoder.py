"""The sharded decoder: one decode split into strips across a process group, for every streamed family.

Owns the step loop every rank runs in the same order — decode this rank's strip of a step, gather the chunk
on the output rank, publish it there, agree on the output rank's verdict — and the boundaries before each
walk (a whole latent, one piece of a stream, the stream's end), where the ranks agree on what comes next.
The failure rule is built on both: every rank stops at the same boundary, the rank whose failure it was
raising its own error and the others :class:`PeerDecodeError`.

The strips themselves are the family adapter's (``streamvae.models.chunked_decoder``) decode of a strip of
the latent, with the hooks of ``_halo`` making each strip's output rows the whole frame's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from streamvae._checks import check_choice
from streamvae._errors import StreamVAEError, describe_first_cause
from streamvae._protocol import ChunkPublisher
from streamvae.distributed._auto import choose_axis
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
from streamvae.models import ChunkedDecoder, DecodeState, chunked_decoder
from streamvae.models._common import uses_spatial_tiling

_TEXT_BYTES = 256  # an error's text in a verdict or a boundary: UTF-8, truncated
_SHARD_CODES = {"auto": 0, "height": 1, "width": 2}

# What the output rank says after each step.
_GO_ON, _FAILED, _WALK_ENDED = 0, 1, 2

# What a rank is about to do at a boundary.
_LATENT, _PIECE, _FINISH, _STOP = 1, 2, 3, 4
_BOUNDARY_KINDS = {_LATENT: "a whole latent", _PIECE: "a piece", _FINISH: "finish", _STOP: "stopped"}


class PeerDecodeError(StreamVAEError, RuntimeError):
    """Raised on a rank whose peer stopped the decode: every rank stopped at the same boundary.

    The output rank's ``on_chunk`` failed (a failed session, an encoder error) or its caller was cancelled;
    or, in a stream of latent pieces, a rank failed, was cancelled or left its stream before the others
    (then the output rank raises this too). The rank whose failure it was raises its own error.
    """

    def __init__(self, message: str, *, chunk: int, output_error: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.chunk = chunk  #: how many chunks had been published when the decode stopped
        self.output_error = output_error  #: "ErrorType: message" of the stopping rank's error (truncated)
        self.rank = rank  #: the group rank that stopped the decode (None: the output rank)


@dataclass(frozen=True)
class _Verdict:
    """Why the ranks stopped at chunk ``chunk``: the output rank's error (``rank`` None) or a peer's stop."""

    chunk: int
    error: str
    rank: int | None = None


def _encode_text(text: str, into: Tensor) -> None:
    told = text.encode()[: into.numel()]
    if told:
        into[: len(told)] = torch.frombuffer(bytearray(told), dtype=torch.uint8)


def _decode_text(data: Tensor) -> str:
    return bytes(data.tolist()).rstrip(b"\0").decode(errors="replace")


@dataclass(eq=False)
class _ShardedState(DecodeState):
    """A stream of latent pieces decoded across the group: the split, and the strip's own stream state."""

    layout: StripLayout | None = None  # None: not sharded, the output rank decodes alone
    inner: DecodeState | None = None  # the family adapter's state for this rank's strip (None: idle rank)
    stats: ShardedDecodeStats = field(default_factory=ShardedDecodeStats)
    chunks: int = 0  # the steps walked so far (the index of the next chunk)
    device: torch.device | None = None  # where the pieces are decoded (the first piece's device)
    stopped: bool = False  # the ranks stopped together: nothing more is agreed on


class ShardedDecoder(ChunkedDecoder):
    """Decodes any VAE :func:`streamvae.models.chunked_decoder` takes across a process group, in strips.

    Create one on every rank of ``group`` (default: the whole world) with the same VAE weights, ``shard``
    and family keywords (``family_kwargs``: what ``chunked_decoder`` takes, such as LTX-Video's ``temb``),
    and call ``decode_to_mp4(decoder, z, ...)`` (or :meth:`decode_with_chunks`) on every rank with the same
    latent. Each rank runs the family's own walk through time (Wan's latent frames, HunyuanVideo's
    overlapping windows, LTX-Video's temporal tiles, CogVideoX's latent batches) on its strip of the latent:
    a band of latent rows (``shard="height"``) or columns (``"width"``). Hooks on the decoder's layers pass
    each spatial convolution its neighbours' boundary rows, give attention the whole frame and, for the
    families that normalize over space (GroupNorm), the whole frame's statistics. Only the ``output_rank``
    (a rank of ``group``) calls ``on_chunk``; ``decode_to_mp4`` returns ``[]`` on the others. Chunks equal
    the single-process ``vae.decode`` (tiling off) bit for bit where the backend sums the same way, else to
    float rounding (docs/distributed.md measures both, per family).

    ``shard="auto"`` chooses the axis per decode (per stream: at its first piece) from the latent's size:
    height, unless the width has at least twice the rows (a width strip's boundary columns are strided
    copies) or the height has fewer rows than ranks; and it does not shard where sharding does not pay
    (one rank, fewer than 16 latent positions a rank, fewer rows than ranks both ways). The output rank
    then decodes alone while the others follow its verdict after each step, so no rank ever needs more
    decode memory than a single process (docs/distributed.md gives the measurements).
    ``collective_timeout`` (a ``timedelta``; default: the group's own timeout) bounds every wait for a
    peer.

    Failure rule (agreement): after each step the output rank broadcasts whether publishing failed. If it
    did, every rank stops at that boundary — no rank skips a collective, none keeps decoding — and the
    output rank raises the original error (a cancelled caller sees its cancellation, as ``decode_to_mp4``
    arranges), every other rank :class:`PeerDecodeError`. A rank whose own decode step raises (out of
    memory, a bug) cannot finish that step's collectives: its peers wait until the collective timeout and
    then raise the backend's error.

    The agreement (what each rank is about to decode, the verdict after each step) is the only place where
    the host waits for its peers under NCCL, whose other collectives are queued on the GPU. It runs over
    gloo with host tensors, each wait bounded by ``collective_timeout``: over the decode group itself when
    it is gloo, else over a gloo group of the same ranks, which the first decoder of a group creates (under
    NCCL, construct decoders on every rank of the group in the same order).

    The hooks are registered on the VAE's decoder layers once and act only inside a sharded decode, in that
    decode's thread: a single-process decode of the same module in another thread is unaffected (create the
    adapter before such threads start). One decode or stream at a time per adapter (another raises
    RuntimeError), and ranks run their sharded decodes of one group in the same order. ``vae.use_tiling``
    must not apply to the latent (sharding is the way to cut memory here): a latent that would tile raises
    ValueError on every rank before any collective. Whole latents only, unless the family decodes latents
    in pieces (:class:`ShardedWanDecoder`).
    """

    def __init__(
        self,
        vae: Any,
        *,
        shard: ShardAxis = "auto",
        group: dist.ProcessGroup | None = None,
        output_rank: int = 0,
        collective_timeout: timedelta | None = None,
        **family_kwargs: Any,
    ) -> None:
        owner = type(self).__name__
        check_choice("shard", shard, tuple(_SHARD_CODES), owner=owner)
        self.shard: ShardAxis = shard
        if collective_timeout is not None and not isinstance(collective_timeout, timedelta):
            raise TypeError(
                f"{owner}: collective_timeout must be a datetime.timedelta or None, "
                f"got {type(collective_timeout).__name__}"
            )
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                f"{owner} needs an initialized torch.distributed process group "
                "(torch.distributed.init_process_group; under torchrun, "
                "streamvae.distributed.init_distributed)"
            )
        #: the family adapter each rank runs on its strip
        self.family: ChunkedDecoder = self._family_adapter(vae, family_kwargs)
        # A distributed decode drains: its peers wait on this rank in collectives until the agreed stop.
        super().__init__(vae, latent_channels=self.family.latent_channels, drain=True)
        self.chunk_value_range = self.family.chunk_value_range
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if isinstance(output_rank, bool) or not isinstance(output_rank, int):
            raise TypeError(f"{owner}: output_rank must be an int, got {type(output_rank).__name__}")
        if not 0 <= output_rank < self.world_size:
            raise ValueError(
                f"{owner}: output_rank must be a rank of the group (0..{self.world_size - 1}), "
                f"got {output_rank}"
            )
        self.output_rank = output_rank
        #: how long any wait of this decoder's agreement lasts before it raises (a peer died or stalled)
        self.collective_timeout: timedelta = resolve_collective_timeout(group, collective_timeout)
        self.stats = ShardedDecodeStats()
        self._output_global_rank = global_rank(group, output_rank)
        self._axes = self._shardable_axes(vae.decoder)
        self._turn = threading.Lock()  # one decode or stream at a time
        install_hooks(vae.decoder)
        # Last: under NCCL it may be a rendezvous, which a decoder refused above must not leave half done.
        self._agreement_group = agreement_group(group, self.collective_timeout)

    def _family_adapter(self, vae: Any, family_kwargs: dict[str, Any]) -> ChunkedDecoder:
        """The single-process adapter of ``vae`` (TypeError naming the supported classes otherwise)."""
        return chunked_decoder(vae, **family_kwargs)

    def _shardable_axes(self, decoder: torch.nn.Module) -> tuple[str, ...]:
        """The axes the decoder can be split along (`shard`'s, or both for "auto"); ValueError if none."""
        wanted = ("height", "width") if self.shard == "auto" else (self.shard,)
        refusals: list[ValueError] = []
        axes = []
        for axis in wanted:
            try:
                check_shardable(decoder, AXIS_DIM[axis])
            except ValueError as error:
                refusals.append(error)
            else:
                axes.append(axis)
        if not axes:
            raise refusals[0]
        return tuple(axes)

    @property
    def is_output_rank(self) -> bool:
        """True on the rank that gathers the output and calls ``on_chunk``."""
        return self.rank == self.output_rank

    def prepare_latents(self, z: Tensor) -> Tensor:
        """Validate a de-normalized latent and cast it to the VAE's dtype and device, as the family does."""
        return self.family.prepare_latents(z)

    def iter_chunks(self, z: Tensor) -> Generator[Tensor, None, None]:
        """Not available: each step is a collective that every rank runs in lockstep with its peers, so
        the decode is driven by :meth:`decode_with_chunks` on every rank, never by one rank's consumer."""
        raise TypeError(
            f"{type(self).__name__} decodes in lockstep with its peers: call decode_with_chunks on every rank"
        )

    def check_takes_pieces(self, *, owner: str | None = None) -> None:
        """Raise TypeError unless the family decodes latents that arrive in pieces (Wan, Qwen-Image)."""
        if self.family.takes_pieces:
            return
        prefix = "" if owner is None else f"{owner}: "
        raise TypeError(
            f"{prefix}{type(self).__name__} of an {type(self.vae).__name__} decodes whole latents only: that "
            "decoder is not causal across calls, so a piece's frames depend on latents still to come. Pass "
            "the whole latent to decode_to_mp4 on every rank (pieces work for AutoencoderKLWan and "
            "AutoencoderKLQwenImage)"
        )

    # -- whole latents --

    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        """Decode ``z`` [B, C, T, H, W], the same on every rank; the output rank publishes each chunk.

        The output rank's ``on_chunk`` is called once per step of the family's walk with whole BCTHW
        chunks unless it raises; then every rank stops after that step, the output rank re-raises the
        error (no chunk retained) and the others raise :class:`PeerDecodeError`. Ranks whose latents
        differ in shape all raise ValueError after the first collective.
        """
        with self._decode_turn(), _on_device(z):
            self.stats = stats = ShardedDecodeStats()
            self._check_untiled(z)
            layout = self._plan(z.shape[-2], z.shape[-1])
            comm, agreement = self._collectives(z.device, stats)
            self._agree_boundary(agreement, _LATENT, z.shape, chunk=0)
            steps = None
            if layout is not None:
                steps = self.family.iter_chunks(layout.strip_of(z))
            elif self.is_output_rank:
                steps = self.family.iter_chunks(z)
            publisher = ChunkPublisher(on_chunk, drain=True)
            try:
                verdict, _ = self._walk(steps, layout, comm, agreement, publisher, stats, first_chunk=0)
            finally:
                if steps is not None:
                    steps.close()  # frees the decoder caches now
            stats.latent_frames += z.shape[2]
            publisher.raise_if_failed()
            if verdict is not None:
                raise _peer_error(verdict, self.output_rank)

    # -- latents in pieces --

    def start(self, batch: int, height: int, width: int) -> DecodeState:
        """Begin a stream of latent pieces [batch, C, t, height, width] on this rank (no collective yet).

        Every rank of the group starts one and feeds the same pieces in the same order; the first feed
        agrees on them. The split is chosen now, from ``height`` and ``width``.
        """
        self.check_takes_pieces()
        if not self._turn.acquire(blocking=False):
            raise RuntimeError(f"{type(self).__name__} runs one decode or stream at a time")
        try:
            self._check_untiled_size(height, width)
            layout = self._plan(height, width)
            inner = None
            if layout is not None:
                inner = self.family.start(batch, *layout.strip_size(height, width))
            elif self.is_output_rank:
                inner = self.family.start(batch, height, width)
        except BaseException:
            self._turn.release()
            raise
        self.stats = stats = ShardedDecodeStats()
        return _ShardedState(
            owner=self, batch=batch, height=height, width=width, layout=layout, inner=inner, stats=stats
        )

    def feed_with_chunks(self, state: DecodeState, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        """Decode the next piece ``z`` of ``state``'s stream, the same piece on every rank, in lockstep.

        The ranks first agree on the piece: pieces that differ in shape between ranks raise ValueError on
        every rank, and a rank that stopped its stream (it failed, was cancelled or left) makes the others
        raise :class:`PeerDecodeError`. Then as :meth:`decode_with_chunks`.
        """
        state = self._open(state)
        self.check_latents(z)
        if (z.shape[0], *z.shape[3:]) != (state.batch, state.height, state.width):
            raise ValueError(
                f"{type(self).__name__}: z must be a piece of the stream's latent [{state.batch}, "
                f"{self.latent_channels}, frames, {state.height}, {state.width}], got shape {tuple(z.shape)}"
            )
        with _on_device(z):
            state.device = z.device
            comm, agreement = self._collectives(z.device, state.stats)
            self._agree_on(state, agreement, _PIECE, z.shape)
            steps = None
            if state.inner is not None:
                piece = z if state.layout is None else state.layout.strip_of(z)
                steps = self.family.feed(state.inner, piece)
            state.fed += z.shape[2]
            self._walk_piece(state, steps, comm, agreement, on_chunk)
            state.decoded = state.fed
            state.stats.latent_frames += z.shape[2]

    def end_with_chunks(self, state: DecodeState, *, on_chunk: Callable[[Tensor], None]) -> None:
        """End ``state``'s stream on every rank together (the ranks agree that all of them finish)."""
        state = self._open(state)
        try:
            device = torch.device("cpu") if state.device is None else state.device
            comm, agreement = self._collectives(device, state.stats)
            self._agree_on(state, agreement, _FINISH, None)
            steps = None if state.inner is None else self.family.end(state.inner)
            self._walk_piece(state, steps, comm, agreement, on_chunk)  # what the family held back
        finally:
            self._close(state)

    def _walk_piece(
        self,
        state: _ShardedState,
        steps: Iterator[Tensor] | None,
        comm: Collectives,
        agreement: Agreement,
        on_chunk: Callable[[Tensor], None],
    ) -> None:
        """One piece's walk (or the end's), under the failure rule: the ranks stop together or go on."""
        publisher = ChunkPublisher(on_chunk, drain=True)
        try:
            verdict, state.chunks = self._walk(
                steps, state.layout, comm, agreement, publisher, state.stats, first_chunk=state.chunks
            )
        finally:
            close = getattr(steps, "close", None)
            if close is not None:
                close()
        if verdict is not None:
            state.stopped = True
        publisher.raise_if_failed()
        if verdict is not None:
            raise _peer_error(verdict, self.output_rank)

    def abort(self, state: DecodeState, *, reason: str | None = None) -> None:
        """End ``state``'s stream without finishing it: tell the peers (unless the ranks stopped together
        already), free the caches. ``reason`` is what the peers' :class:`PeerDecodeError` will say."""
        assert isinstance(state, _ShardedState)
        self._check_owner(state)
        if state.ended:
            return
        try:
            if not state.stopped:
                told = reason or "the stream was left before finish()"
                _, agreement = self._collectives(torch.device("cpu"), state.stats)
                # A peer that is gone or stuck makes this raise within the timeout; this rank is failing
                # already with its own error, which must stay the one raised.
                with contextlib.suppress(RuntimeError, ValueError, PeerDecodeError):
                    self._agree_boundary(agreement, _STOP, None, chunk=state.chunks, text=told)
        finally:
            self._close(state)

    # -- the steps --

    def _walk(
        self,
        steps: Iterator[Tensor] | None,
        layout: StripLayout | None,
        comm: Collectives,
        agreement: Agreement,
        publisher: ChunkPublisher,
        stats: ShardedDecodeStats,
        *,
        first_chunk: int,
    ) -> tuple[_Verdict | None, int]:
        """Run one walk (a latent, a piece, a stream's end) to its end or to the step where the ranks stop
        together; returns the verdict that stopped it (None: it ended) and the next chunk's index."""
        if layout is None:
            return self._walk_alone(steps, agreement, publisher, stats, first_chunk)
        if steps is None:
            return None, first_chunk
        context = ShardContext(self.vae.decoder, layout, comm)
        index = first_chunk
        while True:
            with active(context):
                strip_chunk = next(steps, None)
            if strip_chunk is None:
                return None, index  # every rank's walk has the same steps: all end here together
            stats.steps += 1
            chunk = self._gather_chunk(comm, layout, strip_chunk)
            del strip_chunk
            if chunk is not None:
                publisher.publish(chunk)
                del chunk  # a failed decode's traceback holds this frame: it must not hold a chunk
            _, verdict = self._agree_step(agreement, publisher, index, ended=False)
            index += 1
            if verdict is not None:
                stats.stopped_at = index - 1
                return verdict, index

    def _walk_alone(
        self,
        steps: Iterator[Tensor] | None,
        agreement: Agreement,
        publisher: ChunkPublisher,
        stats: ShardedDecodeStats,
        index: int,
    ) -> tuple[_Verdict | None, int]:
        """Not sharded: the output rank decodes the whole, the others follow its verdict after each step
        (a step more than the walk has, to hear that it ended)."""
        while True:
            ended = True
            if self.is_output_rank and steps is not None:
                chunk = next(steps, None)
                ended = chunk is None
                if chunk is not None:
                    stats.steps += 1
                    publisher.publish(chunk)
                    del chunk
            status, verdict = self._agree_step(agreement, publisher, index, ended=ended)
            if status == _WALK_ENDED:
                return None, index
            index += 1
            if verdict is not None:
                stats.stopped_at = index - 1
                return verdict, index

    def _gather_chunk(self, comm: Collectives, layout: StripLayout, strip_chunk: Tensor) -> Tensor | None:
        """The whole chunk on the output rank (None elsewhere), from every rank's strip of it."""
        scale = layout.scale_of(strip_chunk)
        pieces = comm.gather(layout.pad(strip_chunk, scale), self.output_rank)
        if pieces is None:
            return None
        return layout.join(pieces, scale).to(strip_chunk.device)

    def _agree_step(
        self, agreement: Agreement, publisher: ChunkPublisher, index: int, *, ended: bool
    ) -> tuple[int, _Verdict | None]:
        """Broadcast the output rank's word on chunk ``index``: go on, failed (with the verdict), or (not
        sharded) the walk ended. ``ended`` is what the output rank says when publishing did not fail."""
        status = torch.zeros(1 + _TEXT_BYTES, dtype=torch.uint8)
        if self.is_output_rank:
            if publisher.error is not None:
                status[0] = _FAILED
                _encode_text(describe_first_cause(publisher.error), status[1:])
            elif ended:
                status[0] = _WALK_ENDED
        agreement.broadcast(status, self._output_global_rank, f"the output rank's verdict on chunk {index}")
        said = int(status[0])
        if said != _FAILED:
            return said, None
        return said, _Verdict(chunk=index, error=_decode_text(status[1:]))

    # -- boundaries --

    def _agree_on(self, state: _ShardedState, agreement: Agreement, kind: int, shape: Any) -> None:
        """A stream's boundary: agree, and mark the stream stopped on every rank if the ranks disagree."""
        try:
            self._agree_boundary(agreement, kind, shape, chunk=state.chunks)
        except (ValueError, PeerDecodeError):
            state.stopped = True  # every rank saw the same disagreement
            raise

    def _agree_boundary(
        self, agreement: Agreement, kind: int, shape: Any, *, chunk: int, text: str = ""
    ) -> None:
        """All-gather what every rank is about to do; raise on every rank alike unless all do the same.

        A rank that stops (``_STOP``) makes the others raise :class:`PeerDecodeError`; different latents,
        shard settings or output ranks raise ValueError everywhere.
        """
        dims = tuple(shape) if shape is not None else (0,) * 5
        header = [kind, *dims, _SHARD_CODES[self.shard], self.output_rank]
        mine = torch.zeros(8 * len(header) + _TEXT_BYTES, dtype=torch.uint8)
        mine[: 8 * len(header)] = torch.tensor(header, dtype=torch.int64).view(torch.uint8)
        _encode_text(text, mine[8 * len(header) :])
        everyone = agreement.all_gather(mine, "what each rank decodes next")
        said = [tuple(t[: 8 * len(header)].view(torch.int64).tolist()) for t in everyone]
        if all(s == said[0] for s in said):
            return
        stops = [rank for rank, s in enumerate(said) if s[0] == _STOP]
        if stops:
            if kind == _STOP:
                return  # this rank is stopping anyway: its own error is raised
            rank = stops[0]
            reason = _decode_text(everyone[rank][8 * len(header) :])
            raise _peer_error(_Verdict(chunk=chunk, error=reason, rank=rank), self.output_rank)
        described = "; ".join(f"rank {rank}: {_describe(s)}" for rank, s in enumerate(said))
        raise ValueError(
            "every rank must decode the same latents with the same shard and output_rank, in the same "
            f"order; they differ: {described}"
        )

    # -- helpers --

    @contextlib.contextmanager
    def _decode_turn(self) -> Iterator[None]:
        if not self._turn.acquire(blocking=False):
            raise RuntimeError(f"{type(self).__name__} runs one decode or stream at a time")
        try:
            yield
        finally:
            self._turn.release()

    def _open(self, state: DecodeState) -> _ShardedState:
        if not isinstance(state, _ShardedState):
            raise ValueError(f"{type(self).__name__}: this state belongs to another decoder")
        self._check_open(state)
        if state.stopped:
            raise ValueError(
                f"{type(self).__name__}: this stream stopped on every rank; only end() is possible"
            )
        return state

    def _close(self, state: _ShardedState) -> None:
        if state.ended:
            return
        state.ended = True
        if state.inner is not None:
            chunks = self.family.end(state.inner)
            if isinstance(chunks, Generator):
                chunks.close()
            state.inner = None
        self._turn.release()

    def end(self, state: DecodeState) -> Iterator[Tensor]:
        """End ``state``'s stream as :meth:`abort` does (the peers are told); gives no chunk."""
        self.abort(state)
        return iter(())

    def _collectives(self, device: torch.device, stats: ShardedDecodeStats) -> tuple[Collectives, Agreement]:
        comm = Collectives(self.group, comm_device(self.group, device), stats)
        return comm, Agreement(self._agreement_group, self.collective_timeout, stats)

    def _plan(self, height: int, width: int) -> StripLayout | None:
        """This rank's strip of a latent of this size (None: not sharded, the output rank decodes alone)."""
        chosen: str | None = self.shard
        if self.shard == "auto":
            chosen = choose_axis(height, width, self.world_size)
            if chosen is not None and chosen not in self._axes:
                chosen = next((axis for axis in self._axes if axis != chosen), None)
        if chosen is None:
            return None
        dim = AXIS_DIM[chosen]
        return StripLayout.plan(height if dim == -2 else width, self.world_size, self.rank, dim)

    def _check_untiled(self, z: Tensor) -> None:
        self._check_untiled_size(z.shape[-2], z.shape[-1])

    def _check_untiled_size(self, height: int, width: int) -> None:
        # Decided on the whole latent, so every rank decides alike before its first collective.
        vae = self.vae
        own = getattr(vae, "tile_latent_min_height", None)  # CogVideoX keeps its latent tile size
        latent_tile = None if own is None else (int(own), int(vae.tile_latent_min_width))
        if uses_spatial_tiling(vae, height, width, latent_tile=latent_tile):
            raise ValueError(
                f"{type(self).__name__} decodes untiled strips, but vae.use_tiling would tile this latent: "
                "call vae.disable_tiling() (sharding is what cuts the memory here)"
            )


class ShardedWanDecoder(ShardedDecoder):
    """A :class:`ShardedDecoder` of an ``AutoencoderKLWan`` (2.1 or 2.2) or ``AutoencoderKLQwenImage``.

    Their decoders are causal across calls, so besides whole latents it decodes latents that arrive in
    pieces: every rank calls ``open_latent_stream(decoder, fps=...)`` and pushes the same pieces in the
    same order. The output rank's MP4 is the one ``decode_to_mp4(vae, torch.cat(pieces, dim=2))`` writes
    in one process; the other ranks' ``finish()`` returns ``[]``. Before each piece, and at the end, the
    ranks agree on what comes next: pieces whose shapes differ between ranks raise ValueError on every
    rank, and a rank that fails, is cancelled or leaves its stream makes every other rank raise
    :class:`PeerDecodeError` at that boundary (a rank that stops pushing makes its peers' waits end at the
    collective timeout). Each stream keeps its causal caches per rank, in its own state.
    """

    def _family_adapter(self, vae: Any, family_kwargs: dict[str, Any]) -> ChunkedDecoder:
        from streamvae.models.wan import WanChunkedDecoder

        return WanChunkedDecoder(vae, **family_kwargs)  # raises TypeError for any other class


def sharded_decoder(
    vae: Any,
    *,
    group: dist.ProcessGroup | None = None,
    shard: ShardAxis = "auto",
    output_rank: int = 0,
    collective_timeout: timedelta | None = None,
    **family_kwargs: Any,
) -> ShardedDecoder:
    """The sharded adapter of ``vae``, for every VAE :func:`streamvae.models.chunked_decoder` takes.

    A :class:`ShardedWanDecoder` for Wan 2.1 / 2.2 and Qwen-Image (it also takes latents in pieces), a
    :class:`ShardedDecoder` for HunyuanVideo, LTX-Video, LTX-2, CogVideoX, Mochi and EasyAnimate's Magvit.
    A family whose layers cannot be split (MiniMax-H3's ViT, Allegro's and SVD's whole-frame attention,
    Cosmos' and KVAE's self-padding convolutions) is refused with a ValueError naming the layer, before any
    collective. ``family_kwargs`` are what
    ``chunked_decoder`` takes (LTX-Video's ``temb``). Call it on every rank of ``group`` with the same
    arguments; a bad ``shard`` is a ValueError on every rank, before any collective.
    """
    from streamvae.models.wan import WanChunkedDecoder

    wan = any(isinstance(vae, cls) for cls in WanChunkedDecoder.vae_classes)
    cls = ShardedWanDecoder if wan else ShardedDecoder
    return cls(
        vae,
        shard=shard,
        group=group,
        output_rank=output_rank,
        collective_timeout=collective_timeout,
        **family_kwargs,
    )


def _on_device(z: Tensor) -> contextlib.AbstractContextManager[Any]:
    # The current CUDA device is per thread, and this runs in a worker thread, not the one that set it.
    return torch.cuda.device(z.device) if z.device.type == "cuda" else contextlib.nullcontext()


def _peer_error(verdict: _Verdict, output_rank: int) -> PeerDecodeError:
    who = f"output rank {output_rank}" if verdict.rank is None else f"rank {verdict.rank}"
    return PeerDecodeError(
        f"{who} stopped the decode at chunk {verdict.chunk}: {verdict.error}",
        chunk=verdict.chunk,
        output_error=verdict.error,
        rank=verdict.rank,
    )


def _describe(said: tuple[int, ...]) -> str:
    kind, *shape, shard, output_rank = said
    what = _BOUNDARY_KINDS.get(kind, f"kind {kind}")
    if kind in (_LATENT, _PIECE):
        what += f" of shape {list(shape)}"
    shard_name = next(name for name, code in _SHARD_CODES.items() if code == shard)
    return f"{what}, shard {shard_name!r}, output_rank {output_rank}"
