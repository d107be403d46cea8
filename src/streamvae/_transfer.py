"""Transfer: a fixed ring of reusable host slots that quantized chunks are copied into.

The ring is where backpressure from the encoders reaches the producer: ``transfer`` waits for a free slot
and never grows the pool, and a slot returns only when the last reader of its chunk releases it — being
dequeued by an encoder is not enough, because PyAV may still be reading the buffer.

On CUDA the slots are pinned host buffers and each copy is a non-blocking copy on one side CUDA stream per
device, ordered after an event recorded on the producer's CUDA stream; its landing is awaited by polling a
completion event with a short backoff, so the wait can be abandoned on cancel (a copy queued behind a
collective with a dead peer never completes). On a CPU device the same ring runs with ordinary host slots
and a copy in a worker thread, so the slot logic is exercised on every machine.

The slot lifecycle: free → copying → landed (read by each entry's encoder) → free again after the last
reader's release. A lease discarded before its copy landed is retired: its slot and its source tensor stay
held until the copy is done, so neither is reused while the device may still read or write them.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

import anyio
import numpy as np
import torch
from torch import Tensor

from streamvae._checks import check_int
from streamvae._cuda import ready_event
from streamvae._errors import RingAbortedError
from streamvae._public import public

__all__ = ["ChunkLease", "ChunkTransferStats", "PinnedChunkRing", "host_lease"]

_POLL_START_SECONDS = 0.0002
_POLL_MAX_SECONDS = 0.005


_copy_streams: dict[torch.device, Any] = {}
_copy_streams_lock = threading.Lock()


def _copy_stream(device: torch.device) -> Any:
    """The device → host copy stream of ``device``: one per device per process, shared by every ring.

    Taken from the high-priority pool: NCCL takes its internal streams from the default-priority pool, and
    a copy queued behind a collective on a shared pool stream would wait for that collective (forever, if
    a peer died). High priority also lets a chunk's copy overtake queued decode kernels.
    """
    with _copy_streams_lock:
        stream = _copy_streams.get(device)
        if stream is None:
            stream = _copy_streams[device] = torch.cuda.Stream(device, priority=-1)
        return stream


@public
@dataclass(frozen=True)
class ChunkTransferStats:
    """What a :class:`PinnedChunkRing` has done so far."""

    #: chunks copied into a slot
    transfers: int = 0
    #: bytes copied into slots, all transfers together
    bytes_transferred: int = 0
    #: time spent waiting for copies to land
    copy_wait_seconds: float = 0.0
    #: time ``transfer`` waited for a free slot: encoder backpressure reaching the producer
    slot_wait_seconds: float = 0.0
    #: most slots held at once
    peak_slots_in_use: int = 0
    #: most bytes held in slots at once (copying, or landed and not yet released by every reader)
    peak_pending_bytes: int = 0


class _Slot:
    """One reusable host buffer of the ring."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.buffer: Tensor | None = None
        self.extra: Tensor | None = None  # host buffer for a chunk's small companion tensor

    def view(self, shape: torch.Size, *, pinned: bool) -> Tensor:
        nbytes = math.prod(shape)
        if self.buffer is None or self.buffer.numel() < nbytes:
            # Chunks are steady in size after the first, so a slot reallocates at most a few times.
            self.buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
        return self.buffer[:nbytes].view(shape)

    def extra_like(self, extra: Tensor, *, pinned: bool) -> Tensor:
        if self.extra is None or self.extra.shape != extra.shape or self.extra.dtype != extra.dtype:
            self.extra = torch.empty(extra.shape, dtype=extra.dtype, pin_memory=pinned)
        return self.extra


