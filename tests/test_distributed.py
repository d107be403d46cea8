"""streamvae.distributed: spatial-shard decode across real processes (tests/_ranks.py, gloo).

Each group of ranks runs a list of scenarios in one start of its processes (importing torch and diffusers
costs ~8 s a process on a 2-core CPU); every rank runs ``decode_to_mp4`` on asyncio or trio and writes what
it saw to a file. A hung rank fails the test: the group is joined with a deadline and killed past it, and
gloo's own timeout is set well below that deadline so a rank stuck in a collective reports an error instead.
A stalled rank stays silent until its peers have given up on it (an event they share; ``STALL_SECONDS`` at
most): their wait is bounded by the group's timeout either way, and the run does not sit out a fixed stall.

The reference is diffusers' ``vae.decode`` in this process with one torch thread, like the ranks: CPU
kernels split work by thread, so a different thread count alone moves results by float rounding.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any
from unittest import mock

import anyio
import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import Tensor

from streamvae import ChunkedVideoMP4Session, MP4ByteStream, decode_to_mp4, quantize_chunk
from streamvae.distributed import (
    PeerDecodeError,
    ShardedDecodeStats,
    ShardedWanDecoder,
    _collectives,
    sharded_decoder,
)
from streamvae.models.wan import WanChunkedDecoder
from tests._media import DETERMINISTIC_X264, REFUSED_AT_OPEN, read_mp4
from tests._ranks import (
    Launches,
    decode_alone,
    decode_arguments,
    rank_context,
    run_torchrun_jobs,
    save_decode_inputs,
    sharded_luma,
    spawn_ranks,
)
from tests._vaes import latent, tiny_cogvideox, tiny_qwen_image, tiny_wan21, tiny_wan22

FAMILIES: dict[str, Callable[[], Any]] = {
    "wan21": tiny_wan21,
    "wan22": tiny_wan22,
    "qwen_image": tiny_qwen_image,
}
CODEC = DETERMINISTIC_X264  # byte-identical MP4s for identical frames
GLOO_TIMEOUT = timedelta(seconds=60)  # a rank stuck in a collective raises after this
JOIN_TIMEOUT = 300.0  # a group that has not finished by then hung: the test fails
STALL_TIMEOUT = 3.0  # the process group timeout of the stalled-peer scenario
STALL_SECONDS = 4 * STALL_TIMEOUT  # the longest its stalled rank stops calling collectives

pytestmark = pytest.mark.slow


class EncoderFailed(RuntimeError):
    """The owner's consumer failing at a chosen chunk (what a failed session's push raises)."""


@dataclass(frozen=True)
class Scenario:
    """One sharded decode every rank of a group runs, and what happens to its output rank's consumer."""

    name: str
    family: str
    frames: int
    height: int
    width: int
    shard: str = "height"
    backend: str = "asyncio"
    output_rank: int = 0
    exact: bool = False  # measured torch.equal to vae.decode on this CPU (docs/distributed.md, Exactness)
    fail_at: int | None = None  # the owner's on_chunk raises EncoderFailed at this chunk
    cancel_at: int | None = None  # the owner's caller is cancelled at this chunk
    codec_options: dict[str, str] = field(default_factory=lambda: dict(CODEC))
    plain_decode_in_thread: bool = False  # at chunk 0 the owner decodes the same module unsharded
    # (rank, "dies" | "stalls", decoder call): that rank exits, or stops calling collectives until a peer
    # gave up, just before that call of its decoder. It breaks the group: last scenario of a group.
    peer_fault: tuple[int, str, int] | None = None
    group_timeout: float | None = None  # decode over a new group with this timeout (seconds)
    group_ranks: tuple[int, ...] | None = None  # decode over a new group of these ranks; the rest sit out
    nan_latent: bool = False  # one value of every rank's latent is NaN
    # The agreement runs over a gloo group of its own, as under NCCL (here the decode group is gloo too).
    own_agreement_group: bool = False
    consumer_stalls_at: int | None = None  # the owner's on_chunk stalls at this chunk until a peer gave up
    # the owner's reader of entry 0 closes its byte stream, unread, once this chunk is in the session: the
    # last chunk's index makes the session fail at its end, after the decode's last step and agreement
    reader_closes_at: int | None = None

    @property
    def stalled_rank(self) -> int | None:
        """The rank that stalls (its peers give up on it), if one does."""
        if self.peer_fault is not None and self.peer_fault[1] == "stalls":
            return self.peer_fault[0]
        return self.output_rank if self.consumer_stalls_at is not None else None


