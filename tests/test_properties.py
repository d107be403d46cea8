"""Property-based tests (Hypothesis) for the arithmetic that partitions things.

Strip layouts of the sharded decode, CogVideoX's latent batches, the overlapping windows of HunyuanVideo
and LTX, the quantizers' levels, and the transfer ring's slot accounting. Every run draws the same examples
(``derandomize``) and writes no example database, so CI is reproducible and the checkout stays clean.
"""

from __future__ import annotations

import functools
import itertools
import math
from contextlib import ExitStack
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import anyio
import anyio.from_thread
import numpy as np
import pytest
import torch
from diffusers import AutoencoderKLCogVideoX, AutoencoderKLHunyuanVideo, AutoencoderKLLTXVideo
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from torch import Tensor, nn

from streamvae import PinnedChunkRing, RingAbortedError, quantize_chunk, quantize_chunk_yuv420
from streamvae.distributed._layout import StripLayout
from streamvae.models._common import overlapping_window_chunks
from streamvae.models.cogvideox import CogVideoXChunkedDecoder

properties = settings(max_examples=150, deadline=None, derandomize=True, database=None)
tensor_properties = settings(properties, max_examples=60)
ring_machine = settings(properties, max_examples=100, stateful_step_count=40)


# ------------------------------------------------------------------------------------------ strip layout

rows = st.integers(1, 600)
world_sizes = st.integers(1, 48)
axes = st.sampled_from([-2, -1])


def plans(size: int, world: int, axis: int = -2) -> list[StripLayout]:
    """Every rank's layout of a ``size``-row axis over ``world`` ranks."""
    return [StripLayout.plan(size, world, rank, axis) for rank in range(world)]


@properties
@given(size=rows, world=world_sizes, axis=axes)
def test_strips_partition_the_rows_with_sizes_differing_by_at_most_one(
    size: int, world: int, axis: int
) -> None:
    layouts = plans(size, world, axis)
    bounds = layouts[0].bounds
    assert all(layout.bounds == bounds for layout in layouts)  # the same plan on every rank
    assert len(bounds) == min(size, world)
    assert bounds[0][0] == 0 and bounds[-1][1] == size
    assert all(stop == start for (_, stop), (start, _) in itertools.pairwise(bounds))
    sizes = [stop - start for start, stop in bounds]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the extra rows go to the first strips
    assert all(layout.max_rows == math.ceil(size / len(bounds)) for layout in layouts)


@properties
@given(size=rows, world=world_sizes)
def test_every_strip_is_decoded_by_the_rank_of_the_same_index(size: int, world: int) -> None:
    # join() reads strip s from rank s: each of the first len(bounds) ranks must hold its own strip.
    layouts = plans(size, world)
    for rank, layout in enumerate(layouts):
        assert layout.strip == rank % len(layout.bounds)
        start, stop = layout.bounds[layout.strip]
        assert layout.rows == stop - start
    assert sorted({layout.strip for layout in layouts}) == list(range(len(layouts[0].bounds)))


@properties
@given(size=st.integers(1, 47), extra=st.integers(1, 16))
def test_with_fewer_rows_than_ranks_strips_are_one_row_and_extra_ranks_decode_a_copy(
    size: int, extra: int
) -> None:
    world = size + extra
    layouts = plans(size, world)
    assert layouts[0].bounds == tuple((row, row + 1) for row in range(size))
    for rank, layout in enumerate(layouts):
        assert layout.rows == 1
        if rank >= size:  # a copy of the strip that rank ``strip`` owns, with that rank's neighbours
            owner = layouts[layout.strip]
            assert layout.bounds[layout.strip] == owner.bounds[owner.strip]
            assert layout.neighbours() == owner.neighbours()


@properties
@given(size=rows, world=world_sizes)
def test_neighbours_hold_the_adjacent_strips(size: int, world: int) -> None:
    for layout in plans(size, world):
        before, after = layout.neighbours()
        start, stop = layout.bounds[layout.strip]
        assert (before is None) == (start == 0) and (after is None) == (stop == size)
        if before is not None:
            assert layout.bounds[before][1] == start
        if after is not None:
            assert layout.bounds[after][0] == stop


