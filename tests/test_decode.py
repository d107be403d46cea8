"""decode_to_mp4 and stream_mp4: a real diffusers decode streamed into MP4s, on asyncio and trio."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pytest
import torch
from torch import Tensor

from streamvae import ChunkedVideoMP4Session, SessionClosedError, decode_to_mp4, quantize_chunk, stream_mp4
from streamvae.models import chunked_decoder
from streamvae.testing import foreign_threads, open_containers
from tests._media import DETERMINISTIC_X264, REFUSED_AT_OPEN, bt709_luma, read_luma, read_mp4
from tests._vaes import latent, tiny_wan21, tiny_wan22

pytestmark = pytest.mark.anyio

PINNED = DETERMINISTIC_X264  # byte-identical MP4s for identical frames


@pytest.fixture(scope="module")
def wan21() -> Any:
    return tiny_wan21()


@pytest.fixture(scope="module")
def wan22() -> Any:
    return tiny_wan22()


class RecordingDecoder:
    """Wraps a chunked decoder: records each published chunk and the decoder steps actually run."""

    def __init__(self, inner: Any, *, on_publish: Callable[[int], None] | None = None) -> None:
        self.inner = inner
        self.chunk_value_range = inner.chunk_value_range
        self.latent_channels = inner.latent_channels
        self.prepare_latents = inner.prepare_latents
        self.published: list[Tensor] = []
        self.on_publish = on_publish

    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:

        def record(chunk: Tensor) -> None:
            self.published.append(chunk.clone())
            if self.on_publish is not None:
                self.on_publish(len(self.published))
            on_chunk(chunk)

        self.inner.decode_with_chunks(z, on_chunk=record)


def count_decoder_steps(vae: Any) -> list[int]:
    calls = [0]

    def hook(module: Any, args: Any) -> None:
        calls[0] += 1

    vae.decoder.register_forward_pre_hook(hook)
    return calls


@pytest.mark.parametrize(("factory", "size"), [("wan21", 64), ("wan22", 128)])
async def test_decode_to_mp4_gives_one_mp4_per_entry_with_every_decoded_frame(
    factory: str, size: int, request: pytest.FixtureRequest
) -> None:
    vae = request.getfixturevalue(factory)
    z = latent(vae, batch=2, frames=4)
    with torch.no_grad():
        reference = vae.decode(z).sample
    recorder = RecordingDecoder(chunked_decoder(vae))
    videos = await decode_to_mp4(recorder, z, fps=16, video_codec_options={"qp": "0", **PINNED})
    # The frames handed to the encoder are exactly diffusers' decode, chunk by chunk.
    assert torch.equal(torch.cat(recorder.published, dim=2), reference)
    assert [c.shape[2] for c in recorder.published] == [1, 4, 4, 4]
    expected = quantize_chunk(reference, (-1, 1)).numpy()
    assert len(videos) == 2
    for entry, data in enumerate(videos):
        assert read_mp4(data).frames.shape == (13, size, size, 3)
        # qp 0 is lossless: the luma decoded back is the luma of the decoded frames.
        difference = np.abs(read_luma(data).astype(int) - bt709_luma(expected[entry]).astype(int))
        assert difference.max() <= 1


async def test_decode_to_mp4_takes_the_diffusers_vae_itself_and_casts_the_latent(wan21: Any) -> None:
    z = latent(wan21, frames=2).double()  # the pipeline would cast to the VAE's dtype first
    videos = await decode_to_mp4(wan21, z, fps=8, video_codec_options=PINNED)
    assert read_mp4(videos[0]).frames.shape == (5, 64, 64, 3)


async def test_decode_to_mp4_muxes_audio_per_entry(wan21: Any) -> None:
    z = latent(wan21, batch=2, frames=3)
    wave = np.sin(np.linspace(0, 300, 16000)).astype(np.float32)
    videos = await decode_to_mp4(
        wan21, z, fps=16, audio_waveforms=[None, wave], audio_sample_rate=16000, video_codec_options=PINNED
    )
    silent, loud = read_mp4(videos[0]), read_mp4(videos[1])
    assert silent.audio_duration is None
    assert loud.audio_duration == pytest.approx(9 / 16, abs=0.07) and loud.frames.shape[0] == 9


async def test_stream_mp4_delivers_fragments_while_decoding(wan21: Any) -> None:
    z = latent(wan21, frames=13)  # 49 frames
    pieces: list[bytes] = []
    async with stream_mp4(wan21, z, fps=16, video_codec_options=PINNED) as (video,):
        async for data in video:
            pieces.append(data)
    data = b"".join(pieces)
    assert len(pieces) > 2 and b"moof" in b"".join(pieces[:-1])
    assert read_mp4(data).frames.shape == (49, 64, 64, 3)


async def test_cancelling_the_caller_stops_the_decode_at_the_next_chunk(wan21: Any) -> None:
    await decode_to_mp4(wan21, latent(wan21, frames=2), fps=16)  # warm the pools for the thread baseline
    baseline = foreign_threads()
    vae = tiny_wan21()
    steps = count_decoder_steps(vae)
    published = anyio.Event()

    def on_publish(count: int) -> None:
        if count == 2:
            anyio.from_thread.run_sync(published.set)

    recorder = RecordingDecoder(chunked_decoder(vae), on_publish=on_publish)
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: decode_to_mp4(recorder, latent(vae, frames=40), fps=16))
            await published.wait()
            scope.cancel()
    assert scope.cancelled_caught
    assert 2 <= len(recorder.published) <= 4 and steps[0] <= 5  # far from the 40 latent frames
    assert open_containers() == 0
    assert foreign_threads() <= baseline


async def test_an_encoder_failure_mid_decode_is_raised_after_the_decode_stops(wan21: Any) -> None:
    baseline = foreign_threads()
    vae = tiny_wan21()
    steps = count_decoder_steps(vae)
    with pytest.raises(ValueError, match="libx264 refuses x264-params"):
        await decode_to_mp4(vae, latent(vae, frames=40), fps=16, video_codec_options=REFUSED_AT_OPEN)
    assert steps[0] < 40
    assert open_containers() == 0
    assert foreign_threads() <= baseline


async def test_a_decoder_error_propagates_unchanged_and_aborts_the_session() -> None:
    class Broken:
        chunk_value_range = (-1.0, 1.0)

        def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
            on_chunk(torch.zeros(1, 3, 1, 16, 16))
            raise MemoryError("decoder ran out of memory")

    with pytest.raises(MemoryError, match="out of memory"):
        await decode_to_mp4(Broken(), torch.zeros(1, 4, 2, 2, 2), fps=16)
    assert open_containers() == 0


async def test_ranks_that_do_not_own_the_output_decode_and_return_nothing() -> None:
    class Peer:
        chunk_value_range = (-1.0, 1.0)
        is_output_rank = False
        decoded = 0

        def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
            self.decoded += 1

    peer = Peer()
    assert await decode_to_mp4(peer, torch.zeros(1, 4, 2, 2, 2), fps=16) == []
    assert peer.decoded == 1


@pytest.mark.parametrize(
    ("z", "error", "match"),
    [
        (torch.zeros(16, 5, 8, 8), ValueError, "5-D"),
        (torch.zeros(1, 12, 5, 8, 8), ValueError, "16"),
        (torch.zeros(1, 16, 0, 8, 8), ValueError, "empty"),
        (np.zeros((1, 16, 5, 8, 8)), TypeError, "torch.Tensor"),
    ],
)
async def test_decode_to_mp4_rejects_bad_latents_before_decoding(
    wan21: Any, z: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        await decode_to_mp4(wan21, z, fps=16)


async def test_decode_to_mp4_rejects_an_unsupported_vae_and_bad_session_options(wan21: Any) -> None:
    with pytest.raises(TypeError, match="Linear"):
        await decode_to_mp4(torch.nn.Linear(2, 2), torch.zeros(1, 16, 2, 2, 2), fps=16)
    steps = count_decoder_steps(wan21)
    before = steps[0]
    with pytest.raises(ValueError, match="fps"):
        await decode_to_mp4(wan21, latent(wan21, frames=2), fps=0)
    assert steps[0] == before  # options are checked before the decode starts


async def test_stream_mp4_reader_leaving_early_cancels_the_decode(wan21: Any) -> None:
    vae = tiny_wan21()
    steps = count_decoder_steps(vae)
    async with stream_mp4(vae, latent(vae, frames=60), fps=16, keyframe_interval=4) as (video,):
        async for _ in video:
            break  # the client went away after the first bytes
    assert steps[0] < 60
    assert open_containers() == 0


async def test_stream_mp4_raises_the_session_error_through_the_stream(wan21: Any) -> None:
    with pytest.raises(ValueError, match="libx264 refuses x264-params"):
        async with stream_mp4(
            wan21, latent(wan21, frames=3), fps=16, video_codec_options=REFUSED_AT_OPEN
        ) as (video,):
            async for _ in video:
                pass
    assert open_containers() == 0


async def test_session_push_from_a_caller_owned_decode_loop(wan22: Any) -> None:
    """The S2V pattern: the caller's own loop pushes one decoded clip per iteration."""
    decoder = chunked_decoder(wan22)
    async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16, video_codec_options=PINNED) as session:
        for step in range(3):
            clip = await anyio.to_thread.run_sync(
                lambda s=step: wan22.decode(latent(wan22, frames=2, seed=s)).sample.detach()
            )
            await session.push(clip)
        videos = await session.finish()
    assert decoder.chunk_value_range == (-1.0, 1.0)
    assert read_mp4(videos[0]).frames.shape == (15, 128, 128, 3)
    with pytest.raises(SessionClosedError):
        await session.push(clip)