@dataclass
class RankResult:
    """What one rank saw in one scenario."""

    rank: int
    videos: list[bytes] | None = None  # decode_to_mp4's return value, None if it raised or was cancelled
    error: tuple[str, str] | None = None  # (type name, message) of what decode_to_mp4 raised
    error_bases: tuple[str, ...] = ()  # names of the error's classes, most derived first
    error_notes: tuple[str, ...] = ()  # the notes added to the error on its way up
    peer_chunk: int | None = None  # PeerDecodeError.chunk
    cancelled: bool = False  # the cancel scope around decode_to_mp4 caught its cancellation
    chunks: Tensor | None = None  # what on_chunk received, joined along T
    published: int = 0  # on_chunk calls
    stats: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    plain_decode: Tensor | None = None  # the unsharded decode run in another thread mid-decode
    own_agreement_group: bool = False  # the decoder agreed over a group other than its decode group
    member: bool = True  # False on a rank outside the scenario's group, which took no part


TWO_RANKS = [
    Scenario("wan21_height", "wan21", 3, 8, 8, exact=True, plain_decode_in_thread=True),
    Scenario("wan22_height_owner_1", "wan22", 3, 8, 8, backend="trio", output_rank=1, exact=True),
    Scenario("wan21_width", "wan21", 3, 16, 6, shard="width", backend="trio", exact=True),
    Scenario("wan22_width_odd", "wan22", 2, 4, 5, shard="width"),
    Scenario("qwen_image_height", "qwen_image", 2, 8, 8, backend="trio", exact=True),
    Scenario("wan21_encoder_fails_at_1", "wan21", 4, 8, 8, fail_at=1),
    Scenario("wan22_caller_cancelled_at_1", "wan22", 4, 8, 8, backend="trio", cancel_at=1),
    Scenario("wan21_x264_rejects_its_options", "wan21", 4, 8, 8, codec_options=REFUSED_AT_OPEN),
    Scenario("wan21_nan_latent", "wan21", 3, 8, 8, backend="trio", nan_latent=True),
    Scenario("wan21_reader_closes_at_last", "wan21", 3, 8, 8, backend="trio", reader_closes_at=2),
    Scenario(
        "wan22_own_agreement_group", "wan22", 3, 8, 8, output_rank=1, exact=True, own_agreement_group=True
    ),
    Scenario("wan21_own_agreement_group_fails_at_1", "wan21", 4, 8, 8, fail_at=1, own_agreement_group=True),
    Scenario(
        "wan21_own_agreement_group_slow_owner",
        "wan21",
        3,
        8,
        8,
        backend="trio",
        own_agreement_group=True,
        consumer_stalls_at=1,
        group_timeout=STALL_TIMEOUT,
    ),
    Scenario(
        "wan21_rank_1_stalls", "wan21", 3, 8, 8, peer_fault=(1, "stalls", 2), group_timeout=STALL_TIMEOUT
    ),
]
THREE_RANKS = [
    Scenario("wan21_uneven_strips", "wan21", 3, 8, 8, backend="trio", exact=True),
    Scenario("wan22_uneven_strips", "wan22", 2, 7, 8, exact=True),
    Scenario("wan22_fewer_rows_than_ranks", "wan22", 2, 2, 8, backend="trio"),
    Scenario("wan22_width_one_column_strips", "wan22", 2, 8, 3, shard="width"),
    Scenario("wan22_encoder_fails_at_0_owner_2", "wan22", 3, 8, 8, backend="trio", output_rank=2, fail_at=0),
    Scenario("wan21_caller_cancelled_at_last", "wan21", 3, 8, 8, cancel_at=2),
    Scenario(  # a gloo agreement group over a subgroup: ranks 0 and 2 create it alone
        "wan21_ranks_0_2_own_agreement_group_fails_at_1",
        "wan21",
        3,
        8,
        8,
        output_rank=1,  # global rank 2
        fail_at=1,
        group_ranks=(0, 2),
        own_agreement_group=True,
    ),
    Scenario("wan22_rank_1_dies", "wan22", 3, 8, 8, backend="trio", peer_fault=(1, "dies", 2)),
]
SCENARIOS = {s.name: (world, s) for world, group in ((2, TWO_RANKS), (3, THREE_RANKS)) for s in group}


# ------------------------------------------------------------------------------------------- in each rank


