"""The image VAE (``AutoencoderKL``) as a family, and the pipelines that decode their frames as a batch of
images, a few a ``vae.decode`` call: AnimateDiff & co. and Stable Video Diffusion.

The adapter is checked against ``vae.decode`` of each frame (and of each call's frames as one batch) on a
tiny seeded AutoencoderKL (diffusers' AnimateDiff test VAE). The pipelines are the tiny seeded builders
of :mod:`tests.pipelines.image_vae` and :mod:`tests.pipelines.stable_video_diffusion`: which frames leave
after which ``vae.decode`` call (:func:`run_frame_batches` with a recording sink), a batch of videos whose
calls straddle two videos, and ``pipeline_fps``, the pipeline's own ``fps``.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest
import torch
from torch import Tensor

import streamvae
from streamvae.models import chunked_decoder
from streamvae.models.image_vae import ImageVAEChunkedDecoder
from streamvae.pipelines import generate_mp4, stream_generation
from streamvae.pipelines._capture import ClipSink
from streamvae.pipelines._frames import run_frame_batches
from streamvae.pipelines._plans import find_plan
from tests._adapters import check_decode_chunk_size_passed_on, conforms
from tests._generate import HANG_GUARD, LOSSLESS, assert_frames
from tests._media import bt709_luma, read_luma, read_mp4
from tests.pipelines import BUILDERS
from tests.pipelines._shared import randn
from tests.pipelines.image_vae import DECODE_CHUNK, FRAMES, tiny_autoencoder_kl

pytestmark = pytest.mark.anyio


def two_videos(name: str) -> dict[str, Any]:
    """The overrides of a call of two videos (new tensors each time): AnimateDiff ignores
    ``num_videos_per_prompt`` (two prompts, then); SVD takes it."""
    if name == "animatediff":
        return {"prompt_embeds": randn(2, 16, 32, seed=1), "negative_prompt_embeds": randn(2, 16, 32, seed=2)}
    return {"num_videos_per_prompt": 2}


def latent(batch: int = 2, frames: int = 5, size: int = 4, seed: int = 0) -> Tensor:
    """A BCTHW latent of the tiny VAE (4 channels)."""
    return torch.randn(batch, 4, frames, size, size, generator=torch.Generator().manual_seed(seed))


def frame_by_frame(vae: Any, z: Tensor) -> Tensor:
    """``vae.decode(z[:, :, t])`` for every frame ``t``, as BCTHW: the image VAE's decode of a video."""
    with torch.no_grad():
        return torch.stack([vae.decode(z[:, :, t]).sample for t in range(z.shape[2])], dim=2)


def batched_calls(vae: Any, z: Tensor, size: int) -> Tensor:
    """``vae.decode`` of ``size`` frames of every entry at a time, flattened entry-major as the pipelines
    flatten them, as BCTHW."""
    batch, steps = z.shape[0], []
    with torch.no_grad():
        for start in range(0, z.shape[2], size):
            step = z[:, :, start : start + size]
            images = vae.decode(step.transpose(1, 2).flatten(0, 1)).sample
            steps.append(images.reshape(batch, step.shape[2], *images.shape[1:]).transpose(1, 2))
    return torch.cat(steps, dim=2)


# -- the adapter --


def test_each_frame_is_vae_decode_of_that_frame_and_leaves_when_decoded() -> None:
    vae = tiny_autoencoder_kl()
    z = latent()
    adapter = ImageVAEChunkedDecoder(vae)
    report = conforms(adapter, z, expected=frame_by_frame(vae, z))  # torch.equal, the batch in each call
    assert report.chunk_frames == [1] * 5 and report.decoder_calls == [1, 2, 3, 4, 5]
    assert adapter.streams and adapter.output_frames(5) == 5


@pytest.mark.parametrize(("frames", "decode_chunk_size", "sizes"), [(7, 3, [3, 3, 1]), (4, 9, [4])])
def test_decode_chunk_size_frames_a_call_equal_vae_decode_of_those_frames_as_one_batch(
    frames: int, decode_chunk_size: int, sizes: list[int]
) -> None:
    vae = tiny_autoencoder_kl()
    z = latent(frames=frames)
    adapter = ImageVAEChunkedDecoder(vae, decode_chunk_size=decode_chunk_size)
    report = conforms(adapter, z, expected=batched_calls(vae, z, decode_chunk_size))
    assert report.chunk_frames == sizes and report.decoder_calls == list(range(1, len(sizes) + 1))
    # a batched kernel rounds apart from a one-image one, by float rounding only
    output = torch.cat(report.chunks, dim=2)
    assert (output - frame_by_frame(vae, z)).abs().max() < 1e-4