class ThreadRecordingDecoder:
    """A protocol decoder with every optional part, recording the thread each part runs in."""

    chunk_value_range = (-1.0, 1.0)
    latent_channels = 4

    def __init__(self, *, is_output_rank: bool = True) -> None:
        self.is_output_rank = is_output_rank
        self.threads: dict[str, int] = {}
        self.decodes = 0

    def prepare_latents(self, z: Tensor) -> Tensor:
        self.threads["prepare_latents"] = threading.get_ident()
        return z.to(torch.float32)

    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        self.threads["decode_with_chunks"] = threading.get_ident()
        self.decodes += 1
        if self.is_output_rank:
            for _ in range(z.shape[2]):
                on_chunk(torch.zeros(z.shape[0], 3, 1, 16, 16))


async def test_the_latent_is_prepared_in_the_decode_worker_not_on_the_event_loop() -> None:
    # prepare_latents moves the latent to the decode's device: a host → device copy that waits for the
    # device, which would pause every other stream of a server if it ran on the loop.
    decoder = ThreadRecordingDecoder()
    (video,) = await decode_to_mp4(decoder, torch.zeros(1, 4, 3, 2, 2, dtype=torch.float16), fps=16)
    assert read_mp4(video).frames.shape[0] == 3
    assert threading.get_ident() not in decoder.threads.values()
    assert decoder.threads["prepare_latents"] == decoder.threads["decode_with_chunks"]
    async with stream_mp4(decoder, torch.zeros(1, 4, 2, 2, 2), fps=16) as (stream,):
        data = b"".join([piece async for piece in stream])
    assert read_mp4(data).frames.shape[0] == 2 and threading.get_ident() not in decoder.threads.values()