class Recorder:
    """A protocol decoder that wraps the sharded one and records (or breaks) what its ``on_chunk`` gets."""

    def __init__(
        self, decoder: ShardedWanDecoder, scenario: Scenario, z: Tensor, gave_up: Event | None
    ) -> None:
        self.decoder = decoder
        self.scenario = scenario
        self.z = z
        self.gave_up = gave_up
        self.chunks: list[Tensor] = []
        self.plain_decode: Tensor | None = None
        self.chunk_value_range = decoder.chunk_value_range
        self.latent_channels = decoder.latent_channels
        self.is_output_rank = decoder.is_output_rank
        self._scope: anyio.CancelScope | None = None
        self._reader: MP4ByteStream | None = None

    def settle(self, failure: BaseException | None) -> None:
        self.decoder.settle(failure)  # how the owner's session ended reaches the peers

    def prepare_latents(self, z: Tensor) -> Tensor:
        return self.decoder.prepare_latents(z)

    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        def recording(chunk: Tensor) -> None:
            index = len(self.chunks)
            self.chunks.append(chunk.clone())
            if index == 0 and self.scenario.plain_decode_in_thread:
                self._decode_unsharded_in_another_thread()
            if index == self.scenario.fail_at:
                raise EncoderFailed(f"the encoder failed at chunk {index}")
            if index == self.scenario.cancel_at:
                assert self._scope is not None
                anyio.from_thread.run_sync(self._scope.cancel)
            if index == self.scenario.consumer_stalls_at:
                # A consumer slower than the group's timeout: its peers stop waiting.
                assert self.gave_up is not None
                self.gave_up.wait(STALL_SECONDS)
            on_chunk(chunk)
            if index == self.scenario.reader_closes_at:
                assert self._reader is not None
                anyio.from_thread.run(self._reader.aclose)

        self.decoder.decode_with_chunks(z, on_chunk=recording)

    def _decode_unsharded_in_another_thread(self) -> None:
        # This thread's sharded decode is active (its hooks are live) while another thread decodes plainly.
        chunks: list[Tensor] = []
        plain = WanChunkedDecoder(self.decoder.vae)
        worker = threading.Thread(target=lambda: plain.decode_with_chunks(self.z, on_chunk=chunks.append))
        worker.start()
        worker.join()
        self.plain_decode = torch.cat(chunks, dim=2)

    async def run(self) -> list[bytes] | None:
        def open_reader(session: ChunkedVideoMP4Session) -> None:
            self._reader = session.open_stream(0, max_buffered=64)  # never read: it never waits

        closes = self.scenario.reader_closes_at is not None and self.is_output_rank
        with anyio.CancelScope() as scope:
            self._scope = scope
            return await decode_to_mp4(
                self,
                self.z,
                fps=8,
                video_codec_options=self.scenario.codec_options,
                on_session=open_reader if closes else None,
            )
        return None


def _inject_fault(vae: Any, scenario: Scenario, rank: int, gave_up: Event | None) -> None:
    if scenario.peer_fault is None or scenario.peer_fault[0] != rank:
        return
    _, fault, at_call = scenario.peer_fault
    calls = [0]

    def before_decoder_call(module: Any, args: Any) -> None:
        calls[0] += 1
        if calls[0] == at_call and fault == "dies":
            os._exit(0)  # no cleanup, no goodbye: what a crashed rank looks like to its peers
        if calls[0] == at_call:
            assert gave_up is not None
            gave_up.wait(STALL_SECONDS)

    vae.decoder.register_forward_pre_hook(before_decoder_call)


def _run_scenario(scenario: Scenario, rank: int, gave_up: Event | None) -> RankResult:
    vae = FAMILIES[scenario.family]()
    z = latent(vae, 1, scenario.frames, scenario.height, scenario.width)
    if scenario.nan_latent:
        z[0, 3, 1, 2, 5] = float("nan")
    group = None
    if scenario.group_timeout is not None or scenario.group_ranks is not None:
        timeout = None if scenario.group_timeout is None else timedelta(seconds=scenario.group_timeout)
        ranks = None if scenario.group_ranks is None else list(scenario.group_ranks)
        group = dist.new_group(ranks=ranks, timeout=timeout)  # every rank of the world takes part
        if ranks is not None and rank not in ranks:
            return RankResult(rank=rank, member=False)
    # A group whose host tensors do not go through gloo (NCCL) gets a gloo agreement group of its own.
    as_if_nccl = mock.patch.object(_collectives, "_runs_on_host", lambda group: False)
    with as_if_nccl if scenario.own_agreement_group else contextlib.nullcontext():
        decoder = ShardedWanDecoder(
            vae,
            shard=scenario.shard,  # type: ignore[arg-type]
            output_rank=scenario.output_rank,
            group=group,
        )
    _inject_fault(vae, scenario, rank, gave_up)
    recorder = Recorder(decoder, scenario, z, gave_up)
    result = RankResult(rank=rank)
    started = time.monotonic()
    with contextlib.suppress(Exception):
        try:
            result.videos = anyio.run(recorder.run, backend=scenario.backend)
            result.cancelled = result.videos is None
        except Exception as error:
            result.error = (type(error).__name__, str(error))
            result.error_bases = tuple(cls.__name__ for cls in type(error).__mro__)
            result.error_notes = tuple(getattr(error, "__notes__", ()))
            result.peer_chunk = error.chunk if isinstance(error, PeerDecodeError) else None
    result.seconds = time.monotonic() - started
    if gave_up is not None and rank != scenario.stalled_rank:
        gave_up.set()  # this rank's decode has ended: the stalled one may go on
    result.stats = dataclasses.asdict(decoder.stats)
    result.published = len(recorder.chunks)
    result.chunks = torch.cat(recorder.chunks, dim=2) if recorder.chunks else None
    result.plain_decode = recorder.plain_decode
    result.own_agreement_group = decoder._agreement_group is not group
    return result