def test_use_slicing_decodes_each_image_alone_and_publishes_each_frame() -> None:
    vae = tiny_autoencoder_kl()
    vae.enable_slicing()  # vae.decode then decodes each image of a call alone
    z = latent(frames=4)
    report = conforms(ImageVAEChunkedDecoder(vae, decode_chunk_size=3), z, expected=frame_by_frame(vae, z))
    assert report.chunk_frames == [1, 1, 1, 1]
    assert report.decoder_calls == [2, 4, 6, 8]  # one call an entry a frame


def test_use_tiling_tiles_each_image_as_vae_decode_does() -> None:
    vae = tiny_autoencoder_kl()
    vae.enable_tiling()
    vae.tile_sample_min_size, vae.tile_latent_min_size = 8, 4  # 8-pixel tiles of the 16-pixel frames
    z = latent(frames=3, size=8)
    expected = frame_by_frame(vae, z)
    vae_untiled = tiny_autoencoder_kl()
    assert not torch.equal(frame_by_frame(vae_untiled, z), expected)  # tiling changes the decode
    assert conforms(ImageVAEChunkedDecoder(vae, decode_chunk_size=2), z, expected=batched_calls(vae, z, 2))


def test_chunked_decoder_takes_an_autoencoder_kl() -> None:
    check_decode_chunk_size_passed_on(tiny_autoencoder_kl(), ImageVAEChunkedDecoder, 2, 4, 4)


@pytest.mark.parametrize("decode_chunk_size", [0, -1, 1.5, "2", True, None])
def test_a_bad_decode_chunk_size_is_refused_naming_it(decode_chunk_size: Any) -> None:
    with pytest.raises(ValueError, match="ImageVAEChunkedDecoder: decode_chunk_size must be an int >= 1"):
        chunked_decoder(tiny_autoencoder_kl(), decode_chunk_size=decode_chunk_size)


async def test_decode_to_mp4_writes_every_frame_of_the_image_decode() -> None:
    vae = tiny_autoencoder_kl()
    z = latent(batch=2, frames=5)
    expected = frame_by_frame(vae, z)
    videos = await streamvae.decode_to_mp4(vae, z, fps=8, video_codec_options=LOSSLESS["video_codec_options"])
    levels = streamvae.quantize_chunk(expected, (-1.0, 1.0)).numpy()
    assert len(videos) == 2
    for entry, video in enumerate(videos):
        luma = read_luma(video).astype(int)
        assert luma.shape == (5, 8, 8)  # 2× the 4 × 4 latent
        assert abs(luma - bt709_luma(levels[entry]).astype(int)).max() <= 1


# -- the pipelines: which frames leave after which vae.decode call --


