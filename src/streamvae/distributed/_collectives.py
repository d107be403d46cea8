"""The collectives of a sharded decode: the decode group's gathers, and the agreement at step boundaries.

Two kinds, because they wait differently. The decode group's gathers (halos, whole frames, chunks) are
queued on the GPU under NCCL and never block the host. The agreement (what each rank decodes next, the
output rank's word after each step) is where the host waits for its peers, so it runs over gloo with host
tensors — the decode group itself when it is gloo, else a gloo group over the same ranks — and each of its
waits raises after a deadline instead of waiting for a GPU stream that a dead peer may never release. Its
wire format (fixed-size uint8 tensors: an int64 header and an error's text) is here too, beside it.
"""

from __future__ import annotations

import enum
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, get_args

import torch
import torch.distributed as dist
from torch import Tensor

from streamvae.distributed._layout import ShardAxis
from streamvae.distributed._stats import ShardedDecodeStats


def comm_device(group: dist.ProcessGroup | None, device: torch.device) -> torch.device:
    """Where collective buffers live: the decode's GPU for NCCL, host memory for gloo (and the rest)."""
    backend = str(dist.get_backend(group)).lower()
    if device.type == "cuda" and "nccl" in backend:
        return device
    return torch.device("cpu")


def global_rank(group: dist.ProcessGroup | None, group_rank: int) -> int:
    """The global rank of ``group``'s rank ``group_rank`` (the default group's ranks are global)."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


# One gather into one buffer (NCCL and gloo); torch 2.13 renamed it, older torch has the old name only.
_all_gather_single: Callable[..., Any] = (
    getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
)


class Collectives:
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
        dist.gather(tensor, pieces, dst=global_rank(self.group, dst), group=self.group)
        return pieces


class Agreement:
    """What the ranks of a sharded decode agree on at step boundaries: host tensors over a gloo group.

    These are the waits in which the host waits for its peers, so each is bounded: a peer that died or
    stalled makes them raise after ``timeout`` (gloo sees a closed connection sooner), never hang. Host
    tensors over gloo need no device copy, so they never wait for a GPU stream, where an NCCL collective
    with a dead peer may never complete. Two exchanges: every rank's :class:`Intent` before each walk
    (:meth:`intents`), and the output rank's :class:`Word` after each step (:meth:`word`).
    """

    def __init__(
        self, group: dist.ProcessGroup | None, timeout: timedelta, stats: ShardedDecodeStats
    ) -> None:
        self.group = group
        self.timeout = timeout
        self.stats = stats

    def intents(self, mine: Intent) -> list[Intent]:
        """Every rank's intent at this boundary (this rank's is ``mine``), in the group's rank order."""
        packed = _pack_intent(mine)
        self.stats.collectives += 1
        everyone = [torch.empty_like(packed) for _ in range(dist.get_world_size(self.group))]
        work = dist.all_gather(everyone, packed, group=self.group, async_op=True)
        self._wait(work, "what each rank decodes next")
        return [_unpack_intent(said) for said in everyone]

    def word(self, src: int, word: Word, error: str, *, chunk: int) -> tuple[int, str]:
        """The word global rank ``src`` (the output rank) says on chunk ``chunk``, and its error's text.

        Every rank calls it; only ``src``'s ``word`` and ``error`` are sent, the others' are overwritten.
        """
        status = torch.zeros(1 + _TEXT_BYTES, dtype=torch.uint8)
        status[0] = int(word)
        _encode_text(error, status[1:])
        self.stats.collectives += 1
        work = dist.broadcast(status, src=src, group=self.group, async_op=True)
        self._wait(work, f"the output rank's verdict on chunk {chunk}")
        return int(status[0]), _decode_text(status[1:])

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


# ------------------------------------------------------------------------ the agreement's wire format

_TEXT_BYTES = 256  # an error's text in a word or an intent: UTF-8, truncated
_SHARD_CODES = {name: code for code, name in enumerate(get_args(ShardAxis))}
_SHARD_NAMES = {code: name for name, code in _SHARD_CODES.items()}
_HEADER_BYTES = 8 * 8  # an intent's int64s: kind, the five dims of a shape, shard, output_rank


