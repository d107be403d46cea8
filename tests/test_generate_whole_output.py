"""generate_mp4 / stream_generation on a pipeline whose video is final only at its end (issue 35, group C8):
Kandinsky 6 SR, which blends its decoded tiles, each over every frame, into one canvas. streamvae runs it
to its end, its own ``vae.decode`` untouched, and encodes the canvas it returned: the same frames streamed
or in one call, whatever the tile batches; a cancellation during a tile's denoising stops the pipeline
before its next model forward. tests/test_generate_every.py checks its frames against ``pipe()`` too."""

from __future__ import annotations

import time
from typing import Any

import anyio
import numpy as np
import pytest

from streamvae import read_entries
from streamvae.pipelines import generate_mp4, stream_generation
from streamvae.pipelines._plans import describe, find_plan
from tests._media import read_luma
from tests.pipelines import BUILDERS
from tests.test_generate_every import HANG_GUARD, LOSSLESS, assert_frames, reference, reference_of

pytestmark = pytest.mark.anyio


async def test_stream_generation_streams_the_canvas_the_pipeline_returned() -> None:
    pipe, make_kwargs = BUILDERS["kandinsky6_sr"]()
    frames, _ = reference_of("kandinsky6_sr")  # two tiles, a vae.decode each, blended
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


def _wait_until_cancelled() -> None:
    """Worker thread: return once the caller's cancellation is visible here (bounded)."""
    deadline = time.monotonic() + HANG_GUARD
    while time.monotonic() < deadline:
        try:
            anyio.from_thread.check_cancelled()
        except BaseException:  # the backend's cancellation: seen
            return
        time.sleep(0.01)


async def test_a_cancellation_while_a_tile_is_denoised_stops_the_pipeline_before_its_next_forward() -> None:
    pipe, make_kwargs = BUILDERS["kandinsky6_sr"]()
    steps = make_kwargs()["num_inference_steps"]
    second_tile = anyio.Event()
    forwards: list[str] = []

    def transformer_forward(module: Any, args: Any, kwargs: Any) -> None:
        forwards.append("transformer")
        if forwards.count("transformer") == steps + 1:  # the second tile's first step
            anyio.from_thread.run_sync(second_tile.set)
            _wait_until_cancelled()  # streamvae's own check, after this hook, must stop the pipeline

    hooks = [
        pipe.transformer.register_forward_pre_hook(transformer_forward, with_kwargs=True),
        pipe.vae.decoder.register_forward_pre_hook(lambda module, args: forwards.append("decoder")),
    ]
    scope = anyio.CancelScope()
    try:
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:

                async def generate() -> None:
                    with scope:
                        await generate_mp4(pipe, fps=8, **make_kwargs())

                tg.start_soon(generate)
                await second_tile.wait()
                scope.cancel()
    finally:
        for hook in hooks:
            hook.remove()
    assert scope.cancelled_caught
    # the first tile denoised and decoded; the second's first forward never ran, nor anything after it
    assert forwards[-1] == "transformer" and forwards.count("transformer") == steps + 1
    assert "decoder" in forwards[:-1]
