"""Decode for diffusers' ``AutoencoderKLCosmos`` (Cosmos 1.0's tokenizer), handed on a latent frame's
worth at a time.

``vae.decode`` runs ``post_quant_conv`` and the decoder once over the whole clip: ``_decode`` reads none of
the ``use_tiling`` / ``use_framewise_decoding`` flags (nor the tile or batch sizes) the class keeps, so a
decode is always one decoder call (one per batch entry with ``use_slicing``). Every latent frame but the
first gives ``temporal_compression_ratio`` (8) frames, the first one frame (the Haar unpatcher drops the
``patch_size - 1`` frames before it): 1 + 8 (T − 1) in all. No frame leaves the decoder call before it
returns, so the adapter makes that same call and then hands its frames on, 1 and then 8 a chunk, for the
encoder to take while the rest wait.

The decoder is causal (causal convolutions, temporal attention under a causal mask, GroupNorm over each
frame alone), but it keeps no cache between calls and its temporal upsampling treats a one-frame call
apart, so a decode in time batches through diffusers' modules is not the whole-clip decode.
"""

from __future__ import annotations

from diffusers.models.autoencoders.autoencoder_kl_cosmos import AutoencoderKLCosmos
from torch import Tensor

from streamvae.models._base import WholeClipDecoder

__all__ = ["CosmosChunkedDecoder"]


class CosmosChunkedDecoder(WholeClipDecoder):
    """Decodes an ``AutoencoderKLCosmos`` latent whole, as ``vae.decode`` does, then hands it on in chunks.

    The concatenated chunks are ``torch.equal`` to ``vae.decode(z).sample`` with the instance's
    ``use_slicing`` (the only setting ``vae.decode`` reads: like it, the adapter ignores ``use_tiling`` and
    ``use_framewise_decoding``). ``streams`` is False: the decoder needs the whole latent, so the first
    chunk (1 frame) leaves when the whole clip is decoded, then 8 frames a chunk: views of the clip, held
    until the last is released (memory: as ``vae.decode``). Chunks are nominally in [-1, 1]; the decoder
    does not clamp (neither does ``vae.decode``; the pipelines' post-processing does), so values may
    overshoot.
    """

    vae: AutoencoderKLCosmos
    vae_classes = (AutoencoderKLCosmos,)
    channels_key = "latent_channels"

    def decode_clip(self, z: Tensor) -> Tensor:
        """``post_quant_conv`` and the decoder, once over the whole clip, as ``_decode`` runs them."""
        video: Tensor = self.vae.decoder(self.vae.post_quant_conv(z))
        return video
