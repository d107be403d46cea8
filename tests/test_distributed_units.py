"""streamvae.distributed's parts in this process: the GPU a rank takes, the collective timeout, the agreement.

The agreement (latent shape before the first step, verdict after each) must never wait for a GPU stream: under
NCCL it runs over a gloo group of its own with host tensors. Here the decode group is gloo, and a group that
answers like NCCL (``_runs_on_host`` patched) stands in for one, so the same code paths run on a CPU. The
``cuda`` test runs them for real over NCCL when a GPU is present.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from _vaes import latent, tiny_wan21, tiny_wan22
from torch import Tensor

from streamvae import distributed
from streamvae.distributed import ShardedWanDecoder, init_distributed
from streamvae.models.wan import WanChunkedDecoder

INIT_TIMEOUT = timedelta(seconds=42)  # what init_distributed is told; torch's gloo default is 30 min
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="module")
def group_of_one() -> Iterator[None]:
    """init_distributed run without torchrun: a gloo group of one, its environment restored afterwards."""
    with pytest.MonkeyPatch.context() as patch:
        for name in TORCHRUN_VARIABLES:
            patch.delenv(name, raising=False)
        patch.setattr(distributed, "_init_timeout", None)
        init_distributed(backend="gloo", timeout=INIT_TIMEOUT)
        try:
            yield
        finally:
            dist.destroy_process_group()


def as_if_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every group answer as an NCCL group does: its host tensors do not go through gloo."""
    monkeypatch.setattr(distributed, "_runs_on_host", lambda group: False)


# ------------------------------------------------------------------------------------------- the GPU


@pytest.mark.parametrize(
    ("local_rank", "visible", "index"),
    [(0, 1, 0), (3, 1, 0), (0, 8, 0), (5, 8, 5), (7, 8, 7)],
)
def test_each_rank_takes_a_gpu_of_its_own(local_rank: int, visible: int, index: int) -> None:
    # One visible GPU is the process's own (SLURM's GPU binding, a Kubernetes device plugin); with more,
    # LOCAL_RANK picks one.
    assert distributed._cuda_device_for(local_rank, visible) == index


@pytest.mark.parametrize(("local_rank", "visible"), [(2, 2), (5, 4), (-1, 4), (0, 0)])
def test_a_local_rank_without_a_gpu_of_its_own_is_refused(local_rank: int, visible: int) -> None:
    with pytest.raises(ValueError, match=f"LOCAL_RANK={local_rank} ") as refused:
        distributed._cuda_device_for(local_rank, visible, "0,1")
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
    monkeypatch.setattr(distributed, "_group_timeout", lambda group: None)  # a torch without the attribute
    assert ShardedWanDecoder(tiny_wan21()).collective_timeout == INIT_TIMEOUT
    monkeypatch.setattr(distributed, "_init_timeout", None)  # a group init_distributed did not create
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
    assert distributed._group_timeout(side) == INIT_TIMEOUT
    assert ShardedWanDecoder(vae)._agreement_group is side  # one a group and timeout, not one a decoder
    other = ShardedWanDecoder(vae, collective_timeout=timedelta(seconds=5))._agreement_group
    assert other is not side and distributed._group_timeout(other) == timedelta(seconds=5)


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
    decoder = ShardedWanDecoder(vae)
    agreeing = [False]
    copies: list[str] = []
    collectives: list[tuple[str, Any, str]] = []
    for step in ("_agree", "_check_same_latent"):
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
        "group_timeout": distributed._group_timeout(None),  # read from the NCCL backend itself
        "collective_timeout": decoder.collective_timeout,
        "agreement_backend": None if side is None else str(dist.get_backend(side)),
        "agreement_timeout": None if side is None else distributed._group_timeout(side),
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
