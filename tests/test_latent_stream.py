"""open_latent_stream: latents pushed piece by piece decode to exactly the frames of the whole latent.

The frames checked are the chunks the decode hands to the session (``push_from_thread`` recorded), compared
with ``torch.equal`` to diffusers' ``vae.decode`` (or ``tiled_decode``) of the concatenated latent.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
import torch.distributed as dist
from diffusers import AutoencoderKLHunyuanVideo
from torch import Tensor, nn

from streamvae import (
    ChunkedVideoMP4Session,
    LatentStream,
    SessionClosedError,
    decode_to_mp4,
    open_latent_stream,
)
from streamvae.distributed import ShardedWanDecoder, sharded_decoder
from streamvae.models import ChunkedDecoder, DecodeState
from streamvae.models.wan import WanChunkedDecoder
from streamvae.testing import check_chunked_decoder, enable_small_tiling, foreign_threads, open_containers
from tests._adapters import FrameDecoder, FrameVAE
from tests._media import DETERMINISTIC_X264, REFUSED_AT_OPEN, read_mp4
from tests._vaes import latent, tiny_qwen_image, tiny_wan21, tiny_wan22

pytestmark = pytest.mark.anyio

FAMILIES: dict[str, Callable[[], nn.Module]] = {
    "wan21": tiny_wan21,
    "wan22": tiny_wan22,
    "qwen_image": tiny_qwen_image,
}
TINY_HUNYUAN_VIDEO = {
    "latent_channels": 4,
    "block_out_channels": (8,) * 4,
    "layers_per_block": 1,
    "norm_num_groups": 4,
}
SPLITS = {"frame-by-frame": [1, 1, 1, 1, 1], "uneven": [2, 3], "whole": [5]}
FAST = {"video_codec_options": {"preset": "ultrafast"}}
HANG_GUARD = 120  # seconds: turns a hang into a failure, never a speed check


def reference(vae: Any, z: Tensor, *, tiled: bool = False) -> Tensor:
    """``vae.decode``, or ``tiled_decode`` clamped as ``decode`` clamps (Qwen-Image's does not)."""
    with torch.no_grad():
        out: Tensor = (vae.tiled_decode if tiled else vae.decode)(z).sample
    return out.clamp(-1.0, 1.0)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> tuple[Any, Tensor, Tensor]:
    vae = FAMILIES[request.param]()
    z = latent(vae, h=4, w=4)
    return vae, z, reference(vae, z)


Handed = dict[ChunkedVideoMP4Session, list[Tensor]]


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> Handed:
    """The chunks each session took from its decode worker, in order."""
    taken: Handed = defaultdict(list)
    push = ChunkedVideoMP4Session.push_from_thread

    def recording(session: ChunkedVideoMP4Session, chunk: Tensor) -> None:
        push(session, chunk)
        taken[session].append(chunk.clone())

    monkeypatch.setattr(ChunkedVideoMP4Session, "push_from_thread", recording)
    return taken


def video(handed: Handed, stream: LatentStream) -> Tensor:
    return torch.cat(handed[stream.session], dim=2)


async def decode_in_pieces(vae: Any, pieces: list[Tensor], **options: Any) -> LatentStream:
    async with open_latent_stream(vae, fps=16, **FAST, **options) as stream:
        for piece in pieces:
            await stream.push_latents(piece)
        (mp4, *_) = await stream.finish()
    assert read_mp4(mp4).frames.shape[0] == 1 + 4 * (sum(p.shape[2] for p in pieces) - 1)
    return stream


@pytest.mark.parametrize("sizes", list(SPLITS.values()), ids=list(SPLITS))
async def test_frames_from_any_split_equal_decoding_the_concatenated_latent(
    family: tuple[Any, Tensor, Tensor], sizes: list[int], handed: Handed
) -> None:
    vae, z, expected = family
    stream = await decode_in_pieces(vae, list(z.split(sizes, dim=2)))
    assert torch.equal(video(handed, stream), expected)
    assert [chunk.shape[2] for chunk in handed[stream.session]] == [1, 4, 4, 4, 4]
    statistics = stream.statistics()
    assert (statistics.pieces_pushed, statistics.latent_frames_decoded) == (len(sizes), 5)


@pytest.mark.parametrize("name", list(FAMILIES))
async def test_pieces_with_slicing_and_tiling_equal_the_whole_decode(name: str, handed: Handed) -> None:
    vae = FAMILIES[name]()
    vae.enable_slicing()
    z = latent(vae, batch=2, frames=3, h=4, w=4)
    stream = await decode_in_pieces(vae, list(z.split([2, 1], dim=2)))
    assert torch.equal(video(handed, stream), reference(vae, z))
    vae.disable_slicing()
    enable_small_tiling(vae)
    z = latent(vae, frames=3, h=6, w=7)
    stream = await decode_in_pieces(vae, list(z.split([1, 2], dim=2)))
    assert torch.equal(video(handed, stream), reference(vae, z, tiled=True))


async def test_four_streams_on_one_module_interleaved_each_equal_their_own_decode(handed: Handed) -> None:
    vae = tiny_wan21()
    latents = [
        latent(vae, frames=4, h=4, w=4, seed=1),
        latent(vae, batch=2, frames=3, h=4, w=6, seed=2),
        latent(vae, frames=5, h=6, w=4, seed=3),
        latent(vae, frames=2, h=4, w=4, seed=4),
    ]
    shared = anyio.CapacityLimiter(1)  # one module: one piece decodes at a time, streams take turns
    async with AsyncExitStack() as stack:
        streams = [
            await stack.enter_async_context(open_latent_stream(vae, fps=16, decode_limiter=shared, **FAST))
            for _ in latents
        ]
        for k in range(max(z.shape[2] for z in latents)):  # one latent frame of each stream in turn
            for stream, z in zip(streams, latents, strict=True):
                if k < z.shape[2]:
                    await stream.push_latents(z[:, :, k : k + 1])
        for stream in streams:
            await stream.finish()
    for stream, z in zip(streams, latents, strict=True):
        assert torch.equal(video(handed, stream), reference(vae, z))


async def test_a_piece_that_does_not_fit_the_first_is_refused_before_any_work(handed: Handed) -> None:
    vae = tiny_wan21()
    z = latent(vae, frames=3, h=4, w=4)
    async with open_latent_stream(vae, fps=16, **FAST) as stream:
        await stream.push_latents(z[:, :, :1])
        with pytest.raises(ValueError, match=r"first piece's batch.*batch 2 \(the first piece's: 1\)"):
            await stream.push_latents(latent(vae, batch=2, frames=1, h=4, w=4))
        with pytest.raises(ValueError, match="must have 16 latent channels"):
            await stream.push_latents(torch.zeros(1, 8, 1, 4, 4))
        with pytest.raises(ValueError, match=r"height 6 \(the first piece's: 4\), width 8"):
            await stream.push_latents(latent(vae, frames=1, h=6, w=8))
        with pytest.raises(ValueError, match="must not be empty"):
            await stream.push_latents(z[:, :, :0])
        with pytest.raises(ValueError, match="5-D"):
            await stream.push_latents(z[0])
        with pytest.raises(TypeError, match="torch.Tensor"):
            await stream.push_latents(z.numpy())  # type: ignore[arg-type]
        assert stream.statistics().pieces_pushed == 1
        await stream.push_latents(z[:, :, 1:])  # a refused piece leaves the stream as it was
        await stream.finish()
    assert torch.equal(video(handed, stream), reference(vae, z))


@pytest.mark.parametrize("bad", [1, 2])
async def test_nan_in_a_piece_is_raised_by_the_next_push_or_finish_and_nothing_after_it_decodes(
    bad: int, handed: Handed
) -> None:
    vae = tiny_wan21()
    z = latent(vae, frames=3, h=4, w=4)
    z[:, :, bad, 1, 2] = float("nan")
    where = "push_latents"
    with pytest.raises(ValueError, match=r"push_latents \(piece \d\): z must be finite"):
        async with open_latent_stream(vae, fps=16, **FAST) as stream:
            for k in range(3):
                await stream.push_latents(z[:, :, k : k + 1])  # the NaN is found in the worker
            where = "finish"
            await stream.finish()
    assert where == ("push_latents" if bad == 1 else "finish")  # the push after the bad piece, or finish
    assert len(handed[stream.session]) == bad  # the latent frames before the bad one, nothing after
    assert open_containers() == 0


@dataclass(eq=False)
class HoldingState(DecodeState):
    held: Tensor | None = None


class CausalFrameDecoder(ChunkedDecoder):
    """A causal decoder of one's own: each latent frame's frames come out when the next latent arrives
    (as if they depended on it), the last at the end: start / piece_chunks / end_chunks, as documented."""

    vae: FrameVAE
    takes_pieces = True

    def __init__(self, vae: FrameVAE) -> None:
        super().__init__(vae, latent_channels=vae.decoder.in_channels)

    def start(self, batch: int, height: int, width: int) -> DecodeState:
        return HoldingState(owner=self, batch=batch, height=height, width=width)

    def piece_chunks(self, state: DecodeState, z: Tensor) -> Iterator[Tensor]:
        assert isinstance(state, HoldingState)
        for k in range(z.shape[2]):
            frames = self.vae.frame(z[:, :, k : k + 1])
            state.decoded += 1
            if state.held is not None:
                yield state.held
            state.held = frames

    def end_chunks(self, state: DecodeState) -> Iterator[Tensor]:
        assert isinstance(state, HoldingState)
        held, state.held = state.held, None
        return iter(() if held is None else (held,))


async def test_a_causal_decoder_of_your_own_streams_and_gives_its_held_frames_at_finish(
    handed: Handed,
) -> None:
    vae = FrameVAE()
    decoder = CausalFrameDecoder(vae)
    z = torch.randn(1, 4, 5, 8, 8, generator=torch.Generator().manual_seed(0))
    check_chunked_decoder(decoder, z, reference=vae.decode_frames)
    async with open_latent_stream(decoder, fps=16, **FAST) as stream:
        for piece in z.split([2, 1, 2], dim=2):
            await stream.push_latents(piece)
        await stream.finish()
    assert torch.equal(video(handed, stream), vae.decode_frames(z))


class ProtocolOnly:
    chunk_value_range = (-1.0, 1.0)

    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        on_chunk(torch.zeros(1, 3, 1, 16, 16))


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: AutoencoderKLHunyuanVideo(**TINY_HUNYUAN_VIDEO), "HunyuanVideoChunkedDecoder"),
        (lambda: FrameDecoder(FrameVAE()), "FrameDecoder"),
        (ProtocolOnly, "ProtocolOnly implements only decode_with_chunks"),
    ],
    ids=["hunyuan_video", "chunked_decoder", "protocol_only"],
)
async def test_a_decoder_that_is_not_causal_across_calls_is_refused_at_open(
    make: Callable[[], Any], name: str
) -> None:
    supported = "AutoencoderKLWan, AutoencoderKLQwenImage"
    with pytest.raises(TypeError, match=f"open_latent_stream: {name}.*{supported}"):
        async with open_latent_stream(make(), fps=16):
            pass


