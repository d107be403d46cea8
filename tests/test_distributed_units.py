"""streamvae.distributed's parts in one process: the strip layout, the halo hooks, the GPU a rank takes,
the collective timeout, the agreement.

The layout and the hooks need no process group: the ranks of a decode group are threads here, meeting in
an all_gather at a barrier, and each checks that its strip's result is the whole frame's strip.

The agreement (latent shape before the first step, verdict after each) must never wait for a GPU stream: under
NCCL it runs over a gloo group of its own with host tensors. Here the decode group is gloo, and a group that
answers like NCCL (``_runs_on_host`` patched) stands in for one, so the same code paths run on a CPU. The
``cuda`` test runs them for real over NCCL when a GPU is present.
"""

from __future__ import annotations

import ast
import dataclasses
import multiprocessing
import os
import re
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
import torch.distributed as dist
from diffusers.models.autoencoders.autoencoder_kl_wan import WanAttentionBlock, WanCausalConv3d
from torch import Tensor, nn

from streamvae import distributed
from streamvae.distributed import (
    ShardedDecoder,
    ShardedDecodeStats,
    ShardedWanDecoder,
    _collectives,
    _internals,
    _launch,
    init_distributed,
    sharded_decoder,
)
from streamvae.distributed._auto import choose_axis
from streamvae.distributed._context import ShardContext, active
from streamvae.distributed._halo import halo_rows
from streamvae.distributed._hooks import check_shardable, install_hooks
from streamvae.distributed._internals import group_timeout
from streamvae.distributed._layout import StripLayout
from streamvae.models.wan import WanChunkedDecoder
from tests._vaes import latent, tiny_hunyuan_video, tiny_wan21, tiny_wan22

INIT_TIMEOUT = timedelta(seconds=42)  # what init_distributed is told; torch's gloo default is 30 min
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="module")
def group_of_one() -> Iterator[None]:
    """init_distributed run without torchrun: a gloo group of one, its environment restored afterwards."""
    with pytest.MonkeyPatch.context() as patch:
        for name in TORCHRUN_VARIABLES:
            patch.delenv(name, raising=False)
        patch.setattr(_launch, "_init_timeout", None)
        init_distributed(backend="gloo", timeout=INIT_TIMEOUT)
        try:
            yield
        finally:
            dist.destroy_process_group()


def as_if_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every group answer as an NCCL group does: its host tensors do not go through gloo."""
    monkeypatch.setattr(_collectives, "_runs_on_host", lambda group: False)


# --------------------------------------------------------------------------------------- the strip layout


def strip_of(frame: Tensor, layout: StripLayout, scale: int = 1) -> Tensor:
    """This rank's strip of a whole ``frame`` that has ``scale`` rows per latent row."""
    start, stop = layout.bounds[layout.strip]
    return frame.narrow(layout.axis, start * scale, (stop - start) * scale)


@pytest.mark.parametrize(("rows", "world"), [(8, 1), (8, 2), (8, 3), (7, 3), (10, 4), (2, 3), (1, 4)])
def test_a_plan_splits_the_rows_into_strips_that_differ_by_at_most_one(rows: int, world: int) -> None:
    plans = [StripLayout.plan(rows, world, rank, axis=-2) for rank in range(world)]
    bounds = plans[0].bounds
    assert all(plan.bounds == bounds for plan in plans)  # every rank computes the same plan
    assert len(bounds) == min(rows, world)
    assert [start for start, _ in bounds] == [0] + [stop for _, stop in bounds[:-1]]
    assert bounds[-1][1] == rows
    sizes = [stop - start for start, stop in bounds]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    assert [plan.rows for plan in plans] == [sizes[rank % len(sizes)] for rank in range(world)]
    assert {plan.max_rows for plan in plans} == {max(sizes)}


def test_with_fewer_rows_than_ranks_the_extra_ranks_decode_a_copy_of_a_strip() -> None:
    plans = [StripLayout.plan(2, 3, rank, axis=-1) for rank in range(3)]
    assert plans[0].bounds == ((0, 1), (1, 2))
    assert [plan.strip for plan in plans] == [0, 1, 0]