@properties
@given(size=st.integers(1, 24), world=st.integers(1, 10), axis=axes, scale=st.integers(1, 3))
def test_padded_strips_from_every_rank_join_into_the_whole_frame(
    size: int, world: int, axis: int, scale: int
) -> None:
    shape = [1, 2, size * scale, 3] if axis == -2 else [1, 2, 3, size * scale]
    frame = torch.arange(math.prod(shape), dtype=torch.float32).view(shape)
    layouts = plans(size, world, axis)
    pieces = []
    for layout in layouts:
        start, stop = layout.bounds[layout.strip]
        strip = frame.narrow(axis, start * scale, (stop - start) * scale)
        assert layout.scale_of(strip) == scale
        padded = layout.pad(strip, scale)
        assert padded.shape[axis] == layout.max_rows * scale  # every rank sends the same shape
        pieces.append(padded)
    for layout in layouts:
        assert torch.equal(layout.join(pieces, scale), frame)


# -------------------------------------------------------------------------------- CogVideoX latent batches


class RecordingDecoder(nn.Module):
    """Stands in for CogVideoX's decoder: returns its latents as they are and records which it got."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[int]] = []

    def forward(self, z: Tensor, temb: Any = None, conv_cache: Any = None) -> tuple[Tensor, Any]:
        self.calls.append([int(v) for v in z[0, 0, :, 0, 0]])
        return z, None


@functools.cache
def cogvideox_vae() -> Any:
    """A tiny ``AutoencoderKLCogVideoX`` whose decoder only records the latent frames of each call."""
    vae: Any = AutoencoderKLCogVideoX(
        latent_channels=4, block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=4
    )
    vae.eval()
    vae.post_quant_conv = None
    vae.decoder = RecordingDecoder()
    return vae


@properties
@given(frames=st.integers(1, 40), batch_size=st.integers(1, 6))
def test_cogvideox_latent_batches_partition_the_frames_as_diffusers_batches_them(
    frames: int, batch_size: int
) -> None:
    vae = cogvideox_vae()
    vae.num_latent_frames_batch_size = batch_size
    decoder: RecordingDecoder = vae.decoder
    z = torch.arange(frames, dtype=torch.float32).view(1, 1, frames, 1, 1).expand(1, 4, frames, 1, 1)

    decoder.calls.clear()
    vae.decode(z)
    diffusers_batches = list(decoder.calls)
    decoder.calls.clear()
    chunks: list[Tensor] = []
    CogVideoXChunkedDecoder(vae).decode_with_chunks(z, on_chunk=chunks.append)

    assert decoder.calls == diffusers_batches
    assert [chunk.shape[2] for chunk in chunks] == [len(batch) for batch in decoder.calls]
    assert list(itertools.chain.from_iterable(decoder.calls)) == list(
        range(frames)
    )  # in order, each frame once
    first, *rest = [len(batch) for batch in decoder.calls]
    assert first == (frames if frames < batch_size else batch_size + frames % batch_size)
    assert all(size == batch_size for size in rest)


# ----------------------------------------------------------------------- HunyuanVideo / LTX windows


@dataclass(frozen=True)
class Windows:
    """Temporal window settings as diffusers' HunyuanVideo and LTX VAEs hold them (in sample frames)."""

    ratio: int  # temporal_compression_ratio
    min_frames: int  # tile_sample_min_num_frames
    stride_frames: int  # tile_sample_stride_num_frames


@st.composite
def windows(draw: st.DrawFn) -> Windows:
    ratio = draw(st.sampled_from([1, 2, 4, 8]))
    stride = draw(st.integers(ratio, 6 * ratio))  # at least one latent
    minimum = draw(st.integers(stride, stride + 4 * ratio))  # windows overlap (or touch)
    return Windows(ratio, minimum, stride)


