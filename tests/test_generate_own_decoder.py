"""generate_mp4 / stream_generation on the pipelines whose own model makes their video instead of
``vae.decode`` (issue 35, group C6): LTX-2.5's diffusion decoder, in LTX2VideoDiffusionDecodePipeline (no
VAE) and the modular LTX25AutoBlocks (with sound). Every frame the model made and the sound, streamed once
the decode is whole; a cancellation during the decode stops the pipeline there; the door asks for the model
instead of a VAE. tests/test_generate_every.py checks their frames and sound against ``pipe()`` too."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
import torch

from streamvae import read_entries
from streamvae.pipelines import generate_mp4, stream_generation
from streamvae.pipelines._plans import describe, find_plan
from tests._media import read_luma
from tests.pipelines import BUILDERS
from tests.test_generate_every import HANG_GUARD, LOSSLESS, assert_frames, assert_sound, reference_of

pytestmark = pytest.mark.anyio

#: the builders of the pipelines whose diffusion decoder makes their video
OWN = ["ltx2_diffusion_decode", "ltx25_modular"]


@pytest.mark.parametrize("name", OWN)
async def test_stream_generation_streams_the_video_its_own_model_made_and_its_sound(name: str) -> None:
    pipe, make_kwargs = BUILDERS[name]()
    frames, output = reference_of(name)
    parts: list[bytes] = []
    with anyio.fail_after(HANG_GUARD):
        async with stream_generation(pipe, fps=8, session_options=LOSSLESS, **make_kwargs()) as streams:
            assert len(streams) == 1
            async for _, data in read_entries(streams):
                parts.append(data)
        (whole,) = await generate_mp4(pipe, fps=8, session_options=LOSSLESS, **make_kwargs())
    streamed = b"".join(parts)
    assert len(parts) > 1  # fragmented: bytes left in pieces
    assert_frames(streamed, frames[0])
    assert (read_luma(streamed) == read_luma(whole)).all()  # the same frames, streamed or in one call
    plan = find_plan(pipe, make_kwargs(), owner="test")
    if plan.sound is not None:
        waveforms, _ = plan.sound.read(output, pipe)
        assert_sound(streamed, torch.as_tensor(waveforms[0]).float().numpy())
    assert "decode" not in vars(pipe.diffusion_decoder)  # the stand-in is gone
    assert "after the whole decode" in describe(plan)


async def test_a_pipeline_decoded_by_its_own_model_needs_no_vae() -> None:
    pipe, make_kwargs = BUILDERS["ltx2_diffusion_decode"]()
    assert pipe.vae is None
    frames, _ = reference_of("ltx2_diffusion_decode")
    with anyio.fail_after(HANG_GUARD):
        (video,) = await generate_mp4(pipe, fps=8, session_options=LOSSLESS, **make_kwargs())
    assert_frames(video, frames[0])


async def test_a_pipeline_without_the_model_that_makes_its_video_is_refused_before_it_runs() -> None:
    from diffusers import FlowMatchEulerDiscreteScheduler, LTX2VideoDiffusionDecodePipeline

    pipe = LTX2VideoDiffusionDecodePipeline(
        diffusion_decoder=None, scheduler=FlowMatchEulerDiscreteScheduler()
    )
    _, make_kwargs = BUILDERS["ltx2_diffusion_decode"]()
    with pytest.raises(TypeError, match="makes its video with its diffusion_decoder.decode, and has no"):
        await generate_mp4(pipe, fps=8, **make_kwargs())


def _wait_until_cancelled() -> None:
    """Worker thread: return once the caller's cancellation is visible here (bounded)."""
    deadline = time.monotonic() + HANG_GUARD
    while time.monotonic() < deadline:
        try:
            anyio.from_thread.check_cancelled()
        except BaseException:  # the backend's cancellation: seen
            return
        time.sleep(0.01)


async def test_a_cancellation_during_the_decoders_pass_stops_the_pipeline_at_its_end() -> None:
    pipe, make_kwargs = BUILDERS["ltx25_modular"]()
    decoding = anyio.Event()
    vocoder_forwards: list[int] = []

    def in_the_decode(module: Any, args: Any) -> None:
        anyio.from_thread.run_sync(decoding.set)
        _wait_until_cancelled()  # the pass goes on; the check after it must stop the pipeline

    hooks = [
        pipe.diffusion_decoder.decoder.register_forward_pre_hook(in_the_decode),
        pipe.vocoder.register_forward_pre_hook(lambda module, args: vocoder_forwards.append(1)),
    ]
    scope = anyio.CancelScope()
    try:
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:

                async def generate() -> None:
                    with scope:
                        await generate_mp4(pipe, fps=8, **make_kwargs())

                tg.start_soon(generate)
                await decoding.wait()
                scope.cancel()
    finally:
        for hook in hooks:
            hook.remove()
    assert scope.cancelled_caught
    assert vocoder_forwards == []  # stopped at the decode's end: its audio decode never ran
    assert "decode" not in vars(pipe.diffusion_decoder)
