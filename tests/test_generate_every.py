"""generate_mp4 / stream_generation on the newer diffusers pipelines, each a tiny seeded real pipeline: every
frame and the sound of ``pipe()``, clip-by-clip pipelines streamed as they generate, modular pipelines,
pipelines without ``callback_on_step_end``, a stand-in no other thread sees, and a door that refuses
instead of truncating."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pytest
import torch

from streamvae import read_entries
from streamvae.pipelines import generate_mp4, stream_generation
from streamvae.pipelines._capture import ClipKeeper, ClipSink
from streamvae.pipelines._plans import Clips, PipelinePlan, find_plan, plans
from tests._generate import (
    HANG_GUARD,
    LOSSLESS,
    FirstBytesBeforeTheLastStep,
    assert_frames,
    assert_sound,
    cancelled_when,
    reference,
    reference_of,
    steps_per_clip,
    streamed_parts,
)
from tests._media import read_mp4
from tests.pipelines import BUILDERS, CORE

pytestmark = pytest.mark.anyio

NEW = {name: builder for name, builder in BUILDERS.items() if name not in CORE}  # CORE: test_generate.py
#: builders of pipelines streamvae refuses (test_a_refused_pipeline_... says why)
REFUSED = {
    "easyanimate_control": "diffusers 0.42.1 cannot run it",
    "ltx2_hdr": "linear HDR light",
}


@pytest.mark.parametrize("name", sorted(set(NEW) - set(REFUSED)))
async def test_every_frame_and_the_sound_of_the_pipeline_in_one_call(name: str) -> None:
    pipe, make_kwargs = NEW[name]()
    frames, output = reference_of(name)
    with anyio.fail_after(HANG_GUARD):
        videos = await generate_mp4(pipe, fps=8, session_options=LOSSLESS, **make_kwargs())
    assert len(videos) == frames.shape[0]
    plan = find_plan(pipe, make_kwargs(), owner="test")
    for entry, (video, expected) in enumerate(zip(videos, frames, strict=True)):
        assert_frames(video, expected)
        decoded = read_mp4(video)
        if plan.sound is None:
            assert decoded.audio_channels is None
            continue
        waveforms, _ = plan.sound.read(output, pipe)
        assert_sound(video, torch.as_tensor(waveforms[entry]).float().numpy())


#: builders of pipelines that decode clip by clip (checked against their plans below)
CLIPS = [
    "helios",
    "helios_pyramid",
    "wan_animate",
    "helios_modular",
    "helios_pyramid_modular",
    "helios_pyramid_distilled_modular",
    "wan_animate2_distilled_modular",
    "wan_animate2_modular",
    "cosmos2_5_transfer",
]
#: of those, the ones that decode while they denoise, and take a callback_on_step_end to show it
STREAMED_WHILE_DENOISING = ["helios", "helios_pyramid", "wan_animate", "cosmos2_5_transfer"]


def test_the_clip_builders_are_those_whose_pipeline_decodes_clip_by_clip() -> None:
    for name in sorted(set(NEW) - set(REFUSED)):
        pipe, make_kwargs = NEW[name]()
        assert (find_plan(pipe, make_kwargs(), owner="test").clips is not None) == (name in CLIPS), name


@pytest.mark.parametrize("name", STREAMED_WHILE_DENOISING)
async def test_stream_generation_sends_a_clip_while_the_pipeline_generates_the_next(name: str) -> None:
    pipe, make_kwargs = NEW[name]()
    frames, _ = reference_of(name)
    steps = steps_per_clip(pipe, make_kwargs())
    gate = FirstBytesBeforeTheLastStep(steps)
    parts = await streamed_parts(
        pipe, {**make_kwargs(), "callback_on_step_end": gate}, on_part=gate.first_bytes.set
    )
    assert gate.waited_at is not None  # a later clip's steps ran after the first bytes left
    assert gate.calls > steps  # and the user's callback ran at every step
    assert_frames(b"".join(parts), frames[0])


@pytest.mark.parametrize("name", ["ltx2", "minimax_h3_modular", "allegro"])
async def test_stream_generation_of_a_pipeline_that_decodes_once_streams_its_frames_and_sound(
    name: str,
) -> None:
    pipe, make_kwargs = NEW[name]()
    frames, output = reference_of(name)
    parts = await streamed_parts(pipe, make_kwargs())
    video = b"".join(parts)
    assert len(parts) > 1  # fragmented: bytes left in pieces
    assert_frames(video, frames[0])
    plan = find_plan(pipe, make_kwargs(), owner="test")
    if plan.sound is not None:
        waveforms, _ = plan.sound.read(output, pipe)
        assert_sound(video, torch.as_tensor(waveforms[0]).float().numpy())


# -- what is held back, and the check at the end --


class FakeHelios:
    vae_scale_factor_temporal = 4


class Sent:
    def __init__(self) -> None:
        self.frames: list[torch.Tensor] = []
        self.batches: list[int] = []

    def sink(self) -> ClipSink:
        return ClipSink(self.frames.append, self.batches.append)

    @property
    def count(self) -> int:
        return sum(chunk.shape[2] for chunk in self.frames)


def clip(frames: int, seed: int) -> torch.Tensor:
    return torch.rand(1, 3, frames, 4, 4, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def as_output(chunks: list[torch.Tensor]) -> torch.Tensor:
    """The ``[B, F, C, H, W]`` output ``output_type="pt"`` gives for these decoded chunks."""
    return (torch.cat(chunks, dim=2) / 2 + 0.5).clamp(0, 1).permute(0, 2, 1, 3, 4)


def test_a_clip_is_sent_as_decoded_and_only_what_the_final_trim_may_cut_waits() -> None:
    sent = Sent()
    keeper = ClipKeeper(plans()["HeliosPipeline"], {}, FakeHelios(), sent.sink(), "test")
    first, second = clip(33, 1), clip(33, 2)
    keeper.start_clip(1, (-1.0, 1.0))
    for piece in first.split(8, dim=2):
        keeper.take(piece)
    keeper.end_clip()
    assert sent.batches == [1] and sent.count == 33  # nothing of the first clip waits
    keeper.start_clip(1, (-1.0, 1.0))
    keeper.take(second)
    keeper.end_clip()
    assert sent.count == 65  # 66 decoded; (66 - 1) // 4 * 4 + 1 = 65 are final
    keeper.finish(as_output([first, second])[:, :65])
    assert sent.count == 65
    assert torch.equal(torch.cat(sent.frames, dim=2), torch.cat([first, second], dim=2)[:, :, :65])


def test_a_pipeline_that_kept_other_frames_than_those_sent_is_an_error_not_a_video() -> None:
    sent = Sent()
    keeper = ClipKeeper(plans()["HeliosPipeline"], {}, FakeHelios(), sent.sink(), "test")
    first = clip(33, 1)
    keeper.start_clip(1, (-1.0, 1.0))
    keeper.take(first)
    keeper.end_clip()
    changed = first.clone()
    changed[:, :, 20] = -changed[:, :, 20]
    with pytest.raises(RuntimeError, match="frame 20 is not the frame streamvae sent"):
        keeper.finish(as_output([changed]))
    with pytest.raises(RuntimeError, match="returned 30 frames, but streamvae had sent 33"):
        keeper.finish(as_output([first])[:, :30])


def test_wan_animate_drops_the_conditioning_frames_of_later_segments_and_cuts_to_the_pose_video() -> None:
    sent = Sent()
    kwargs = {"pose_video": [None] * 20, "prev_segment_conditioning_frames": 5}
    plan = plans()["WanAnimatePipeline"]

    class FakeAnimate:
        def __call__(self, prev_segment_conditioning_frames: int = 1) -> None: ...

    keeper = ClipKeeper(plan, kwargs, FakeAnimate(), sent.sink(), "test")
    segments = [clip(13, 1), clip(13, 2)]
    for segment in segments:
        keeper.start_clip(1, (-1.0, 1.0))
        keeper.take(segment)
        keeper.end_clip()
    kept = torch.cat([segments[0], segments[1][:, :, 5:]], dim=2)[:, :, :20]
    assert sent.count == 20
    keeper.finish(as_output([kept]))
    assert torch.equal(torch.cat(sent.frames, dim=2), kept)


def _control_videos() -> list[Any]:
    """Every form of ``controls`` Cosmos 2.5 Transfer's ``video_processor.preprocess_video`` reads."""
    import PIL.Image

    pixels = np.random.default_rng(5).integers(0, 256, (2, 7, 8, 8, 3), dtype=np.uint8)
    frames = [PIL.Image.fromarray(frame) for frame in pixels[0]]
    tensor = torch.from_numpy(pixels).permute(0, 1, 4, 2, 3).float() / 255
    # one video as frames, as an array or a tensor; a batch as a list, an array or a tensor; one image
    return [frames, pixels[0], tensor[0], [frames, frames], [tensor[0], tensor[1]], pixels, tensor, frames[0]]