@pytest.mark.parametrize("axis", [-2, -1])
@pytest.mark.parametrize("scale", [1, 2, 4])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_strips_padded_to_the_tallest_join_into_the_frame(axis: int, scale: int, world: int) -> None:
    latent_rows = 7
    shape = [1, 2, 3, 5, 5]
    shape[axis] = latent_rows * scale  # a decoder layer after upsampling by ``scale``
    frame = torch.randn(shape)
    plans = [StripLayout.plan(latent_rows, world, rank, axis) for rank in range(world)]
    padded = []
    for plan in plans:
        strip = strip_of(frame, plan, scale)
        assert plan.scale_of(strip) == scale
        sent = plan.pad(strip, scale)
        assert sent.shape[axis] == plan.max_rows * scale  # every rank sends one shape
        assert torch.equal(sent.narrow(axis, 0, strip.shape[axis]), strip)
        assert not sent.narrow(axis, strip.shape[axis], sent.shape[axis] - strip.shape[axis]).any()
        padded.append(sent)
    for plan in plans:
        assert torch.equal(plan.join(padded, scale), frame)


def test_a_layer_that_is_not_a_whole_multiple_of_the_strip_is_refused() -> None:
    layout = StripLayout.plan(7, 2, 0, axis=-2)  # a 4-row strip
    with pytest.raises(RuntimeError, match="not a whole upsampling factor"):
        layout.scale_of(torch.zeros(1, 1, 6, 3))


def test_neighbours_are_the_strips_before_and_after_and_none_at_the_frame_edges() -> None:
    assert [StripLayout.plan(8, 3, rank, -2).neighbours() for rank in range(3)] == [
        (None, 1),
        (0, 2),
        (1, None),
    ]
    assert StripLayout.plan(8, 1, 0, -2).neighbours() == (None, None)


# ------------------------------------------------------------------------------------------ the halo hooks

T = TypeVar("T")


