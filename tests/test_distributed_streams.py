"""Latents in pieces across ranks: every rank streams the same pieces through ``open_latent_stream``.

Real processes (tests/_ranks.py, gloo), as in tests/test_distributed.py: one group of two ranks runs every
scenario in one start of its processes, each rank writing what it saw to a file. A hung rank fails the test
(the group is joined with a deadline and killed past it); a stalled one waits until its peer has given up
on it (an event they share, ``STALL_SECONDS`` at most), not a fixed time. The reference is the single
process's ``decode_to_mp4(vae, torch.cat(pieces, dim=2))`` with one torch thread and deterministic x264.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.synchronize import Event
from typing import Any

import anyio
import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import Tensor

from streamvae import decode_to_mp4, open_latent_stream
from streamvae.distributed import PeerDecodeError, sharded_decoder
from tests._media import DETERMINISTIC_X264, REFUSED_AT_OPEN, read_mp4
from tests._ranks import rank_context, spawn_ranks
from tests._vaes import latent, tiny_wan21, tiny_wan22

FAMILIES = {"wan21": tiny_wan21, "wan22": tiny_wan22}
GLOO_TIMEOUT = timedelta(seconds=60)  # a rank stuck in a collective raises after this
JOIN_TIMEOUT = 300.0  # a group that has not finished by then hung: the test fails
STALL_TIMEOUT = 3.0  # the process group timeout of the stalled-rank scenario
STALL_SECONDS = 4 * STALL_TIMEOUT  # the longest its stalled rank waits before its next push
WORLD = 2
REPEATS = 3  # runs of each race-prone scenario

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Stream:
    """A stream every rank runs: its pieces (latent frames each), and what goes wrong on which rank."""

    name: str
    family: str = "wan21"
    pieces: tuple[int, ...] = (1, 2, 1)
    height: int = 8
    width: int = 8
    shard: str = "height"
    backend: str = "asyncio"
    output_rank: int = 0
    exact: bool = True  # the sharded chunks were measured bit-equal to the single process's (whole latents)
    codec_options: dict[str, str] = field(default_factory=lambda: dict(DETERMINISTIC_X264))
    longer_piece: tuple[int, int] | None = None  # (rank, piece): that rank's piece has one more frame
    nan_piece: tuple[int, int] | None = None  # (rank, piece): that rank's piece holds a NaN
    cancel_after: tuple[int, int] | None = None  # (rank, piece): that rank's block is cancelled after it
    raise_after: tuple[int, int] | None = None  # (rank, piece): that rank's own code raises after it
    stall_before: tuple[int, int] | None = None  # (rank, piece): that rank waits for its peer to give up
    # the output rank's reader of entry 0 (fragmented) closes its byte stream after this piece, unread:
    # the last piece's index closes it between the last push and finish()
    reader_closes_after: int | None = None
    # every rank has a live audio track; the output rank's lasts less than its video, which its finish()
    # finds after every step was agreed
    short_audio: bool = False
    group_timeout: float | None = None  # stream over a new group with this timeout (seconds)
    alone: bool = False  # auto decides not to shard: the output rank decodes, the others follow


STREAMS = [
    Stream("wan21_height"),
    Stream("wan22_width_owner_1", "wan22", (2, 1), 8, 8, shard="width", backend="trio", output_rank=1),
    Stream("wan21_frame_by_frame_trio", pieces=(1, 1, 1, 1), backend="trio"),
    Stream("wan21_auto", pieces=(2, 2), shard="auto", exact=False),
    # 2×4 latent positions on 2 ranks: too few to pay for a split
    Stream("wan21_auto_too_small_to_split", pieces=(1, 2), height=2, width=4, shard="auto", alone=True),
    Stream("wan21_pieces_differ", longer_piece=(1, 1)),
    Stream("wan21_rank_1_nan_piece", backend="trio", nan_piece=(1, 2)),
    *(Stream(f"wan21_rank_1_cancelled_{n}", pieces=(1, 1, 1), cancel_after=(1, 0)) for n in range(REPEATS)),
    *(
        Stream(f"wan21_owner_cancelled_{n}", pieces=(1, 1, 1), cancel_after=(0, 1), backend="trio")
        for n in range(REPEATS)
    ),
    # The output rank's reader goes away: mid-stream (a later push fails, or finish(), as the encoder's
    # timing has it), and after the last step, where only the output rank's finish() can know.
    *(
        Stream(f"wan21_owner_reader_closes_{when}_{n}", pieces=(1, 1, 1, 1), reader_closes_after=after)
        for when, after in (("mid_stream", 1), ("before_finish", 3))
        for n in range(REPEATS)
    ),
    Stream("wan21_owner_audio_too_short", pieces=(1, 1), short_audio=True),
    Stream("wan21_owner_encoder_rejects_its_options", pieces=(1, 1, 1, 1), codec_options=REFUSED_AT_OPEN),
    # The caller's own exception leaving the block, on the output rank and on the other, a few times over
    # (a decode thread that gets to its next push first, on a loaded machine, is what these catch).
    *(Stream(f"wan21_owner_raises_{n}", pieces=(1, 1, 1, 1), raise_after=(0, 2)) for n in range(REPEATS)),
    *(
        Stream(f"wan21_rank_1_raises_{n}", pieces=(1, 1, 1, 1), raise_after=(1, 1), backend="trio")
        for n in range(REPEATS)
    ),
    # Last: the stalled rank's peer leaves the stream's group behind.
    Stream("wan21_rank_1_stops_pushing", stall_before=(1, 1), group_timeout=STALL_TIMEOUT),
]
BY_NAME = {s.name: s for s in STREAMS}


@dataclass
class RankResult:
    rank: int
    videos: list[bytes] | None = None  # what finish() returned; None if it raised or was cancelled
    error: tuple[str, str] | None = None  # (type name, message)
    error_bases: tuple[str, ...] = ()
    peer_rank: int | None = None  # PeerDecodeError.rank
    cancelled: bool = False
    seconds: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------- in each rank


def pieces_of(stream: Stream, rank: int) -> list[Tensor]:
    vae = FAMILIES[stream.family]()
    z = latent(vae, 1, sum(stream.pieces), stream.height, stream.width)
    pieces = list(z.split(list(stream.pieces), dim=2))
    if stream.longer_piece is not None and stream.longer_piece[0] == rank:
        index = stream.longer_piece[1]
        pieces[index] = torch.cat([pieces[index], pieces[index][:, :, -1:]], dim=2)
    if stream.nan_piece is not None and stream.nan_piece[0] == rank:
        pieces[stream.nan_piece[1]] = pieces[stream.nan_piece[1]].clone()
        pieces[stream.nan_piece[1]][0, 0, 0, 0, 0] = float("nan")
    return pieces


def _run_stream(stream: Stream, rank: int, gave_up: Event | None) -> RankResult:
    group = None
    if stream.group_timeout is not None:
        group = dist.new_group(timeout=timedelta(seconds=stream.group_timeout))
    vae = FAMILIES[stream.family]()
    decoder = sharded_decoder(vae, shard=stream.shard, group=group, output_rank=stream.output_rank)  # type: ignore[arg-type]
    pieces = pieces_of(stream, rank)

    closes_reader = stream.reader_closes_after is not None and rank == stream.output_rank
    audio: dict[str, Any] = {"audio_channels": 1, "audio_sample_rate": 8000} if stream.short_audio else {}
    kwargs: dict[str, Any] = {"output": "fragmented" if closes_reader else "mp4", **audio}

    async def run() -> list[bytes] | None:
        with anyio.CancelScope() as scope:
            async with open_latent_stream(
                decoder, fps=8, video_codec_options=stream.codec_options, **kwargs
            ) as opened:
                reader = opened.open_stream(0, max_buffered=64) if closes_reader else None  # never waits
                if stream.short_audio and rank == stream.output_rank:
                    opened.push_audio(np.zeros(80, dtype=np.float32))  # 0.01 s, of a 0.625 s video
                for index, piece in enumerate(pieces):
                    if stream.stall_before == (rank, index):
                        # Stops pushing for longer than the timeout: until the peer has raised.
                        assert gave_up is not None
                        await anyio.to_thread.run_sync(gave_up.wait, STALL_SECONDS)
                    await opened.push_latents(piece)
                    if reader is not None and index == stream.reader_closes_after:
                        await reader.aclose()
                    if stream.raise_after == (rank, index):
                        raise RuntimeError(f"rank {rank}'s own code failed after piece {index}")
                    if stream.cancel_after == (rank, index):
                        scope.cancel()
                        await anyio.sleep(0)
                return await opened.finish()
        return None

    result = RankResult(rank=rank)
    started = time.monotonic()
    try:
        result.videos = anyio.run(run, backend=stream.backend)
        result.cancelled = result.videos is None
    except Exception as error:
        result.error = (type(error).__name__, str(error))
        result.error_bases = tuple(cls.__name__ for cls in type(error).__mro__)
        result.peer_rank = error.rank if isinstance(error, PeerDecodeError) else None
    result.seconds = time.monotonic() - started
    if gave_up is not None and (stream.stall_before is None or stream.stall_before[0] != rank):
        gave_up.set()  # this rank's stream has ended: the stalled one may go on
    result.stats = dataclasses.asdict(decoder.stats)
    return result


def _rank_main(rank: int, folder: str, gave_up: dict[str, Event]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/store", rank=rank, world_size=WORLD, timeout=GLOO_TIMEOUT
    )
    try:
        results: dict[str, RankResult] = {}
        for index, stream in enumerate(STREAMS):
            results[stream.name] = _run_stream(stream, rank, gave_up.get(stream.name))
            torch.save(results, f"{folder}/rank{rank}.pt")
            if index + 1 < len(STREAMS):
                dist.barrier()  # a stream that failed leaves its ranks apart: start the next together
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[RankResult]]:
    folder = tmp_path_factory.mktemp("streams")
    # A stream with a stalled rank: the event its peer sets once it gave up on it.
    gave_up = {s.name: rank_context().Event() for s in STREAMS if s.stall_before is not None}
    spawn_ranks(WORLD, _rank_main, (str(folder), gave_up), deadline_s=JOIN_TIMEOUT)
    per_rank = [torch.load(folder / f"rank{rank}.pt", weights_only=False) for rank in range(WORLD)]
    return {s.name: [results[s.name] for results in per_rank] for s in STREAMS}


def single_process_video(stream: Stream) -> bytes:
    vae = FAMILIES[stream.family]()
    z = torch.cat(pieces_of(stream, -1), dim=2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        (video,) = anyio.run(lambda: decode_to_mp4(vae, z, fps=8, video_codec_options=stream.codec_options))
    finally:
        torch.set_num_threads(threads)
    return video


COMPLETE = [
    "wan21_height",
    "wan22_width_owner_1",
    "wan21_frame_by_frame_trio",
    "wan21_auto",
    "wan21_auto_too_small_to_split",
]


# ------------------------------------------------------------------------------------------------ tests


@pytest.mark.parametrize("name", COMPLETE)
def test_the_output_rank_writes_the_single_process_video_and_the_others_get_an_empty_list(
    ranks: dict[str, list[RankResult]], name: str
) -> None:
    stream = BY_NAME[name]
    results = ranks[name]
    single = single_process_video(stream)
    owner = results[stream.output_rank]
    assert owner.error is None and owner.videos is not None, owner.error
    if stream.exact:
        assert owner.videos == [single]  # byte-identical under deterministic x264
    else:
        got, want = read_mp4(owner.videos[0]).frames, read_mp4(single).frames
        assert got.shape == want.shape
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    for rank, result in enumerate(results):
        if rank != stream.output_rank:
            assert result.error is None and result.videos == []
    counts = {(r.stats["collectives"], r.stats["latent_frames"]) for r in results}
    assert len(counts) == 1, [r.stats for r in results]  # every rank ran the same collectives
    assert results[0].stats["latent_frames"] == sum(stream.pieces)
    steps = [r.stats["steps"] for r in results]
    if stream.alone:  # only the output rank decodes; no halo was exchanged
        assert steps[stream.output_rank] == sum(stream.pieces) and sum(steps) == sum(stream.pieces)
        assert all(r.stats["halo_exchanges"] == 0 for r in results)
    else:
        assert steps == [sum(stream.pieces)] * WORLD and results[0].stats["halo_exchanges"] > 0


def test_pieces_whose_shapes_differ_between_ranks_are_a_value_error_on_every_rank(
    ranks: dict[str, list[RankResult]],
) -> None:
    for result in ranks["wan21_pieces_differ"]:
        assert result.error is not None and result.error[0] == "ValueError", result.error
        assert "they differ" in result.error[1]
        assert "rank 0: a piece of shape [1, 16, 2, 8, 8]" in result.error[1]
        assert "rank 1: a piece of shape [1, 16, 3, 8, 8]" in result.error[1]
        assert result.seconds < GLOO_TIMEOUT.total_seconds() / 2  # nobody waited out a collective


def test_a_rank_whose_piece_fails_its_check_stops_the_other_at_that_piece(
    ranks: dict[str, list[RankResult]],
) -> None:
    owner, failing = ranks["wan21_rank_1_nan_piece"]
    assert failing.error is not None and failing.error[0] == "ValueError"
    assert "must be finite" in failing.error[1]
    assert owner.error is not None and owner.error[0] == "PeerDecodeError", owner.error
    assert owner.peer_rank == 1 and "rank 1 stopped the decode" in owner.error[1]
    assert "ValueError" in owner.error[1] and "must be finite" in owner.error[1]
    assert owner.stats["latent_frames"] == 3  # the two pieces before it
    assert owner.seconds < GLOO_TIMEOUT.total_seconds() / 2


@pytest.mark.parametrize("n", range(REPEATS))
@pytest.mark.parametrize("name", ["wan21_rank_1_cancelled", "wan21_owner_cancelled"])
def test_a_rank_cancelled_mid_stream_stops_the_other_naming_its_cancellation(
    ranks: dict[str, list[RankResult]], name: str, n: int
) -> None:
    stream = BY_NAME[f"{name}_{n}"]
    assert stream.cancel_after is not None
    rank = stream.cancel_after[0]
    cancelled, told = ranks[stream.name][rank], ranks[stream.name][1 - rank]
    assert cancelled.cancelled and cancelled.error is None
    assert told.error is not None and told.error[0] == "PeerDecodeError", told.error
    assert told.peer_rank == rank
    # Named, whichever backend: asyncio's CancelledError, trio's Cancelled.
    named = "Cancelled: cancelled" if stream.backend == "trio" else "CancelledError: cancelled"
    assert named in told.error[1], told.error
    assert told.seconds < GLOO_TIMEOUT.total_seconds() / 2


def test_an_output_rank_that_fails_after_the_last_step_names_that_to_the_other(
    ranks: dict[str, list[RankResult]],
) -> None:
    owner, peer = ranks["wan21_owner_audio_too_short"]
    assert owner.error is not None and owner.error[0] == "ValueError", owner.error
    assert "the live audio does not last as long as the video" in owner.error[1]
    assert owner.stats["stopped_at"] is None  # every step ran and was agreed: finish() found it
    # Told once the owner's session has ended, instead of an empty list as if the video were whole.
    assert peer.error is not None and peer.error[0] == "PeerDecodeError", peer.error
    assert "after the decode's last chunk (2 chunks): ValueError: " in peer.error[1], peer.error
    assert "the live audio does not last as long as the video" in peer.error[1]
    assert peer.stats["collectives"] == owner.stats["collectives"]


@pytest.mark.parametrize("n", range(REPEATS))
@pytest.mark.parametrize("when", ["mid_stream", "before_finish"])
def test_an_output_rank_whose_reader_closed_its_stream_names_that_to_the_other(
    ranks: dict[str, list[RankResult]], when: str, n: int
) -> None:
    owner, peer = ranks[f"wan21_owner_reader_closes_{when}_{n}"]
    closed = "the reader of entry 0's stream closed it before the MP4 was complete"
    assert owner.error == ("SessionClosedError", closed), owner.error  # the first cause, nothing after it
    # Never an empty list, as if the video were whole: the peer is told, whichever step the owner knew at.
    assert peer.error is not None and peer.error[0] == "PeerDecodeError", peer.error
    assert f"SessionClosedError: {closed}" in peer.error[1], peer.error
    assert peer.stats["collectives"] == owner.stats["collectives"]  # the same agreements, nothing left over
    assert peer.seconds < GLOO_TIMEOUT.total_seconds() / 2


@pytest.mark.parametrize("n", range(REPEATS))
@pytest.mark.parametrize(
    ("name", "raiser", "piece"), [("wan21_owner_raises", 0, 2), ("wan21_rank_1_raises", 1, 1)]
)
def test_a_ranks_own_exception_is_what_the_other_rank_is_told(
    ranks: dict[str, list[RankResult]], name: str, raiser: int, piece: int, n: int
) -> None:
    owner, peer = ranks[f"{name}_{n}"]
    failed, told = (owner, peer) if raiser == 0 else (peer, owner)
    message = f"rank {raiser}'s own code failed after piece {piece}"
    assert failed.error == ("RuntimeError", message), failed.error
    assert told.error is not None and told.error[0] == "PeerDecodeError", told.error
    assert f"RuntimeError: {message}" in told.error[1], told.error
    if raiser == 0:  # the peer hears the owner's own error, not the session it closed on the way out
        assert "SessionClosedError" not in told.error[1]
    else:  # the output rank hears which rank failed
        assert owner.peer_rank == 1


def test_an_output_rank_whose_encoder_fails_stops_every_rank(ranks: dict[str, list[RankResult]]) -> None:
    owner, peer = ranks["wan21_owner_encoder_rejects_its_options"]
    assert owner.error is not None and "libx264 refuses x264-params" in owner.error[1], owner.error
    assert peer.error is not None and peer.error[0] == "PeerDecodeError", peer.error
    assert peer.peer_rank is None and "output rank 0 stopped the decode" in peer.error[1]
    assert owner.error[0] in peer.error[1]
    assert owner.stats["stopped_at"] == peer.stats["stopped_at"] is not None


def test_a_rank_that_stops_pushing_makes_its_peer_raise_after_the_collective_timeout(
    ranks: dict[str, list[RankResult]],
) -> None:
    owner, _ = ranks["wan21_rank_1_stops_pushing"]
    assert owner.error is not None and "RuntimeError" in owner.error_bases, owner.error
    # The wait is the agreement's, bounded by the group's timeout: not by how long the peer stays silent.
    assert STALL_TIMEOUT * 0.9 <= owner.seconds < STALL_SECONDS * 0.75
    assert owner.stats["latent_frames"] == 1
