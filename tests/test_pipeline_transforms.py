"""The pipelines that change their decoded video after ``vae.decode`` (``_transforms``): what each
sends and when, checked against the pipeline's own code, and the branches the automatic test of
tests/test_generate_every.py does not reach (a letterboxed Wan-Animate 2 image, a plan that does not match
its pipeline, the frames a blending pipeline holds back)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import PIL.Image
import pytest
import torch
from diffusers import HunyuanVideoFramepackPipeline
from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video_framepack import FramepackSamplingType

from streamvae import read_entries
from streamvae.models import as_decoder
from streamvae.models.wan import WanChunkedDecoder
from streamvae.pipelines import generate_mp4, stream_generation
from streamvae.pipelines._capture import ClipSink
from streamvae.pipelines._plans import Joined, PipelinePlan, plans
from streamvae.pipelines._transforms import BlendKeeper, Framed
from tests._generate import (
    HANG_GUARD,
    LOSSLESS,
    FirstBytesBeforeTheLastStep,
    assert_frames,
    reference,
    steps_per_clip,
)
from tests._vaes import tiny_qwen_image, tiny_wan21, tiny_wan22
from tests.pipelines import BUILDERS

pytestmark = pytest.mark.anyio


# -- Wan-Animate 2: the letterbox crop --


def _wide_image() -> PIL.Image.Image:
    """A seeded 32 × 48 (height × width) noise image: at a 24 × 24 area the blocks resolve a 16 × 16 frame,
    letterbox the image into it and crop its 10 × 16 region back out of every decoded frame."""
    pixels = np.random.default_rng(5).integers(0, 256, (32, 48, 3), dtype=np.uint8)
    return PIL.Image.fromarray(pixels)


async def test_wan_animate2_crops_each_segment_as_its_decode_step_crops_the_letterboxed_video() -> None:
    pipe, make_kwargs = BUILDERS["wan_animate2_modular"]()

    def kwargs() -> dict[str, Any]:
        return make_kwargs(image=_wide_image(), height=24, width=24)

    frames, _ = reference(pipe, kwargs())
    assert frames.shape == (1, 17, 10, 16, 3)  # letterboxed: the 16 × 16 frames cropped to 10 × 16
    with anyio.fail_after(HANG_GUARD):
        (video,) = await generate_mp4(pipe, fps=8, session_options=LOSSLESS, **kwargs())
    assert_frames(video, frames[0])


# -- pipelines that decode more than once after their loop --


def test_motif_with_a_small_vae_batch_size_decodes_each_group_of_videos_in_its_own_call() -> None:
    pipe, make_kwargs = BUILDERS["motif_video_batches"]()
    batches: list[int] = []
    original = pipe.vae.decode

    def decode(latents: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        batches.append(latents.shape[0])
        return original(latents, *args, **kwargs)

    pipe.vae.decode = decode
    try:
        frames = pipe(**make_kwargs(), output_type="np").frames
    finally:
        del pipe.vae.decode
    assert batches == [1, 1] and np.asarray(frames).shape[0] == 2  # the branch the builder is for


async def test_a_joined_plan_that_does_not_match_its_pipeline_fails_before_a_byte_is_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipe, make_kwargs = BUILDERS["chronoedit_temporal_reasoning"]()
    keeps_the_edits_first_frame = Joined(order=lambda latents, *_: [(latents[1], 0), (latents[0], 0)])
    plan = PipelinePlan("ChronoEditPipeline", joined=keeps_the_edits_first_frame)
    monkeypatch.setitem(plans(), "ChronoEditPipeline", plan)
    received: list[bytes] = []
    with (
        anyio.fail_after(HANG_GUARD),
        pytest.raises(RuntimeError, match="returned 9 placeholder frames where its plan makes 10"),
    ):
        async with stream_generation(pipe, fps=8, **make_kwargs()) as streams:
            async for _, data in read_entries(streams):
                received.append(data)
    assert received == []


@pytest.mark.parametrize("make_vae", [tiny_wan21, tiny_wan22, tiny_qwen_image])
def test_the_wan_adapter_knows_the_frames_of_its_decode(make_vae: Callable[[], Any]) -> None:
    # the count run_joined's placeholders and its end check use (1 + 4(T − 1))
    vae = make_vae()
    adapter = as_decoder(vae)
    for latent_frames in (1, 2, 3):
        z = torch.randn(1, vae.config.z_dim, latent_frames, 4, 4, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            frames = vae.decode(z).sample.shape[2]
        assert adapter.output_frames(latent_frames) == frames == 1 + 4 * (latent_frames - 1)


async def test_a_joined_wan_decode_that_sends_other_frames_than_its_plan_counts_fails_at_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A count one frame off for every decode: the pipeline's placeholders agree with the plan, and only the
    # frames streamvae sent tell them apart (the end check, which runs for a Wan VAE).
    pipe, make_kwargs = BUILDERS["chronoedit_temporal_reasoning"]()
    monkeypatch.setattr(WanChunkedDecoder, "output_frames", lambda self, latent_frames: 4 * latent_frames)
    with (
        anyio.fail_after(HANG_GUARD),
        pytest.raises(RuntimeError, match="returned 15 frames, but streamvae sent 9"),
    ):
        await generate_mp4(pipe, fps=8, **make_kwargs())


# -- decode-once pipelines that drop frames or put frames in front --


class _Chunks:
    """A decoder that publishes the given chunks (the part of a ChunkedDecoder that Framed uses)."""

    chunk_value_range = (-1.0, 1.0)
    latent_channels = 4

    def __init__(self, chunks: list[torch.Tensor]) -> None:
        self.chunks = chunks

    def prepare_latents(self, z: torch.Tensor) -> torch.Tensor:
        return z

    def decode_with_chunks(self, z: torch.Tensor, *, on_chunk: Callable[[torch.Tensor], None]) -> None:
        for chunk in self.chunks:
            on_chunk(chunk)


def _clip(frames: int, seed: int) -> torch.Tensor:
    return torch.rand(1, 3, frames, 4, 4, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def test_framed_sends_the_lead_first_and_leaves_out_the_dropped_frames_across_chunks() -> None:
    chunks = [_clip(3, 1), _clip(3, 2), _clip(3, 3)]
    lead = _clip(2, 4)
    sent: list[torch.Tensor] = []
    framed = Framed(_Chunks(chunks), drop=4, lead=lambda: lead, owner="test")  # type: ignore[arg-type]
    framed.decode_with_chunks(torch.zeros(1, 4, 3, 1, 1), on_chunk=sent.append)
    assert [chunk.shape[2] for chunk in sent] == [2, 2, 3]
    assert torch.equal(torch.cat(sent, dim=2), torch.cat([lead, torch.cat(chunks, dim=2)[:, :, 4:]], dim=2))


def test_framed_refuses_a_decode_with_no_frame_past_the_dropped_ones() -> None:
    framed = Framed(_Chunks([_clip(4, 1)]), drop=4, lead=None, owner="test")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="drops the first 4 frames of its decode, which gave 4"):
        framed.decode_with_chunks(torch.zeros(1, 4, 2, 1, 1), on_chunk=lambda chunk: None)


async def test_stream_generation_streams_each_transformed_pipeline_exactly() -> None:
    for name in (
        "hunyuan_video_i2v",
        "skyreels_v2_df_v2v",
        "motif_video_batches",
        "chronoedit_temporal_reasoning",
        "framepack",
        "framepack_vanilla",
    ):
        pipe, make_kwargs = BUILDERS[name]()
        frames, _ = reference(pipe, make_kwargs())
        parts: dict[int, list[bytes]] = {entry: [] for entry in range(frames.shape[0])}
        with anyio.fail_after(HANG_GUARD):
            async with stream_generation(pipe, fps=8, session_options=LOSSLESS, **make_kwargs()) as streams:
                async for entry, data in read_entries(streams):
                    parts[entry].append(data)
        assert len(streams) == frames.shape[0], name
        for entry, pieces in parts.items():
            assert len(pieces) > 1, name  # fragmented: bytes left in pieces
            assert_frames(b"".join(pieces), frames[entry])


# -- FramePack: what is held back until it is blended --


class _FakeFramepack:
    """What the FramePack plan reads of its pipeline: the signature's defaults, the temporal ratio, and the
    pipeline's own ``_soft_append``."""

    vae_scale_factor_temporal = 4
    _soft_append = HunyuanVideoFramepackPipeline._soft_append

    def __call__(
        self,
        latent_window_size: int = 3,
        sampling_type: FramepackSamplingType = FramepackSamplingType.INVERTED_ANTI_DRIFTING,
    ) -> None: ...


