"""A diffusers pipeline in one call (streamvae.pipelines), against real diffusers pipelines built from tiny
configs with seeded random weights: the frames are the pipeline's own, the bytes those of decode_to_mp4 /
stream_mp4 for the latents the pipeline passes to vae.decode, and cancellation ends the denoising loop."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
import torch

from streamvae import decode_to_mp4, read_entries, stream_mp4
from streamvae.models import as_decoder
from streamvae.pipelines import generate_mp4, stream_generation
from streamvae.pipelines._capture import run_to_decode
from tests._media import DETERMINISTIC_X264, read_mp4
from tests.pipelines import CORE as BUILDERS

pytestmark = pytest.mark.anyio

PINNED = {"video_codec_options": DETERMINISTIC_X264}
WAN = "wan21"  # the family the cancellation and door tests run on
Builder = Callable[[], tuple[Any, Callable[[], dict[str, Any]]]]


def captured_in_a_thread(pipe: Any, kwargs: dict[str, Any]) -> Any:
    """What the pipeline passes to vae.decode (the worker-thread function, called from a plain thread)."""
    result: list[Any] = []

    async def main() -> None:
        result.append(await anyio.to_thread.run_sync(lambda: run_to_decode(pipe, kwargs, owner="test")))

    anyio.run(main)
    return result[0]


@pytest.fixture(params=sorted(BUILDERS))
def family(request: pytest.FixtureRequest) -> tuple[Any, Callable[[], dict[str, Any]]]:
    builder: Builder = BUILDERS[request.param]
    return builder()


def test_the_latents_decode_to_exactly_the_pipelines_own_frames(
    family: tuple[Any, Callable[[], dict[str, Any]]],
) -> None:
    pipe, make_kwargs = family
    reference = pipe(**make_kwargs(), output_type="np").frames
    captured = captured_in_a_thread(pipe, make_kwargs())
    decoder = as_decoder(pipe.vae, **captured.decode_kwargs)
    video = torch.cat(list(decoder.iter_chunks(decoder.prepare_latents(captured.latents))), dim=2)
    # What the pipelines' video processor makes of vae.decode's output, for output_type="np".
    frames = (video / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 4, 1).float().numpy()
    assert frames.shape == np.asarray(reference).shape
    np.testing.assert_array_equal(frames, np.asarray(reference))
    assert "decode" not in vars(pipe.vae)  # the stand-in is gone


async def test_generate_mp4_writes_the_bytes_decode_to_mp4_writes_for_the_pipelines_latents(
    family: tuple[Any, Callable[[], dict[str, Any]]],
) -> None:
    pipe, make_kwargs = family
    videos = await generate_mp4(pipe, fps=8, session_options=PINNED, **make_kwargs())
    captured = await anyio.to_thread.run_sync(lambda: run_to_decode(pipe, make_kwargs(), owner="test"))
    decoder = as_decoder(pipe.vae, **captured.decode_kwargs)
    expected = await decode_to_mp4(decoder, captured.latents, fps=8, **PINNED)
    assert videos == expected
    reference = np.asarray(pipe(**make_kwargs(), output_type="np").frames)
    for video, frames in zip(videos, reference, strict=True):
        decoded = read_mp4(video)
        assert decoded.frames.shape[:3] == frames.shape[:3] and decoded.fps == 8


async def test_stream_generation_streams_the_bytes_stream_mp4_streams(
    family: tuple[Any, Callable[[], dict[str, Any]]],
) -> None:
    pipe, make_kwargs = family
    with anyio.fail_after(120):  # hang guard
        async with stream_generation(pipe, fps=8, session_options=PINNED, **make_kwargs()) as streams:
            parts: dict[int, list[bytes]] = {entry: [] for entry in range(len(streams))}
            async for entry, data in read_entries(streams):
                parts[entry].append(data)
    captured = await anyio.to_thread.run_sync(lambda: run_to_decode(pipe, make_kwargs(), owner="test"))
    decoder = as_decoder(pipe.vae, **captured.decode_kwargs)
    async with stream_mp4(decoder, captured.latents, fps=8, **PINNED) as expected_streams:
        expected: dict[int, list[bytes]] = {entry: [] for entry in range(len(expected_streams))}
        async for entry, data in read_entries(expected_streams):
            expected[entry].append(data)
    assert {e: b"".join(p) for e, p in parts.items()} == {e: b"".join(p) for e, p in expected.items()}
    assert all(len(p) > 1 for p in parts.values())  # fragmented: bytes left in pieces, as they were written


# -- cancellation --


class StepRecorder:
    """A ``callback_on_step_end`` that records each denoising step and sets ``second_step`` at step 1."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.second_step = anyio.Event()

    def __call__(
        self, pipe: Any, step: int, timestep: Any, callback_kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        self.steps.append(step)
        if step == 1:
            anyio.from_thread.run_sync(self.second_step.set)  # the pipeline runs in a worker thread
        return {}


@pytest.fixture
def wan() -> tuple[Any, Callable[[], dict[str, Any]]]:
    return BUILDERS[WAN]()


async def test_a_cancellation_ends_the_denoising_loop_at_its_next_step_and_decodes_nothing(
    wan: tuple[Any, Callable[[], dict[str, Any]]],
) -> None:
    pipe, make_kwargs = wan
    recorder = StepRecorder()
    scope = anyio.CancelScope()
    kwargs = {**make_kwargs(), "num_inference_steps": 40, "callback_on_step_end": recorder}
    with anyio.fail_after(120):  # hang guard
        async with anyio.create_task_group() as tg:

            async def generate() -> None:
                with scope:
                    await generate_mp4(pipe, fps=8, **kwargs)

            tg.start_soon(generate)
            await recorder.second_step.wait()
            scope.cancel()
    assert scope.cancelled_caught  # the caller sees its own cancellation
    steps = recorder.steps
    assert steps[:2] == [0, 1] and len(steps) <= 3  # the loop ended at the step after the cancellation
    assert "decode" not in vars(pipe.vae)
    # The pipeline is whole afterwards: the next call runs to the end.
    (video,) = await generate_mp4(pipe, fps=8, **make_kwargs())
    assert read_mp4(video).frames.shape[0] > 0


async def test_a_cancellation_before_the_call_runs_no_step(
    wan: tuple[Any, Callable[[], dict[str, Any]]],
) -> None:
    pipe, make_kwargs = wan
    recorder = StepRecorder()
    with anyio.CancelScope() as scope:
        scope.cancel()
        await generate_mp4(pipe, fps=8, callback_on_step_end=recorder, **make_kwargs())
    assert scope.cancelled_caught and recorder.steps == []


async def test_the_users_step_callback_still_runs_and_may_change_the_latents(
    wan: tuple[Any, Callable[[], dict[str, Any]]],
) -> None:
    pipe, make_kwargs = wan
    recorder = StepRecorder()

    def zero(pipe: Any, step: int, timestep: Any, callback_kwargs: dict[str, Any]) -> dict[str, Any]:
        return {"latents": torch.zeros_like(callback_kwargs["latents"])}

    def zero_latents(pipe: Any, step: int, timestep: Any, callback_kwargs: dict[str, Any]) -> dict[str, Any]:
        recorder(pipe, step, timestep, callback_kwargs)
        return zero(pipe, step, timestep, callback_kwargs)

    kwargs = {**make_kwargs(), "callback_on_step_end": zero_latents}
    (video,) = await generate_mp4(pipe, fps=8, session_options=PINNED, **kwargs)
    assert recorder.steps == list(range(kwargs["num_inference_steps"]))
    reference = np.asarray(pipe(**{**make_kwargs(), "callback_on_step_end": zero}, output_type="np").frames)
    decoded = read_mp4(video).frames.astype(np.float32) / 255
    assert abs(decoded.mean() - reference[0].mean()) < 0.05  # the zeroed latents' video, not the other one


# -- checked at the door --


class NotAPipeline:
    vae = None

    def __call__(self, **kwargs: Any) -> None:
        raise AssertionError("must not run")


@pytest.mark.parametrize("entry", ["generate_mp4", "stream_generation"])
async def test_every_argument_is_checked_before_the_pipeline_runs(
    entry: str, wan: tuple[Any, Callable[[], dict[str, Any]]]
) -> None:
    pipe, make_kwargs = wan
    calls: list[int] = []
    hook = pipe.transformer.register_forward_pre_hook(lambda module, args: calls.append(1))

    async def call(target: Any, **kwargs: Any) -> None:
        if entry == "generate_mp4":
            await generate_mp4(target, **kwargs)
        else:
            async with stream_generation(target, **kwargs):
                raise AssertionError("the block must not be entered")

    cases: list[tuple[Any, dict[str, Any], type[Exception], str]] = [
        (NotAPipeline(), {"fps": 8}, TypeError, "pipe must be a diffusers pipeline"),
        (torch.nn.Linear(1, 1), {"fps": 8}, TypeError, "pipe must be a diffusers pipeline"),
        (pipe, {"fps": "16"}, ValueError, "fps must be a number"),
        (pipe, {"fps": 8, "output_type": "np"}, ValueError, "output_type is streamvae's to choose"),
        (pipe, {"fps": 8, "num_frame": 9}, TypeError, "unexpected keyword argument 'num_frame'"),
        (pipe, {"fps": 8, "session_options": [("crf", "18")]}, TypeError, "session_options must be a dict"),
        (pipe, {"fps": 8, "session_options": {"fps": 16}}, ValueError, "pass fps to"),
        (pipe, {"fps": 8, "session_options": {"batch_frames": 0}}, ValueError, "batch_frames must be"),
        (pipe, {"fps": 8, "session_options": {"crff": "18"}}, ValueError, "has 'crff', not a SessionOptions"),
        (pipe, {"fps": 8, "callback_on_step_end": 3}, TypeError, "callback_on_step_end must be callable"),
    ]
    try:
        for target, kwargs, error, match in cases:
            arguments = {**make_kwargs(), **kwargs} if target is pipe else kwargs
            with pytest.raises(error, match=f"^{entry}: .*{match}"):
                await call(target, **arguments)
    finally:
        hook.remove()
    assert calls == []  # no denoising step ran


async def test_a_pipeline_whose_vae_streamvae_does_not_decode_is_refused_naming_what_works() -> None:
    class OtherVAE(torch.nn.Module):
        def decode(self, z: torch.Tensor, return_dict: bool = True) -> Any:
            raise AssertionError("must not run")

    class OtherPipeline:
        vae = OtherVAE()

        def __call__(self, *, output_type: str = "np", callback_on_step_end: Any = None) -> None:
            raise AssertionError("must not run")

    with pytest.raises(
        TypeError, match=r"^generate_mp4: OtherPipeline's VAE .* is not one streamvae decodes.*Wan"
    ):
        await generate_mp4(OtherPipeline(), fps=8)


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("ltx", r"a pipeline's packed output .* streamvae\.pipelines\.generate_mp4"),
        ("cogvideox", r"frames-first \[batch, frames, channels, height, width\].*generate_mp4"),
    ],
)
async def test_decode_to_mp4_given_a_pipelines_latent_output_says_what_to_do_instead(
    name: str, match: str
) -> None:
    pipe, make_kwargs = BUILDERS[name]()
    latents = pipe(**make_kwargs(), output_type="latent").frames
    with pytest.raises(ValueError, match=match):
        await decode_to_mp4(pipe.vae, latents, fps=8)