class Recorder:
    """A :class:`ClipSink` that keeps what is pushed, with the VAE decoder's calls made by then."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.chunks: list[Tensor] = []
        self.calls_at_push: list[int] = []
        self.decoder_calls = 0

    def sink(self) -> ClipSink:
        return ClipSink(self.push, self.batches.append)

    def push(self, chunk: Tensor) -> None:
        self.chunks.append(chunk.clone())
        self.calls_at_push.append(self.decoder_calls)

    def frames(self) -> list[int]:
        return [chunk.shape[2] for chunk in self.chunks]


async def record(name: str, recorder: Recorder, **overrides: Any) -> np.ndarray:
    """Run builder ``name``'s pipeline through :func:`run_frame_batches` into ``recorder``, in a worker
    thread as generate_mp4 does (counting the calls of its VAE's decoder); return the pipeline's own frames
    for the same call, ``[B, F, H, W, 3]``."""
    pipe, make_kwargs = BUILDERS[name]()

    def count(module: Any, args: Any) -> None:
        recorder.decoder_calls += 1

    hook = pipe.vae.decoder.register_forward_pre_hook(count)
    try:
        plan = find_plan(pipe, make_kwargs(), owner="test")
        kwargs = make_kwargs(**overrides)
        with anyio.fail_after(HANG_GUARD):
            await anyio.to_thread.run_sync(run_frame_batches, pipe, plan, kwargs, recorder.sink(), "test")
    finally:
        hook.remove()
    return np.asarray(pipe(**make_kwargs(**overrides), output_type="np").frames)


def sent_frames(recorder: Recorder) -> np.ndarray:
    """What was pushed, as the pipeline's ``output_type="np"`` holds it: ``[B, F, H, W, 3]`` in [0, 1]."""
    video = torch.cat(recorder.chunks, dim=2).float()
    return ((video / 2 + 0.5).clamp(0, 1)).permute(0, 2, 3, 4, 1).numpy()


async def test_each_decode_call_of_animatediff_leaves_as_it_is_decoded() -> None:
    recorder = Recorder()
    expected = await record("animatediff", recorder)  # decode_chunk_size 3 of 4 frames: calls of 3, then 1
    assert recorder.batches == [1]
    assert recorder.frames() == [DECODE_CHUNK, FRAMES - DECODE_CHUNK]
    assert recorder.calls_at_push == [1, 2]  # the first call's frames before the second call
    np.testing.assert_allclose(sent_frames(recorder), expected, atol=1e-6)


async def test_a_pipeline_that_decodes_every_frame_in_one_call_sends_them_after_it() -> None:
    recorder = Recorder()
    expected = await record("text_to_video_sd", recorder)
    assert recorder.frames() == [FRAMES] and recorder.calls_at_push == [1]
    np.testing.assert_allclose(sent_frames(recorder), expected, atol=1e-6)


async def test_with_vae_slicing_a_one_call_decode_sends_each_frame_as_it_is_decoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vae.decode decodes each image of a call alone under ``use_slicing``: so does streamvae, and each
    frame leaves once decoded, the frames still the pipeline's own."""
    pipe, _ = BUILDERS["text_to_video_sd"]()
    monkeypatch.setattr(pipe.vae, "use_slicing", True)
    recorder = Recorder()
    expected = await record("text_to_video_sd", recorder)
    assert recorder.frames() == [1] * FRAMES and recorder.calls_at_push == [1, 2, 3, 4]
    np.testing.assert_allclose(sent_frames(recorder), expected, atol=1e-6)


async def test_a_batch_of_videos_leaves_as_every_video_has_its_frames() -> None:
    """Two videos of 4 frames flattened into 8 images, 3 a call: [v0 0-2], [v0 3, v1 0-1], [v1 2-3]."""
    recorder = Recorder()
    expected = await record("animatediff", recorder, **two_videos("animatediff"))
    assert recorder.batches == [2]
    assert recorder.frames() == [2, 2] and recorder.calls_at_push == [2, 3]
    np.testing.assert_allclose(sent_frames(recorder), expected, atol=1e-6)


async def test_stable_video_diffusion_sends_each_calls_frames_once_it_returns() -> None:
    recorder = Recorder()
    expected = await record("stable_video_diffusion", recorder, decode_chunk_size=2)
    assert recorder.frames() == [1, 1, 1, 1]  # each call's frames handed on one at a time
    assert recorder.calls_at_push == [1, 1, 2, 2]
    np.testing.assert_allclose(sent_frames(recorder), expected, atol=1e-6)


def assert_videos(videos: list[bytes], frames: np.ndarray) -> None:
    """Each MP4's luma is that of its reference video (``[F, H, W, 3]`` in [0, 1]) within a level."""
    assert len(videos) == frames.shape[0]
    for video, expected in zip(videos, frames, strict=True):
        assert_frames(video, expected)


@pytest.mark.parametrize("name", ["animatediff", "stable_video_diffusion"])
async def test_a_batch_whose_calls_straddle_two_videos_is_the_pipelines_every_frame(name: str) -> None:
    """Two videos of 4 frames, 3 images a call: SVD's temporal decoder decodes the second call's frames
    (the first video's last, the second's first two) as one clip, as the pipeline does."""
    pipe, make_kwargs = BUILDERS[name]()
    overrides = {**two_videos(name), "decode_chunk_size": 3}
    expected = np.asarray(pipe(**make_kwargs(**overrides), output_type="np").frames)
    with anyio.fail_after(HANG_GUARD):
        videos = await generate_mp4(pipe, fps=8, session_options=LOSSLESS, **make_kwargs(**overrides))
    assert_videos(videos, expected)


async def test_stream_generation_streams_an_image_vae_pipeline() -> None:
    pipe, make_kwargs = BUILDERS["animatediff"]()
    expected = np.asarray(pipe(**make_kwargs(), output_type="np").frames)
    parts: list[bytes] = []
    with anyio.fail_after(HANG_GUARD):
        async with stream_generation(pipe, fps=8, session_options=LOSSLESS, **make_kwargs()) as streams:
            assert len(streams) == 1
            async for _, data in streamvae.read_entries(streams):
                parts.append(data)
    assert len(parts) > 1
    assert_videos([b"".join(parts)], expected)
    assert "decode_latents" not in vars(pipe) and "decode" not in vars(pipe.vae)  # nothing outlives the call


async def test_two_calls_on_one_pipeline_at_once_each_get_their_own_frames() -> None:
    """The second call watches decode_latents while the first holds the pipeline's turn."""
    pipe, make_kwargs = BUILDERS["animatediff"]()
    expected = {
        name: np.asarray(pipe(**make_kwargs(**overrides), output_type="np").frames)
        for name, overrides in (("one", {}), ("two", two_videos("animatediff")))
    }
    videos: dict[str, list[bytes]] = {}

    async def run(name: str, overrides: dict[str, Any]) -> None:
        kwargs = make_kwargs(**overrides)
        videos[name] = await generate_mp4(pipe, fps=8, session_options=LOSSLESS, **kwargs)

    with anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as group:
            group.start_soon(run, "one", {})
            group.start_soon(run, "two", two_videos("animatediff"))
    for name, frames in expected.items():
        assert_videos(videos[name], frames)
    assert "decode_latents" not in vars(pipe) and "decode" not in vars(pipe.vae)


async def test_leaving_the_block_early_stops_the_pipeline_and_leaves_it_as_it_was() -> None:
    pipe, make_kwargs = BUILDERS["animatediff"]()
    with anyio.fail_after(HANG_GUARD):
        async with stream_generation(pipe, fps=8, **make_kwargs()) as streams:
            first = await streams[0].__anext__()  # the first call's bytes; the block is left before the end
    assert first
    assert "decode_latents" not in vars(pipe) and "decode" not in vars(pipe.vae)
    frames = np.asarray(pipe(**make_kwargs(), output_type="np").frames)  # the pipeline runs as before
    with anyio.fail_after(HANG_GUARD):
        assert_videos(await generate_mp4(pipe, fps=8, session_options=LOSSLESS, **make_kwargs()), frames)


# -- pipeline_fps: the pipeline's own fps --


async def test_pipeline_fps_is_the_fps_the_pipeline_sees(monkeypatch: pytest.MonkeyPatch) -> None:
    pipe, make_kwargs = BUILDERS["stable_video_diffusion"]()
    seen: list[int] = []
    original = pipe._get_add_time_ids

    def spy(fps: int, *args: Any, **kwargs: Any) -> Any:
        seen.append(fps)  # SVD conditions on fps - 1
        return original(fps, *args, **kwargs)

    monkeypatch.setattr(pipe, "_get_add_time_ids", spy)
    expected = np.asarray(pipe(**make_kwargs(fps=12), output_type="np").frames)
    with anyio.fail_after(HANG_GUARD):
        videos = await generate_mp4(pipe, fps=8, pipeline_fps=12, session_options=LOSSLESS, **make_kwargs())
        default = await generate_mp4(pipe, fps=8, session_options=LOSSLESS, **make_kwargs())
    assert seen == [11, 11, 6]  # the reference, pipeline_fps=12, then the pipeline's own default (7)
    assert_videos(videos, expected)
    assert read_mp4(videos[0]).fps == 8 and read_mp4(default[0]).fps == 8  # the video's rate is fps=


async def test_pipeline_fps_is_refused_by_a_pipeline_without_fps() -> None:
    pipe, make_kwargs = BUILDERS["animatediff"]()
    with pytest.raises(
        TypeError, match="generate_mp4: pipeline_fps is the pipeline's own fps argument, and "
    ):
        await generate_mp4(pipe, fps=8, pipeline_fps=8, **make_kwargs())


@pytest.mark.parametrize("pipeline_fps", [0, -7, float("nan"), float("inf"), "7", True])
async def test_a_bad_pipeline_fps_is_refused_naming_it(pipeline_fps: Any) -> None:
    pipe, make_kwargs = BUILDERS["stable_video_diffusion"]()
    with pytest.raises(ValueError, match="stream_generation: pipeline_fps must be a positive number"):
        stream_generation(pipe, fps=8, pipeline_fps=pipeline_fps, **make_kwargs())
