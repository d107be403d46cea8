"""Streaming decode for diffusers' ``AutoencoderKLTemporalDecoder`` (Stable Video Diffusion).

SVD's VAE decodes frames, not a video latent: ``vae.decode(z, num_frames)`` takes ``[batch·frames, C, H,
W]`` and gives one video frame per latent frame. Its temporal decoder mixes the frames of one call (temporal
attention and convolutions, ``time_conv_out``), so frames are final only when their call returns, and a
call's frames depend on which frames it holds. ``StableVideoDiffusionPipeline.decode_latents`` flattens
``[batch, frames]``, scales by ``1 / scaling_factor`` and calls ``vae.decode`` once per
``decode_chunk_size`` frames; each call's frames are final when it returns, so each is published right away.

The adapter takes BCTHW latents and makes the same calls on frame ranges: a step decodes frames ``[k·n,
(k+1)·n)`` of every batch entry in one decoder call (``num_frames`` = the frames in that range), so each
chunk holds the whole batch. For one entry these are exactly the pipeline's calls. For several, each entry's
frames are those of the pipeline decoding that entry alone: the pipeline itself chunks the flattened
``[batch·frames]`` axis, so where ``n`` does not divide the frame count one of its calls joins the end of
one video to the start of the next and decodes them as one clip.
"""

from __future__ import annotations

from collections.abc import Generator

import torch
from diffusers.models.autoencoders.autoencoder_kl_temporal_decoder import AutoencoderKLTemporalDecoder
from torch import Tensor

from streamvae._checks import check_int
from streamvae.models._base import ChunkedDecoder
from streamvae.models._common import split_frames

__all__ = ["StableVideoChunkedDecoder"]


class StableVideoChunkedDecoder(ChunkedDecoder):
    """Publishes each ``decode_chunk_size`` frames of an ``AutoencoderKLTemporalDecoder`` decode as soon
    as their decoder call returns.

    ``decode_chunk_size`` is the pipeline's: the latent frames decoded together (default None: every frame
    in one call, as the pipeline does by default). A latent [B, C, F, H, W] decodes in ``ceil(F / n)``
    calls, each the frames ``[k·n, (k+1)·n)`` of every entry. The concatenated chunks are ``torch.equal``
    to those calls made with ``vae.decode(z_k, num_frames=m)`` on ``z_k`` = that range flattened as the
    pipeline flattens it (``[B·m, C, H, W]``, entry-major), reshaped to BCTHW; for batch 1 that is
    ``decode_latents`` itself. ``streams`` is True when ``decode_chunk_size`` is set (a latent with more
    frames than that streams); a decode in one call hands its frames on one at a time. ``use_slicing`` is
    ignored, as ``vae.decode`` ignores it. The latents are those ``vae.decode`` takes, in BCTHW: the
    pipeline's ``1 / scaling_factor * latents`` with frames and channels swapped. Chunks are in [-1, 1]
    nominally (the decoder does not clamp; the pipeline's post-processing does).

    Memory: one call's activations, as the pipeline's ``decode_chunk_size`` bounds them.
    """

    vae: AutoencoderKLTemporalDecoder
    vae_classes = (AutoencoderKLTemporalDecoder,)
    channels_key = "latent_channels"

    def __init__(
        self, vae: AutoencoderKLTemporalDecoder, *, decode_chunk_size: int | None = None, drain: bool = False
    ) -> None:
        super().__init__(vae, drain=drain)
        if decode_chunk_size is not None:
            check_int("decode_chunk_size", decode_chunk_size, minimum=1, owner=type(self).__name__)
        #: latent frames a decoder call decodes (None: all of them)
        self.decode_chunk_size = decode_chunk_size

    @property
    def streams(self) -> bool:
        """True with a ``decode_chunk_size``: a latent of more frames leaves one call's frames at a time."""
        return self.decode_chunk_size is not None

    def entry_slices(self, batch: int) -> list[slice]:
        """One: ``vae.decode`` decodes every entry of a call together, whatever ``use_slicing`` says."""
        return [slice(None)]

    def entry_chunks(self, z: Tensor, entries: slice) -> Generator[Tensor, None, None]:
        num_frames = z.shape[2]
        size = self.decode_chunk_size or num_frames
        if size >= num_frames:  # one call; its frames still go to the encoder one at a time
            yield from split_frames(self._decode_call(z), latent_frames=z.shape[2], step=1)
            return
        for start in range(0, num_frames, size):
            yield self._decode_call(z[:, :, start : start + size])

    def _decode_call(self, z: Tensor) -> Tensor:
        """``vae.decode`` of ``z``'s frames as the pipeline flattens them, as BCTHW; without ``decode``'s
        forward hook, which the base runs once per decode."""
        batch, _, num_frames = z.shape[:3]
        latents = z.transpose(1, 2).flatten(0, 1).contiguous()  # [B, C, m, H, W] -> [B·m, C, H, W]
        # what vae.decode does with num_frames=m
        image_only_indicator = torch.zeros(batch, num_frames, dtype=latents.dtype, device=latents.device)
        frames: Tensor = self.vae.decoder(
            latents, num_frames=num_frames, image_only_indicator=image_only_indicator
        )
        # [B·m, 3, H', W'] -> BCTHW, as decode_latents reshapes it
        return frames.reshape(batch, num_frames, *frames.shape[1:]).transpose(1, 2)
