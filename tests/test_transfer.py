from __future__ import annotations

from typing import Any

import anyio
import anyio.abc
import pytest
import torch

from streamvae import ChunkTransferStats, PinnedChunkRing, RingAbortedError
from streamvae._transfer import host_lease

pytestmark = pytest.mark.anyio


def frames(value: int, count: int = 2) -> torch.Tensor:
    return torch.full((1, count, 4, 6, 3), value, dtype=torch.uint8)


async def test_transfer_copies_the_frames_into_a_host_slot() -> None:
    ring = PinnedChunkRing(2, "cpu")
    source = frames(7)
    lease = await ring.transfer(source, readers=1)
    host = await lease.wait_landed()
    assert torch.equal(host, source) and host.data_ptr() != source.data_ptr()
    assert ring.slots_in_use == 1
    lease.release()
    assert ring.slots_in_use == 0


async def test_slot_returns_only_after_its_last_reader() -> None:
    ring = PinnedChunkRing(1, "cpu")
    lease = await ring.transfer(frames(1), readers=3)
    await lease.wait_landed()
    lease.release()
    lease.release()
    assert ring.slots_in_use == 1 and lease.readers == 1
    lease.release()
    assert ring.slots_in_use == 0
    with pytest.raises(RuntimeError, match="more times"):
        lease.release()


