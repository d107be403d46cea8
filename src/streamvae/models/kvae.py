"""Streaming decode for diffusers' ``AutoencoderKLKVAEVideo`` (Kandinsky's KVAE video VAE).

KVAE's ``vae.decode`` walks time in segments: the latent is cut into a first segment of
``ceil(17 / r)`` latent frames and then segments of ``ceil(16 / r)`` (``r`` the config's
``temporal_compress_times``: 5, 4, 4, …, the last taking what is left), and each segment is one decoder
call. The calls share a cache, a plain dict made by ``_decode`` and passed as an argument: every causal
convolution keeps the last input frames of the previous segment there, every spatial norm a flag that its
first frame is behind it. Nothing in a later call reads or changes an earlier call's output, so a
segment's frames are final as soon as it is decoded and are published right away. Inside a call GroupNorm
normalizes over all the call's frames, which is why the cut, not just the order, must be the one
diffusers makes.

The cut is greedy: a full segment has the same bounds whatever follows it, and only the last one may be
short. So latents may also arrive in pieces: the frames fed are held until they fill the next segment,
which is then decoded, and what is left at the end is decoded as the short last segment — the cut of
the whole latent, whatever the split. The cache is made per stream and batch lane and never put on the
module, so ``vae.decode`` is unaffected by any stream, finished or not.

Frames per segment follow the decoder's temporal upsamplers: each doubles a call's frames (the first
call's first frame stays single), but a call of one latent frame stays one frame. So a latent whose last
segment holds a single latent frame decodes to fewer than ``1 + r (T - 1)`` frames (6 latents: 17 + 1),
as ``vae.decode`` does.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from diffusers.models.autoencoders.autoencoder_kl_kvae_video import (
    AutoencoderKLKVAEVideo,
    KVAECachedPXSUpsample,
)
from torch import Tensor

from streamvae._checks import is_int
from streamvae.models._base import ChunkedDecoder, DecodeState

__all__ = ["KVAEVideoChunkedDecoder"]

#: ``AutoencoderKLKVAEVideo._decode``'s ``seg_len``: sample frames a segment adds (the first adds one more);
#: ``vae.decode`` never passes another
_SEGMENT_FRAMES = 16


@dataclass(eq=False)
class _KVAEState(DecodeState):
    """A KVAE stream: one decoder cache per lane, and the latent frames fed but not yet decoded."""

    # (lane, its cache): a lane is the batch slice decoded together (the whole batch, or one entry under
    # use_slicing); the cache is the dict diffusers' _decode makes and hands to every decoder call
    lanes: list[tuple[slice, dict[Any, Any]]] = field(default_factory=list)
    held: list[Tensor] = field(default_factory=list)  # the open segment's latent frames, in order
    segments: int = 0  # segments decoded


class KVAEVideoChunkedDecoder(ChunkedDecoder):
    """Publishes each segment of an ``AutoencoderKLKVAEVideo`` decode as soon as it is decoded.

    For the instance the user already has (same module, same weights). The chunks concatenated along T
    are ``torch.equal`` to ``vae.decode(z).sample`` with the instance's ``use_slicing``: the same decoder
    calls on the same segments in the same order. ``vae.decode`` has no tiling (``use_tiling`` is a flag it
    never reads), so neither has this. ``streams`` is True: 17 frames for the first segment (5 latents),
    16 for each full one after. Latents may arrive in pieces (:meth:`start`, :meth:`feed`, :meth:`end`):
    frames decoded from any split equal the whole decode; a piece's frames leave once a segment is full,
    the short last segment's at :meth:`end`. Chunks are nominally in [-1, 1]; the decoder does not clamp
    (neither does ``vae.decode``), so values may overshoot.

    Memory: the cache is the one ``vae.decode`` keeps (the last input frames of every causal convolution);
    frame-major order keeps one per batch entry under ``use_slicing``, where ``vae.decode`` keeps one at a
    time. A stream also holds the latent frames of its open segment (fewer than one segment).
    """

    vae: AutoencoderKLKVAEVideo
    vae_classes = (AutoencoderKLKVAEVideo,)
    channels_key = "z_channels"
    takes_pieces = True

    def __init__(self, vae: AutoencoderKLKVAEVideo, *, drain: bool = False) -> None:
        super().__init__(vae, drain=drain)
        ratio = int(vae.config["temporal_compress_times"])
        # latent frames of the first segment and of every full one after, as _decode rounds them
        self._first_segment = math.ceil((_SEGMENT_FRAMES + 1) / ratio)
        self._segment = math.ceil(_SEGMENT_FRAMES / ratio)
        self._temporal_upsamplers = sum(
            isinstance(module, KVAECachedPXSUpsample) and module.temporal_compress
            for module in vae.decoder.modules()
        )

    def output_frames(self, latent_frames: int) -> int:
        """Frames per entry of a decode of ``latent_frames`` latent frames, segment by segment."""
        frames = 0
        for index, size in enumerate(self._segment_sizes(latent_frames)):
            for _ in range(self._temporal_upsamplers):  # each doubles; the first call drops its first copy
                size = 1 if size == 1 else 2 * size - (index == 0)
            frames += size
        return frames

    def start(self, batch: int, height: int, width: int) -> DecodeState:
        """Begin a stream of latent pieces [batch, z_channels, t, height, width]; ``use_slicing`` is read
        now."""
        for name, size in (("batch", batch), ("height", height), ("width", width)):
            if not is_int(size) or size < 1:
                raise ValueError(f"{type(self).__name__}.start: {name} must be a positive int, got {size!r}")
        lanes = [(entries, self._new_cache()) for entries in self.entry_slices(batch)]
        return _KVAEState(owner=self, batch=batch, height=height, width=width, lanes=lanes)

    def piece_chunks(self, state: DecodeState, z: Tensor) -> Generator[Tensor, None, None]:
        assert isinstance(state, _KVAEState)
        state.held.append(z)
        while sum(piece.shape[2] for piece in state.held) >= self._size_of(state.segments):
            frames = state.held[0] if len(state.held) == 1 else torch.cat(state.held, dim=2)
            size = self._size_of(state.segments)
            rest = frames[:, :, size:]
            state.held = [rest] if rest.shape[2] > 0 else []
            state.decoded += size
            yield self._decode_segment(state, frames[:, :, :size])
        # The frames left wait for the next piece or the end; a copy, as the caller may reuse its tensor.
        state.held = [torch.cat(state.held, dim=2).clone()] if state.held else []
        state.decoded = state.fed

    def end_chunks(self, state: DecodeState) -> Iterator[Tensor]:
        assert isinstance(state, _KVAEState)
        complete = state.decoded == state.fed  # else a piece was left half decoded: nothing is final
        held, lanes = state.held, state.lanes
        state.held, state.lanes = [], []  # the stream lets go of its caches now; the last segment takes them
        if not complete or not held:
            return iter(())
        return self._last_segment(state, torch.cat(held, dim=2), lanes)

    def _last_segment(
        self, state: _KVAEState, frames: Tensor, lanes: list[tuple[slice, dict[Any, Any]]]
    ) -> Iterator[Tensor]:
        """The short last segment, decoded when its chunk is asked for (never, by a stream aborted)."""
        state.lanes = lanes
        try:
            yield self._decode_segment(state, frames)
        finally:
            state.lanes = []

    def _decode_segment(self, state: _KVAEState, frames: Tensor) -> Tensor:
        """One decoder call a lane for one segment, as ``_decode`` makes it; one chunk for the whole batch."""
        outputs: list[Tensor] = [self.vae.decoder(frames[entries], cache) for entries, cache in state.lanes]
        state.segments += 1
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)  # as vae.decode joins slices

    def _size_of(self, index: int) -> int:
        """Latent frames of full segment ``index``."""
        return self._first_segment if index == 0 else self._segment

    def _segment_sizes(self, latent_frames: int) -> list[int]:
        """The greedy cut of ``latent_frames``: full segments, then what is left."""
        sizes: list[int] = []
        left = latent_frames
        while left > 0:
            sizes.append(min(self._size_of(len(sizes)), left))
            left -= sizes[-1]
        return sizes

    def _new_cache(self) -> dict[Any, Any]:
        # The one touch of a diffusers private here: the empty decoder cache _decode makes for each decode.
        cache: dict[Any, Any] = self.vae._make_decoder_cache()
        return cache
