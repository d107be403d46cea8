"""The collectives of a sharded decode: the decode group's gathers, and the agreement at step boundaries.

Two kinds, because they wait differently. The decode group's gathers (halos, whole frames, chunks) are
queued on the GPU under NCCL and never block the host. The agreement (the latent's shape, the output
rank's verdict) is where the host waits for its peers, so it runs over gloo with host tensors — the
decode group itself when it is gloo, else a gloo group over the same ranks — and each of its waits raises
after a deadline instead of waiting for a GPU stream that a dead peer may never release.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

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