class WaitingTransfer:
    """A transfer started in a task of its own: what it landed, and an event set once it is done."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.landed: list[torch.Tensor] = []


async def waiting_transfer(
    tg: anyio.abc.TaskGroup, ring: PinnedChunkRing, value: int, *, release: bool = False
) -> WaitingTransfer:
    """Start a transfer of ``frames(value)`` in ``tg`` and return once it has had every chance to get a
    slot (the caller then checks that it is still waiting)."""
    transfer, started = WaitingTransfer(), anyio.Event()

    async def run() -> None:
        started.set()
        lease = await ring.transfer(frames(value), readers=1)
        transfer.landed.append(await lease.wait_landed())
        if release:
            lease.release()
        transfer.done.set()

    tg.start_soon(run)
    await started.wait()
    for _ in range(20):
        await anyio.lowlevel.checkpoint()
    return transfer


async def test_transfer_waits_for_a_free_slot_instead_of_growing_the_pool() -> None:
    ring = PinnedChunkRing(2, "cpu")
    held = [await ring.transfer(frames(i), readers=1) for i in range(2)]
    async with anyio.create_task_group() as tg:
        third = await waiting_transfer(tg, ring, 9)
        assert not third.done.is_set() and ring.slots_in_use == 2
        await held[0].wait_landed()
        held[0].release()
        await third.done.wait()
    assert ring.slots_in_use == 2 and int(third.landed[0][0, 0, 0, 0, 0]) == 9
    stats = ring.stats()
    assert stats.transfers == 3 and stats.peak_slots_in_use == 2
    assert stats.slot_wait_seconds > 0


async def test_slots_are_reused_not_reallocated_for_same_sized_chunks() -> None:
    ring = PinnedChunkRing(1, "cpu")
    pointers = set()
    for i in range(4):
        lease = await ring.transfer(frames(i), readers=1)
        pointers.add((await lease.wait_landed()).data_ptr())
        lease.release()
    assert len(pointers) == 1


async def test_abort_wakes_a_waiting_transfer_with_the_given_error() -> None:
    ring = PinnedChunkRing(1, "cpu")
    await ring.transfer(frames(0), readers=1)
    waiting = anyio.Event()
    caught: list[BaseException] = []

    async def blocked() -> None:
        waiting.set()
        try:
            await ring.transfer(frames(1), readers=1)
        except ValueError as error:
            caught.append(error)

    async with anyio.create_task_group() as tg:
        tg.start_soon(blocked)
        await waiting.wait()
        await anyio.lowlevel.checkpoint()
        ring.abort(ValueError("encoder died"))
    assert [str(e) for e in caught] == ["encoder died"]
    assert ring.slots_in_use == 0
    with pytest.raises(ValueError, match="encoder died"):
        await ring.transfer(frames(2), readers=1)


async def test_abort_without_an_error_raises_ring_aborted() -> None:
    ring = PinnedChunkRing(1, "cpu")
    ring.abort()
    with pytest.raises(RingAbortedError):
        await ring.transfer(frames(0), readers=1)


async def test_discard_gives_back_every_remaining_reader() -> None:
    ring = PinnedChunkRing(1, "cpu")
    lease = await ring.transfer(frames(0), readers=4)
    lease.release()
    lease.discard()
    assert ring.slots_in_use == 0 and lease.readers == 0
    lease.discard()  # idempotent
    assert ring.slots_in_use == 0


async def test_stats_count_bytes_and_peak_pending_bytes() -> None:
    ring = PinnedChunkRing(3, "cpu")
    leases = [await ring.transfer(frames(i, count=1 + i), readers=1) for i in range(3)]
    sizes = [lease.nbytes for lease in leases]
    for lease in leases:
        lease.release()
    stats = ring.stats()
    assert isinstance(stats, ChunkTransferStats)
    assert stats.bytes_transferred == sum(sizes) == stats.peak_pending_bytes
    assert stats.copy_wait_seconds == 0.0  # nobody awaited a landing


async def test_transfer_rejects_bad_arguments() -> None:
    ring = PinnedChunkRing(1, "cpu")
    with pytest.raises(ValueError, match="readers"):
        await ring.transfer(frames(0), readers=0)
    with pytest.raises(ValueError, match="contiguous uint8"):
        await ring.transfer(torch.zeros(2, 2), readers=1)
    with pytest.raises(ValueError, match="contiguous uint8"):
        await ring.transfer(frames(0).transpose(1, 2), readers=1)
    assert ring.slots_in_use == 0


@pytest.mark.parametrize("depth", [0, -1, 1.5, True])
def test_ring_depth_must_be_a_positive_int(depth: object) -> None:
    with pytest.raises(ValueError, match="depth"):
        PinnedChunkRing(depth, "cpu")  # type: ignore[arg-type]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.cuda
async def test_cuda_ring_uses_pinned_slots_and_lands_asynchronous_copies() -> None:
    ring = PinnedChunkRing(2, "cuda")
    producer = torch.cuda.Stream()
    with torch.cuda.stream(producer):
        source = torch.arange(4 * 1024 * 1024, device="cuda").to(torch.uint8).reshape(4, 1024, 1024)
    with torch.cuda.stream(producer):
        lease = await ring.transfer(source, readers=2)
    host = await lease.wait_landed()
    assert host.is_pinned() and torch.equal(host, source.cpu())
    lease.release()
    lease.release()
    assert ring.slots_in_use == 0 and ring.stats().transfers == 1


class PendingCopy:
    """Stands in for the completion event of a CUDA copy that has not landed yet (CPU rings copy at once)."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


async def in_flight(ring: PinnedChunkRing, value: int) -> tuple[Any, PendingCopy]:
    """A lease whose copy is still in flight, as a CUDA ring hands them out."""
    lease = await ring.transfer(frames(value), readers=1)
    copy = PendingCopy()
    lease._copy_done, lease._landed = copy, False
    return lease, copy


async def test_a_discarded_lease_keeps_its_slot_until_its_copy_lands() -> None:
    ring = PinnedChunkRing(1, "cpu")
    lease, copy = await in_flight(ring, 1)
    lease.discard()
    assert ring.slots_in_use == 1  # the copy may still write the slot: it is not reused yet
    async with anyio.create_task_group() as tg:
        next_transfer = await waiting_transfer(tg, ring, 2, release=True)
        assert not next_transfer.done.is_set()
        copy.done = True  # the copy lands: the retired slot comes back by itself
        await next_transfer.done.wait()
    assert ring.slots_in_use == 0