class Word(enum.IntEnum):
    """What the output rank says after each step."""

    GO_ON = 0
    FAILED = 1  # publishing failed (its error's text follows): every rank stops after this step
    WALK_ENDED = 2  # not sharded: the output rank's walk has no step left


class Next(enum.IntEnum):
    """What a rank is about to do at a boundary."""

    LATENT = 1  # decode a whole latent
    PIECE = 2  # decode the next piece of a stream
    FINISH = 3  # end a stream
    STOP = 4  # leave a stream before its end (its reason's text follows)


_NEXT_NAMES: dict[int, str] = {
    Next.LATENT: "a whole latent",
    Next.PIECE: "a piece",
    Next.FINISH: "finish",
    Next.STOP: "stopped",
}


@dataclass(frozen=True)
class Intent:
    """What one rank says it does next, at a boundary: the ranks go on only if all say the same."""

    kind: int  # a Next (a peer's as it sent it)
    shape: tuple[int, ...]  # the latent's or piece's [B, C, T, H, W]; zeros for none
    shard: str  # the decoder's shard option ("code N" for one this version does not know)
    output_rank: int
    reason: str = ""  # why the rank stops (Next.STOP): what its peers' PeerDecodeError says

    def same_as(self, other: Intent) -> bool:
        """Whether ``other`` says the same (its reason aside)."""
        return (self.kind, self.shape, self.shard, self.output_rank) == (
            other.kind,
            other.shape,
            other.shard,
            other.output_rank,
        )

    def describe(self) -> str:
        """What this intent says, for the error that ranks which disagree raise."""
        what = _NEXT_NAMES.get(self.kind, f"kind {self.kind}")
        if self.kind in (Next.LATENT, Next.PIECE):
            what += f" of shape {list(self.shape)}"
        return f"{what}, shard {self.shard!r}, output_rank {self.output_rank}"


def _pack_intent(intent: Intent) -> Tensor:
    header = [int(intent.kind), *intent.shape, _SHARD_CODES[intent.shard], intent.output_rank]
    assert 8 * len(header) == _HEADER_BYTES, intent
    packed = torch.zeros(_HEADER_BYTES + _TEXT_BYTES, dtype=torch.uint8)
    packed[:_HEADER_BYTES] = torch.tensor(header, dtype=torch.int64).view(torch.uint8)
    _encode_text(intent.reason, packed[_HEADER_BYTES:])
    return packed


def _unpack_intent(packed: Tensor) -> Intent:
    kind, *shape, shard, output_rank = packed[:_HEADER_BYTES].view(torch.int64).tolist()
    return Intent(
        kind=kind,
        shape=tuple(shape),
        shard=_SHARD_NAMES.get(shard, f"code {shard}"),
        output_rank=output_rank,
        reason=_decode_text(packed[_HEADER_BYTES:]),
    )


def _encode_text(text: str, into: Tensor) -> None:
    told = text.encode()[: into.numel()]
    if told:
        into[: len(told)] = torch.frombuffer(bytearray(told), dtype=torch.uint8)


def _decode_text(data: Tensor) -> str:
    return bytes(data.tolist()).rstrip(b"\0").decode(errors="replace")


# ------------------------------------------------------------------------------ the agreement's group


def _runs_on_host(group: dist.ProcessGroup | None) -> bool:
    """Whether ``group`` sends host tensors through gloo: plain gloo, or a ``cpu:gloo,cuda:nccl`` group."""
    backend = str(dist.get_backend(group)).lower()
    return backend == "gloo" or "cpu:gloo" in backend


# decode group -> timeout -> its gloo agreement group; forgotten with the decode group
_agreement_groups: weakref.WeakKeyDictionary[dist.ProcessGroup, dict[timedelta, dist.ProcessGroup]] = (
    weakref.WeakKeyDictionary()
)
_agreement_lock = threading.Lock()


def agreement_group(group: dist.ProcessGroup | None, timeout: timedelta) -> dist.ProcessGroup | None:
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
                    "a sharded decoder needs torch.distributed's gloo backend for its agreement"
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