async def test_a_rank_without_the_output_checks_the_session_options_before_decoding() -> None:
    # Every rank refuses a bad option before its first collective: none is left waiting for peers
    # that already raised.
    decoder = ThreadRecordingDecoder(is_output_rank=False)
    z = torch.zeros(1, 4, 2, 2, 2)
    with pytest.raises(ValueError, match="fps must be a number between"):
        await decode_to_mp4(decoder, z, fps=0)
    with pytest.raises(ValueError, match="libx264 has no option 'presett'"):
        await decode_to_mp4(decoder, z, fps=16, video_codec_options={"presett": "fast"})
    assert decoder.decodes == 0
    # Output files belong to the output rank: another rank does not look at their directory.
    assert await decode_to_mp4(decoder, z, fps=16, output_files=["/no/such/dir/out.mp4"]) == []
    assert decoder.decodes == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.cuda
async def test_a_cuda_decode_runs_on_a_stream_of_its_own(wan21: Any) -> None:
    streams: list[Any] = []
    inner = chunked_decoder(wan21.to("cuda"))

    class StreamRecorder:
        chunk_value_range = inner.chunk_value_range
        latent_channels = inner.latent_channels
        prepare_latents = inner.prepare_latents

        def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
            streams.append(torch.cuda.current_stream(z.device))
            inner.decode_with_chunks(z, on_chunk=on_chunk)

    try:
        videos = await decode_to_mp4(StreamRecorder(), latent(wan21, frames=3), fps=16)
    finally:
        wan21.to("cpu")
    assert read_mp4(videos[0]).frames.shape[0] == 9
    assert streams and streams[0] != torch.cuda.default_stream(streams[0].device)
