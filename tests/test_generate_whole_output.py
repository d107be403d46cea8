"""generate_mp4 / stream_generation on a pipeline whose video is final only at its end:
Kandinsky 6 SR, which blends its decoded tiles, each over every frame, into one canvas. streamvae runs it
to its end, its own ``vae.decode`` untouched, and encodes the canvas it returned: the same frames streamed
or in one call, whatever the tile batches; a cancellation during a tile's denoising stops the pipeline
before its next model forward. tests/test_generate_every.py checks its frames against ``pipe()`` too."""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

from streamvae.pipelines import generate_mp4
from streamvae.pipelines._plans import describe, find_plan
from tests._generate import (
    HANG_GUARD,
    LOSSLESS,
    assert_frames,
    cancelled_when,
    reference,
    reference_of,
    streamed_as_in_one_call,
    wait_until_cancelled,
)
from tests.pipelines import BUILDERS

pytestmark = pytest.mark.anyio


async def test_stream_generation_streams_the_canvas_the_pipeline_returned() -> None:
    pipe, make_kwargs = BUILDERS["kandinsky6_sr"]()
    frames, _ = reference_of("kandinsky6_sr")  # two tiles, a vae.decode each, blended
    await streamed_as_in_one_call(pipe, make_kwargs, frames[0])
    assert "decode" not in vars(pipe.vae)  # its own vae.decode ran, never a stand-in
    plan = find_plan(pipe, make_kwargs(), owner="test")
    assert plan.whole_output and plan.sound is None
    assert "the first byte leaves after the whole run" in describe(plan)


async def test_tiles_decoded_together_give_the_pipelines_canvas_too() -> None:
    pipe, make_kwargs = BUILDERS["kandinsky6_sr"]()
    kwargs = make_kwargs(tiles_batch_size=2)  # both tiles in one transformer batch and one vae.decode
    frames, _ = reference(pipe, make_kwargs(tiles_batch_size=2))
    assert np.abs(frames - reference_of("kandinsky6_sr")[0]).max() > 0  # other noise: another video
    with anyio.fail_after(HANG_GUARD):
        (video,) = await generate_mp4(pipe, fps=8, session_options=LOSSLESS, **kwargs)
    assert_frames(video, frames[0])


async def test_a_cancellation_while_a_tile_is_denoised_stops_the_pipeline_before_its_next_forward() -> None:
    pipe, make_kwargs = BUILDERS["kandinsky6_sr"]()
    steps = make_kwargs()["num_inference_steps"]
    second_tile = anyio.Event()
    forwards: list[str] = []

    def transformer_forward(module: Any, args: Any, kwargs: Any) -> None:
        forwards.append("transformer")
        if forwards.count("transformer") == steps + 1:  # the second tile's first step
            anyio.from_thread.run_sync(second_tile.set)
            wait_until_cancelled()  # streamvae's own check, after this hook, must stop the pipeline

    hooks = [
        pipe.transformer.register_forward_pre_hook(transformer_forward, with_kwargs=True),
        pipe.vae.decoder.register_forward_pre_hook(lambda module, args: forwards.append("decoder")),
    ]
    scope = await cancelled_when(pipe, make_kwargs(), second_tile, hooks)
    assert scope.cancelled_caught
    # the first tile denoised and decoded; the second's first forward never ran, nor anything after it
    assert forwards[-1] == "transformer" and forwards.count("transformer") == steps + 1
    assert "decoder" in forwards[:-1]
