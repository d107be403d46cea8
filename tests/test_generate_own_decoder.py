"""generate_mp4 / stream_generation on the pipelines whose own model makes their video instead of
``vae.decode``: LTX-2.5's diffusion decoder, in LTX2VideoDiffusionDecodePipeline (no
VAE) and the modular LTX25AutoBlocks (with sound). Every frame the model made and the sound, streamed once
the decode is whole; a cancellation during the decode stops the pipeline there; the door asks for the model
instead of a VAE. tests/test_generate_every.py checks their frames and sound against ``pipe()`` too."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import torch

from streamvae.pipelines import generate_mp4
from streamvae.pipelines._plans import describe, find_plan
from tests._generate import (
    HANG_GUARD,
    LOSSLESS,
    assert_frames,
    assert_sound,
    cancelled_when,
    reference_of,
    streamed_as_in_one_call,
    wait_until_cancelled,
)
from tests.pipelines import BUILDERS

pytestmark = pytest.mark.anyio

#: the builders of the pipelines whose diffusion decoder makes their video
OWN = ["ltx2_diffusion_decode", "ltx25_modular"]


@pytest.mark.parametrize("name", OWN)
async def test_stream_generation_streams_the_video_its_own_model_made_and_its_sound(name: str) -> None:
    pipe, make_kwargs = BUILDERS[name]()
    frames, output = reference_of(name)
    streamed = await streamed_as_in_one_call(pipe, make_kwargs, frames[0])
    plan = find_plan(pipe, make_kwargs(), owner="test")
    assert (plan.sound is not None) == (name == "ltx25_modular")  # the blocks make sound, the other not
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


async def test_a_cancellation_during_the_decoders_pass_stops_the_pipeline_at_its_end() -> None:
    pipe, make_kwargs = BUILDERS["ltx25_modular"]()
    decoding = anyio.Event()
    vocoder_forwards: list[int] = []

    def in_the_decode(module: Any, args: Any) -> None:
        anyio.from_thread.run_sync(decoding.set)
        wait_until_cancelled()  # the pass goes on; the check after it must stop the pipeline

    hooks = [
        pipe.diffusion_decoder.decoder.register_forward_pre_hook(in_the_decode),
        pipe.vocoder.register_forward_pre_hook(lambda module, args: vocoder_forwards.append(1)),
    ]
    scope = await cancelled_when(pipe, make_kwargs(), decoding, hooks)
    assert scope.cancelled_caught
    assert vocoder_forwards == []  # stopped at the decode's end: its audio decode never ran
    assert "decode" not in vars(pipe.diffusion_decoder)