@pytest.mark.parametrize("controls", _control_videos())
def test_cosmos_transfer_cuts_its_chunks_to_as_many_frames_as_the_pipeline_reads_off_its_controls(
    controls: Any,
) -> None:
    """The frames the plan counts are those of the pipeline's preprocessed controls."""
    pipe, _ = NEW["cosmos2_5_transfer"]()
    frames = int(pipe.video_processor.preprocess_video(controls, 8, 8).shape[2])
    clips = plans()["Cosmos2_5_TransferPipeline"].clips
    assert clips is not None
    final_length = clips.final_length
    assert final_length(100, {"controls": controls}, pipe) == frames
    assert final_length(100, {"controls": controls, "num_frames": 3}, pipe) == min(frames, 3)
    assert final_length(2, {"controls": controls}, pipe) == min(frames, 2)


async def test_cosmos_transfer_with_a_longer_overlap_and_a_shorter_video_is_still_every_frame() -> None:
    """2 latent frames of overlap (5 frames: chunks 0–8 and 4–12) and a cut to 11."""
    pipe, make_kwargs = NEW["cosmos2_5_transfer"]()
    options = {"num_ar_conditional_frames": None, "num_ar_latent_conditional_frames": 2, "num_frames": 11}
    frames, _ = reference(pipe, make_kwargs(**options))
    assert frames.shape[1] == 11
    with anyio.fail_after(HANG_GUARD):
        (video,) = await generate_mp4(pipe, fps=8, session_options=LOSSLESS, **make_kwargs(**options))
    assert_frames(video, frames[0])