@pytest.mark.parametrize("shard", ["height", "auto"])
async def test_a_sharded_stream_of_one_rank_writes_the_single_process_video(
    tmp_path: Path, shard: str
) -> None:
    # A group of one: "height" runs the strip machinery (one strip), "auto" does not shard a group of one.
    # Real ranks stream in tests/test_distributed.py.
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        vae = tiny_wan21()
        z = latent(vae, frames=5, h=4, w=6)
        decoder = sharded_decoder(vae, shard=shard)  # type: ignore[arg-type]
        assert isinstance(decoder, ShardedWanDecoder)
        with anyio.fail_after(HANG_GUARD):
            async with open_latent_stream(decoder, fps=16, video_codec_options=DETERMINISTIC_X264) as stream:
                for piece in (z[:, :, :2], z[:, :, 2:3], z[:, :, 3:]):
                    await stream.push_latents(piece)
                videos = await stream.finish()
            single = await decode_to_mp4(vae, z, fps=16, video_codec_options=DETERMINISTIC_X264)
        assert videos == single
        assert decoder.stats.latent_frames == 5
        assert decoder.stats.steps == 5  # one a latent frame, sharded or not
    finally:
        dist.destroy_process_group()


async def test_a_sharded_decoder_of_a_family_not_causal_across_calls_takes_whole_latents_only(
    tmp_path: Path,
) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        decoder = sharded_decoder(AutoencoderKLHunyuanVideo(**TINY_HUNYUAN_VIDEO))
        whole_only = (
            "open_latent_stream: ShardedDecoder of an AutoencoderKLHunyuanVideo decodes whole latents only"
        )
        with pytest.raises(TypeError, match=whole_only):
            async with open_latent_stream(decoder, fps=16):
                pass
    finally:
        dist.destroy_process_group()