@public
class ChunkLease:
    """A chunk's claim on a ring slot, shared by its readers (one per batch entry).

    Await :meth:`wait_landed` before reading :attr:`host`; each reader calls :meth:`release` once it is done
    with the buffer, and the slot returns to the ring after the last one. :meth:`discard` gives up every
    remaining reader at once (teardown); if the copy has not landed yet, the slot and the source tensor stay
    held until it has, so neither is reused while the copy may still write or read them.
    """

    def __init__(
        self, ring: PinnedChunkRing | None, slot: _Slot | None, shape: torch.Size, readers: int
    ) -> None:
        self._ring = ring
        self._slot = slot
        self._host: Tensor | None = None
        self._extra: Tensor | None = None
        self._readers = readers
        self._source: tuple[Tensor, Tensor | None] | None = None  # what a pending copy reads
        self._copy_done: Any = None  # torch.cuda.Event of a pending CUDA copy
        self._landed = False
        self._discarded = False
        self.shape = tuple(shape)
        self.nbytes = math.prod(shape)

    @property
    def readers(self) -> int:
        """Readers that have not released the chunk yet."""
        return self._readers

    @property
    def landed(self) -> bool:
        return self._landed

    @property
    def host(self) -> Tensor:
        """The chunk in host memory; valid from landing until the last reader releases it."""
        if not self._landed or self._host is None:
            raise RuntimeError("ChunkLease.host read before the copy landed (await wait_landed() first)")
        return self._host

    @property
    def extra(self) -> Tensor | None:
        """The host copy of the ``extra`` tensor the chunk was transferred with (None without one)."""
        if not self._landed:
            raise RuntimeError("ChunkLease.extra read before the copy landed (await wait_landed() first)")
        return self._extra

    def numpy(self) -> np.ndarray[Any, Any]:
        """:attr:`host` as a NumPy array sharing its memory."""
        return self.host.numpy()

    def _copy_finished(self) -> bool:
        return self._copy_done is None or bool(self._copy_done.query())

    def _copy_finished_or_failed(self) -> bool:
        """Teardown's view: a copy whose event cannot be queried (a sticky CUDA error poisons every later
        call) will never land, so it counts as done — its memory is protected by ``record_stream``."""
        try:
            return self._copy_finished()
        except RuntimeError:
            return True

    def _mark_landed(self) -> None:
        self._landed = True
        self._copy_done = None
        self._source = None  # the copy has read it: the producer may reuse it now

    async def wait_landed(self) -> Tensor:
        """Wait until the copy into the slot is complete and return :attr:`host`.

        The wait polls a completion event with a short backoff, so it is a cancellation point and can be
        abandoned; it raises the ring's abort error if the ring is aborted first.
        """
        if not self._landed:
            started = time.perf_counter()
            delay = _POLL_START_SECONDS
            while not self._copy_finished():
                if self._ring is not None:
                    self._ring._check_aborted()
                await anyio.sleep(delay)
                delay = min(delay * 2, _POLL_MAX_SECONDS)
            self._mark_landed()
            if self._ring is not None:
                self._ring._note_copy_wait(time.perf_counter() - started)
        if self._ring is not None:
            self._ring._check_aborted()
        return self.host

    def release(self) -> None:
        """One reader is done with the buffer; the last release returns the slot to the ring.

        After :meth:`discard` (or the ring's abort) it does nothing: the readers were already given back.
        """
        if self._discarded:
            return
        if self._readers <= 0:
            raise RuntimeError("ChunkLease released more times than it has readers")
        self._readers -= 1
        if self._readers == 0 and self._ring is not None:
            self._ring._return(self)

    def discard(self) -> None:
        """Release every remaining reader (teardown of a chunk nobody will read)."""
        self._discarded = True
        if self._readers > 0:
            self._readers = 0
            if self._ring is not None:
                self._ring._return(self)


def host_lease(frames: Tensor, *, readers: int, ready: Any = None, extra: Tensor | None = None) -> ChunkLease:
    """A landed lease over ``frames`` (and ``extra``) copied to host memory, outside any ring (the blocking
    path).

    Call it from a worker thread: copying a CUDA tensor to the host blocks until the device is done. The
    copy waits for ``ready`` (a ``torch.cuda.Event``) when given. A CPU tensor is not copied: the lease
    reads it in place.
    """
    if ready is not None:
        torch.cuda.current_stream(frames.device).wait_event(ready)
    lease = ChunkLease(None, None, frames.shape, readers)
    lease._host = frames.detach().to("cpu").contiguous()
    if extra is not None:
        lease._extra = extra.detach().to("cpu")
    lease._mark_landed()
    return lease