async def test_a_plan_that_does_not_match_the_pipeline_fails_the_call_and_its_readers_loudly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipe, make_kwargs = NEW["helios"]()
    keeps_all = Clips(drop_front=lambda *_: 0, final_length=lambda kept, *_: kept)  # wrong: Helios trims
    monkeypatch.setitem(plans(), "HeliosPipeline", PipelinePlan("HeliosPipeline", clips=keeps_all))
    with anyio.fail_after(HANG_GUARD), pytest.raises(RuntimeError, match="returned 65 frames, but streamvae"):
        await generate_mp4(pipe, fps=8, **make_kwargs())
    received: list[bytes] = []
    with anyio.fail_after(HANG_GUARD), pytest.raises(RuntimeError, match="returned 65 frames"):
        async with stream_generation(pipe, fps=8, **make_kwargs()) as streams:
            async for _, data in read_entries(streams):
                received.append(data)
    assert received  # the first clip left as it was decoded; the stream then failed instead of ending


# -- sound --


async def test_your_own_audio_replaces_the_pipelines_sound() -> None:
    pipe, make_kwargs = NEW["ltx2"]()
    own = np.sin(np.arange(8000, dtype=np.float32) / 5)[None] / 2  # 0.5 s at 16 kHz, the video 1.1 s
    options = {**LOSSLESS, "audio_waveforms": [own], "audio_sample_rate": 16000}
    with anyio.fail_after(HANG_GUARD):
        (video,) = await generate_mp4(pipe, fps=8, session_options=options, **make_kwargs())
    assert_sound(video, own)


# -- no reach beyond the call --