class ThreadGroup:
    """A decode group in this process: each rank is a thread, and all_gather meets at a barrier."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._barrier = threading.Barrier(size, timeout=60)  # a rank that fails breaks it: no hang
        self._sent: list[Tensor | None] = [None] * size

    def all_gather(self, rank: int, tensor: Tensor) -> list[Tensor]:
        self._sent[rank] = tensor.clone()
        self._barrier.wait()
        pieces = [piece for piece in self._sent if piece is not None]
        self._barrier.wait()  # nobody sends the next tensor before every rank has read this one
        return pieces

    def run(self, body: Callable[[int, ThreadComm], T]) -> list[T]:
        """``body(rank, comm)`` on every rank at once; what each returned, in rank order."""
        results: list[Any] = [None] * self.size
        errors: list[BaseException] = []

        def rank_main(rank: int) -> None:
            try:
                results[rank] = body(rank, ThreadComm(self, rank))
            except BaseException as error:
                errors.append(error)
                self._barrier.abort()

        threads = [
            threading.Thread(target=rank_main, args=(rank,), name=f"rank{rank}") for rank in range(self.size)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return results


class ThreadComm:
    """One rank's collectives in a :class:`ThreadGroup`, counted as the decode group's are."""

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.stats = ShardedDecodeStats()

    def all_gather(self, tensor: Tensor) -> list[Tensor]:
        self.stats.collectives += 1
        return self.group.all_gather(self.rank, tensor)


def seen_rows(layer: nn.Module, axis: int) -> dict[str, list[int]]:
    """The rows along ``axis`` of each input ``layer`` runs on after the sharding hooks, by thread name."""
    seen: dict[str, list[int]] = defaultdict(list)

    def record(module: nn.Module, args: Sequence[Tensor]) -> None:
        seen[threading.current_thread().name].append(args[0].shape[axis])

    layer.register_forward_pre_hook(record)  # after install_hooks: it sees what they made of the input
    return seen


@pytest.mark.parametrize("axis", [-2, -1])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_a_conv_gets_its_neighbours_rows_before_and_is_cropped_to_its_strip_after(
    axis: int, world: int
) -> None:
    conv = nn.Conv2d(2, 3, 3, padding=1).double()
    install_hooks(conv)
    install_hooks(conv)  # once per module: a second adapter of the same VAE adds no second halo
    seen = seen_rows(conv, axis)
    frame = torch.randn(1, 2, 7, 7, dtype=torch.float64)

    def rank_main(rank: int, comm: ThreadComm) -> tuple[Tensor, StripLayout, ThreadComm]:
        layout = StripLayout.plan(frame.shape[axis], world, rank, axis)
        context = ShardContext(conv, layout, comm)
        with active(context), torch.no_grad():
            out = conv(strip_of(frame, layout))
        assert context.crops == {}  # every row added was cropped again
        return out, layout, comm

    ranks = ThreadGroup(world).run(rank_main)
    with torch.no_grad():
        expected = conv(frame)
    for rank, (out, layout, comm) in enumerate(ranks):
        before, after = layout.neighbours()
        added = (before is not None) + (after is not None)  # nothing at the frame's edges
        assert seen[f"rank{rank}"] == [layout.rows + added]
        assert out.shape[axis] == layout.rows
        torch.testing.assert_close(out, strip_of(expected, layout))
        assert comm.stats.halo_exchanges == comm.stats.collectives == 1  # edges too: the same collectives


def test_a_causal_conv_gets_the_same_halo_rows_for_its_cache_and_its_input() -> None:
    conv = WanCausalConv3d(2, 3, 3, padding=1).double()
    install_hooks(conv)
    frames = torch.randn(1, 2, 2, 6, 5, dtype=torch.float64)
    cache = torch.randn(1, 2, 2, 6, 5, dtype=torch.float64)  # the previous step's last frames

    def rank_main(rank: int, comm: ThreadComm) -> tuple[Tensor, StripLayout]:
        layout = StripLayout.plan(6, 3, rank, -2)
        with active(ShardContext(conv, layout, comm)), torch.no_grad():
            return conv(strip_of(frames, layout), cache_x=strip_of(cache, layout)), layout

    with torch.no_grad():
        expected = conv(frames, cache_x=cache)
    for out, layout in ThreadGroup(3).run(rank_main):
        torch.testing.assert_close(out, strip_of(expected, layout))


@pytest.mark.parametrize("world", [2, 3])
def test_attention_runs_on_the_whole_frame_and_keeps_this_ranks_rows(world: int) -> None:
    block = WanAttentionBlock(4).double()
    install_hooks(block)
    seen = seen_rows(block, -2)
    frame = torch.randn(1, 4, 2, 7, 3, dtype=torch.float64)

    def rank_main(rank: int, comm: ThreadComm) -> tuple[Tensor, StripLayout, ThreadComm]:
        layout = StripLayout.plan(7, world, rank, -2)
        with active(ShardContext(block, layout, comm)), torch.no_grad():
            return block(strip_of(frame, layout)), layout, comm

    ranks = ThreadGroup(world).run(rank_main)
    with torch.no_grad():
        expected = block(frame)
    for rank, (out, layout, comm) in enumerate(ranks):
        assert seen[f"rank{rank}"] == [7]  # the whole frame, from strips of 3, 2 and 2 rows padded to 3
        torch.testing.assert_close(out, strip_of(expected, layout))
        assert comm.stats.attention_gathers == comm.stats.collectives == 1


def test_an_elementwise_layer_computes_a_strip_as_the_whole_frame_does() -> None:
    # CPU kernels compute a tensor's tail (numel % vector step) with scalar code that rounds differently.
    silu = nn.SiLU()
    install_hooks(silu)
    seen = seen_rows(silu, 0)
    # 128 values, computed by the vector code throughout; on AVX2 its strip's tail rounds apart unhooked.
    frame = torch.randn(1, 2, 8, 8, generator=torch.Generator().manual_seed(0))
    layout = StripLayout.plan(8, 3, 0, -2)
    strip = strip_of(frame, layout).contiguous()  # 48 values: a scalar tail of its own

    def rank_main(rank: int, comm: ThreadComm) -> Tensor:
        with active(ShardContext(silu, layout, comm)):
            out: Tensor = silu(strip)
            return out

    (out,) = ThreadGroup(1).run(rank_main)
    assert seen["rank0"][0] % 64 == 0
    assert out.shape == strip.shape
    assert torch.equal(out, strip_of(silu(frame), layout))


def test_the_hooks_do_nothing_outside_a_sharded_decode_of_their_decoder() -> None:
    conv, other = nn.Conv2d(1, 1, 3, padding=1), nn.Conv2d(1, 1, 3, padding=1)
    install_hooks(conv)
    x = torch.randn(1, 1, 4, 4)
    with torch.no_grad():
        plain = conv(x)

        def rank_main(rank: int, comm: ThreadComm) -> Tensor:
            # This thread decodes ``other`` sharded: ``conv``'s hooks are not its.
            with active(ShardContext(other, StripLayout.plan(4, 1, rank, -2), comm)):
                out: Tensor = conv(x)
                return out

        assert torch.equal(ThreadGroup(1).run(rank_main)[0], plain)
        assert torch.equal(conv(x), plain)


@pytest.mark.parametrize(
    ("layer", "rows"),
    [
        (nn.Conv2d(1, 1, 3, padding=1), 1),
        (nn.Conv2d(1, 1, 1), 0),
        (nn.Conv2d(1, 1, (1, 3), padding=(0, 1)), 0),  # mixes columns only: no rows to pass along height
        (WanCausalConv3d(1, 1, 3, padding=1), 1),  # pads in forward, from its own ``_padding``
    ],
)
def test_a_conv_needs_as_many_halo_rows_as_it_reads_beyond_its_output(layer: nn.Module, rows: int) -> None:
    assert halo_rows(layer, -2) == rows


@pytest.mark.parametrize(
    "layer",
    [
        nn.Conv2d(1, 1, 3, stride=2, padding=1),
        nn.Conv2d(1, 1, 3, dilation=2, padding=2),
        nn.Conv2d(1, 1, 5, padding=2),
        nn.Upsample(scale_factor=2, mode="bilinear"),
        nn.Upsample(scale_factor=1.5, mode="nearest"),
    ],
)
def test_a_layer_whose_rows_do_not_map_one_to_one_is_refused(layer: nn.Module) -> None:
    with pytest.raises(ValueError, match="cannot shard"):
        check_shardable(nn.Sequential(layer), -2)


# ---------------------------------------------------------------------------------- the kernel routing


def kernel_queries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the device of every input torch's private kernel selector is asked about."""
    select = _internals._SELECT_CONV_BACKEND
    assert select is not None, "this torch has the selector: the routing is what these tests check"
    asked: list[str] = []

    def recording(x: Tensor, *args: Any) -> Any:
        asked.append(x.device.type)
        return select(x, *args)

    monkeypatch.setattr(_internals, "_SELECT_CONV_BACKEND", recording)
    return asked


