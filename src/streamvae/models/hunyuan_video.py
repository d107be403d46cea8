"""Streaming decode for diffusers' ``AutoencoderKLHunyuanVideo`` (HunyuanVideo).

HunyuanVideo's VAE walks time in overlapping windows ("framewise decoding", on by default): with
``tile_sample_min_num_frames=16`` and ``tile_sample_stride_num_frames=12`` each window decodes 5 latent
frames, windows start every 3 latents, and the last 4 frames of a window blend into the first 4 of the
next. Every window but the first drops its first frame (the decoder treats a window's first latent as an
image). Each window's kept frames (13, then 12 a window) are final once it is blended, so they are
published right away.

Within one decoder call nothing streams: GroupNorm normalizes over all frames of the call. A latent that
fits in one window (``frames <= tile_sample_min_num_frames // 4``), or any latent with
``use_framewise_decoding`` off, decodes in one call, whose frames are then published a latent frame's
worth at a time (1, then 4 a chunk).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import cast

from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import AutoencoderKLHunyuanVideo
from diffusers.models.autoencoders.vae import DecoderOutput
from torch import Tensor

from streamvae.models._base import ChunkedDecoder
from streamvae.models._common import overlapping_window_chunks, split_frames, uses_spatial_tiling

__all__ = ["HunyuanVideoChunkedDecoder"]


class HunyuanVideoChunkedDecoder(ChunkedDecoder):
    """Publishes each window of a HunyuanVideo decode as soon as no later window can change it.

    The concatenated chunks are ``torch.equal`` to ``vae.decode(z).sample`` with the instance's settings:
    framewise windows, spatial tiling inside each window (``use_tiling``), and ``use_slicing``. Chunks are
    in [-1, 1] nominally (the decoder does not clamp; the pipelines' post-processing does).
    """

    vae: AutoencoderKLHunyuanVideo
    vae_classes = (AutoencoderKLHunyuanVideo,)
    channels_key = "latent_channels"

    @property
    def streams(self) -> bool:
        """True with framewise decoding on (the default): each window leaves once blended."""
        return bool(self.vae.use_framewise_decoding)

    def entry_chunks(self, z: Tensor, entries: slice) -> Generator[Tensor, None, None]:
        vae = self.vae
        min_window_latents = vae.tile_sample_min_num_frames // vae.temporal_compression_ratio
        if vae.use_framewise_decoding and z.shape[2] > min_window_latents:
            yield from overlapping_window_chunks(vae, z, self._decode_window)
        else:  # one decoder call; its frames still go to the encoder a latent frame's worth at a time
            yield from split_frames(
                self._decode_window(z, True), latent_frames=z.shape[2], step=vae.temporal_compression_ratio
            )

    def _decode_window(self, z: Tensor, first: bool) -> Tensor:
        """Decode latent frames ``z`` in one decoder call (spatially tiled if large), as diffusers does."""
        vae = self.vae
        decoded: Tensor
        if uses_spatial_tiling(vae, z.shape[-2], z.shape[-1]):
            decoded = cast(DecoderOutput, vae.tiled_decode(z, return_dict=True)).sample
        else:
            decoded = vae.decoder(vae.post_quant_conv(z))
        # A later window starts on a latent the previous one also decoded; its image-like first frame goes.
        return decoded if first else decoded[:, :, 1:]