def fake_window_vae(settings_: Windows, family: str) -> SimpleNamespace:
    """What ``overlapping_window_chunks`` and diffusers' ``_temporal_tiled_decode`` read from a VAE.

    Its decoder maps n latents to (n - 1) r + 1 frames, as the causal video VAEs do; each frame's value
    tells which latent window and which frame of it produced it, so blends of the wrong frames show.
    """
    ratio = settings_.ratio

    def decoder(tile: Tensor, temb: Tensor | None = None) -> Tensor:
        count = (tile.shape[2] - 1) * ratio + 1
        frames = tile[:, :, :1] * 1000 + torch.arange(count, dtype=tile.dtype).view(1, 1, -1, 1, 1)
        return frames.contiguous()

    cls = AutoencoderKLHunyuanVideo if family == "hunyuan" else AutoencoderKLLTXVideo
    return SimpleNamespace(
        temporal_compression_ratio=ratio,
        spatial_compression_ratio=8,
        tile_sample_min_num_frames=settings_.min_frames,
        tile_sample_stride_num_frames=settings_.stride_frames,
        tile_sample_min_height=256,
        tile_sample_min_width=256,
        use_tiling=False,
        post_quant_conv=lambda tile: tile,
        decoder=decoder,
        blend_t=functools.partial(cls.blend_t, None),
    )


def family_window(vae: SimpleNamespace, family: str) -> Any:
    """``decode_window`` as the family's adapter writes it: HunyuanVideo drops a later window's first
    frame, LTX its last."""

    def decode_window(latents: Tensor, first: bool) -> Tensor:
        decoded: Tensor = vae.decoder(latents)
        if first:
            return decoded
        return decoded[:, :, 1:] if family == "hunyuan" else decoded[:, :, :-1]

    return decode_window


def window_latent(frames: int) -> Tensor:
    return torch.arange(frames, dtype=torch.float32).view(1, 1, frames, 1, 1)


families = st.sampled_from(["hunyuan", "ltx"])


@properties
@given(window=windows(), frames=st.integers(1, 30), family=families)
def test_window_chunks_are_non_empty_and_join_into_what_diffusers_temporal_tiled_decode_returns(
    window: Windows, frames: int, family: str
) -> None:
    vae = fake_window_vae(window, family)
    z = window_latent(frames)
    chunks = list(overlapping_window_chunks(vae, z, family_window(vae, family)))
    sizes = [chunk.shape[2] for chunk in chunks]
    assert all(size > 0 for size in sizes)
    assert sum(sizes) == (frames - 1) * window.ratio + 1
    assert sizes[0] <= window.stride_frames + 1 and all(size <= window.stride_frames for size in sizes[1:])
    if family == "hunyuan":
        expected = AutoencoderKLHunyuanVideo._temporal_tiled_decode(vae, z, return_dict=False)[0]  # type: ignore[arg-type]
    else:
        expected = AutoencoderKLLTXVideo._temporal_tiled_decode(vae, z, None, return_dict=False)[0]  # type: ignore[arg-type]
    assert torch.equal(torch.cat(chunks, dim=2), expected)


# ------------------------------------------------------------------------------------------------ quantize


@st.composite
def value_ranges(draw: st.DrawFn) -> tuple[float, float]:
    """Increasing ranges whose ends float32 holds exactly (what a float32 chunk can hit exactly)."""
    ends = st.floats(-1e4, 1e4, width=32, allow_subnormal=False)
    low = draw(ends)
    high = draw(ends.filter(lambda v: v > low + 1e-3 * max(1.0, abs(low))))
    return low, high


def float32(value: float) -> float:
    return float(np.float32(value))


@st.composite
def chunks(draw: st.DrawFn, value_range: tuple[float, float], *, even: bool = False) -> np.ndarray:
    """A [1, 3, t, h, w] float32 chunk around ``value_range``: inside, outside, at the ends and ±inf."""
    low, high = value_range
    span = high - low
    values = st.one_of(
        st.floats(low, high, width=32),
        st.floats(float32(low - span), float32(high + span), width=32),
        st.sampled_from([low, high, -math.inf, math.inf]),
    )
    sides = st.integers(1, 2).map(lambda n: 2 * n) if even else st.integers(1, 4)
    shape = (1, 3, draw(st.integers(1, 2)), draw(sides), draw(sides))
    return draw(arrays(np.float32, shape, elements=values))


