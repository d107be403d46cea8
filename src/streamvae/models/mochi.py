"""Decode for diffusers' ``AutoencoderKLMochi`` (Mochi 1), handed on a latent frame's worth at a time.

``vae.decode`` runs the decoder once over the whole clip (``use_framewise_decoding`` is off by default),
or, with ``use_tiling`` and a latent larger than one tile, once per spatial tile over the whole clip
(``tiled_decode``), blending the tiles. Every latent frame gives ``temporal_compression_ratio`` (6)
frames, and the first 5 of the clip are dropped (``drop_last_temporal_frames``, on by default): 1 +
6 (T − 1) frames in all. No frame leaves a decoder call before the call returns, so the adapter makes
that same call over the whole clip and then hands its frames on, 1 and then 6 a chunk, for the encoder to
take while the rest wait.

The decoder itself would allow more: it has no attention, its GroupNorm normalizes each frame alone and
its convolutions are causal, so no frame depends on a later latent. But those convolutions pad the clip's
start by repeating its first frame and carry nothing from one call to the next, so a decode in time
batches through diffusers' modules is not the whole-clip decode. Streaming would need the adapter to carry
each convolution's last frames itself, re-walking the decoder's layers, and would not be bit-equal (a
convolution rounds differently over a different number of frames). diffusers' own framewise path does
not work (see :class:`MochiChunkedDecoder`), so the adapter refuses it rather than reproduce it.
"""

from __future__ import annotations

from typing import cast

from diffusers.models.autoencoders.autoencoder_kl_mochi import AutoencoderKLMochi
from diffusers.models.autoencoders.vae import DecoderOutput
from torch import Tensor

from streamvae.models._base import WholeClipDecoder
from streamvae.models._common import uses_spatial_tiling

__all__ = ["MochiChunkedDecoder"]


class MochiChunkedDecoder(WholeClipDecoder):
    """Decodes an ``AutoencoderKLMochi`` latent whole, as ``vae.decode`` does, then hands it on in chunks.

    The concatenated chunks are ``torch.equal`` to ``vae.decode(z).sample`` with the instance's settings:
    the same decoder call (or ``tiled_decode`` with ``use_tiling`` and a latent larger than a tile),
    ``use_slicing``, and ``drop_last_temporal_frames``. ``streams`` is False: the decoder needs the whole
    latent, so the first chunk (1 frame) leaves when the whole clip is decoded, then 6 frames a chunk:
    views of the clip, held until the last is released (memory: as ``vae.decode``).
    Chunks are nominally in [-1, 1]; the decoder does not clamp (neither does ``vae.decode``; the
    pipeline's post-processing does), so values may overshoot.

    ``vae.use_framewise_decoding`` is refused (ValueError, before any work): diffusers'
    ``_enable_framewise_decoding()`` switches the causal convolutions to constant padding, which loses
    their spatial padding, so ``vae.decode`` raises; the flag set alone decodes every
    ``num_latent_frames_batch_size`` latent frames without the ones before, so the batches do not join up.
    """

    vae: AutoencoderKLMochi
    vae_classes = (AutoencoderKLMochi,)
    channels_key = "latent_channels"

    def output_frames(self, latent_frames: int) -> int:
        """``r`` frames a latent frame (``r`` the temporal compression), less ``r - 1`` with
        ``drop_last_temporal_frames`` (``vae.decode`` drops them whenever there are ``r``: always)."""
        ratio = self.temporal_ratio
        frames = latent_frames * ratio
        return frames - (ratio - 1) if self.vae.drop_last_temporal_frames else frames

    def check_latents(self, z: object, *, owner: str | None = None) -> None:
        """The base's latent checks, and a ValueError while ``vae.use_framewise_decoding`` is on (why: the
        class docstring), so a decode is refused before it starts."""
        super().check_latents(z, owner=owner)
        if self.vae.use_framewise_decoding:
            raise ValueError(
                f"{owner or type(self).__name__}: vae.use_framewise_decoding is on, and diffusers' framewise "
                "Mochi decode does not work: _enable_framewise_decoding() switches the causal convolutions "
                "to constant padding, which loses their spatial padding (vae.decode fails), and the flag "
                f"alone decodes every {self.vae.num_latent_frames_batch_size} latent frames without the "
                "ones before (the batches do not join up); set vae.use_framewise_decoding = False to "
                "decode the whole clip, as vae.decode does by default"
            )

    def decode_clip(self, z: Tensor) -> Tensor:
        """The decoder once over the whole clip (or ``tiled_decode``), dropping frames as ``_decode`` does."""
        vae = self.vae
        if uses_spatial_tiling(vae, z.shape[-2], z.shape[-1]):
            return cast(DecoderOutput, vae.tiled_decode(z, return_dict=True)).sample  # drops frames itself
        video: Tensor
        video, _ = vae.decoder(z)
        ratio = self.temporal_ratio
        if vae.drop_last_temporal_frames and video.shape[2] >= ratio:
            video = video[:, :, ratio - 1 :]
        return video
