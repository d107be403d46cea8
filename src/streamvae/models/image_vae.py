"""Streaming decode of a video with diffusers' image VAE, ``AutoencoderKL``, a few frames a call.

``AutoencoderKL`` decodes images: ``vae.decode(z)`` takes ``[N, C, H, W]`` latents and gives one image per
latent, each image on its own (convolutions, GroupNorm and the mid-block's attention all work within one
image). The video pipelines built on it (AnimateDiff, I2VGenXL, PIA, text-to-video SD) flatten a video's
``[batch, frames]`` into that ``N`` and call ``vae.decode`` on a few frames at a time (their
``decode_chunk_size``) or on all of them. No frame waits for another, so each call's frames are final when
it returns.

The adapter takes BCTHW latents like every other and makes the same kind of call on frame ranges: a step
decodes frames ``[k·n, (k+1)·n)`` of every batch entry in one ``vae.decode``-equivalent call (``n`` the
``decode_chunk_size``) and publishes them. With ``use_slicing`` on, ``vae.decode`` decodes each image of a
call alone; so does the adapter, and then each frame leaves as soon as it is decoded. Batched kernels round
differently from one-image ones (on CPU, a few 1e-6 in float32), so a call of several frames equals
``vae.decode`` of exactly those frames as a batch, and ``decode_chunk_size=1``, the default, equals
``vae.decode(z[:, :, t])`` for every ``t``.
"""

from __future__ import annotations

from collections.abc import Generator

from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL
from torch import Tensor

from streamvae._checks import check_int
from streamvae.models._base import ChunkedDecoder

__all__ = ["ImageVAEChunkedDecoder"]


class ImageVAEChunkedDecoder(ChunkedDecoder):
    """Decodes a video latent with an ``AutoencoderKL``, ``decode_chunk_size`` frames a call, publishing each
    call's frames as soon as it returns.

    ``decode_chunk_size`` (default 1) is the latent frames of every entry decoded in one call, flattened
    entry-major as the pipelines flatten them (``[B·n, C, H, W]``). The concatenated chunks equal, bit for
    bit, the calls ``vae.decode(z[:, :, k·n:(k+1)·n].transpose(1, 2).flatten(0, 1)).sample`` reshaped to
    BCTHW; with the default, ``vae.decode(z[:, :, t]).sample`` for every frame ``t``. The instance's
    settings are read at each decode as ``vae.decode`` reads them: ``use_tiling`` (``_decode`` tiles each
    image), ``use_slicing`` (each image of a call decoded alone; the adapter then publishes a frame at a
    time). The latents are those ``vae.decode`` takes, in BCTHW: the pipelines' ``latents /
    scaling_factor``. Chunks are nominally in [-1, 1]; the decoder does not clamp (the pipelines'
    post-processing does).

    Memory: one call's activations (``decode_chunk_size`` images, one with ``use_slicing``).
    """

    vae: AutoencoderKL
    vae_classes = (AutoencoderKL,)
    channels_key = "latent_channels"

    def __init__(self, vae: AutoencoderKL, *, decode_chunk_size: int = 1, drain: bool = False) -> None:
        super().__init__(vae, drain=drain)
        #: latent frames of every entry a call decodes
        self.decode_chunk_size = check_int(
            "decode_chunk_size", decode_chunk_size, minimum=1, owner=type(self).__name__
        )

    def output_frames(self, latent_frames: int) -> int:
        """One image per latent frame."""
        return latent_frames

    def entry_chunks(self, z: Tensor, entries: slice) -> Generator[Tensor, None, None]:
        # use_slicing: vae.decode decodes each image of a call alone, so each frame is its own call (the base
        # has already split the batch into entries)
        size = 1 if self.vae.use_slicing else self.decode_chunk_size
        for start in range(0, z.shape[2], size):
            yield self._decode_call(z[:, :, start : start + size])

    def _decode_call(self, z: Tensor) -> Tensor:
        """``vae.decode`` of ``z``'s frames flattened as the pipelines flatten them, as BCTHW; through
        ``_decode`` (tiling, ``post_quant_conv``, the decoder), without ``decode``'s forward hook, which the
        base runs once per decode."""
        batch, _, frames = z.shape[:3]
        latents = z.transpose(1, 2).flatten(0, 1).contiguous()  # [B, C, n, H, W] -> [B·n, C, H, W]
        images: Tensor = self.vae._decode(latents, return_dict=False)[0]
        return images.reshape(batch, frames, *images.shape[1:]).transpose(1, 2)