def decode_conv_in_strips(conv: nn.Conv2d, frame: Tensor) -> list[tuple[Tensor, StripLayout, ThreadComm]]:
    """``conv`` on each of 2 height strips of ``frame``, one rank a thread."""

    def rank_main(rank: int, comm: ThreadComm) -> tuple[Tensor, StripLayout, ThreadComm]:
        layout = StripLayout.plan(frame.shape[-2], 2, rank, -2)
        with active(ShardContext(conv, layout, comm)), torch.no_grad():
            return conv(strip_of(frame, layout)), layout, comm

    return ThreadGroup(2).run(rank_main)


def test_a_strip_convolves_with_the_kernel_of_the_whole_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    # 32·24·32 input values take oneDNN; a strip's 32·13·32 would take thnn_conv2d, which sums apart.
    conv = nn.Conv2d(32, 8, 3, padding=1)
    asked = kernel_queries(monkeypatch)
    install_hooks(conv)
    assert "_conv_forward" in vars(conv)  # routed with the other hooks, before any decode
    frame = torch.randn(1, 32, 24, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = conv(frame)
    assert asked == []  # outside a sharded decode the layer is its own
    for out, layout, comm in decode_conv_in_strips(conv, frame):
        assert torch.equal(out, strip_of(expected, layout))
        assert comm.stats.kernel_overrides == 1
    assert asked and set(asked) == {"cpu"}


def test_a_torch_without_the_kernel_selector_convolves_a_strip_with_its_own_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_internals, "_SELECT_CONV_BACKEND", None)
    conv = nn.Conv2d(32, 8, 3, padding=1)
    install_hooks(conv)
    assert "_conv_forward" not in vars(conv)  # nothing of the routing is installed
    frame = torch.randn(1, 32, 24, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = conv(frame)
    for out, layout, comm in decode_conv_in_strips(conv, frame):
        torch.testing.assert_close(out, strip_of(expected, layout))  # the strip's kernel rounds apart
        assert comm.stats.kernel_overrides == 0 and comm.stats.halo_exchanges == 1


def test_a_grouped_convolution_is_not_routed() -> None:
    conv = nn.Conv2d(4, 4, 3, padding=1, groups=2)
    install_hooks(conv)
    assert "_conv_forward" not in vars(conv)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.cuda
def test_a_strip_on_a_gpu_never_asks_for_the_kernel_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    conv = nn.Conv2d(32, 8, 3, padding=1).cuda()
    asked = kernel_queries(monkeypatch)
    install_hooks(conv)
    frame = torch.randn(1, 32, 24, 32, device="cuda")
    with torch.no_grad():
        expected = conv(frame)
    for out, layout, comm in decode_conv_in_strips(conv, frame):
        torch.testing.assert_close(out, strip_of(expected, layout))
        assert comm.stats.kernel_overrides == 0
    assert asked == []


def test_the_installed_diffusers_still_sets_every_internal_read() -> None:
    assert _internals._CHANGED == {}


def test_a_layer_whose_diffusers_internals_changed_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    changed = {WanCausalConv3d: ("_padding", "the padding it applies in forward")}
    monkeypatch.setattr(_internals, "_CHANGED", changed)
    with pytest.raises(ValueError, match=r"'0': cannot shard WanCausalConv3d: diffusers .* no longer sets"):
        check_shardable(nn.Sequential(WanCausalConv3d(1, 1, 3, padding=1)), -2)


# ------------------------------------------------------------------------------------------- the GPU


@pytest.mark.parametrize(
    ("local_rank", "visible", "index"),
    [(0, 1, 0), (3, 1, 0), (0, 8, 0), (5, 8, 5), (7, 8, 7)],
)
def test_each_rank_takes_a_gpu_of_its_own(local_rank: int, visible: int, index: int) -> None:
    # One visible GPU is the process's own (SLURM's GPU binding, a Kubernetes device plugin); with more,
    # LOCAL_RANK picks one.
    assert _launch._cuda_device_for(local_rank, visible) == index


@pytest.mark.parametrize(("local_rank", "visible"), [(2, 2), (5, 4), (-1, 4), (0, 0)])
def test_a_local_rank_without_a_gpu_of_its_own_is_refused(local_rank: int, visible: int) -> None:
    with pytest.raises(ValueError, match=f"LOCAL_RANK={local_rank} ") as refused:
        _launch._cuda_device_for(local_rank, visible, "0,1")
    assert f"sees {visible} GPU(s)" in str(refused.value)
    assert "CUDA_VISIBLE_DEVICES='0,1'" in str(refused.value)


def test_init_distributed_sets_the_gpu_it_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)  # a group exists: only the device is picked
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert init_distributed() == torch.device("cuda", 0) == chosen[-1]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert init_distributed() == torch.device("cuda", 3) == chosen[-1]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match="LOCAL_RANK=3 has no GPU of its own"):
        init_distributed()
    assert len(chosen) == 2