async def test_another_thread_decoding_with_the_same_vae_meanwhile_gets_its_ordinary_decode() -> None:
    pipe, make_kwargs = NEW["helios"]()
    z = torch.randn(1, 16, 3, 2, 2, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = pipe.vae.decode(z).sample
    seen: list[Any] = []

    def other_thread() -> None:
        with torch.no_grad():
            seen.append(pipe.vae.decode(z).sample)

    def at_step(pipe_: Any, step: int, timestep: Any, callback_kwargs: dict[str, Any]) -> dict[str, Any]:
        if step == 0 and not seen:
            worker = threading.Thread(target=other_thread)
            worker.start()
            worker.join(timeout=HANG_GUARD)
        return {}

    with anyio.fail_after(HANG_GUARD):
        (video,) = await generate_mp4(pipe, fps=8, callback_on_step_end=at_step, **make_kwargs())
    assert len(seen) == 1 and torch.equal(seen[0], expected)
    assert "decode" not in vars(pipe.vae)
    assert read_mp4(video).frames.shape[0] == reference_of("helios")[0].shape[1]


# -- cancellation without callback_on_step_end --


async def test_a_pipeline_without_a_step_callback_is_stopped_at_its_next_model_forward() -> None:
    pipe, make_kwargs = NEW["hunyuan_video15"]()
    assert "callback_on_step_end" not in __import__("inspect").signature(pipe).parameters
    forwards: list[int] = []
    first = anyio.Event()

    def on_forward(module: Any, args: Any) -> None:
        forwards.append(1)
        if len(forwards) == 1:
            anyio.from_thread.run_sync(first.set)

    hook = pipe.transformer.register_forward_pre_hook(on_forward)
    scope = await cancelled_when(pipe, {**make_kwargs(), "num_inference_steps": 30}, first, [hook])
    assert scope.cancelled_caught
    assert len(forwards) <= 3  # not the 30 steps' forwards: stopped before the next one
    assert "decode" not in vars(pipe.vae)


# -- the door --


async def test_a_pipeline_streamvae_has_not_checked_is_refused_before_any_step() -> None:
    pipe, make_kwargs = NEW["helios"]()

    class Overridden(type(pipe)):  # type: ignore[misc]
        def __call__(self, **kwargs: Any) -> Any:
            raise AssertionError("must not run")

    overridden = object.__new__(Overridden)
    overridden.__dict__.update(pipe.__dict__)
    with pytest.raises(TypeError, match="overrides HeliosPipeline.__call__"):
        await generate_mp4(overridden, fps=8, **make_kwargs())


@pytest.mark.parametrize("name", sorted(REFUSED))
async def test_a_refused_pipeline_is_a_type_error_naming_why_before_any_step(name: str) -> None:
    pipe, make_kwargs = NEW[name]()
    forwards: list[int] = []
    denoiser = getattr(pipe, "transformer", None) or pipe.unet
    hook = denoiser.register_forward_pre_hook(lambda module, args: forwards.append(1))
    try:
        with pytest.raises(TypeError, match=REFUSED[name]):
            await generate_mp4(pipe, fps=8, **make_kwargs())
    finally:
        hook.remove()
    assert forwards == []


#: calls of checked pipelines with an option their plan refuses (builder, the kwargs changed, why): LTX-Video
#: long multi-prompt's tiled decode (4 × 4 tiles by default), Sana-Video's resolution binning at a size the
#: transformer was not trained at (the tiny ones' ``sample_size`` 8 has no bins: 30 is the 480p model's)
UNCHECKED_CALLS = [
    ("ltx_long_multi_prompt", {}, "refused for this call: with decode_horizontal_tiles=4 and decode_"),
    ("ltx_long_multi_prompt", {"decode_vertical_tiles": 2}, "decode_vertical_tiles=2 "),
    ("sana_video", {"use_resolution_binning": True}, "a 32×32 video is generated at 624×624, the trained"),
    ("sana_video_i2v", {"use_resolution_binning": True}, "resized back after vae.decode"),
    # Cosmos 2.5 Predict's frame repeats, Cosmos 3's sound and transfer workflow
    ("cosmos2_5_predict", {"num_frames": 10}, "num_frames=10 is not 4·k"),
    ("cosmos3", {"enable_sound": True}, "enable_sound=True: streamvae does not mux"),
    ("cosmos3_modular", {"control_videos": {}}, "control_videos"),
]


@pytest.mark.parametrize(("name", "changed", "why"), UNCHECKED_CALLS)
async def test_a_call_with_an_option_the_plan_refuses_is_a_value_error_before_any_step(
    name: str, changed: dict[str, Any], why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipe, make_kwargs = NEW[name]()
    if "use_resolution_binning" in changed:
        config = {**pipe.transformer.config, "sample_size": 30}
        monkeypatch.setattr(pipe.transformer, "_internal_dict", type(pipe.transformer.config)(config))
    tiles = ("decode_horizontal_tiles", "decode_vertical_tiles")  # left out: the pipeline's defaults, 4 × 4
    kwargs = {key: value for key, value in make_kwargs().items() if key not in tiles} | changed
    forwards: list[int] = []
    hook = pipe.transformer.register_forward_pre_hook(lambda module, args: forwards.append(1))
    try:
        with pytest.raises(ValueError, match=why):
            await generate_mp4(pipe, fps=8, **kwargs)
        with pytest.raises(ValueError, match=why):
            async with stream_generation(pipe, fps=8, **kwargs):
                pass
    finally:
        hook.remove()
    assert forwards == []


def test_easyanimate_control_is_refused_because_diffusers_itself_cannot_run_it() -> None:
    """The refusal holds only while diffusers' own call fails: a release that fixes it fails this test."""
    pipe, make_kwargs = NEW["easyanimate_control"]()
    with pytest.raises(TypeError, match="text_encoder_index"):
        pipe(**make_kwargs(), output_type="np")
    assert not hasattr(pipe, "decode_latents")


class CosmosSafetyChecker:
    """Named as cosmos_guardrail's checker, the one streamvae refuses: it sees the whole decoded video."""


@pytest.mark.parametrize(
    "name", ["cosmos_t2w", "cosmos2_5_predict", "cosmos2_5_transfer", "cosmos3", "cosmos3_modular"]
)
async def test_a_cosmos_pipeline_with_the_real_guardrail_is_refused_before_any_step(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipe, make_kwargs = NEW[name]()
    monkeypatch.setattr(pipe, "safety_checker", CosmosSafetyChecker())
    with pytest.raises(ValueError, match="its CosmosSafetyChecker checks the whole decoded video"):
        await generate_mp4(pipe, fps=8, **make_kwargs())
    if name == "cosmos3":  # the call's own opt-out: the pipeline then checks nothing, and streams
        assert find_plan(pipe, {**make_kwargs(), "enable_safety_check": False}, owner="test")


@pytest.mark.parametrize("entry", ["generate_mp4", "stream_generation"])
async def test_kandinsky6_without_its_sound_is_refused_before_any_step_saying_how_to_write_silent_videos(
    entry: str,
) -> None:
    pipe, make_kwargs = NEW["kandinsky6"]()
    kwargs = make_kwargs(sample_audio=False)
    forwards: list[int] = []
    hook = pipe.transformer.register_forward_pre_hook(lambda module, args: forwards.append(1))
    message = (
        rf'^{entry}: Kandinsky6TI2VAPipeline with sample_audio=False makes no soundtrack; .*"audio_waveforms"'
    )
    try:
        with anyio.fail_after(HANG_GUARD), pytest.raises(ValueError, match=message):
            if entry == "generate_mp4":
                await generate_mp4(pipe, fps=8, **kwargs)
            else:
                async with stream_generation(pipe, fps=8, **kwargs):
                    raise AssertionError("the block must not be entered")
    finally:
        hook.remove()
    assert forwards == []  # refused at the door: no denoising step ran


async def test_kandinsky6_silent_videos_are_the_pipelines_frames() -> None:
    pipe, make_kwargs = NEW["kandinsky6"]()
    silent = {**LOSSLESS, "audio_waveforms": [None], "audio_sample_rate": 16000}
    with anyio.fail_after(HANG_GUARD):
        (video,) = await generate_mp4(pipe, fps=8, session_options=silent, **make_kwargs(sample_audio=False))
    assert read_mp4(video).audio_channels is None
    assert_frames(video, np.asarray(pipe(**make_kwargs(sample_audio=False), output_type="np").frames)[0])


async def test_a_modular_pipeline_takes_only_its_inputs_and_leaves_output_to_streamvae() -> None:
    pipe, make_kwargs = NEW["minimax_h3_modular"]()
    with pytest.raises(TypeError, match="takes no input 'nonsense'"):
        await generate_mp4(pipe, fps=8, nonsense=1, **make_kwargs())
    with pytest.raises(ValueError, match="output is streamvae's to choose"):
        await generate_mp4(pipe, fps=8, output="videos", **make_kwargs())
    with pytest.raises(ValueError, match="output_type is streamvae's to choose"):
        await generate_mp4(pipe, fps=8, output_type="np", **make_kwargs())


Builder = Callable[[], tuple[Any, Callable[..., dict[str, Any]]]]
