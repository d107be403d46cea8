"""The pipelines that change their decoded video after ``vae.decode``, streamed as the pipeline's own code
would change it.

Each pipeline here still runs its own code up to (and past) ``vae.decode``; what differs is what streamvae
does with what it decodes, so that the frames written are those the pipeline returns:

- **frames dropped or put in front** (:class:`Framed`, a pipeline that decodes once): HunyuanVideo-I2V's
  ``latent_concat`` mode cuts the first 4 frames of its decode, SkyReels-V2 DF video-to-video puts its own
  (preprocessed) input video before it. The cut frames are never sent; the input's frames are sent first,
  before the first decoded chunk. The first byte leaves after the denoising, as for any decode-once
  pipeline.
- **several decodes after the loop, joined** (:func:`run_joined`): Motif's ``vae_batch_size`` groups
  (each group decoded as its own batch, as its call decoded it, the groups stepped together so that each
  chunk holds every video: :class:`_Apart`), ChronoEdit's temporal-reasoning video and its edit (joined
  in time, the edit's first frame dropped). Neither looks at its decoded pixels but to join them, so the
  stand-in only takes each call's latents and hands back a placeholder (one pixel a frame, as many frames
  as the decode gives, or one a latent frame where the adapter cannot tell without decoding); once the
  pipeline has returned, streamvae decodes those latents, in the order the pipeline's video holds them,
  chunk by chunk. The first byte leaves after the denoising and the first chunk, as for a decode-once
  pipeline. The placeholder video the pipeline returned is checked against the plan (batch and frame
  count) before anything is sent, so a plan that does not match the pipeline fails the call instead of
  writing another video.
- **sections blended into each other** (:func:`run_blended`, FramePack): each section is decoded by
  streamvae as the pipeline asks for it and handed back; :class:`BlendKeeper` holds the frames the next
  section can still change and blends them with the pipeline's own ``_soft_append``. Appending (vanilla
  sampling), all but the overlap leave as each section is decoded; prepending (the default inverted
  anti-drifting sampling), the video's first frames are the last section's, so the first byte leaves after
  the last section. The pipeline's video is checked frame by frame against what was sent, as for a
  clip-by-clip pipeline.
- **a crop of every frame** (Wan-Animate 2's letterbox, :attr:`streamvae.pipelines._plans.Clips.crop`):
  applied to each clip's chunks by the clip keeper of ``_capture``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from streamvae._decode_worker import check_abandoned, run_decode
from streamvae._protocol import publish_chunks
from streamvae._quantize import ValueRange
from streamvae.models import ChunkedDecoder, ProtocolDecoder, as_decoder
from streamvae.models._common import joined_steps
from streamvae.pipelines._capture import (
    ClipSink,
    DecoderWrapper,
    call_pipeline,
    check_fingerprints,
    decode_each_call,
    decode_result,
    fingerprints,
    video_output,
)
from streamvae.pipelines._plans import Blended, PipelinePlan

__all__ = [
    "BlendKeeper",
    "Framed",
    "framed_decoder",
    "in_session",
    "run_blended",
    "run_in_session",
    "run_joined",
]


class Framed(DecoderWrapper):
    """A :class:`streamvae.SupportsChunkedVAEDecode` that publishes ``decoder``'s decode without its first
    ``drop`` frames, after the pixel frames ``lead()`` makes (BCTHW in the decoder's value range, made in
    the decode's thread and sent on its device before the first decoded chunk). A decode that gives no more
    than ``drop`` frames is a RuntimeError, not a shorter video."""

    def __init__(
        self, decoder: ChunkedDecoder, *, drop: int, lead: Callable[[], Tensor] | None, owner: str
    ) -> None:
        super().__init__(decoder)
        self.drop, self.lead, self.owner = drop, lead, owner

    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        if self.lead is not None:
            on_chunk(self.lead().to(z.device))
        dropper = _Dropper(self.drop, on_chunk)
        self.decoder.decode_with_chunks(z, on_chunk=dropper)
        dropper.check(self.owner)


class _Dropper:
    """An ``on_chunk`` that leaves out the first ``drop`` frames and counts what it passes on."""

    def __init__(self, drop: int, on_chunk: Callable[[Tensor], None]) -> None:
        self.drop, self.left, self.on_chunk, self.sent = drop, drop, on_chunk, 0

    def __call__(self, chunk: Tensor) -> None:
        if self.left:
            dropped = min(self.left, chunk.shape[2])
            self.left -= dropped
            chunk = chunk[:, :, dropped:]
        if chunk.shape[2]:
            self.sent += chunk.shape[2]
            self.on_chunk(chunk)

    def check(self, owner: str) -> None:
        """A RuntimeError unless the decode gave more frames than the pipeline drops."""
        if self.drop and self.sent == 0:
            raise RuntimeError(
                f"{owner}: the pipeline drops the first {self.drop} frames of its decode, which gave "
                f"{self.drop - self.left}: it would return no frame of it"
            )


def framed_decoder(
    decoder: ChunkedDecoder, plan: PipelinePlan, kwargs: Mapping[str, Any], pipe: Any, *, owner: str
) -> ChunkedDecoder:
    """``decoder`` as the plan of a pipeline that decodes once frames it: without the frames it drops,
    after the frames it puts in front; ``decoder`` itself when it does neither."""
    if plan.drop_frames is None and plan.lead_frames is None:
        return decoder
    drop = 0 if plan.drop_frames is None else plan.drop_frames(kwargs, pipe)
    make_lead = plan.lead_frames
    lead = None if make_lead is None else (lambda: make_lead(kwargs, pipe))
    if drop == 0 and lead is None:
        return decoder
    return ProtocolDecoder(Framed(decoder, drop=drop, lead=lead, owner=owner))


def in_session(plan: PipelinePlan) -> bool:
    """Whether a call of ``plan``'s pipeline runs as the producer of one session (its decodes streamed by
    :func:`run_joined` or :func:`run_blended`), not as one decode of its captured latents."""
    return plan.joined is not None or plan.blended is not None


def run_in_session(
    pipe: Any, plan: PipelinePlan, pipeline_kwargs: Mapping[str, Any], sink: ClipSink, owner: str
) -> None:
    """Worker thread: :func:`run_joined` or :func:`run_blended`, as ``plan`` says."""
    run = run_joined if plan.joined is not None else run_blended
    run(pipe, plan, pipeline_kwargs, sink, owner)


def run_joined(
    pipe: Any, plan: PipelinePlan, pipeline_kwargs: Mapping[str, Any], sink: ClipSink, owner: str
) -> None:
    """Worker thread: run a pipeline that decodes several times after its loop to its end, each
    ``vae.decode`` handed a placeholder of its decoded shape; then decode what it passed there in its
    video's order (:attr:`PipelinePlan.joined`) and send it to ``sink``; then check that the pipeline's
    (placeholder) video has the batch and the frames sent (a RuntimeError if not)."""
    assert plan.joined is not None
    vae = pipe.vae
    calls: list[tuple[Tensor, Mapping[str, Any]]] = []

    def stand_in(latents: Tensor, extra: Mapping[str, Any], return_dict: bool) -> Any:
        check_abandoned(owner)  # a cancellation during the last denoising step
        calls.append((latents, extra))
        frames = _placeholder_frames(as_decoder(vae, owner=owner, **extra), latents.shape[2])
        shape = (latents.shape[0], 3, frames, 1, 1)
        return decode_result(torch.zeros(shape, dtype=latents.dtype, device=latents.device), return_dict)

    video = video_output(plan, call_pipeline(pipe, plan, pipeline_kwargs, stand_in, owner=owner))
    described = f"{owner}: {plan.name}"
    if not calls:
        raise RuntimeError(f"{described} returned without calling vae.decode: nothing to decode")
    extra = calls[0][1]
    if any(
        other.keys() != extra.keys() or not all(_same(other[k], extra[k]) for k in extra)
        for _, other in calls
    ):
        raise RuntimeError(f"{described} called vae.decode with other arguments from one call to the next")
    pieces = [
        (latents if isinstance(latents, tuple) else (latents,), drop)
        for latents, drop in plan.joined.order([latents for latents, _ in calls], pipeline_kwargs, pipe)
    ]
    batch = sum(group.shape[0] for group in pieces[0][0])
    if video.shape[0] != batch:
        raise RuntimeError(
            f"{described} returned {video.shape[0]} videos, but its plan decodes {batch}: its plan does not "
            "match this pipeline's code, and the video written would not be the pipeline's"
        )
    decoder = as_decoder(vae, owner=owner, **extra)
    # The pipeline joined its placeholders as it joins its videos: the plan must make the same count.
    expected = sum(_placeholder_frames(decoder, groups[0].shape[2]) - drop for groups, drop in pieces)
    if video.shape[1] != expected:
        raise RuntimeError(
            f"{described} returned {video.shape[1]} placeholder frames where its plan makes {expected}: its "
            "plan does not match this pipeline's code, and the video written would not be the pipeline's"
        )
    sink.on_batch(batch)
    sent = 0
    for groups, drop in pieces:
        dropper = _Dropper(drop, sink.push)
        if len(groups) == 1:
            run_decode(decoder, groups[0], dropper, owner)
        else:
            apart = ProtocolDecoder(_Apart(decoder, [group.shape[0] for group in groups]))
            run_decode(apart, torch.cat(groups), dropper, owner)
        dropper.check(owner)
        sent += dropper.sent
    if (
        all(decoder.output_frames(groups[0].shape[2]) is not None for groups, _ in pieces)
        and sent != expected
    ):
        raise RuntimeError(
            f"{described} returned {video.shape[1]} frames, but streamvae sent {sent}: its plan does not "
            "match this pipeline's code, and the video written is not the pipeline's"
        )


class _Apart(DecoderWrapper):
    """A :class:`streamvae.SupportsChunkedVAEDecode` that decodes each group of ``sizes`` entries of a
    latent as its own batch, as a pipeline's separate ``vae.decode`` calls did, the groups stepped together
    (one chunk of each per step, joined along the batch), so each chunk holds every entry."""

    def __init__(self, decoder: ChunkedDecoder, sizes: list[int]) -> None:
        super().__init__(decoder)
        self.sizes = sizes

    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        # each group's walk starts at the first step, inside the publishing
        walks = (self.decoder.iter_chunks(group) for group in z.split(self.sizes))
        publish_chunks(joined_steps(walks), on_chunk, drain=self.decoder.drain)


def _same(first: Any, second: Any) -> bool:
    """Whether two ``vae.decode`` arguments are the same value (tensors: equal shape and values)."""
    if isinstance(first, Tensor) or isinstance(second, Tensor):
        return isinstance(first, Tensor) and isinstance(second, Tensor) and torch.equal(first, second)
    return bool(first == second)


def _placeholder_frames(decoder: ChunkedDecoder, latent_frames: int) -> int:
    """The frames of the placeholder that stands for a decode of ``latent_frames``: the decode's own count
    where the adapter knows it, else one a latent frame (the pipelines in :func:`run_joined` only slice
    and join what they decode, so the count of their video still tells whether the plan is theirs)."""
    frames = decoder.output_frames(latent_frames)
    return latent_frames if frames is None else frames


def run_blended(
    pipe: Any, plan: PipelinePlan, pipeline_kwargs: Mapping[str, Any], sink: ClipSink, owner: str
) -> None:
    """Worker thread: run a pipeline that decodes once per section and blends the sections
    (:attr:`PipelinePlan.blended`), streamvae decoding each section as the pipeline asks for it and handing
    it back; send each frame once no later section can change it (:class:`BlendKeeper`); then check what
    was sent against the video the pipeline returned (a RuntimeError if it differs)."""
    assert plan.blended is not None
    keeper = BlendKeeper(plan.blended, pipeline_kwargs, pipe, sink, owner)
    start, end = keeper.start_section, keeper.end_section
    video = decode_each_call(pipe, plan, pipeline_kwargs, start=start, take=keeper.take, end=end, owner=owner)
    keeper.finish(video, plan.name)


class BlendKeeper:
    """Worker thread: the frames of a blending pipeline's video that no later section can change, sent as
    soon as they are.

    A pipeline that appends (FramePack's vanilla sampling) joins a section ``C`` after its video ``H`` as
    ``[H[:-o], blend(H[-o:], C[:o]), C[o:]]``: only the last ``o`` frames of the video so far can still
    change, and its final cut drops at most a few more from the end, so all but the last
    ``max(o, most_cut)`` frames leave as they are decoded, and the held ones are blended with the
    pipeline's own blend when the next section's first ``o`` frames are decoded. A pipeline that prepends
    (the inverted anti-drifting sampling) joins each section in front, ``[C[:-o], blend(C[-o:], H[:o]),
    H[o:]]``: its first frame is the last section's, so no frame can leave before the last section is
    decoded; the keeper holds the video, joined section by section as the pipeline joins it, and sends it
    at the end. Each frame sent leaves a fingerprint to check the pipeline's output against.
    """

    def __init__(
        self, spec: Blended, kwargs: Mapping[str, Any], pipe: Any, sink: ClipSink, owner: str
    ) -> None:
        self._spec, self._kwargs, self._pipe, self._sink, self._owner = spec, kwargs, pipe, sink, owner
        self._overlap = spec.overlap(kwargs, pipe)
        self._prepends = spec.prepends(kwargs, pipe)
        self._hold = max(self._overlap, spec.most_cut(kwargs, pipe))
        self._held: Tensor | None = None  # the frames of the video not sent yet, in order
        self._section: list[Tensor] = []  # the current section's frames not joined yet
        self._joining = False  # whether the current section's first frames wait to be blended in
        self._sections = 0
        self._sent = 0
        self._batch: int | None = None
        self._value_range: ValueRange = (-1.0, 1.0)
        self.fingerprints: list[Tensor] = []

    def start_section(self, batch: int, value_range: ValueRange) -> None:
        if self._batch is None:
            self._batch = batch
            self._sink.on_batch(batch)
        self._value_range = value_range
        self._section = []
        self._joining = not self._prepends and self._sections > 0

    def take(self, chunk: Tensor) -> None:
        if not self._prepends and not self._joining:
            self._append(chunk)
            return
        self._section.append(chunk)
        if self._joining and sum(piece.shape[2] for piece in self._section) >= self._overlap:
            self._join_section_start()

    def end_section(self) -> None:
        if self._prepends:
            current = torch.cat(self._section, dim=2)
            self._held = current if self._held is None else self._blend(current, self._held)
        elif self._joining:
            decoded = sum(piece.shape[2] for piece in self._section)
            raise RuntimeError(
                f"{self._owner}: a section of {decoded} frames is shorter than the {self._overlap} frames "
                "the pipeline blends it over"
            )
        self._section = []
        self._sections += 1

    def finish(self, video: Tensor, name: str) -> None:
        """Send what the pipeline's output keeps of the held frames; check the output against the frames
        sent. ``video`` is the pipeline's ``[B, F, C, H, W]`` output in [0, 1]."""
        described = f"{self._owner}: {name} returned {video.shape[1]} frames"
        if self._batch is None or self._held is None:
            raise RuntimeError(f"{described} without calling vae.decode: nothing was decoded")
        joined = self._sent + self._held.shape[2]
        final = self._spec.final_length(joined, self._kwargs, self._pipe)
        if not self._sent <= final <= joined or video.shape[1] != final:
            raise RuntimeError(
                f"{described}, but streamvae had joined {joined} and sent {self._sent}: its plan does not "
                "match this pipeline's code, and the video written would not be the pipeline's"
            )
        self._release(final - self._sent)
        check_fingerprints(video, self.fingerprints, described, changed="in a way its plan does not")

    def _join_section_start(self) -> None:
        """Blend the held end of the video with the current section's first frames, as the pipeline
        does, and go on appending the rest of the section."""
        assert self._held is not None
        current = torch.cat(self._section, dim=2)
        self._section, self._joining = [], False
        overlap = self._overlap
        if self._held.shape[2] < overlap:
            raise RuntimeError(
                f"{self._owner}: the video so far has {self._held.shape[2]} frames, fewer than the {overlap} "
                "the pipeline blends the next section over"
            )
        blended = self._blend(self._held[:, :, -overlap:], current[:, :, :overlap])
        self._held = torch.cat([self._held[:, :, :-overlap], blended], dim=2)
        self._append(current[:, :, overlap:])

    def _append(self, frames: Tensor) -> None:
        if frames.shape[2]:
            self._held = frames if self._held is None else torch.cat([self._held, frames], dim=2)
        if self._held is not None:
            self._release(self._held.shape[2] - self._hold)

    def _blend(self, history: Tensor, current: Tensor) -> Tensor:
        return self._spec.blend(self._pipe, history, current, self._overlap)

    def _release(self, count: int) -> None:
        """Send the first ``count`` held frames (none if ``count`` is not positive)."""
        if count <= 0 or self._held is None:
            return
        frames, self._held = self._held[:, :, :count], self._held[:, :, count:]
        self.fingerprints.extend(fingerprints(frames, self._value_range))
        self._sink.push(frames)
        self._sent += count
