"""Helpers shared by the generate_mp4 / stream_generation tests: the reference a pipeline's own call gives,
the checks of an MP4 against it, and the two ways a test drives a generation (streamed piece by piece, or
cancelled at a moment a hook chooses)."""

from __future__ import annotations

import functools
import io
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import av
import numpy as np
from torch.utils.hooks import RemovableHandle

from streamvae import read_entries
from streamvae.pipelines import generate_mp4, stream_generation
from streamvae.pipelines._plans import find_plan
from tests._media import bt709_luma, read_luma, read_mp4
from tests.pipelines import BUILDERS

LOSSLESS = {"video_codec_options": {"threads": "1", "crf": "0"}}  # lossless luma, deterministic
HANG_GUARD = 300  # seconds: a generous bound on a tiny pipeline's call, so a hang fails instead of waiting


# -- the reference: the pipeline's own call --


@functools.cache
def reference_of(name: str) -> tuple[np.ndarray, Any]:
    """:func:`reference` of builder ``name``'s default call, once per process (asyncio's test and trio's
    share it: the call is seeded, so it gives the same frames every time)."""
    pipe, make_kwargs = BUILDERS[name]()
    return reference(pipe, make_kwargs())


def reference(pipe: Any, kwargs: dict[str, Any]) -> tuple[np.ndarray, Any]:
    """``pipe(**kwargs, output_type="np")``'s frames ``[B, F, H, W, 3]`` and its output (for its sound)."""
    plan = find_plan(pipe, kwargs, owner="test")
    if plan.modular:
        output = pipe(**kwargs, output_type="np", output=list(plan.outputs))
        videos = np.asarray(output[plan.outputs[0]])
        return (videos[None] if videos.ndim == 4 else videos), output  # Cosmos 3's: one, no batch axis
    output = pipe(**kwargs, output_type="np")
    if "images" in output:  # an image pipeline (Cosmos 2 text to image): each image a one-frame video
        return np.asarray(output.images)[:, None], output
    if "video" in output:  # Cosmos 3: one video a call, without a batch axis
        return np.asarray(output.video)[None], output
    frames = np.asarray(output.frames)
    # SanaWMPipeline returns its one video's frames [F, H, W, 3], without the batch axis
    return (frames[None] if frames.ndim == 4 else frames), output


# -- the checks of an MP4 --


def assert_frames(video: bytes, frames: np.ndarray) -> None:
    """The MP4's luma is that of the reference frames (``[F, H, W, 3]`` in [0, 1]) within a level."""
    luma = read_luma(video).astype(int)
    expected = bt709_luma(np.round(frames * 255).astype(np.uint8)).astype(int)
    assert luma.shape == expected.shape
    assert abs(luma - expected).max() <= 1


def assert_sound(video: bytes, waveform: np.ndarray) -> None:
    """The MP4's audio track is ``waveform`` (``[channels, samples]``): as many channels, as long as the
    video (the session pads it with silence or trims it to the video), and the waveform's energy (AAC is
    lossy and delays the signal, so the energy of the whole track is what is compared)."""
    decoded = read_mp4(video)
    assert decoded.audio_channels == waveform.shape[0] and decoded.audio_duration is not None
    assert abs(decoded.audio_duration - decoded.video_duration) < 0.1
    with av.open(io.BytesIO(video)) as container:
        samples = np.concatenate([f.to_ndarray() for f in container.decode(audio=0)], axis=-1)
    energy, expected = float(np.square(samples).sum()), float(np.square(waveform).sum())
    assert expected > 0 and 0.5 < energy / expected < 2


# -- driving a generation --


async def streamed_parts(
    pipe: Any, kwargs: dict[str, Any], *, on_part: Callable[[], None] | None = None
) -> list[bytes]:
    """The pieces of the one lossless MP4 ``stream_generation(pipe, fps=8, **kwargs)`` streams, as its
    reader got them; ``on_part`` runs after each, while the pipeline may still be generating."""
    parts: list[bytes] = []
    with anyio.fail_after(HANG_GUARD):
        async with stream_generation(pipe, fps=8, session_options=LOSSLESS, **kwargs) as streams:
            assert len(streams) == 1
            async for _, data in read_entries(streams):
                parts.append(data)
                if on_part is not None:
                    on_part()
    return parts