ONE_BUFFER_GATHER = "one_buffer_gather"  # not a scenario: each rank's check of the halo gather


def _check_one_buffer_gather(rank: int) -> RankResult:
    """Whether the decode's one-buffer all_gather gives what a list all_gather gives, for a few tensors."""
    world = dist.get_world_size()
    tensors = {
        "halo rows (1-D)": torch.arange(10, dtype=torch.float32) + 100 * rank,
        "strip (5-D, not contiguous)": torch.randn(1, 3, 2, 5, 4).transpose(-1, -2) + rank,
        "bfloat16": (torch.randn(4, 6) + rank).to(torch.bfloat16),
    }
    same: dict[str, Any] = {}
    for name, tensor in tensors.items():
        comm = _collectives.Collectives(None, torch.device("cpu"), ShardedDecodeStats())
        ours = comm.all_gather(tensor)
        theirs = [torch.empty_like(tensor.contiguous()) for _ in range(world)]
        dist.all_gather(theirs, tensor.contiguous())
        same[name] = len(ours) == world and all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    return RankResult(rank=rank, stats=same)


def _rank_main(
    rank: int, world: int, folder: str, scenarios: list[Scenario], gave_up: dict[str, Event]
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world, timeout=GLOO_TIMEOUT
    )
    try:
        results: dict[str, RankResult] = {ONE_BUFFER_GATHER: _check_one_buffer_gather(rank)}
        for index, scenario in enumerate(scenarios):
            results[scenario.name] = _run_scenario(scenario, rank, gave_up.get(scenario.name))
            torch.save(results, f"{folder}/rank{rank}.pt")  # a rank that dies later keeps these
            if index + 1 < len(scenarios):
                dist.barrier()  # a scenario whose group broke leaves its ranks apart: start the next together
    finally:
        dist.destroy_process_group()


def run_group(world: int, scenarios: list[Scenario], folder: Path) -> dict[str, list[RankResult]]:
    """Start ``world`` ranks that run ``scenarios``; fail the test if any rank hangs or dies."""
    # A scenario with a stalled rank: the event its peers set once they gave up on it.
    gave_up = {s.name: rank_context().Event() for s in scenarios if s.stalled_rank is not None}
    spawn_ranks(world, _rank_main, (world, str(folder), scenarios, gave_up), deadline_s=JOIN_TIMEOUT)
    per_rank = [torch.load(folder / f"rank{rank}.pt", weights_only=False) for rank in range(world)]
    died = RankResult(rank=-1, error=("died", ""))
    names = [ONE_BUFFER_GATHER, *(s.name for s in scenarios)]
    return {name: [results.get(name, died) for results in per_rank] for name in names}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[RankResult]]:
    return run_group(2, TWO_RANKS, tmp_path_factory.mktemp("two_ranks"))


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[RankResult]]:
    return run_group(3, THREE_RANKS, tmp_path_factory.mktemp("three_ranks"))


def results_of(request: pytest.FixtureRequest, name: str) -> tuple[Scenario, list[RankResult]]:
    """The scenario and what each rank of its group saw, in group rank order."""
    world, scenario = SCENARIOS[name]
    group: dict[str, list[RankResult]] = request.getfixturevalue("two_ranks" if world == 2 else "three_ranks")
    return scenario, [r for r in group[name] if r.member]


# ------------------------------------------------------------------------------------------- references


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def reference(scenario: Scenario) -> tuple[Any, Tensor, Tensor]:
    """The scenario's VAE, latent, and diffusers' single-process ``vae.decode`` of it (one torch thread)."""
    vae = FAMILIES[scenario.family]()
    z = latent(vae, 1, scenario.frames, scenario.height, scenario.width)
    with one_torch_thread(), torch.no_grad():
        return vae, z, vae.decode(z).sample


def owner_of(scenario: Scenario, ranks: list[RankResult]) -> RankResult:
    return ranks[scenario.output_rank]


def others_of(scenario: Scenario, ranks: list[RankResult]) -> list[RankResult]:
    return [r for group_rank, r in enumerate(ranks) if group_rank != scenario.output_rank]


