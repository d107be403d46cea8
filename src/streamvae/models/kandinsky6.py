"""Streaming decode for diffusers' ``Kandinsky6SRVAE`` (the causal K-VAE of Kandinsky 6's super-resolution).

Its ``vae.decode`` walks time in segments: the latent is cut into a first segment of ``s + 1`` latent
frames and then segments of ``s`` (``s = 16 // r``, ``r`` the VAE's ``temporal_compression_ratio``: 5, 4,
4, …, the last taking what is left), and each segment is one call of the decoder module. The calls share
a cache, a dict the decoder makes (``vae.decoder.make_cache()``) and that ``decode`` passes to each call:
every causal convolution keeps there the input frames the next segment's first window needs, every
spatial norm a flag that its first segment is behind it. Nothing in a later call reads or changes an
earlier call's output, so a segment's frames are final as soon as it is decoded and are published right
away.

The cut is greedy, so latents may also arrive in pieces; the walk, the pieces and the cache made per
stream are ``SegmentDecoder``'s (``models/_base.py``), shared with KVAE.

Frames per segment follow the decoder's temporal upsamplers: each doubles a call's frames, but the first
call drops the extra copy of its first frame (``T + 1`` latent frames become ``2T + 1``): the first segment
of ``n`` latent frames gives ``1 + r (n − 1)`` frames, every later one ``r n``, ``1 + r (T − 1)`` in all.
``vae.decode`` reads no slicing or tiling setting: the whole batch goes through each call.
"""

from __future__ import annotations

from typing import Any

from diffusers.models.autoencoders.autoencoder_kandinsky6_sr import Kandinsky6SRUpsample, Kandinsky6SRVAE
from torch import Tensor

from streamvae.models._base import SegmentDecoder

__all__ = ["Kandinsky6SRChunkedDecoder"]

#: ``autoencoder_kandinsky6_sr.SEGMENT_FRAMES``: sample frames a segment adds (the first adds one more);
#: ``vae.decode`` never uses another
_SEGMENT_FRAMES = 16


class Kandinsky6SRChunkedDecoder(SegmentDecoder[dict[str, Any]]):
    """Publishes each segment of a ``Kandinsky6SRVAE`` decode as soon as it is decoded.

    For the instance the user already has (same module, same weights). The chunks concatenated along T are
    ``torch.equal`` to ``vae.decode(z).sample``: the same decoder calls on the same segments in the same
    order, with a cache of their own. ``streams`` is True: 17 frames for the first segment (5 latents at
    ``r`` 4), 16 for each full one after. Latents may arrive in pieces (:meth:`start`, :meth:`feed`,
    :meth:`end`): frames decoded from any split equal the whole decode; a piece's frames leave once a
    segment is full, the short last segment's at :meth:`end`. Chunks are nominally in [-1, 1]; the decoder
    does not clamp (neither does ``vae.decode``; the super-resolution pipeline rescales and clamps), so
    values may overshoot.

    Memory: the cache ``vae.decode`` keeps (the last input frames of every causal convolution), and the
    latent frames of the open segment (fewer than one segment).
    """

    vae: Kandinsky6SRVAE
    vae_classes = (Kandinsky6SRVAE,)
    channels_key = "latent_channels"

    def __init__(self, vae: Kandinsky6SRVAE, *, drain: bool = False) -> None:
        super().__init__(vae, drain=drain)
        # latent frames of every full segment after the first, as decode cuts them; the first takes the
        # leading latent frame too
        self.segment = _SEGMENT_FRAMES // int(vae.config["temporal_compression_ratio"])
        self.first_segment = self.segment + 1
        self._temporal_upsamplers = sum(
            isinstance(module, Kandinsky6SRUpsample) and module.compress_time
            for module in vae.decoder.modules()
        )

    def segment_frames(self, latent_frames: int, *, first: bool) -> int:
        """Each temporal upsampler doubles a call's frames; the first call drops its extra first copy."""
        frames = latent_frames
        for _ in range(self._temporal_upsamplers):
            frames = 2 * frames - first
        return frames

    def new_caches(self, batch: int) -> dict[str, Any]:
        """The dict ``vae.decode`` makes and hands to every decoder call (one for the whole batch)."""
        cache: dict[str, Any] = self.vae.decoder.make_cache()
        return cache

    def decode_segment(self, frames: Tensor, caches: dict[str, Any]) -> Tensor:
        """One decoder call for one segment, as ``decode`` makes it."""
        decoded: Tensor = self.vae.decoder(frames, caches)
        return decoded