async def streamed_as_in_one_call(
    pipe: Any, make_kwargs: Callable[..., dict[str, Any]], frames: np.ndarray
) -> bytes:
    """The MP4 ``stream_generation`` streams of one call: fragmented (its bytes left in pieces), the frames
    ``frames`` and the same frames as ``generate_mp4`` gives in one call."""
    parts = await streamed_parts(pipe, make_kwargs())
    with anyio.fail_after(HANG_GUARD):
        (whole,) = await generate_mp4(pipe, fps=8, session_options=LOSSLESS, **make_kwargs())
    streamed = b"".join(parts)
    assert len(parts) > 1  # fragmented: bytes left in pieces
    assert_frames(streamed, frames)
    assert (read_luma(streamed) == read_luma(whole)).all()  # the same frames, streamed or in one call
    return streamed


def wait_until_cancelled() -> None:
    """Worker thread (a hook inside the pipeline): return once the caller's cancellation is visible here
    (bounded), so the pipeline goes on only after the cancellation it must notice."""
    deadline = time.monotonic() + HANG_GUARD
    while time.monotonic() < deadline:
        try:
            anyio.from_thread.check_cancelled()
        except Exception:  # not a cancellation (asyncio's and trio's are BaseExceptions): a failure
            raise
        except BaseException:  # the backend's cancellation: seen
            return
        time.sleep(0.01)
    raise AssertionError(f"the caller's cancellation did not reach the worker within {HANG_GUARD} s")


async def cancelled_when(
    pipe: Any, kwargs: dict[str, Any], event: anyio.Event, hooks: list[RemovableHandle]
) -> anyio.CancelScope:
    """Run ``generate_mp4(pipe, fps=8, **kwargs)`` in a task and cancel it once ``event`` is set by one of
    ``hooks``, the pipeline's model hooks, which are removed at the end whatever happens; the cancel scope,
    whose ``cancelled_caught`` says the call ended there."""
    scope = anyio.CancelScope()
    try:
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:

                async def generate() -> None:
                    with scope:
                        await generate_mp4(pipe, fps=8, **kwargs)

                tg.start_soon(generate)
                await event.wait()
                scope.cancel()
    finally:
        for hook in hooks:
            hook.remove()
    return scope


class FirstBytesBeforeTheLastStep:
    """A ``callback_on_step_end`` that, at the first step of a later clip, waits until the reader has had
    bytes: a pipeline whose bytes only left at its end would never get past it (the wait has a bound)."""

    def __init__(self, steps_per_clip: int) -> None:
        self.steps_per_clip = steps_per_clip
        self.calls = 0
        self.first_bytes = threading.Event()
        self.waited_at: int | None = None

    def __call__(
        self, pipe: Any, step: int, timestep: Any, callback_kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        self.calls += 1
        if self.calls == self.steps_per_clip + 1:  # the first step of the second clip
            assert self.first_bytes.wait(timeout=HANG_GUARD), "no bytes before the second clip's steps"
            self.waited_at = self.calls
        return {}


def steps_per_clip(pipe: Any, kwargs: dict[str, Any]) -> int:
    """How many times ``callback_on_step_end`` runs before the pipeline's first ``vae.decode``."""
    steps: list[int] = []
    at_decode: list[int] = []
    original = pipe.vae.decode

    def count(pipe_: Any, step: int, timestep: Any, callback_kwargs: dict[str, Any]) -> dict[str, Any]:
        steps.append(step)
        return {}

    def decode(*args: Any, **kw: Any) -> Any:
        at_decode.append(len(steps))
        return original(*args, **kw)

    pipe.vae.decode = decode
    try:
        pipe(**{**kwargs, "callback_on_step_end": count}, output_type="np")
    finally:
        del pipe.vae.decode
    assert len(at_decode) >= 2 and at_decode[0] < len(steps)
    return at_decode[0]