COMPLETE = [
    name
    for name, (_, s) in SCENARIOS.items()
    if s.fail_at is None
    and s.cancel_at is None
    and s.codec_options == CODEC
    and s.peer_fault is None
    and s.consumer_stalls_at is None
    and s.reader_closes_at is None
    and not s.nan_latent
]


# ------------------------------------------------------------------------------------------------ tests


@pytest.mark.parametrize("name", COMPLETE)
def test_owner_chunks_equal_the_single_process_decode(request: pytest.FixtureRequest, name: str) -> None:
    scenario, ranks = results_of(request, name)
    _, _, expected = reference(scenario)
    owner = owner_of(scenario, ranks)
    assert owner.error is None and owner.chunks is not None
    assert owner.published == scenario.frames
    assert owner.chunks.shape == expected.shape
    delta = (owner.chunks - expected).abs().max().item()
    assert delta <= 1e-5, f"max |Δ| {delta:.3g}"
    levels = quantize_chunk(owner.chunks, (-1.0, 1.0)).int() - quantize_chunk(expected, (-1.0, 1.0)).int()
    assert levels.abs().max().item() <= 1
    if scenario.exact:
        assert torch.equal(owner.chunks, expected), f"expected bit-exact, max |Δ| {delta:.3g}"


@pytest.mark.parametrize("name", [s.name for _, s in SCENARIOS.values() if s.exact])
def test_owner_mp4_is_the_single_process_mp4_when_the_chunks_are_exact(
    request: pytest.FixtureRequest, name: str
) -> None:
    scenario, ranks = results_of(request, name)
    vae, z, expected = reference(scenario)
    with one_torch_thread():
        single = anyio.run(lambda: decode_to_mp4(vae, z, fps=8, video_codec_options=CODEC))
    owner = owner_of(scenario, ranks)
    assert owner.videos == single
    assert read_mp4(owner.videos[0]).frames.shape[:3] == expected.shape[2:]


@pytest.mark.parametrize("name", COMPLETE)
def test_non_owner_ranks_publish_nothing_and_get_an_empty_list(
    request: pytest.FixtureRequest, name: str
) -> None:
    scenario, ranks = results_of(request, name)
    for rank in others_of(scenario, ranks):
        assert rank.error is None
        assert rank.videos == []
        assert rank.published == 0 and rank.chunks is None
        assert rank.stats["steps"] == scenario.frames


@pytest.mark.parametrize(
    "name",
    [
        name
        for name, (_, s) in SCENARIOS.items()
        if s.peer_fault is None and s.consumer_stalls_at is None and not s.nan_latent
    ],
)
def test_every_rank_runs_the_same_collectives(request: pytest.FixtureRequest, name: str) -> None:
    _, ranks = results_of(request, name)
    counts = {(r.stats["collectives"], r.stats["steps"], r.stats["halo_exchanges"]) for r in ranks}
    assert len(counts) == 1, [r.stats for r in ranks]
    collectives, steps, halos = counts.pop()
    assert collectives > steps * 2 and halos > 0


def check_stopped_together(scenario: Scenario, ranks: list[RankResult], chunk: int, cause: str) -> None:
    """Check every rank stopped after ``chunk`` at once and each non-output one raised PeerDecodeError
    whose message says ``cause``."""
    for rank in ranks:
        assert rank.stats["stopped_at"] == chunk
        assert rank.stats["steps"] == chunk + 1
        assert rank.seconds < GLOO_TIMEOUT.total_seconds() / 2  # nobody waited out a collective
    for rank in others_of(scenario, ranks):
        assert rank.error is not None and rank.error[0] == "PeerDecodeError"
        assert rank.peer_chunk == chunk
        assert cause in rank.error[1]


@pytest.mark.parametrize(
    "name", [s.name for _, s in SCENARIOS.values() if s.fail_at is not None or s.cancel_at is not None]
)
def test_an_owner_whose_consumer_fails_or_caller_is_cancelled_stops_every_rank_at_that_chunk(
    request: pytest.FixtureRequest, name: str
) -> None:
    scenario, ranks = results_of(request, name)
    owner = owner_of(scenario, ranks)
    if scenario.fail_at is not None:
        assert owner.error == ("EncoderFailed", f"the encoder failed at chunk {scenario.fail_at}")
        assert owner.published == scenario.fail_at + 1  # the failing call included; none after it
        assert scenario.fail_at + 1 < scenario.frames  # so stopping early is visible
        check_stopped_together(scenario, ranks, scenario.fail_at, "EncoderFailed: the encoder failed")
    else:
        assert scenario.cancel_at is not None
        assert owner.cancelled and owner.error is None  # the caller sees its own cancellation, nothing else
        check_stopped_together(scenario, ranks, scenario.cancel_at, "cancelled")


