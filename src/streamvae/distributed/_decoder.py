"""The sharded decoders: one decode split into strips across a process group, stepped in lockstep.

:class:`ShardedDecoder` has a family adapter (``streamvae.models.chunked_decoder``) and runs that family's
walk through time on this rank's strip of the latent, with the hooks of ``_hooks`` making each strip's
output rows the whole frame's. :class:`ShardedWanDecoder` is the sharded decoder of the Wan family, whose
decoders are causal across calls: it adds latents that arrive in pieces. Both are
:class:`~streamvae.models.ChunkedDecoder`\\ s with the whole of that surface: the steps (``iter_chunks``;
``start`` / ``feed`` / ``end``) yield each whole chunk on the output rank, and ``decode_with_chunks``
(``feed_with_chunks``, ``end_with_chunks``) drive those same steps into ``on_chunk``.

Owns the walk every rank runs in the same order, and the boundary before it. A walk (a whole latent, one
piece of a stream, the stream's end) begins at a boundary, where the ranks agree on what comes next, then
loops over steps: take the step's chunk, hand it on on the output rank, agree on the output rank's word.
The loop is one, with two sources of steps: sharded, every rank decodes its strip and the output rank
gathers the chunk; not sharded, the output rank decodes the whole alone and its word says when the walk
ends (``_collectives.Agreement`` carries the boundaries and the words). The failure rule is built on them:
every rank stops at the same boundary, the rank whose failure it was raising its own error and the others
:class:`~streamvae.distributed.PeerDecodeError` (defined with every streamvae error in ``streamvae._errors``).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, get_args

import torch
import torch.distributed as dist
from torch import Tensor

from streamvae._checks import check_choice, is_int
from streamvae._errors import PeerDecodeError, describe_first_cause
from streamvae._protocol import ChunkPublisher
from streamvae.distributed._auto import choose_axis
from streamvae.distributed._collectives import (
    Agreement,
    Collectives,
    Intent,
    Next,
    Word,
    agreement_group,
    comm_device,
    global_rank,
)
from streamvae.distributed._context import ShardContext, active
from streamvae.distributed._hooks import check_shardable, install_hooks
from streamvae.distributed._launch import resolve_collective_timeout
from streamvae.distributed._layout import AXIS_DIM, ShardAxis, StripLayout
from streamvae.distributed._stats import ShardedDecodeStats
from streamvae.models import ChunkedDecoder, DecodeState, chunked_decoder
from streamvae.models._common import uses_spatial_tiling
from streamvae.models.wan import WanChunkedDecoder

_NO_SHAPE = (0,) * 5  # what a boundary without a latent (a stream's end, a stop) says for its shape


@dataclass(frozen=True)
class _Verdict:
    """Why the ranks stopped at chunk ``chunk``: the output rank's error (``rank`` None) or a peer's stop."""

    chunk: int
    error: str
    rank: int | None = None
    own: bool = False  # this rank's own failure: it raises that error, not PeerDecodeError


# One walk's steps: each whole chunk is yielded on the output rank (nothing elsewhere), and what is sent
# back is why handing it on failed (None: it did not). A walk returns the verdict that stopped it (None:
# it ended) and the next chunk's index.
_Walk = Generator[Tensor, BaseException | None, tuple[_Verdict | None, int]]
_Steps = Generator[Tensor, BaseException | None, None]


@dataclass(eq=False)
class _ShardedState(DecodeState):
    """A sharded decode's progress: a whole latent's (one walk) or a stream of latent pieces' (a walk a
    piece, and one at its end). The split, the strip's own stream state, and where the ranks stand."""

    layout: StripLayout | None = None  # None: not sharded, the output rank decodes alone
    inner: DecodeState | None = None  # the family adapter's stream state for this rank's strip (None: none)
    stats: ShardedDecodeStats = field(default_factory=ShardedDecodeStats)
    chunks: int = 0  # the steps walked so far (the index of the next chunk)
    device: torch.device | None = None  # where the latent or the pieces are decoded (None: no piece yet)
    stopped: bool = False  # the ranks stopped together: nothing more is agreed on