async def test_open_stream_gives_fragments_while_pieces_still_arrive() -> None:
    vae = tiny_wan21()
    z = latent(vae, frames=8, h=4, w=4)
    fragment = anyio.Event()
    data: list[bytes] = []
    with anyio.fail_after(HANG_GUARD):
        async with open_latent_stream(
            vae, fps=16, output="fragmented", keyframe_interval=4, video_codec_options={"tune": "zerolatency"}
        ) as stream:
            entry = stream.open_stream(0)

            async def read() -> None:
                async for piece in entry:
                    data.append(piece)
                    if b"moof" in piece:
                        fragment.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                for k in range(7):
                    await stream.push_latents(z[:, :, k : k + 1])
                with pytest.raises(SessionClosedError, match="before the first push"):
                    stream.open_stream(1)
                await fragment.wait()  # a fragment holding frames came out before the last piece went in
                await stream.push_latents(z[:, :, 7:])
                assert await stream.finish() == [b""]
    assert read_mp4(b"".join(data)).frames.shape[0] == 29


async def test_leaving_the_block_early_aborts_ends_the_state_and_leaves_nothing_behind() -> None:
    await decode_to_mp4(tiny_wan21(), latent(tiny_wan21(), frames=2, h=4, w=4), fps=16)  # warm the pools
    baseline = foreign_threads()
    vae = tiny_wan21()
    ended: list[DecodeState] = []

    class Recording(WanChunkedDecoder):
        def end_chunks(self, state: DecodeState) -> Iterator[Tensor]:
            ended.append(state)
            return super().end_chunks(state)

    z = latent(vae, frames=40, h=4, w=4)
    with anyio.CancelScope() as scope:
        async with open_latent_stream(Recording(vae), fps=16) as stream:
            for k in range(40):
                await stream.push_latents(z[:, :, k : k + 1])
                if k == 3:
                    scope.cancel()
    assert scope.cancelled_caught and 4 <= stream.statistics().pieces_pushed <= 5
    with pytest.raises(KeyError, match="client went away"):
        async with open_latent_stream(Recording(vae), fps=16) as stream:
            await stream.push_latents(z[:, :, :3])
            raise KeyError("client went away")
    assert len(ended) == 2 and all(state.ended for state in ended)
    assert open_containers() == 0
    assert foreign_threads() <= baseline