def test_an_encoder_error_reaches_the_owner_caller_and_every_peer_stops(
    request: pytest.FixtureRequest,
) -> None:
    scenario, ranks = results_of(request, "wan21_x264_rejects_its_options")
    owner = owner_of(scenario, ranks)
    assert owner.error is not None and owner.error[0] == "ValueError"
    assert "libx264 refuses x264-params" in owner.error[1]
    stopped_at = owner.stats["stopped_at"]
    assert stopped_at is not None
    for rank in others_of(scenario, ranks):
        assert rank.error is not None and rank.error[0] == "PeerDecodeError"
        assert "ValueError" in rank.error[1]
        assert rank.peer_chunk == stopped_at == rank.stats["stopped_at"]


def test_an_owner_whose_session_fails_after_the_last_step_stops_every_peer(
    request: pytest.FixtureRequest,
) -> None:
    scenario, ranks = results_of(request, "wan21_reader_closes_at_last")
    owner = owner_of(scenario, ranks)
    closed = "the reader of entry 0's stream closed it before the MP4 was complete"
    assert owner.error == ("SessionClosedError", closed), owner.error
    assert owner.published == 3 and owner.stats["stopped_at"] is None  # every step ran and was agreed
    for rank in others_of(scenario, ranks):
        # Told once the owner's session has ended, instead of returning [] as if the video were whole.
        assert rank.error is not None and rank.error[0] == "PeerDecodeError", rank.error
        assert f"after the decode's last chunk (3 chunks): SessionClosedError: {closed}" in rank.error[1]
        assert rank.peer_chunk == 3 and rank.stats["collectives"] == owner.stats["collectives"]


def test_a_non_finite_latent_is_refused_on_every_rank_before_any_collective(
    request: pytest.FixtureRequest,
) -> None:
    _, ranks = results_of(request, "wan21_nan_latent")
    for rank in ranks:
        assert rank.error is not None and rank.error[0] == "ValueError", rank.error
        assert "z must be finite, but 1 of its" in rank.error[1]
        assert rank.published == 0 and rank.stats["collectives"] == 0 and rank.stats["steps"] == 0


def test_a_plain_decode_in_another_thread_is_unaffected_by_a_sharded_one(
    request: pytest.FixtureRequest,
) -> None:
    scenario, ranks = results_of(request, "wan21_height")
    _, _, expected = reference(scenario)
    owner = owner_of(scenario, ranks)
    assert owner.plain_decode is not None
    assert torch.equal(owner.plain_decode, expected)


def test_fewer_latent_rows_than_ranks_completes_on_every_rank(request: pytest.FixtureRequest) -> None:
    scenario, ranks = results_of(request, "wan22_fewer_rows_than_ranks")
    assert scenario.height < len(ranks)
    assert [r.error for r in ranks] == [None] * len(ranks)
    assert owner_of(scenario, ranks).published == scenario.frames


def test_a_dead_peer_makes_every_other_rank_raise_at_once(request: pytest.FixtureRequest) -> None:
    _, ranks = results_of(request, "wan22_rank_1_dies")
    assert ranks[1].error == ("died", "")
    for rank in (ranks[0], ranks[2]):  # the output rank's decode_to_mp4 among them
        assert rank.error is not None and "RuntimeError" in rank.error_bases, rank.error
        assert rank.seconds < GLOO_TIMEOUT.total_seconds() / 2  # gloo sees the closed connection


def test_a_stalled_peer_makes_every_other_rank_raise_after_the_group_timeout(
    request: pytest.FixtureRequest,
) -> None:
    scenario, ranks = results_of(request, "wan21_rank_1_stalls")
    owner = owner_of(scenario, ranks)  # rank 0; rank 1 stops calling collectives in its second step
    assert owner.error is not None and "RuntimeError" in owner.error_bases, owner.error
    # The wait is the collective's, bounded by the group's timeout: not by how long the peer stays silent.
    assert STALL_TIMEOUT * 0.9 <= owner.seconds < STALL_SECONDS * 0.75
    assert owner.stats["steps"] == 1 and owner.published == 1


@pytest.mark.parametrize("world", [2, 3])
def test_the_one_buffer_halo_gather_equals_a_list_gather(request: pytest.FixtureRequest, world: int) -> None:
    group: dict[str, list[RankResult]] = request.getfixturevalue("two_ranks" if world == 2 else "three_ranks")
    for rank in group[ONE_BUFFER_GATHER]:
        assert rank.stats and all(rank.stats.values()), rank.stats