class _Turn:
    """One decode or stream at a time per decoder: a whole latent's decode, or a stream start to end."""

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._lock = threading.Lock()

    def take(self) -> None:
        """Take the turn, or raise RuntimeError at once if a decode or stream holds it."""
        if not self._lock.acquire(blocking=False):
            raise RuntimeError(f"{self._owner} runs one decode or stream at a time")

    def give_back(self) -> None:
        self._lock.release()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.take()
        try:
            yield
        finally:
            self.give_back()


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

    Failure rule (agreement): after each step the output rank broadcasts whether handing the chunk on
    failed. If it did, every rank stops at that boundary — no rank skips a collective, none keeps decoding
    — and the output rank raises the original error (a cancelled caller sees its cancellation, as
    ``decode_to_mp4`` arranges), every other rank :class:`PeerDecodeError`. A rank whose own decode step
    raises (out of memory, a bug) cannot finish that step's collectives: its peers wait until the
    collective timeout and then raise the backend's error.

    Stepped (:meth:`iter_chunks`), it is the same decode: every rank iterates its generator to the end; the
    output rank's yields each whole chunk, the others' none. An output rank whose consumer stops early
    (closes the generator, or throws into it) stops every rank at that step, as a failed ``on_chunk`` does.

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
    ValueError on every rank before any collective. Whole latents only: latents in pieces are
    :class:`ShardedWanDecoder`'s.
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
        check_choice("shard", shard, get_args(ShardAxis), owner=owner)
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
        # A distributed decode drains: its peers wait on this rank in collectives until the agreed stop.
        # The base refuses a VAE outside ``vae_classes`` (ShardedWanDecoder's family).
        super().__init__(vae, drain=True)
        #: the family adapter each rank runs on its strip (a TypeError names the supported classes)
        self.family: ChunkedDecoder = chunked_decoder(vae, **family_kwargs)
        self.latent_channels = self.family.latent_channels
        self.chunk_value_range = self.family.chunk_value_range
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if not is_int(output_rank):
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
        self._turn = _Turn(owner)
        # A decode or stream that ended on every rank, whose output's end is not told yet (settle): how
        # many chunks it published. None: nothing to tell.
        self._untold: int | None = None
        install_hooks(vae.decoder)
        # Last: under NCCL it may be a rendezvous, which a decoder refused above must not leave half done.
        self._agreement_group = agreement_group(group, self.collective_timeout)

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

    # -- what the family says --

    @property
    def is_output_rank(self) -> bool:
        """True on the rank that gathers the output and calls ``on_chunk``."""
        return self.rank == self.output_rank

    @property
    def streams(self) -> bool:
        """The family's: whether a chunk leaves while later ones still decode (every rank walks alike)."""
        return self.family.streams

    def output_frames(self, latent_frames: int) -> int | None:
        """The family's count of frames per entry for ``latent_frames`` latent frames (None: unknown)."""
        return self.family.output_frames(latent_frames)

    def prepare_latents(self, z: Tensor) -> Tensor:
        """Validate a de-normalized latent and cast it to the VAE's dtype and device, as the family does."""
        return self.family.prepare_latents(z)

    def check_takes_pieces(self, *, owner: str | None = None) -> None:
        """Raise TypeError unless this decoder decodes latents in pieces (``takes_pieces``)."""
        if self.takes_pieces:
            return
        prefix = "" if owner is None else f"{owner}: "
        causal = " and ".join(cls.__name__ for cls in ShardedWanDecoder.vae_classes)
        raise TypeError(
            f"{prefix}{type(self).__name__} of an {type(self.vae).__name__} decodes whole latents only: pass "
            "the whole latent to decode_to_mp4 on every rank. Latents in pieces need a decoder that is "
            f"causal across calls: a ShardedWanDecoder, which sharded_decoder gives for {causal}"
        )

    # -- whole latents --

    def iter_chunks(self, z: Tensor) -> Generator[Tensor, None, None]:
        """Decode ``z`` [B, C, T, H, W], the same on every rank, step by step in lockstep with the peers.

        A generator: on the output rank, of each whole BCTHW chunk, in order; on the others, of nothing (it
        ends when the decode does). Call it on every rank and iterate each generator to its end. Each step
        runs when the output rank asks for its chunk (its peers wait in that step's collectives), and the
        generator keeps no chunk it yielded. Closing the output rank's generator early, or throwing into it,
        stops every rank after that step: the others raise :class:`PeerDecodeError`. ``z`` is checked now;
        the decode, its turn and its first collective begin at the first step.
        """
        self.check_latents(z)
        return self._latent_steps(z)

    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        """Decode ``z`` [B, C, T, H, W], the same on every rank; the output rank publishes each chunk.

        The output rank's ``on_chunk`` is called once per step of the family's walk with whole BCTHW
        chunks unless it raises; then every rank stops after that step, the output rank re-raises the
        error (no chunk retained) and the others raise :class:`PeerDecodeError`. Ranks whose latents
        differ in shape all raise ValueError after the first collective.
        """
        self.check_latents(z)
        with _on_device(z.device):
            self._publish(self._latent_steps(z), on_chunk)

    def _latent_steps(self, z: Tensor) -> _Steps:
        """The steps of a whole latent's decode, with the turn held from the first to the last."""
        with self._turn.held():
            self._settle_untold()
            self.stats = stats = ShardedDecodeStats()
            height, width = z.shape[-2], z.shape[-1]
            self._check_untiled(height, width)
            layout = self._plan(height, width)
            walk = _ShardedState(self, z.shape[0], height, width, layout=layout, stats=stats, device=z.device)

            def open_steps() -> Iterator[Tensor] | None:
                if layout is None and not self.is_output_rank:
                    return None  # not sharded: the output rank decodes alone
                return self.family.iter_chunks(_this_ranks_part(layout, z))

            verdict = yield from self._agree_and_walk(walk, Next.LATENT, z.shape, open_steps)
            stats.latent_frames += z.shape[2]
            self._raise_if_a_peer_stopped(verdict)
            if verdict is None:
                self._untold = walk.chunks

    # -- the steps --

    def _publish(self, steps: _Steps, on_chunk: Callable[[Tensor], None]) -> None:
        """Drive ``steps`` into ``on_chunk`` under the failure rule.

        The first error ``on_chunk`` raises is sent back into the walk, where every rank stops after that
        step; it is re-raised once the walk is over.
        """
        publisher = ChunkPublisher(on_chunk, drain=True)
        try:
            chunk = next(steps)
            while True:
                publisher.publish(chunk)
                del chunk  # a failed decode's traceback holds this frame: it must not hold a chunk
                chunk = steps.send(publisher.error)
        except StopIteration:
            pass
        finally:
            steps.close()
        publisher.raise_if_failed()

    def _agree_and_walk(
        self,
        walk: _ShardedState,
        kind: Next,
        shape: Any,
        open_steps: Callable[[], Iterator[Tensor] | None],
    ) -> Generator[Tensor, BaseException | None, _Verdict | None]:
        """A boundary and the walk after it, as every walk runs: agree with every rank on what comes next
        (``kind``: a latent of ``shape``, a piece, the stream's end), open this rank's steps (None: it has
        none), walk them and close them, which frees the decoder caches now.

        Returns the verdict that stopped the walk (None: it ended); ``walk.chunks`` counts its chunks.
        ``walk.stopped`` records that the ranks stopped together: they disagreed at the boundary, the
        consumer stopped taking chunks, or a verdict stopped them.
        """
        device = torch.device("cpu") if walk.device is None else walk.device
        comm, agreement = self._collectives(device, walk.stats)
        with _on_device(device):
            try:
                self._agree_boundary(agreement, kind, shape, chunk=walk.chunks)
            except (ValueError, PeerDecodeError):
                walk.stopped = True  # every rank saw the same disagreement
                raise
            steps = open_steps()
        try:
            verdict, walk.chunks = yield from self._walk(walk, steps, comm, agreement, device)
        except BaseException:
            if walk.stats.stopped_at is not None:  # the consumer stopped taking chunks: so did every rank
                walk.stopped = True
            raise
        finally:
            close = getattr(steps, "close", None)
            if close is not None:
                close()
        if verdict is not None:
            walk.stopped = True
        return verdict

    def _walk(
        self,
        walk: _ShardedState,
        steps: Iterator[Tensor] | None,
        comm: Collectives,
        agreement: Agreement,
        device: torch.device,
    ) -> _Walk:
        """Run one walk (a latent, a piece, a stream's end) from chunk ``walk.chunks`` to its end or to the
        step where the ranks stop together (see ``_Walk``).

        One loop, two sources of steps. Sharded, every rank decodes its strip of each step and the output
        rank gathers the chunk: every rank has the same steps, so all see the walk end together. Not
        sharded, the output rank decodes the whole and the others have no steps: its word after each step
        says whether the walk ended (a step more than the walk has), and they follow it.
        """
        stats = walk.stats
        if walk.layout is None:
            ends_together, source = False, self._whole_steps(steps, stats)
        else:
            assert steps is not None  # every rank decodes its strip
            context = ShardContext(self.vae.decoder, walk.layout, comm)
            ends_together, source = True, self._strip_steps(steps, context, comm, stats)
        index = walk.chunks
        while True:
            with _on_device(device):
                held = next(source, None)
            if held is None and ends_together:
                return None, index  # every rank's walk has the same steps: all end here together
            failure = (yield from self._hand_on(held, agreement, stats, index)) if held else None
            status, verdict = self._agree_step(agreement, failure, index, ended=held is None)
            if status == Word.WALK_ENDED:
                return None, index
            index += 1
            if verdict is not None:
                stats.stopped_at = index - 1
                return verdict, index

    def _whole_steps(
        self, steps: Iterator[Tensor] | None, stats: ShardedDecodeStats
    ) -> Iterator[list[Tensor]]:
        """Not sharded: ``[chunk]`` for each step of the output rank's decode of the whole, then the end. A
        rank without steps gives ``[]`` for every step, never an end: the output rank's word tells it."""
        if steps is None:
            while True:
                yield []
        # A list the walk pops the chunk from: suspended here, the source holds no chunk it handed on.
        while held := list(itertools.islice(steps, 1)):
            stats.steps += 1
            yield held

    def _strip_steps(
        self, steps: Iterator[Tensor], context: ShardContext, comm: Collectives, stats: ShardedDecodeStats
    ) -> Iterator[list[Tensor]]:
        """Sharded: for each step of this rank's strip, its chunk gathered (:meth:`_step`), then the end."""
        while (held := self._step(steps, context, comm, stats)) is not None:
            yield held

    def _step(
        self, steps: Iterator[Tensor], context: ShardContext, comm: Collectives, stats: ShardedDecodeStats
    ) -> list[Tensor] | None:
        """Decode this rank's strip of the next step and gather its chunk: ``[chunk]`` on the output rank,
        ``[]`` elsewhere; None once the walk has ended."""
        with active(context):
            strip_chunk = next(steps, None)
        if strip_chunk is None:
            return None
        stats.steps += 1
        layout = context.layout
        scale = layout.scale_of(strip_chunk)
        pieces = comm.gather(layout.pad(strip_chunk, scale), self.output_rank)
        if pieces is None:
            return []
        return [layout.join(pieces, scale).to(strip_chunk.device)]

    def _hand_on(
        self, held: list[Tensor], agreement: Agreement, stats: ShardedDecodeStats, index: int
    ) -> Generator[Tensor, BaseException | None, BaseException | None]:
        """Yield chunk ``index`` (taken out of ``held``: a suspended walk holds no chunk it yielded) and
        return why handing it on failed (None: it did not).

        A consumer that stops taking chunks (it closes the generator, or throws into it) stops every rank
        at this step: the peers hear it in this step's agreement, then the exit goes on. ``stopped_at`` then
        records the step, which a stream's walk reads to know that the ranks stopped together.
        """
        try:
            return (yield held.pop())
        except BaseException as stopped:  # GeneratorExit from close(), or what the consumer threw in
            self._agree_step(agreement, stopped, index, ended=False)
            stats.stopped_at = index
            raise

    def _agree_step(
        self, agreement: Agreement, failure: BaseException | None, index: int, *, ended: bool
    ) -> tuple[int, _Verdict | None]:
        """Broadcast the output rank's word on chunk ``index``: go on, failed (``failure``, with the
        verdict), or (not sharded) the walk ended. ``ended`` is what the output rank says when handing the
        chunk on did not fail."""
        word, error = Word.GO_ON, ""
        if self.is_output_rank:
            if failure is not None:
                word, error = Word.FAILED, _what_stopped(failure)
            elif ended:
                word = Word.WALK_ENDED
        said, text = agreement.word(self._output_global_rank, word, error, chunk=index)
        if said != Word.FAILED:
            return said, None
        return said, _Verdict(chunk=index, error=text, own=failure is not None)

    # -- after the decode --

    def settle(self, failure: BaseException | None) -> None:
        """Tell every rank how the output's end went, after a decode or stream that ended on every rank.

        The ranks agree after every step, but the output rank's session can still fail after the last one:
        its reader closed the stream, the encoder or the output file failed at the end. So once the
        session has ended, every rank calls this (:func:`streamvae.decode_to_mp4`,
        :func:`streamvae.stream_mp4` and :func:`streamvae.open_latent_stream` do): the output rank says
        ``failure`` (None: the output is whole), and the others raise :class:`PeerDecodeError` naming it,
        unless they are failing with their own error (``failure``), which stays theirs. It does nothing
        where the decode did not end on every rank (the ranks stopped together and know why). A caller
        that never calls it (the decode's own methods, driven on every rank) is settled, as going on, at
        the next decode's start. Bounded by ``collective_timeout``.
        """
        if self._untold is None:
            return
        with self._turn.held():
            self._settle_untold(failure)

    def _settle_untold(self, failure: BaseException | None = None) -> None:
        chunks, self._untold = self._untold, None
        if chunks is None:
            return
        _, agreement = self._collectives(torch.device("cpu"), self.stats)
        word, error = Word.GO_ON, ""
        if self.is_output_rank and failure is not None:
            word, error = Word.FAILED, _what_stopped(failure)
        said, text = agreement.word(self._output_global_rank, word, error, chunk=chunks)
        if said == Word.FAILED and failure is None:
            raise PeerDecodeError(
                f"output rank {self.output_rank} failed to finish the output after the decode's last "
                f"chunk ({chunks} chunks): {text}",
                chunk=chunks,
                output_error=text,
            )

    def _raise_if_a_peer_stopped(self, verdict: _Verdict | None) -> None:
        if verdict is not None and not verdict.own:
            raise _peer_error(verdict, self.output_rank)

    # -- boundaries --

    def _agree_boundary(
        self, agreement: Agreement, kind: Next, shape: Any, *, chunk: int, reason: str = ""
    ) -> None:
        """All-gather what every rank is about to do; raise on every rank alike unless all do the same.

        A rank that stops (``Next.STOP``, saying ``reason``) makes the others raise
        :class:`PeerDecodeError`; different latents, shard settings or output ranks raise ValueError
        everywhere.
        """
        shape = _NO_SHAPE if shape is None else tuple(shape)
        everyone = agreement.intents(Intent(kind, shape, self.shard, self.output_rank, reason))
        if all(said.same_as(everyone[0]) for said in everyone):
            return
        stops = [rank for rank, said in enumerate(everyone) if said.kind == Next.STOP]
        if stops:
            if kind == Next.STOP:
                return  # this rank is stopping anyway: its own error is raised
            rank = stops[0]
            verdict = _Verdict(chunk=chunk, error=everyone[rank].reason, rank=rank)
            raise _peer_error(verdict, self.output_rank)
        described = "; ".join(f"rank {rank}: {said.describe()}" for rank, said in enumerate(everyone))
        raise ValueError(
            "every rank must decode the same latents with the same shard and output_rank, in the same "
            f"order; they differ: {described}"
        )

    # -- helpers --

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

    def _check_untiled(self, height: int, width: int) -> None:
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
    """The :class:`ShardedDecoder` of an ``AutoencoderKLWan`` (2.1 or 2.2) or ``AutoencoderKLQwenImage``.

    Their decoders are causal across calls, so besides whole latents it decodes latents that arrive in
    pieces: every rank calls ``open_latent_stream(decoder, fps=...)`` and pushes the same pieces in the
    same order. The output rank's MP4 is the one ``decode_to_mp4(vae, torch.cat(pieces, dim=2))`` writes
    in one process; the other ranks' ``finish()`` returns ``[]``. Before each piece, and at the end, the
    ranks agree on what comes next: pieces whose shapes differ between ranks raise ValueError on every
    rank, and a rank that fails, is cancelled or leaves its stream makes every other rank raise
    :class:`PeerDecodeError` at that boundary (a rank that stops pushing makes its peers' waits end at the
    collective timeout). Each stream keeps its causal caches per rank, in its own state. Stepped, a stream
    is :meth:`start`, :meth:`feed` (a generator of each piece's chunks, as :meth:`iter_chunks` is of a
    latent's) and :meth:`end`, on every rank.
    """

    vae_classes = WanChunkedDecoder.vae_classes
    takes_pieces = True

    def start(self, batch: int, height: int, width: int) -> DecodeState:
        """Begin a stream of latent pieces [batch, C, t, height, width] on this rank (no collective yet).

        Every rank of the group starts one and feeds the same pieces in the same order; the first feed
        agrees on them. The split is chosen now, from ``height`` and ``width``. The stream holds this
        decoder's turn until it ends.
        """
        self._turn.take()
        try:
            self._settle_untold()
            self._check_untiled(height, width)
            layout = self._plan(height, width)
            inner = None
            if layout is not None:
                inner = self.family.start(batch, *layout.strip_size(height, width))
            elif self.is_output_rank:
                inner = self.family.start(batch, height, width)
        except BaseException:
            self._turn.give_back()
            raise
        self.stats = stats = ShardedDecodeStats()
        return _ShardedState(
            owner=self, batch=batch, height=height, width=width, layout=layout, inner=inner, stats=stats
        )

    def feed(self, state: DecodeState, z: Tensor) -> Generator[Tensor, None, None]:
        """Decode the next piece ``z`` of ``state``'s stream, the same piece on every rank, in lockstep.

        A generator of the chunks the piece makes final (on the output rank; none on the others), as
        :meth:`iter_chunks` is of a whole latent's. The piece is checked now; the ranks agree on it at the
        first step: pieces that differ in shape between ranks raise ValueError on every rank, and a rank
        that stopped its stream (it failed, was cancelled or left) makes the others raise
        :class:`PeerDecodeError`. Take every chunk of a piece before feeding the next; an output rank that
        stops early stops every rank's stream at that step (then only :meth:`end` or :meth:`abort`).
        """
        state = self._check_piece(state, z)
        return self._piece_steps(state, z)

    def feed_with_chunks(self, state: DecodeState, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        """:meth:`feed` piece ``z`` and publish its chunks into the output rank's ``on_chunk``, under the
        failure rule of :meth:`decode_with_chunks`."""
        state = self._check_piece(state, z)
        with _on_device(z.device):
            self._publish(self._piece_steps(state, z), on_chunk)

    def end(self, state: DecodeState) -> Iterator[Tensor]:
        """End ``state``'s stream on every rank together (as :meth:`end_with_chunks`), now; gives the chunks
        the family held back (none for Wan). A stream the ranks stopped together is only freed, and ending
        an ended stream gives nothing."""
        self._check_owner(state)
        assert isinstance(state, _ShardedState)
        if state.ended:
            return iter(())
        if state.stopped:
            self._close(state)
            return iter(())
        return iter(list(self._finish_steps(state)))

    def end_with_chunks(self, state: DecodeState, *, on_chunk: Callable[[Tensor], None]) -> None:
        """End ``state``'s stream on every rank together (the ranks agree that all of them finish) and
        publish what the family held back."""
        state = self._open(state)
        with _on_device(state.device or torch.device("cpu")):
            self._publish(self._finish_steps(state), on_chunk)

    def abort(self, state: DecodeState, *, reason: str | None = None) -> None:
        """End ``state``'s stream without finishing it: tell the peers (unless the ranks stopped together
        already), free the caches. ``reason`` is what the peers' :class:`PeerDecodeError` will say."""
        self._check_owner(state)
        assert isinstance(state, _ShardedState)
        if state.ended:
            return
        try:
            if not state.stopped:
                told = reason or "the stream was left before finish()"
                _, agreement = self._collectives(torch.device("cpu"), state.stats)
                # A peer that is gone or stuck makes this raise within the timeout; this rank is failing
                # already with its own error, which must stay the one raised.
                with contextlib.suppress(RuntimeError, ValueError, PeerDecodeError):
                    self._agree_boundary(agreement, Next.STOP, None, chunk=state.chunks, reason=told)
        finally:
            self._close(state)

    def _check_piece(self, state: DecodeState, z: Tensor) -> _ShardedState:
        """``state``, piece ``z`` counted as fed, if ``z`` may be fed now; else ValueError or TypeError."""
        state = self._open(state)
        self._take_piece(state, z)
        state.device = z.device
        return state

    def _piece_steps(self, state: _ShardedState, z: Tensor) -> _Steps:
        inner, layout = state.inner, state.layout
        verdict = yield from self._agree_and_walk(
            state,
            Next.PIECE,
            z.shape,
            lambda: None if inner is None else self.family.feed(inner, _this_ranks_part(layout, z)),
        )
        self._raise_if_a_peer_stopped(verdict)
        if verdict is None:
            state.decoded = state.fed
            state.stats.latent_frames += z.shape[2]

    def _finish_steps(self, state: _ShardedState) -> _Steps:
        inner = state.inner
        try:
            verdict = yield from self._agree_and_walk(  # what the family held back
                state, Next.FINISH, None, lambda: None if inner is None else self.family.end(inner)
            )
            self._raise_if_a_peer_stopped(verdict)
            if verdict is None:
                self._untold = state.chunks
        finally:
            self._close(state)

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
        self._turn.give_back()


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
    causal = isinstance(vae, ShardedWanDecoder.vae_classes)
    cls = ShardedWanDecoder if causal else ShardedDecoder
    return cls(
        vae,
        shard=shard,
        group=group,
        output_rank=output_rank,
        collective_timeout=collective_timeout,
        **family_kwargs,
    )


def _on_device(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    # The current CUDA device is per thread, and this runs in a worker thread, not the one that set it.
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _this_ranks_part(layout: StripLayout | None, z: Tensor) -> Tensor:
    """What of latent ``z`` this rank decodes: its strip, or the whole where the decode is not sharded."""
    return z if layout is None else layout.strip_of(z)


def _what_stopped(error: BaseException) -> str:
    """What the output rank tells its peers stopped it: the first cause of ``error``."""
    if isinstance(error, GeneratorExit):
        return "the output rank stopped taking chunks (its steps were closed before their end)"
    return describe_first_cause(error)


def _peer_error(verdict: _Verdict, output_rank: int) -> PeerDecodeError:
    who = f"output rank {output_rank}" if verdict.rank is None else f"rank {verdict.rank}"
    return PeerDecodeError(
        f"{who} stopped the decode at chunk {verdict.chunk}: {verdict.error}",
        chunk=verdict.chunk,
        output_error=verdict.error,
        rank=verdict.rank,
    )