async def test_landing_is_awaited_by_polling_and_abandoned_on_cancel_or_abort() -> None:
    ring = PinnedChunkRing(2, "cpu")
    lease, copy = await in_flight(ring, 3)
    with anyio.move_on_after(0.05) as scope:
        await lease.wait_landed()  # never lands: the wait must be abandonable
    assert scope.cancelled_caught and not lease.landed
    with pytest.raises(RuntimeError, match="before the copy landed"):
        lease.host  # noqa: B018
    copy.done = True
    host = await lease.wait_landed()
    assert int(host[0, 0, 0, 0, 0]) == 3 and lease._source is None  # the source is let go once landed
    assert ring.stats().copy_wait_seconds > 0  # the wait that saw the copy land is counted
    other, _ = await in_flight(ring, 4)
    ring.abort(ValueError("peer died"))
    with pytest.raises(ValueError, match="peer died"):
        await other.wait_landed()
    assert ring.slots_in_use == 1  # the in-flight copy's slot stays out of the pool


class PoisonedCopy:
    """The completion event of a copy after a sticky CUDA error: every query raises."""

    def query(self) -> bool:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


async def test_teardown_after_a_sticky_cuda_error_gives_every_slot_back_without_raising() -> None:
    ring = PinnedChunkRing(2, "cpu")
    held = await ring.transfer(frames(1), readers=1)
    held._copy_done, held._landed = PoisonedCopy(), False
    retired, copy = await in_flight(ring, 2)
    retired.discard()  # its copy is in flight: the slot is retired, not free
    copy.done = True  # ... and lands; abort reclaims it without waiting for a transfer to poll
    ring.abort(RuntimeError("the decode failed"))  # queries the poisoned event: must not raise
    assert ring.slots_in_use == 0
    with pytest.raises(RuntimeError, match="illegal memory access"):
        await held.wait_landed()  # outside teardown, a failing query is the error it is


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.cuda
async def test_cuda_copy_stream_is_one_high_priority_stream_per_device() -> None:
    from streamvae._transfer import _copy_stream

    device = torch.device("cuda", 0)
    stream = _copy_stream(device)
    assert _copy_stream(device) is stream and stream.priority < 0
    first, second = PinnedChunkRing(1, device), PinnedChunkRing(1, device)
    for ring in (first, second):
        (await ring.transfer(frames(5).to(device), readers=1)).release()
    assert _copy_stream(device) is stream


async def test_an_extra_tensor_travels_with_its_chunk_and_is_read_once_landed() -> None:
    ring = PinnedChunkRing(1, "cpu")
    count = torch.tensor(5)
    lease = await ring.transfer(frames(1), readers=1, extra=count)
    copy = PendingCopy()
    lease._copy_done, lease._landed = copy, False
    with pytest.raises(RuntimeError, match="before the copy landed"):
        lease.extra  # noqa: B018
    copy.done = True
    await lease.wait_landed()
    count += 1  # the slot holds its own copy
    assert lease.extra is not None and int(lease.extra) == 5
    lease.release()
    plain = await ring.transfer(frames(2), readers=1)
    await plain.wait_landed()
    assert plain.extra is None
    plain.release()
    blocking = host_lease(frames(3), readers=1, extra=torch.tensor(7))
    assert blocking.extra is not None and int(blocking.extra) == 7
    with pytest.raises(ValueError, match="extra are on"):
        await PinnedChunkRing(1, "cpu").transfer(frames(1), readers=1, extra=torch.tensor(1, device="meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.cuda
async def test_cuda_ring_copies_an_extra_tensor_into_a_pinned_buffer_with_its_chunk() -> None:
    ring = PinnedChunkRing(1, "cuda")
    source = torch.full((1, 2, 64, 64, 3), 9, dtype=torch.uint8, device="cuda")
    count = torch.isnan(torch.tensor([float("nan"), 1.0, float("nan")], device="cuda")).sum()
    lease = await ring.transfer(source, readers=1, extra=count)
    await lease.wait_landed()
    assert lease.extra is not None and lease.extra.is_pinned() and int(lease.extra) == 2
    lease.release()