def test_a_group_that_is_not_gloo_agrees_over_a_gloo_group_of_its_own(request: pytest.FixtureRequest) -> None:
    for name, (_, scenario) in SCENARIOS.items():
        _, ranks = results_of(request, name)
        for rank in ranks:
            if rank.rank >= 0:  # a rank that died reports nothing
                assert rank.own_agreement_group == scenario.own_agreement_group, name


def test_a_slow_owner_makes_its_peers_raise_after_the_group_timeout(request: pytest.FixtureRequest) -> None:
    # The peer waits for the owner's verdict over the agreement group, whose timeout is the decode group's
    # (3 s here), not torch's default for gloo (30 min): it raises while the owner is still publishing.
    scenario, ranks = results_of(request, "wan21_own_agreement_group_slow_owner")
    owner, (peer,) = owner_of(scenario, ranks), others_of(scenario, ranks)
    assert peer.error is not None and "RuntimeError" in peer.error_bases, peer.error
    assert any("agreeing on the output rank's verdict on chunk 1" in note for note in peer.error_notes)
    assert STALL_TIMEOUT * 0.9 <= peer.seconds < STALL_SECONDS * 0.75
    assert peer.stats["steps"] == scenario.consumer_stalls_at + 1 and peer.published == 0
    assert owner.error is not None and "RuntimeError" in owner.error_bases, owner.error  # no hang either
    assert owner.published == scenario.consumer_stalls_at + 1


# --------------------------------------------------------------------------------- a group of one, here


@pytest.fixture(scope="module")
def group_of_one(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    store = tmp_path_factory.mktemp("group_of_one") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1, timeout=GLOO_TIMEOUT)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_group_of_one_decodes_like_the_single_process_adapter(group_of_one: None) -> None:
    vae = tiny_wan22()
    z = latent(vae, 1, 3, 4, 4)
    sharded, plain = ShardedWanDecoder(vae), WanChunkedDecoder(vae)
    assert sharded.is_output_rank
    with one_torch_thread():
        expected: list[Tensor] = []
        plain.decode_with_chunks(z, on_chunk=expected.append)
        got: list[Tensor] = []
        sharded.decode_with_chunks(z, on_chunk=got.append)
    assert len(got) == len(expected) == 3
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_a_latent_that_would_tile_is_refused_before_any_collective(group_of_one: None) -> None:
    vae = tiny_wan21()
    vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32)
    decoder = ShardedWanDecoder(vae)
    with pytest.raises(ValueError, match="disable_tiling"):
        decoder.decode_with_chunks(latent(vae, 1, 2, 8, 8), on_chunk=lambda chunk: None)
    assert decoder.stats.collectives == 0


def test_bad_options_are_refused_at_construction(group_of_one: None) -> None:
    vae = tiny_wan21()
    with pytest.raises(ValueError, match="shard must be"):
        ShardedWanDecoder(vae, shard="depth")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="output_rank"):
        ShardedWanDecoder(vae, output_rank=1)
    with pytest.raises(TypeError, match="AutoencoderKLWan"):
        ShardedWanDecoder(torch.nn.Linear(2, 2))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        (
            {"shard": "depth"},
            ValueError,
            "shard must be 'auto', 'height' or 'width', got 'depth'",
        ),
        ({"shard": None}, ValueError, "shard must be 'auto', 'height' or 'width', got None"),
        ({"output_rank": 1}, ValueError, r"output_rank must be a rank of the group \(0..0\), got 1"),
        ({"output_rank": 0.0}, TypeError, "output_rank must be an int, got float"),
        ({"collective_timeout": 30}, TypeError, "collective_timeout must be a datetime.timedelta or None"),
        ({"temb": torch.zeros(1)}, TypeError, "temb"),
    ],
)
def test_sharded_decoder_refuses_bad_arguments_before_any_collective(
    group_of_one: None, arguments: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        sharded_decoder(tiny_wan21(), **arguments)


def test_sharded_decoder_gives_the_wan_adapter_for_the_wan_family(group_of_one: None) -> None:
    for make in (tiny_wan21, tiny_wan22, tiny_qwen_image):
        decoder = sharded_decoder(make())
        assert type(decoder) is ShardedWanDecoder and decoder.shard == "auto"
    with pytest.raises(TypeError, match="supported diffusers classes"):
        sharded_decoder(torch.nn.Linear(2, 2))


def test_a_group_of_one_with_auto_decodes_alone_like_the_single_process_adapter(group_of_one: None) -> None:
    vae = tiny_wan21()
    z = latent(vae, 1, 3, 4, 4)
    decoder = sharded_decoder(vae)  # auto: a group of one is not split
    with one_torch_thread():
        expected: list[Tensor] = []
        WanChunkedDecoder(vae).decode_with_chunks(z, on_chunk=expected.append)
        got: list[Tensor] = []
        decoder.decode_with_chunks(z, on_chunk=got.append)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True)) and len(got) == 3
    assert decoder.stats.halo_exchanges == 0 and decoder.stats.steps == 3