async def test_one_mp4_per_video_of_the_call(wan: tuple[Any, Callable[[], dict[str, Any]]]) -> None:
    pipe, make_kwargs = wan
    kwargs = {**make_kwargs(), "num_videos_per_prompt": 2}
    videos = await generate_mp4(pipe, fps=8, session_options=PINNED, **kwargs)
    reference = np.asarray(pipe(**{**make_kwargs(), "num_videos_per_prompt": 2}, output_type="np").frames)
    assert len(videos) == 2 == len(reference) and videos[0] != videos[1]
    decoded = [read_mp4(video).frames.astype(np.float32) / 255 for video in videos]
    assert all(d.shape == r.shape for d, r in zip(decoded, reference, strict=True))
    distance = [[float(np.abs(d - r).mean()) for r in reference] for d in decoded]
    # Each entry is its own video, in order (16×16 noise is far from lossless at crf 18: compare, not bound).
    assert distance[0][0] < distance[0][1] and distance[1][1] < distance[1][0]


async def test_a_pipeline_that_sets_num_videos_per_prompt_aside_is_not_refused_at_the_door(
    tmp_path: Path,
) -> None:
    # CogVideoXPipeline takes num_videos_per_prompt but sets it to 1: its call makes one video, which one
    # output file fits (the batch is not counted at the door from an argument the pipeline sets aside).
    pipe, make_kwargs = BUILDERS["cogvideox"]()
    path = tmp_path / "one.mp4"
    kwargs = {**make_kwargs(), "num_videos_per_prompt": 2}
    videos = await generate_mp4(pipe, fps=8, session_options={**PINNED, "output_files": [path]}, **kwargs)
    reference = np.asarray(pipe(**kwargs, output_type="np").frames)
    assert len(videos) == 1 == len(reference)
    assert path.read_bytes() == videos[0]
    assert read_mp4(videos[0]).frames.shape[:3] == reference[0].shape[:3]