@st.composite
def ordered_pairs(
    draw: st.DrawFn, *, even: bool = False
) -> tuple[tuple[float, float], np.ndarray, np.ndarray]:
    """A value range and two chunks x <= y elementwise."""
    value_range = draw(value_ranges())
    x = draw(chunks(value_range, even=even))
    span = float32(2 * (value_range[1] - value_range[0]))
    nudge = draw(arrays(np.float32, x.shape, elements=st.floats(0, span, width=32)))
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.where(np.isinf(x), x, x + nudge).astype(np.float32)  # inf + nudge stays inf
    return value_range, x, y


def rgb(chunk: np.ndarray, value_range: tuple[float, float]) -> np.ndarray:
    return quantize_chunk(torch.from_numpy(chunk), value_range).numpy().astype(np.int64)


def yuv_planes(chunk: np.ndarray, value_range: tuple[float, float]) -> tuple[np.ndarray, ...]:
    """The Y, U and V planes of each frame, [T, H, W] and [T, H/2, W/2]."""
    _, _, frames, height, width = chunk.shape
    planes = quantize_chunk_yuv420(torch.from_numpy(chunk), value_range).numpy().astype(np.int64)
    flat = planes[0].reshape(frames, -1)
    area = height * width
    y = flat[:, :area].reshape(frames, height, width)
    u = flat[:, area : area + area // 4].reshape(frames, height // 2, width // 2)
    v = flat[:, area + area // 4 :].reshape(frames, height // 2, width // 2)
    return y, u, v


@tensor_properties
@given(case=ordered_pairs())
def test_rgb_levels_are_monotone_in_the_input(
    case: tuple[tuple[float, float], np.ndarray, np.ndarray],
) -> None:
    value_range, x, y = case
    assert np.all(rgb(x, value_range) <= rgb(y, value_range))


@tensor_properties
@given(data=st.data())
def test_rgb_levels_round_the_clamped_value_to_the_nearest_level(data: st.DataObject) -> None:
    low, high = value_range = data.draw(value_ranges())
    chunk = data.draw(chunks(value_range))
    levels = rgb(chunk, value_range)  # BTHWC
    assert levels.min() >= 0 and levels.max() <= 255
    ideal = 255 * (np.clip(chunk.astype(np.float64), low, high) - low) / (high - low)
    assert np.all(np.abs(levels - np.moveaxis(ideal, 1, -1)) <= 0.5 + 1e-3)


@tensor_properties
@given(value_range=value_ranges())
def test_rgb_range_ends_and_infinities_give_the_extreme_levels(value_range: tuple[float, float]) -> None:
    low, high = value_range
    chunk = np.array([low, -math.inf, high, math.inf], dtype=np.float32).reshape(1, 1, 1, 2, 2)
    levels = rgb(np.repeat(chunk, 3, axis=1), value_range)
    assert levels[0, 0, :, :, 0].tolist() == [[0, 0], [255, 255]]


@tensor_properties
@given(case=ordered_pairs(even=True))
def test_yuv420_luma_is_monotone_and_every_plane_stays_in_limited_range(
    case: tuple[tuple[float, float], np.ndarray, np.ndarray],
) -> None:
    value_range, x, y = case
    x_planes, y_planes = yuv_planes(x, value_range), yuv_planes(y, value_range)
    assert np.all(x_planes[0] <= y_planes[0])
    for luma, u, v in (x_planes, y_planes):
        assert luma.min() >= 16 and luma.max() <= 235
        assert min(u.min(), v.min()) >= 16 and max(u.max(), v.max()) <= 240


@tensor_properties
@given(data=st.data())
def test_yuv420_grey_has_neutral_chroma_and_the_range_ends_are_black_and_white(data: st.DataObject) -> None:
    low, high = value_range = data.draw(value_ranges())
    grey = data.draw(chunks(value_range, even=True))[:, :1]
    chunk = np.repeat(grey, 3, axis=1)  # R = G = B everywhere
    _, u, v = yuv_planes(chunk, value_range)
    assert np.all(u == 128) and np.all(v == 128)
    ends = np.repeat(np.array([low, high], dtype=np.float32).reshape(1, 1, 2, 1, 1), 3, axis=1)
    luma, u, v = yuv_planes(np.broadcast_to(ends, (1, 3, 2, 2, 2)).copy(), value_range)
    assert luma[0].tolist() == [[16, 16], [16, 16]] and luma[1].tolist() == [[235, 235], [235, 235]]
    assert np.all(u == 128) and np.all(v == 128)


@pytest.mark.parametrize("value_range", [(128.0, 128.001), (10000.0, 10000.01)])
def test_the_top_of_any_valid_range_gives_the_top_level(value_range: tuple[float, float]) -> None:
    high = np.float32(value_range[1])
    chunk = np.array([high, high, math.inf, math.inf], dtype=np.float32).reshape(1, 1, 1, 2, 2)
    chunk = np.repeat(chunk, 3, axis=1)
    luma, _, _ = yuv_planes(chunk, value_range)
    assert rgb(chunk, value_range).max() == rgb(chunk, value_range).min() == 255
    assert luma.max() == luma.min() == 235


# ----------------------------------------------------------------------------------- transfer ring slots


class PendingCopy:
    """Stands in for the completion event of a CUDA copy that has not landed yet (CPU rings copy at once)."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


@dataclass
class Tracked:
    """The model's view of one lease."""

    lease: Any
    value: int
    readers: int
    copy: PendingCopy | None
    returned: bool = False  # every reader released, or discarded
    retired: bool = False  # returned while its copy was in flight

    @property
    def in_flight(self) -> bool:
        return self.copy is not None and not self.copy.done

    @property
    def writes_slot(self) -> bool:
        """The lease's slot may still be written: a reader holds it, or a copy into it is in flight."""
        return not self.returned or self.in_flight


class RingMachine(RuleBasedStateMachine):
    """A ``PinnedChunkRing`` on the CPU, driven from a blocking portal; in-flight CUDA copies simulated."""

    backend = "asyncio"

    def __init__(self) -> None:
        super().__init__()
        self.exits = ExitStack()
        self.portal = self.exits.enter_context(anyio.from_thread.start_blocking_portal(self.backend))
        self.ring: PinnedChunkRing | None = None
        self.depth = 0
        self.leases: list[Tracked] = []
        self.aborted = False
        self.transfers = 0

    @initialize(depth=st.integers(1, 4))
    def create_ring(self, depth: int) -> None:
        self.depth = depth
        self.ring = self.portal.call(PinnedChunkRing, depth, "cpu")

    # -- helpers --

    def _transfer(self, value: int, readers: int) -> Any:
        ring = self.ring
        assert ring is not None

        async def transfer() -> Any:
            with anyio.fail_after(10):  # a hang guard only: the rules never wait for a slot
                return await ring.transfer(
                    torch.full((1, 1, 2, 2, 3), value, dtype=torch.uint8), readers=readers
                )

        return self.portal.call(transfer)

    def _return(self, tracked: Tracked) -> None:
        tracked.returned = True
        tracked.readers = 0
        tracked.retired = tracked.in_flight

    def _live(self) -> list[Tracked]:
        return [t for t in self.leases if not t.returned]

    def _slot_holders(self) -> list[Tracked]:
        return [t for t in self.leases if t.writes_slot]

    def _has_free_slot(self) -> bool:
        return len(self._slot_holders()) < self.depth

    # -- rules --

    @precondition(lambda self: not self.aborted and self._has_free_slot())
    @rule(readers=st.integers(1, 3), in_flight=st.booleans())
    def transfer(self, readers: int, in_flight: bool) -> None:
        holders = self._slot_holders()
        self.transfers += 1
        value = self.transfers % 256
        lease = self._transfer(value, readers)
        assert all(lease._slot is not other.lease._slot for other in holders), "slot handed out while in use"
        copy = None
        if in_flight:
            copy = PendingCopy()
            lease._copy_done, lease._landed = copy, False
        self.leases.append(Tracked(lease, value, readers, copy))

    @precondition(lambda self: self.aborted)
    @rule()
    def transfer_after_abort_fails(self) -> None:
        with pytest.raises(RingAbortedError):
            self._transfer(0, 1)

    @precondition(lambda self: any(not t.in_flight for t in self._live()))
    @rule(data=st.data())
    def wait_landed(self, data: st.DataObject) -> None:
        tracked = data.draw(st.sampled_from([t for t in self._live() if not t.in_flight]))
        host = self.portal.call(tracked.lease.wait_landed)
        assert bool((host == tracked.value).all()), "a held slot was overwritten"

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        tracked = data.draw(st.sampled_from(self._live()))
        self.portal.call(tracked.lease.release)
        tracked.readers -= 1
        if tracked.readers == 0:
            self._return(tracked)

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data())
    def discard(self, data: st.DataObject) -> None:
        tracked = data.draw(st.sampled_from(self._live()))
        self.portal.call(tracked.lease.discard)
        self._return(tracked)
        self.portal.call(tracked.lease.release)  # a no-op after discard

    @precondition(lambda self: any(t.in_flight for t in self.leases))
    @rule(data=st.data())
    def copy_lands(self, data: st.DataObject) -> None:
        tracked = data.draw(st.sampled_from([t for t in self.leases if t.in_flight]))
        assert tracked.copy is not None
        tracked.copy.done = True

    @precondition(lambda self: not self.aborted and len(self.leases) > self.depth)  # once slots were reused
    @rule()
    def abort(self) -> None:
        assert self.ring is not None
        self.portal.call(self.ring.abort)
        self.aborted = True
        for tracked in self._live():
            self._return(tracked)

    # -- invariants --

    @invariant()
    def slots_in_use_counts_the_slots_that_may_still_be_written(self) -> None:
        if self.ring is None:
            return
        holders = self._slot_holders()
        landed_retired = sum(1 for t in self.leases if t.retired and not t.in_flight)
        assert 0 <= self.ring.slots_in_use <= self.depth
        # A retired slot whose copy has landed comes back at the ring's next transfer or abort.
        assert len(holders) <= self.ring.slots_in_use <= len(holders) + landed_retired

    @invariant()
    def no_two_holders_share_a_slot(self) -> None:
        slots = [id(t.lease._slot) for t in self._slot_holders()]
        assert len(slots) == len(set(slots))

    def teardown(self) -> None:
        try:
            if self.ring is not None:
                self._every_slot_comes_back()
        finally:
            self.exits.close()

    def _every_slot_comes_back(self) -> None:
        """Once every lease is released and every copy has landed, the ring holds no slot."""
        ring = self.ring
        assert ring is not None
        for tracked in self._live():
            self.portal.call(tracked.lease.discard)
            self._return(tracked)
        for tracked in self.leases:
            if tracked.copy is not None:
                tracked.copy.done = True
        if self.aborted:
            self.portal.call(ring.abort)  # reclaims retired slots whose copy has landed
        else:
            # All ``depth`` slots can be held at once, without waiting (the guard fails a wait).
            fresh = [self._transfer(1, 1) for _ in range(self.depth)]
            assert len({id(lease._slot) for lease in fresh}) == self.depth
            for lease in fresh:
                self.portal.call(lease.release)
        assert ring.slots_in_use == 0


def test_ring_slots_are_never_shared_and_all_come_back(anyio_backend: str) -> None:
    machine = type(f"RingMachine[{anyio_backend}]", (RingMachine,), {"backend": anyio_backend})
    run_state_machine_as_test(machine, settings=ring_machine)


@pytest.mark.anyio
async def test_a_slot_retired_at_abort_comes_back_once_its_copy_lands() -> None:
    ring = PinnedChunkRing(1, "cpu")
    lease = await ring.transfer(torch.zeros((1, 1, 2, 2, 3), dtype=torch.uint8), readers=1)
    copy = PendingCopy()
    lease._copy_done, lease._landed = copy, False
    ring.abort()
    copy.done = True  # every reader is gone and every copy has landed
    await anyio.wait_all_tasks_blocked()
    assert ring.slots_in_use == 0