async def test_an_encoder_failure_is_raised_as_it_is_by_push_or_finish() -> None:
    vae = tiny_wan21()
    z = latent(vae, frames=6, h=4, w=4)
    with pytest.raises(ValueError, match="libx264 refuses x264-params"):
        async with open_latent_stream(vae, fps=16, video_codec_options=REFUSED_AT_OPEN) as stream:
            for k in range(6):
                await stream.push_latents(z[:, :, k : k + 1])
            await stream.finish()
    assert stream.statistics().latent_frames_decoded < 6
    assert open_containers() == 0


class Gate:
    """Open while the decode worker waits to hand a chunk to the session (set from its thread)."""

    def __init__(self) -> None:
        self.event, self.stay_open = anyio.Event(), False

    def close(self) -> None:
        if not self.stay_open and self.event.is_set():
            self.event = anyio.Event()


async def test_a_slow_reader_holds_push_latents(monkeypatch: pytest.MonkeyPatch) -> None:
    # The reader takes bytes only while the decode worker is stuck handing a chunk over: the slowest
    # reader that still lets the stream end. push_latents must then stay within a few pieces of it.
    gate = Gate()
    push = ChunkedVideoMP4Session.push_from_thread

    def gated(session: ChunkedVideoMP4Session, chunk: Tensor) -> None:
        anyio.from_thread.run_sync(gate.event.set)
        try:
            push(session, chunk)
        finally:
            anyio.from_thread.run_sync(gate.close)

    monkeypatch.setattr(ChunkedVideoMP4Session, "push_from_thread", gated)
    vae = tiny_wan21()
    z = latent(vae, frames=16, h=4, w=4)
    read: list[bytes] = []
    ahead: list[int] = []  # at each push's return: latent frames pushed beyond what the reader took
    options = {"tune": "zerolatency", "preset": "ultrafast"}
    with anyio.fail_after(HANG_GUARD):
        async with open_latent_stream(
            vae, fps=16, output="fragmented", keyframe_interval=1, video_codec_options=options
        ) as stream:
            entry = stream.open_stream(0, max_buffered=1)

            async def read_slowly() -> None:
                while True:
                    await gate.event.wait()
                    try:
                        read.append(await anext(entry))
                    except StopAsyncIteration:
                        return

            async with anyio.create_task_group() as tg:
                tg.start_soon(read_slowly)
                for k in range(16):
                    await stream.push_latents(z[:, :, k : k + 1])
                    ahead.append(stream.statistics().latent_frames_pushed - len(read) // 4)
                gate.stay_open = True
                gate.event.set()
                await stream.finish()
    assert read_mp4(b"".join(read)).frames.shape[0] == 61
    assert max(ahead) <= 8, ahead  # bounded by the pipeline's depth, not by the 16 pieces


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.cuda
async def test_a_cuda_stream_decodes_on_a_stream_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    streams: list[Any] = []
    push = ChunkedVideoMP4Session.push_from_thread

    def recording(session: ChunkedVideoMP4Session, chunk: Tensor) -> None:
        streams.append(torch.cuda.current_stream(chunk.device))
        push(session, chunk)

    monkeypatch.setattr(ChunkedVideoMP4Session, "push_from_thread", recording)
    vae = tiny_wan21().to("cuda")
    z = latent(vae, frames=4, h=4, w=4)  # on the CPU: prepared (copied to the GPU) in the worker
    stream = await decode_in_pieces(vae, list(z.split([1, 2, 1], dim=2)))
    assert len(streams) == 4 and len(set(streams)) == 1  # every piece on the same stream, the worker's
    assert streams[0] != torch.cuda.default_stream(streams[0].device)
    assert stream.session.pixel_format == "yuv420p"  # chunks were on the GPU