# ------------------------------------------------------------------------------------------- timeouts


def test_a_decoder_waits_as_long_as_init_distributed_was_told(group_of_one: None) -> None:
    assert ShardedWanDecoder(tiny_wan21()).collective_timeout == INIT_TIMEOUT


def test_a_decoder_on_its_own_group_waits_as_long_as_that_group(group_of_one: None) -> None:
    group = dist.new_group(timeout=timedelta(seconds=7))
    assert ShardedWanDecoder(tiny_wan21(), group=group).collective_timeout == timedelta(seconds=7)


def test_a_collective_timeout_given_to_the_decoder_wins(group_of_one: None) -> None:
    given = timedelta(seconds=5)
    assert ShardedWanDecoder(tiny_wan21(), collective_timeout=given).collective_timeout == given


def test_where_torch_does_not_tell_the_timeout_init_distributed_was_given_is_used(
    group_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_launch, "group_timeout", lambda group: None)  # a torch without the attribute
    assert ShardedWanDecoder(tiny_wan21()).collective_timeout == INIT_TIMEOUT
    monkeypatch.setattr(_launch, "_init_timeout", None)  # a group init_distributed did not create
    assert ShardedWanDecoder(tiny_wan21()).collective_timeout == dist.constants.default_pg_timeout


# ------------------------------------------------------------------------------------------ agreement


def test_a_gloo_decode_group_agrees_over_itself(group_of_one: None) -> None:
    group = dist.new_group()
    assert ShardedWanDecoder(tiny_wan21())._agreement_group is None  # the default group
    assert ShardedWanDecoder(tiny_wan21(), group=group)._agreement_group is group