def _check_device(device: object) -> torch.device:
    """``device`` as a :class:`torch.device` the ring can copy from, or a ValueError naming it.

    Torch's own errors name neither the ring nor the argument, and some come late: a CUDA index this
    machine lacks, or a meta device, fails only at the first copy, in a worker thread.
    """
    checked: torch.device | None = None
    if isinstance(device, (str, torch.device)):
        with contextlib.suppress(RuntimeError):  # torch's error for a name it does not know
            checked = torch.device(device)
    if checked is None or checked.type == "meta":  # a meta tensor holds no data to copy
        raise ValueError(
            f"PinnedChunkRing: device must be a torch.device or a device name such as 'cpu' or 'cuda:0', "
            f"got {device!r}"
        )
    if checked.type == "cuda" and (
        not torch.cuda.is_available() or (checked.index or 0) >= torch.cuda.device_count()
    ):
        raise ValueError(f"PinnedChunkRing: device {device!r} is not a CUDA device of this machine")
    return checked


@public
class PinnedChunkRing:
    """A fixed pool of ``depth`` reusable host slots for device → host chunk copies.

    ``device`` is where the chunks live: a CUDA device gives pinned slots and asynchronous copies on a side
    stream; ``"cpu"`` gives ordinary slots and a copy in a worker thread. Methods other than the copy itself
    run on the event loop thread; the ring is not shared between event loops.
    """

    def __init__(self, depth: int, device: torch.device | str = "cpu") -> None:
        self.depth = check_int("depth", depth, minimum=1, owner="PinnedChunkRing")
        self.device = _check_device(device)
        self._cuda = self.device.type == "cuda"
        if self._cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._free: list[_Slot] = [_Slot(i) for i in range(depth)]
        self._held: set[ChunkLease] = set()
        self._retired: list[ChunkLease] = []  # discarded before their copy landed
        self._changed = anyio.Event()
        self._error: BaseException | None = None
        self._limiter = anyio.CapacityLimiter(1)
        self._stats = ChunkTransferStats()
        self._pending_bytes = 0

    @property
    def slots_in_use(self) -> int:
        """Slots held by a chunk that some reader (or a pending copy) still needs."""
        # A retired slot whose copy has landed is needed by nobody: it comes back now, not at the next
        # transfer (after an abort there is none).
        self._reclaim_retired(teardown=self._error is not None)
        return self.depth - len(self._free)

    def stats(self) -> ChunkTransferStats:
        return replace(self._stats)

    def abort(self, error: BaseException | None = None) -> None:
        """Fail every present and future wait of the ring with ``error`` and give back every held slot.

        Slots whose copy has not landed stay out of the pool until it does.
        """
        if self._error is None:
            self._error = error if error is not None else RingAbortedError("the transfer ring was aborted")
        for lease in list(self._held):
            lease.discard()
        self._reclaim_retired(teardown=True)
        self._wake()

    async def transfer(
        self, frames: Tensor, *, readers: int, ready: Any = None, extra: Tensor | None = None
    ) -> ChunkLease:
        """Copy ``frames`` (a contiguous uint8 tensor on the ring's device) into a free slot.

        Waits for a free slot first; the returned lease lands once the copy completes (await
        :meth:`ChunkLease.wait_landed`). On CUDA the copy starts after ``ready`` (a ``torch.cuda.Event``);
        without one, an event is recorded on the calling thread's current stream. ``frames`` stays
        referenced by the lease until the copy has landed.

        ``extra`` is a small tensor on the same device that travels with the chunk (a count computed on
        the device, say): it is copied in the same ordered, non-blocking way into a host buffer of the slot
        and read from :attr:`ChunkLease.extra` once the lease has landed, so reading it never waits for
        the device.
        """
        owner = "PinnedChunkRing.transfer"
        check_int("readers", readers, minimum=1, owner=owner)
        for name, tensor in (("frames", frames), ("extra", extra)):
            if tensor is not None and not isinstance(tensor, Tensor):
                raise TypeError(f"{owner}: {name} must be a torch.Tensor, got {type(tensor).__name__}")
        if frames.dtype != torch.uint8 or not frames.is_contiguous():
            raise ValueError(
                f"{owner}: frames must be a contiguous uint8 torch.Tensor, got "
                f"{'' if frames.is_contiguous() else 'a non-contiguous '}{frames.dtype}"
            )
        for name, tensor in (("frames", frames), ("extra", extra)):
            if tensor is not None and (
                tensor.device.type != self.device.type or (self._cuda and tensor.device != self.device)
            ):
                raise ValueError(
                    f"{owner}: {name} are on {tensor.device}, but this ring copies from {self.device}"
                )
        if self._cuda and ready is None:
            ready = ready_event(self.device)
        slot = await self._acquire()
        lease = ChunkLease(self, slot, frames.shape, readers)
        lease._source = (frames, extra)
        self._hold(lease)
        try:
            await anyio.to_thread.run_sync(self._copy, lease, frames, ready, extra, limiter=self._limiter)
        except BaseException:
            lease.discard()
            raise
        self._stats = replace(
            self._stats,
            transfers=self._stats.transfers + 1,
            bytes_transferred=self._stats.bytes_transferred + lease.nbytes,
        )
        return lease

    # -- internals (event loop thread unless noted) --

    def _copy(self, lease: ChunkLease, frames: Tensor, ready: Any, extra: Tensor | None) -> None:
        """Worker thread: start (CUDA) or do (CPU) the copy into the lease's slot."""
        assert lease._slot is not None
        # Allocating (pinned) host memory can take milliseconds: it belongs in the worker thread too.
        host = lease._host = lease._slot.view(frames.shape, pinned=self._cuda)
        host_extra = None if extra is None else lease._slot.extra_like(extra, pinned=self._cuda)
        lease._extra = host_extra
        if not self._cuda:
            host.copy_(frames)
            if host_extra is not None and extra is not None:
                host_extra.copy_(extra)
            return
        with torch.cuda.device(self.device):
            stream = _copy_stream(self.device)
            stream.wait_event(ready)
            # The sources were allocated on other streams: their memory is not reused before this stream
            # has read it, even if the lease lets go of them first (teardown after a CUDA error).
            frames.record_stream(stream)
            if extra is not None:
                extra.record_stream(stream)
            with torch.cuda.stream(stream):
                host.copy_(frames, non_blocking=True)
                if host_extra is not None and extra is not None:
                    host_extra.copy_(extra, non_blocking=True)
                done = torch.cuda.Event()
                done.record(stream)
            lease._copy_done = done

    def _check_aborted(self) -> None:
        if self._error is not None:
            raise self._error

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _reclaim_retired(self, *, teardown: bool = False) -> None:
        done = ChunkLease._copy_finished_or_failed if teardown else ChunkLease._copy_finished
        for lease in [lease for lease in self._retired if done(lease)]:
            self._retired.remove(lease)
            lease._mark_landed()
            self._give_back(lease)

    async def _acquire(self) -> _Slot:
        started = time.perf_counter()
        delay = _POLL_START_SECONDS
        while True:
            self._check_aborted()
            self._reclaim_retired()
            if self._free:
                break
            if self._retired:
                # A retired slot frees itself when its copy lands, and nothing signals that: poll.
                with anyio.move_on_after(delay):
                    await self._changed.wait()
                delay = min(delay * 2, _POLL_MAX_SECONDS)
            else:
                await self._changed.wait()
        waited = time.perf_counter() - started
        slot = self._free.pop(0)
        self._stats = replace(
            self._stats,
            slot_wait_seconds=self._stats.slot_wait_seconds + waited,
            peak_slots_in_use=max(self._stats.peak_slots_in_use, self.slots_in_use),
        )
        return slot

    def _hold(self, lease: ChunkLease) -> None:
        self._held.add(lease)
        self._pending_bytes += lease.nbytes
        self._stats = replace(
            self._stats, peak_pending_bytes=max(self._stats.peak_pending_bytes, self._pending_bytes)
        )

    def _note_copy_wait(self, seconds: float) -> None:
        self._stats = replace(self._stats, copy_wait_seconds=self._stats.copy_wait_seconds + seconds)

    def _return(self, lease: ChunkLease) -> None:
        if lease not in self._held:
            return
        self._held.discard(lease)
        # Teardown (discard, abort) must not raise: a failed query counts as landed.
        if not lease._copy_finished_or_failed():
            self._retired.append(lease)  # keeps slot and source alive until the copy lands
            return
        self._give_back(lease)

    def _give_back(self, lease: ChunkLease) -> None:
        self._pending_bytes -= lease.nbytes
        assert lease._slot is not None
        self._free.append(lease._slot)
        self._wake()