class _Sent:
    def __init__(self) -> None:
        self.frames: list[torch.Tensor] = []

    def sink(self) -> ClipSink:
        return ClipSink(self.frames.append, lambda batch: None)

    @property
    def count(self) -> int:
        return sum(chunk.shape[2] for chunk in self.frames)


def _as_output(video: torch.Tensor) -> torch.Tensor:
    """The ``[B, F, C, H, W]`` output ``output_type="pt"`` gives for a decoded BCTHW video."""
    return (video / 2 + 0.5).clamp(0, 1).permute(0, 2, 1, 3, 4)


def _keeper(sampling: FramepackSamplingType, sent: _Sent) -> tuple[BlendKeeper, _FakeFramepack]:
    plan = plans()["HunyuanVideoFramepackPipeline"]
    assert plan.blended is not None
    pipe = _FakeFramepack()
    return BlendKeeper(plan.blended, {"sampling_type": sampling}, pipe, sent.sink(), "test"), pipe


def _section(keeper: BlendKeeper, section: torch.Tensor) -> None:
    keeper.start_section(1, (-1.0, 1.0))
    for piece in section.split(4, dim=2):
        keeper.take(piece)
    keeper.end_section()


async def test_framepack_vanilla_streams_its_first_section_while_the_pipeline_generates_the_next() -> None:
    pipe, make_kwargs = BUILDERS["framepack_vanilla"]()
    frames, _ = reference(pipe, make_kwargs())
    gate = FirstBytesBeforeTheLastStep(steps_per_clip(pipe, make_kwargs()))
    parts: list[bytes] = []
    with anyio.fail_after(HANG_GUARD):
        kwargs = {**make_kwargs(), "callback_on_step_end": gate}
        async with stream_generation(pipe, fps=8, session_options=LOSSLESS, **kwargs) as streams:
            async for _, data in read_entries(streams):
                parts.append(data)
                gate.first_bytes.set()
    assert gate.waited_at is not None  # the second section's steps ran after the first bytes left
    assert_frames(b"".join(parts), frames[0])