def test_an_nccl_decode_group_agrees_over_a_gloo_group_of_its_ranks_with_its_timeout(
    group_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_if_nccl(monkeypatch)
    vae = tiny_wan21()
    side = ShardedWanDecoder(vae)._agreement_group
    assert side is not None and side is not dist.group.WORLD
    assert dist.get_backend(side) == "gloo"
    assert dist.get_process_group_ranks(side) == dist.get_process_group_ranks(dist.group.WORLD)
    assert group_timeout(side) == INIT_TIMEOUT
    assert ShardedWanDecoder(vae)._agreement_group is side  # one a group and timeout, not one a decoder
    other = ShardedWanDecoder(vae, collective_timeout=timedelta(seconds=5))._agreement_group
    assert other is not side and group_timeout(other) == timedelta(seconds=5)


def watch(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, before: Callable[..., None]) -> None:
    """Call ``before(*args, **kwargs)`` ahead of every call of ``owner.name``."""
    original = getattr(owner, name)

    def watched(*args: Any, **kwargs: Any) -> Any:
        before(*args, **kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, watched)


def test_the_agreement_moves_no_tensor_between_devices_and_uses_only_its_group(
    group_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A device copy in the agreement would wait for the GPU stream, behind this step's NCCL collectives.
    as_if_nccl(monkeypatch)
    vae = tiny_wan22()
    z = latent(vae, 1, 3, 4, 4)
    decoder = ShardedWanDecoder(vae, shard="height")
    agreeing = [False]
    copies: list[str] = []
    collectives: list[tuple[str, Any, str]] = []
    for step in ("_agree_step", "_agree_boundary"):
        original = getattr(ShardedWanDecoder, step)

        def scoped(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            agreeing[0] = True
            try:
                return _original(*args, **kwargs)
            finally:
                agreeing[0] = False

        monkeypatch.setattr(ShardedWanDecoder, step, scoped)
    for copy in ("to", "cpu", "cuda", "copy_"):
        watch(
            monkeypatch,
            torch.Tensor,
            copy,
            lambda *a, _n=copy, **k: copies.append(_n) if agreeing[0] else None,
        )
    # The decode group's gathers are all_gather_single and gather: these two are the agreement's alone.
    watch(
        monkeypatch,
        dist,
        "all_gather",
        lambda p, t, **k: collectives.append(("all_gather", k["group"], t.device.type)),
    )
    watch(
        monkeypatch,
        dist,
        "broadcast",
        lambda t, **k: collectives.append(("broadcast", k["group"], t.device.type)),
    )

    got: list[Tensor] = []
    decoder.decode_with_chunks(z, on_chunk=got.append)

    side = decoder._agreement_group
    assert copies == []
    assert collectives == [("all_gather", side, "cpu")] + [("broadcast", side, "cpu")] * 3
    expected: list[Tensor] = []
    WanChunkedDecoder(vae).decode_with_chunks(z, on_chunk=expected.append)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_an_owner_that_fails_over_its_own_agreement_group_stops_at_that_chunk(
    group_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_if_nccl(monkeypatch)
    vae = tiny_wan21()
    decoder = ShardedWanDecoder(vae)
    published: list[Tensor] = []

    def fail_at_1(chunk: Tensor) -> None:
        published.append(chunk)
        if len(published) == 2:
            raise OSError("the sink went away")

    with pytest.raises(OSError, match="the sink went away"):
        decoder.decode_with_chunks(latent(vae, 1, 4, 4, 4), on_chunk=fail_at_1)
    assert decoder.stats.stopped_at == 1 and decoder.stats.steps == 2 and len(published) == 2


# --------------------------------------------------------------------------------- the agreement's format


def test_the_agreement_carries_each_ranks_intent_and_the_output_ranks_word(group_of_one: None) -> None:
    stats = ShardedDecodeStats()
    agreement = _collectives.Agreement(None, timedelta(seconds=30), stats)
    stop = _collectives.Intent(_collectives.Next.STOP, (0,) * 5, "width", 0, reason="é" * 200)
    (heard,) = agreement.intents(stop)
    assert heard.same_as(stop) and heard.shard == "width"
    assert heard.reason == "é" * 128  # 400 bytes of text, cut to the 256 a boundary carries
    word = agreement.word(0, _collectives.Word.FAILED, "OSError: the sink went away", chunk=3)
    assert word == (_collectives.Word.FAILED, "OSError: the sink went away")
    assert stats.collectives == 2
    piece = _collectives.Intent(_collectives.Next.PIECE, (1, 16, 2, 4, 6), "auto", 1)
    assert piece.describe() == "a piece of shape [1, 16, 2, 4, 6], shard 'auto', output_rank 1"
    assert not piece.same_as(dataclasses.replace(piece, shape=(1, 16, 3, 4, 6)))
    assert piece.same_as(dataclasses.replace(piece, reason="only the reason differs"))


# --------------------------------------------------------------------------- a sharded decoder, stepped


def single_process_chunks(vae: nn.Module, z: Tensor) -> list[Tensor]:
    expected: list[Tensor] = []
    WanChunkedDecoder(vae).decode_with_chunks(z, on_chunk=expected.append)  # type: ignore[arg-type]
    return expected


def words_said(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """Record the word and the text the output rank says after each step."""
    said: list[tuple[int, str]] = []
    watch(
        monkeypatch,
        _collectives.Agreement,
        "word",
        lambda agreement, src, word, error, **k: said.append((int(word), error)),
    )
    return said


@pytest.mark.parametrize("shard", ["height", "auto"])
def test_a_sharded_decoder_steps_through_the_chunks_it_publishes(group_of_one: None, shard: str) -> None:
    # "height" runs the strip machinery (one strip); "auto" does not split a group of one.
    vae = tiny_wan22()
    z = latent(vae, 1, 3, 4, 4)
    decoder = sharded_decoder(vae, shard=shard)  # type: ignore[arg-type]
    chunks = list(decoder.iter_chunks(z))
    expected = single_process_chunks(vae, z)
    assert len(chunks) == len(expected) == 3
    assert all(torch.equal(a, b) for a, b in zip(chunks, expected, strict=True))
    assert decoder.stats.steps == 3 and decoder.stats.stopped_at is None


def test_an_output_rank_that_stops_stepping_stops_every_rank_at_that_step(
    group_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    vae = tiny_wan22()
    z = latent(vae, 1, 4, 4, 4)
    decoder = sharded_decoder(vae, shard="height")
    said = words_said(monkeypatch)
    steps = decoder.iter_chunks(z)
    next(steps), next(steps)
    steps.close()
    assert decoder.stats.stopped_at == 1 and decoder.stats.steps == 2
    assert [word for word, _ in said] == [_collectives.Word.GO_ON, _collectives.Word.FAILED]
    assert "stopped taking chunks" in said[-1][1]  # what the peers' PeerDecodeError says
    said.clear()
    steps = decoder.iter_chunks(z)  # the decode gave its turn back
    next(steps)
    with pytest.raises(OSError, match="the sink went away"):
        steps.throw(OSError("the sink went away"))
    assert said == [(_collectives.Word.FAILED, "OSError: the sink went away")]
    assert decoder.stats.stopped_at == 0


def test_a_sharded_stream_steps_piece_by_piece(group_of_one: None) -> None:
    vae = tiny_wan22()
    z = latent(vae, 1, 5, 4, 6)
    decoder = sharded_decoder(vae, shard="height")
    state = decoder.start(1, 4, 6)
    chunks: list[Tensor] = []
    for piece in (z[:, :, :2], z[:, :, 2:3], z[:, :, 3:]):
        chunks.extend(decoder.feed(state, piece))
    chunks.extend(decoder.end(state))
    expected = single_process_chunks(vae, z)
    assert len(chunks) == len(expected) == 5
    assert all(torch.equal(a, b) for a, b in zip(chunks, expected, strict=True))
    assert decoder.stats.latent_frames == decoder.stats.steps == 5
    assert list(decoder.end(state)) == []  # ended: nothing more, no collective
    decoder.decode_with_chunks(z, on_chunk=lambda chunk: None)  # the stream gave its turn back


def test_a_piece_left_before_its_end_stops_the_stream_on_every_rank(group_of_one: None) -> None:
    vae = tiny_wan22()
    z = latent(vae, 1, 3, 4, 4)
    decoder = sharded_decoder(vae, shard="height")
    state = decoder.start(1, 4, 4)
    steps = decoder.feed(state, z)
    next(steps)
    steps.close()
    with pytest.raises(ValueError, match="stopped on every rank"):
        decoder.feed(state, z)
    assert list(decoder.end(state)) == []  # frees the stream, with no collective left to agree on
    decoder.decode_with_chunks(z, on_chunk=lambda chunk: None)


def test_a_sharded_decoder_takes_pieces_where_it_says_it_does(group_of_one: None) -> None:
    wan = sharded_decoder(tiny_wan21())
    assert type(wan) is ShardedWanDecoder and wan.takes_pieces
    wan.check_takes_pieces()
    for whole_only in (ShardedDecoder(tiny_wan21()), sharded_decoder(tiny_hunyuan_video())):
        assert type(whole_only) is ShardedDecoder and not whole_only.takes_pieces
        with pytest.raises(TypeError, match="decodes whole latents only.*a ShardedWanDecoder"):
            whole_only.check_takes_pieces()
        with pytest.raises(TypeError, match="decodes whole latents only"):
            whole_only.start(1, 4, 4)
    with pytest.raises(TypeError, match="ShardedWanDecoder wraps a diffusers AutoencoderKLWan or"):
        ShardedWanDecoder(tiny_hunyuan_video())


# ------------------------------------------------------------------------------------ the package's shape

PACKAGE = Path(distributed.__file__).parent


def package_imports(path: Path) -> set[str]:
    """The modules of the package that ``path`` imports anywhere: at the top, under TYPE_CHECKING, in a
    function (``__init__`` for names its ``__init__`` exports)."""
    modules = {module.stem for module in PACKAGE.glob("*.py")}
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[2] for alias in node.names if alias.name.startswith(PREFIX)}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: this package
                base = f"streamvae.distributed.{base}".rstrip(".")
            if base.startswith(PREFIX):
                found.add(base.split(".")[2])
            elif base == "streamvae.distributed":
                found |= {alias.name if alias.name in modules else "__init__" for alias in node.names}
    return found


PREFIX = "streamvae.distributed."


def test_no_module_of_the_package_imports_one_that_imports_it_back() -> None:
    graph = {path.stem: package_imports(path) for path in PACKAGE.glob("*.py")}
    assert graph["_decoder"] >= {"_hooks", "_collectives"}  # the parser sees the imports it should

    def cycle_from(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        for imported in sorted(graph[module]):
            found = cycle_from(imported, [*path, module])
            if found is not None:
                return found
        return None

    cycles = [cycle for module in sorted(graph) if (cycle := cycle_from(module, [])) is not None]
    assert cycles == [], " ; ".join(" -> ".join(cycle) for cycle in cycles)


@pytest.mark.parametrize(
    "touchpoint",
    [
        r"torch\._C\b",  # comments and docstrings included
        r"torch\.ops\b",
        r"\._conv_forward\b",
        r"\.forward = ",
        r"\._padding\b",
        r"\.time_causal_padding\b",
        r"\.per_channel_scale1\b",
        r"\.channel_dim\b",
        r"\._device_types\b",
        r"\._get_backend\b",
    ],
)
def test_every_private_api_of_torch_and_diffusers_is_touched_in_one_module(touchpoint: str) -> None:
    naming = sorted(path.name for path in PACKAGE.glob("*.py") if re.search(touchpoint, path.read_text()))
    assert naming == ["_internals.py"]


# ------------------------------------------------------------------------------------- NCCL, for real


def _decode_over_nccl(folder: str) -> None:
    """One NCCL rank: init_distributed, a sharded decode over its gloo agreement group, what it saw."""
    for name in TORCHRUN_VARIABLES:
        os.environ.pop(name, None)
    device = init_distributed(timeout=timedelta(seconds=30))
    vae = tiny_wan21().to(device)
    z = latent(vae, 1, 3, 4, 4).to(device)
    decoder = ShardedWanDecoder(vae)
    got: list[Tensor] = []
    expected: list[Tensor] = []
    decoder.decode_with_chunks(z, on_chunk=lambda chunk: got.append(chunk.cpu()))
    WanChunkedDecoder(vae).decode_with_chunks(z, on_chunk=lambda chunk: expected.append(chunk.cpu()))
    side = decoder._agreement_group
    report = {
        "device": str(device),
        "backend": str(dist.get_backend()),
        "group_timeout": group_timeout(None),  # read from the NCCL backend itself
        "collective_timeout": decoder.collective_timeout,
        "agreement_backend": None if side is None else str(dist.get_backend(side)),
        "agreement_timeout": None if side is None else group_timeout(side),
        "max_delta": max((a - b).abs().max().item() for a, b in zip(got, expected, strict=True)),
        "stats": dataclasses.asdict(decoder.stats),
    }
    torch.save(report, f"{folder}/report.pt")
    dist.destroy_process_group()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.cuda
def test_an_nccl_rank_decodes_with_its_agreement_over_gloo(tmp_path: Path) -> None:
    rank = multiprocessing.get_context("spawn").Process(target=_decode_over_nccl, args=(str(tmp_path),))
    rank.start()
    rank.join(300)
    if rank.is_alive():
        rank.kill()
        pytest.fail("the NCCL rank hung")
    assert rank.exitcode == 0
    report = torch.load(tmp_path / "report.pt", weights_only=False)
    assert report["device"] == "cuda:0" and report["backend"] == "nccl"
    assert report["group_timeout"] == report["collective_timeout"] == timedelta(seconds=30)
    assert report["agreement_backend"] == "gloo"
    assert report["agreement_timeout"] == timedelta(seconds=30)
    assert report["stats"]["steps"] == 3 and report["stats"]["stopped_at"] is None
    assert report["max_delta"] <= 1e-5, report


@pytest.mark.parametrize(
    ("height", "width", "world", "axis"),
    [
        (8, 8, 1, None),  # one rank: nothing to split
        (8, 8, 2, "height"),  # 32 positions a rank
        (4, 8, 2, "width"),  # 16 positions a rank, the fewest that pay; columns twice the rows
        (4, 4, 2, None),  # 8 positions a rank: the collectives cost what the split saves (CPU 0.9×)
        (30, 52, 2, "height"),  # width strips are strided copies: height wins at comparable sizes
        (4, 52, 2, "width"),  # width strips 13× taller than height strips
        (26, 52, 2, "width"),  # exactly twice: width
        (1, 64, 2, "width"),  # fewer rows than ranks along the height
        (3, 40, 4, "width"),  # too few rows for every rank along the height
        (3, 3, 1, None),
    ],
)
def test_auto_chooses_the_axis_from_the_latent_size(
    height: int, width: int, world: int, axis: str | None
) -> None:
    assert choose_axis(height, width, world) == axis
