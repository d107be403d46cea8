"""Running a pipeline that decodes its video as a batch of images, a few frames a ``vae.decode`` call.

The pipelines with an image VAE (AnimateDiff, I2VGenXL, PIA, text-to-video SD) and Stable Video Diffusion
end in a ``decode_latents`` that flattens the latents' ``[batch, frames]`` into one batch of images,
entry-major, and calls ``vae.decode`` on ``decode_chunk_size`` of them at a time (or on all at once); it
joins what the calls return, reshapes it back into videos and post-processes them. Each call's frames are
final when it returns (an image VAE decodes each image alone; SVD's temporal decoder mixes only the frames
of one call), so each call can leave at once. A plan with :class:`~streamvae.pipelines._plans.FrameBatches`
runs that way (:func:`run_frame_batches`):

- the pipeline runs its own code to its end, its ``decode_latents`` included; streamvae only watches
  ``decode_latents`` start (the latents it is given say the batch and the frames of each video, which the
  flattened calls no longer do) and end, and stands in for ``vae.decode``;
- each ``vae.decode`` call is decoded by streamvae's adapter making exactly that call (the same latents as
  one batch, ``num_frames`` for SVD), its frames handed to the session as the adapter publishes them and
  handed back to the pipeline as ``vae.decode`` would return them;
- frame ``i`` of the flattened order is frame ``i % F`` of video ``i // F``: a video's frames go out as soon
  as every video of the batch has its frame there (one video: as each call is decoded);
- at the end the frames sent are checked, in number and order, against the video the pipeline returned, as
  for a pipeline that decodes clip by clip (:class:`~streamvae.pipelines._capture.ClipKeeper`).

Memory: the pipeline joins its calls' frames into its video and returns it, as it always did; streamvae
adds only the frames of a call that the batch's other videos have not reached yet.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import threading
import types
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from streamvae._decode_worker import run_decode
from streamvae._quantize import ValueRange
from streamvae.models import as_decoder
from streamvae.pipelines._capture import ClipKeeper, ClipSink, call_pipeline, decode_result, video_output
from streamvae.pipelines._plans import Clips, PipelinePlan, no_drop

__all__ = ["run_frame_batches"]


def _every_frame_kept(kept: int, kwargs: Mapping[str, Any], pipe: Any) -> int:
    return kept


#: what the pipeline keeps of its decode: every frame, each final once decoded
_EVERY_FRAME = Clips(drop_front=no_drop, final_length=_every_frame_kept)


def run_frame_batches(
    pipe: Any, plan: PipelinePlan, pipeline_kwargs: Mapping[str, Any], sink: ClipSink, owner: str
) -> None:
    """Worker thread: run a pipeline whose ``decode_latents`` decodes its frames as batches of images,
    streamvae decoding and streaming each ``vae.decode`` call as the pipeline makes it and handing its
    frames back; then check that what was sent is, in number and order, the video the pipeline returned
    (a RuntimeError if not)."""
    assert plan.frame_batches is not None
    shape = plan.frame_batches.shape
    vae = pipe.vae
    keeper = ClipKeeper(dataclasses.replace(plan, clips=_EVERY_FRAME), pipeline_kwargs, pipe, sink, owner)
    frames = _FlattenedFrames(keeper, plan.name, owner)

    def start(latents: Tensor) -> None:
        frames.start(*shape(latents), as_decoder(vae, owner=owner).chunk_value_range)

    def stand_in(latents: Tensor, extra: Mapping[str, Any], return_dict: bool) -> Any:
        return decode_result(frames.decode(vae, latents, extra), return_dict)

    with _watching_decode_latents(pipe, start, frames.end):
        output = call_pipeline(pipe, plan, pipeline_kwargs, stand_in, owner=owner)
    keeper.finish(video_output(plan, output))


class _FlattenedFrames:
    """Worker thread: the frames of one ``decode_latents``, decoded call by call in the flattened order,
    handed to the keeper as BCTHW chunks of every video once each video has them."""

    def __init__(self, keeper: ClipKeeper, name: str, owner: str) -> None:
        self._keeper, self._name, self._owner = keeper, name, owner
        self._batch = 0  # videos; 0 until decode_latents starts
        self._frames = 0  # frames of each video
        self._decoded = 0  # frames of the flattened order decoded so far
        self._pending: list[list[Tensor]] = []  # per video: its decoded frames not yet sent, in order

    def start(self, batch: int, frames: int, value_range: ValueRange) -> None:
        """``decode_latents`` starts on ``batch`` videos of ``frames`` frames each."""
        if self._batch:
            raise RuntimeError(
                f"{self._owner}: {self._name} called decode_latents a second time; its plan decodes once"
            )
        self._batch, self._frames = batch, frames
        self._pending = [[] for _ in range(batch)]
        self._keeper.start_clip(batch, value_range)

    def decode(self, vae: Any, latents: Tensor, extra: Mapping[str, Any]) -> Tensor:
        """One ``vae.decode(latents, **extra)`` call of ``decode_latents``: decoded by the adapter making
        that same call, its frames taken as they are published; returns what ``vae.decode`` returns."""
        if not self._batch:
            raise RuntimeError(
                f"{self._owner}: {self._name} called vae.decode outside decode_latents: its plan does not "
                "match this pipeline's code"
            )
        count = latents.shape[0]
        others = dict(extra)
        # SVD's temporal decoder: the call's frames are one clip (the pipeline passes their count)
        if others.pop("num_frames", count) != count or others or latents.ndim != 4:
            raise RuntimeError(
                f"{self._owner}: {self._name} called vae.decode with {latents.ndim}-D latents and "
                f"{', '.join(extra) or 'no other arguments'}; its plan expects a batch of image latents "
                "[frames, C, H, W] (and num_frames equal to their count)"
            )
        decoder = as_decoder(vae, owner=self._owner, decode_chunk_size=count)
        pieces: list[Tensor] = []

        def on_chunk(chunk: Tensor) -> None:
            pieces.append(chunk)
            self._take(chunk)

        # the call's images as one entry of ``count`` frames: the adapter flattens it back to ``latents``;
        # decoded on the worker's decode stream, which this thread's stream waits for when run_decode
        # returns (decode_stream), so the cat below and the pipeline's reads come after the frames
        run_decode(decoder, latents.transpose(0, 1).unsqueeze(0), on_chunk, self._owner)
        return torch.cat(pieces, dim=2)[0].transpose(0, 1)  # [1, 3, count, H, W] -> [count, 3, H, W]

    def end(self) -> None:
        """``decode_latents`` returned: every frame of every video must have been decoded."""
        if self._decoded != self._batch * self._frames:
            raise RuntimeError(
                f"{self._owner}: {self._name} decoded {self._decoded} of its {self._batch} × "
                f"{self._frames} frames: its plan does not match this pipeline's code"
            )
        self._keeper.end_clip()

    def _take(self, chunk: Tensor) -> None:
        """File a published chunk's frames under their videos (frame ``i`` is video ``i // F``'s), then
        send what every video has."""
        start = 0
        while start < chunk.shape[2]:
            video, frame = divmod(self._decoded, self._frames)
            if video >= self._batch:
                raise RuntimeError(
                    f"{self._owner}: {self._name} decoded more than its {self._batch} × {self._frames} "
                    "frames: its plan does not match this pipeline's code"
                )
            take = min(chunk.shape[2] - start, self._frames - frame)
            self._pending[video].append(chunk[:, :, start : start + take])
            self._decoded += take
            start += take
        self._release()

    def _release(self) -> None:
        """Send the frames every video has, as one chunk of the whole batch."""
        ready = min(sum(piece.shape[2] for piece in pieces) for pieces in self._pending)
        if ready == 0:
            return
        if self._batch == 1:  # nothing to wait for: each piece as it came
            for piece in self._pending[0]:
                self._keeper.take(piece)
            self._pending[0].clear()
            return
        heads = []
        for video, pieces in enumerate(self._pending):
            joined = torch.cat(pieces, dim=2)
            heads.append(joined[:, :, :ready])
            self._pending[video] = [joined[:, :, ready:]] if joined.shape[2] > ready else []
        self._keeper.take(torch.cat(heads))


@dataclass
class _Watchers:
    """The ``decode_latents`` watchers of one pipeline instance, by the thread whose call they watch, and
    what the instance had as its own ``decode_latents`` before the first was put on."""

    by_thread: dict[int, tuple[Callable[[Tensor], None], Callable[[], None]]]
    had_own: bool
    own: Any


_watchers_lock = threading.Lock()
_watchers: weakref.WeakKeyDictionary[Any, _Watchers] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def _watching_decode_latents(
    pipe: Any, start: Callable[[Tensor], None], end: Callable[[], None]
) -> Iterator[None]:
    """Make this pipeline instance's ``decode_latents``, called in this thread, call ``start(latents)``,
    the pipeline's own ``decode_latents`` and ``end()``; in any other thread it is the pipeline's own (or
    another call's watcher: calls on one pipeline wait for each other's turn only once inside
    ``call_pipeline``, so several may be watching). When the last watcher leaves, what the instance had
    is put back (an instance attribute of its own, or nothing)."""
    thread = threading.get_ident()
    with _watchers_lock:
        watchers = _watchers.get(pipe)
        if watchers is None:
            had_own = "decode_latents" in vars(pipe)
            watchers = _watchers[pipe] = _Watchers({}, had_own, vars(pipe).get("decode_latents"))
            pipe.decode_latents = _watched_decode_latents(pipe, watchers)
        watchers.by_thread[thread] = (start, end)
    try:
        yield
    finally:
        with _watchers_lock:
            del watchers.by_thread[thread]
            if not watchers.by_thread:
                del _watchers[pipe]
                if watchers.had_own:
                    pipe.decode_latents = watchers.own
                else:
                    del pipe.decode_latents


def _watched_decode_latents(pipe: Any, watchers: _Watchers) -> Callable[..., Any]:
    """The ``decode_latents`` :func:`_watching_decode_latents` puts on ``pipe``."""
    original = watchers.own if watchers.had_own else types.MethodType(type(pipe).decode_latents, pipe)
    signature = inspect.signature(original)
    latents_name = next(iter(signature.parameters))

    def decode_latents(*args: Any, **kwargs: Any) -> Any:
        watcher = watchers.by_thread.get(threading.get_ident())
        if watcher is None:
            return original(*args, **kwargs)
        start, end = watcher
        start(signature.bind(*args, **kwargs).arguments[latents_name])
        result = original(*args, **kwargs)
        end()
        return result

    return decode_latents