def test_one_decode_at_a_time_per_adapter(group_of_one: None) -> None:
    vae = tiny_wan21()
    decoder = sharded_decoder(vae, shard="height")
    state = decoder.start(1, 4, 4)
    with pytest.raises(RuntimeError, match="one decode or stream at a time"):
        decoder.decode_with_chunks(latent(vae, 1, 2, 4, 4), on_chunk=lambda chunk: None)
    decoder.abort(state, reason="done")
    decoder.decode_with_chunks(latent(vae, 1, 2, 4, 4), on_chunk=lambda chunk: None)  # free again


def test_a_decoder_needs_a_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ShardedWanDecoder(tiny_wan21())


# ----------------------------------------------------------------------------------------------- launch

EXAMPLE = ["--shard", "height", "--frames", "3", "--timeout", "60"]  # examples/distributed_decode.py's
EXAMPLE_RUNS = {"whole": [], "in_pieces": ["--pieces", "1"]}  # and each of its two modes
# What ``streamvae decode`` reads: a VAE and the shape of a seeded latent (CogVideoX's 5 frames: 2 batches).
CLI_INPUTS: dict[str, tuple[Callable[[], Any], tuple[int, ...]]] = {
    "wan21": (tiny_wan21, (1, 16, 3, 8, 8)),
    "cogvideox": (tiny_cogvideox, (1, 4, 5, 6, 8)),
}
CLI_DECODES = {  # each with --shard under torchrun, and alone: (its inputs, --shard, the video's [T, H, W])
    "wan21_height": ("wan21", "height", (9, 64, 64)),
    "cogvideox_auto": ("cogvideox", "auto", (17, 48, 64)),
    "cogvideox_width": ("cogvideox", "width", (17, 48, 64)),
}


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Launches:
    """Two torchrun launches on 2 ranks (each rank's imports cost more than its jobs): every CLI_DECODES
    ``python -m streamvae decode --shard``, then the example in pieces (in the decodes' process group); the
    whole example alone (it destroys its group: the last job of a launch)."""
    folder = tmp_path_factory.mktemp("torchrun")
    jobs = {}
    for name, (make, shape) in CLI_INPUTS.items():
        (folder / name).mkdir()
        z = torch.randn(shape, generator=torch.Generator().manual_seed(0))
        save_decode_inputs(folder / name, make(), z)
    for name, (inputs, shard, _) in CLI_DECODES.items():
        output = ["-o", str(folder / f"{name}.mp4"), "--shard", shard]
        jobs[name] = ["-m", "streamvae", *decode_arguments(folder / inputs), *output]
    example = Path(__file__).parents[1] / "examples" / "distributed_decode.py"
    runs = {
        run: [str(example), *EXAMPLE, "-o", str(folder / f"example_{run}.mp4"), *pieces]
        for run, pieces in EXAMPLE_RUNS.items()
    }
    launches = [{**jobs, "example_in_pieces": runs["in_pieces"]}, {"example_whole": runs["whole"]}]
    return run_torchrun_jobs(folder, launches, timeout_s=JOIN_TIMEOUT)


@pytest.fixture(scope="module")
def decoded_alone(launched: Launches) -> dict[str, np.ndarray]:
    """The luma of each of CLI_INPUTS' ``streamvae decode`` in this process, without ``--shard``."""
    folder = launched.folder
    return {
        name: decode_alone(decode_arguments(folder / name), folder / f"{name}_alone.mp4")
        for name in CLI_INPUTS
    }


@pytest.mark.parametrize("run", list(EXAMPLE_RUNS))
def test_the_torchrun_example_writes_the_video(launched: Launches, run: str) -> None:
    job = launched.jobs[f"example_{run}"]
    assert job.succeeded(), (job.statuses, job.launch_stderr[-4000:])
    assert "rank 1/2: decoded 3 latent frames" in job.stdout
    video = read_mp4((launched.folder / f"example_{run}.mp4").read_bytes())
    assert video.frames.shape == (9, 64, 64, 3)


@pytest.mark.parametrize("name", list(CLI_DECODES))
def test_torchrun_streamvae_decode_with_shard_matches_the_single_process_video(
    launched: Launches, decoded_alone: dict[str, np.ndarray], name: str
) -> None:
    inputs, _, shape = CLI_DECODES[name]
    sharded = sharded_luma(launched.jobs[name], launched.folder / f"{name}.mp4")
    single = decoded_alone[inputs]
    assert sharded.shape == single.shape == shape
    assert np.abs(sharded.astype(int) - single.astype(int)).max() <= 1
