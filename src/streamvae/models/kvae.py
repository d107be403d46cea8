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

The cut is greedy, so latents may also arrive in pieces; the walk, the pieces and the caches made per
stream (one a batch lane here) are ``SegmentDecoder``'s (``models/_base.py``), shared with
Kandinsky 6 SR.

Frames per segment follow the decoder's temporal upsamplers: each doubles a call's frames (the first
call's first frame stays single), but a call of one latent frame stays one frame. So a latent whose last
segment holds a single latent frame decodes to fewer than ``1 + r (T - 1)`` frames (6 latents: 17 + 1),
as ``vae.decode`` does.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from diffusers.models.autoencoders.autoencoder_kl_kvae_video import (
    AutoencoderKLKVAEVideo,
    KVAECachedPXSUpsample,
)
from torch import Tensor

from streamvae.models._base import SegmentDecoder

__all__ = ["KVAEVideoChunkedDecoder"]

#: ``AutoencoderKLKVAEVideo._decode``'s ``seg_len``: sample frames a segment adds (the first adds one more);
#: ``vae.decode`` never passes another
_SEGMENT_FRAMES = 16

#: a stream's caches: (lane, its cache) per lane, a lane the batch slice decoded together (the whole
#: batch, or one entry under use_slicing), its cache the dict diffusers' _decode makes and hands to every
#: decoder call
_Lanes = list[tuple[slice, dict[Any, Any]]]


class KVAEVideoChunkedDecoder(SegmentDecoder[_Lanes]):
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

    def __init__(self, vae: AutoencoderKLKVAEVideo, *, drain: bool = False) -> None:
        super().__init__(vae, drain=drain)
        ratio = int(vae.config["temporal_compress_times"])
        # latent frames of the first segment and of every full one after, as _decode rounds them
        self.first_segment = math.ceil((_SEGMENT_FRAMES + 1) / ratio)
        self.segment = math.ceil(_SEGMENT_FRAMES / ratio)
        self._temporal_upsamplers = sum(
            isinstance(module, KVAECachedPXSUpsample) and module.temporal_compress
            for module in vae.decoder.modules()
        )

    def segment_frames(self, latent_frames: int, *, first: bool) -> int:
        """Each temporal upsampler doubles a call's frames (the first call drops its extra first copy), but
        a call of one latent frame stays one frame."""
        frames = latent_frames
        for _ in range(self._temporal_upsamplers):
            frames = 1 if frames == 1 else 2 * frames - first
        return frames

    def new_caches(self, batch: int) -> _Lanes:
        """One empty decoder cache a lane; ``use_slicing`` is read now."""
        return [(entries, self._new_cache()) for entries in self.entry_slices(batch)]

    def decode_segment(self, frames: Tensor, caches: _Lanes) -> Tensor:
        """One decoder call a lane for one segment, as ``_decode`` makes it; one chunk for the whole batch."""
        outputs: list[Tensor] = [self.vae.decoder(frames[entries], cache) for entries, cache in caches]
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)  # as vae.decode joins slices

    def _new_cache(self) -> dict[Any, Any]:
        # The one touch of a diffusers private here: the empty decoder cache _decode makes for each decode.
        cache: dict[Any, Any] = self.vae._make_decoder_cache()
        return cache