def test_framepack_vanilla_sends_all_but_the_overlap_as_each_section_is_decoded() -> None:
    sent = _Sent()
    keeper, pipe = _keeper(FramepackSamplingType.VANILLA, sent)
    sections = [_clip(13, 1), _clip(21, 2), _clip(21, 3)]  # latent window 3: an overlap of 9 frames
    expected = sections[0]
    _section(keeper, sections[0])
    assert sent.count == 13 - 9  # the first section's last 9 frames wait for the next one
    for count, section in zip((25 - 9, 37 - 9), sections[1:], strict=True):
        expected = pipe._soft_append(expected, section, 9)
        _section(keeper, section)
        assert sent.count == count
    keeper.finish(_as_output(expected[:, :, :37]), "HunyuanVideoFramepackPipeline")
    assert torch.equal(torch.cat(sent.frames, dim=2), expected[:, :, :37])


def test_framepack_inverted_sends_nothing_before_its_last_section_the_first_frames_of_its_video() -> None:
    sent = _Sent()
    keeper, pipe = _keeper(FramepackSamplingType.INVERTED_ANTI_DRIFTING, sent)
    sections = [_clip(9, 1), _clip(21, 2), _clip(25, 3)]
    expected = sections[0]
    for section in sections:
        _section(keeper, section)
        expected = section if section is sections[0] else pipe._soft_append(section, expected, 9)
        assert sent.count == 0  # a later section goes in front: no frame is in its place yet
    keeper.finish(_as_output(expected), "HunyuanVideoFramepackPipeline")
    assert torch.equal(torch.cat(sent.frames, dim=2), expected)


def test_a_blend_that_is_not_the_pipelines_is_an_error_not_a_video() -> None:
    sent = _Sent()
    keeper, _ = _keeper(FramepackSamplingType.VANILLA, sent)
    first, second = _clip(13, 1), _clip(21, 2)
    _section(keeper, first)
    _section(keeper, second)
    appended = torch.cat([first, second[:, :, 9:]], dim=2)  # no blend: not what the keeper sent
    with pytest.raises(RuntimeError, match="frame 5 is not the frame streamvae sent"):
        keeper.finish(_as_output(appended), "HunyuanVideoFramepackPipeline")
