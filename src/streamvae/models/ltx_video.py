"""Streaming decode for diffusers' ``AutoencoderKLLTXVideo`` (LTX-Video) and ``AutoencoderKLLTX2Video``.

LTX-Video's decoder is not causal in time (its convolutions pad both sides), so one decoder call needs all
of its latent frames before any output frame is known; LTX-2's is causal by default, but neither keeps
state from one call to the next, and ``vae.decode`` makes one call for the whole clip. It walks time only
with temporal tiling on (``use_framewise_decoding``, off by default): windows of
``tile_sample_min_num_frames // 8 + 1`` latent frames (3 by default) start every
``tile_sample_stride_num_frames // 8`` latents (1), every window but the first drops its last frame, and
the last ``min - stride`` sample frames (8) of a window blend into the first frames of the next. A
window's kept frames (9, then 8 a window) are final once it is blended and are published right away.
With temporal tiling off, the whole clip is one decoder call, whose frames are then published a latent
frame's worth at a time (1, then 8 a chunk).

Unlike HunyuanVideo, diffusers keeps the first frame of every later LTX window and drops its last;
streaming reproduces that exactly, as it must to equal ``vae.decode``.
"""

from __future__ import annotations

import inspect
from collections.abc import Generator
from typing import Any, cast

from diffusers.models.autoencoders.autoencoder_kl_ltx import AutoencoderKLLTXVideo
from diffusers.models.autoencoders.vae import DecoderOutput
from torch import Tensor

from streamvae.models._base import ChunkedDecoder
from streamvae.models._common import overlapping_window_chunks, split_frames, uses_spatial_tiling

try:
    from diffusers.models.autoencoders.autoencoder_kl_ltx2 import AutoencoderKLLTX2Video
except ImportError:  # diffusers before LTX-2
    _LTX_CLASSES: tuple[type, ...] = (AutoencoderKLLTXVideo,)
else:
    _LTX_CLASSES = (AutoencoderKLLTXVideo, AutoencoderKLLTX2Video)

__all__ = ["LTXVideoChunkedDecoder"]


class LTXVideoChunkedDecoder(ChunkedDecoder):
    """Publishes each temporal window of an LTX-Video / LTX-2 decode as soon as no later window can change it.

    ``temb`` (the decode timestep the pipelines pass as ``vae.decode(z, temb)``, for checkpoints with
    ``timestep_conditioning``) and, for LTX-2, ``causal`` pass through to every decoder call as ``decode``
    passes them. The concatenated chunks are ``torch.equal`` to ``vae.decode(z, temb).sample`` with the
    instance's settings (temporal tiling, spatial tiling inside each window). With ``use_slicing`` each
    entry decodes alone with its own row of ``temb``, or the one row there is (diffusers' own sliced
    ``decode`` mis-pairs latents and timesteps when ``temb`` is given and fails; the result here equals
    decoding the entries one by one). Chunks are in [-1, 1] nominally.

    Checkpoints with ``decoder_inject_noise`` draw noise from the global RNG in every decoder call; the
    result equals ``decode`` from the same RNG state except with ``use_slicing``, where entries interleave.
    """

    vae: AutoencoderKLLTXVideo | AutoencoderKLLTX2Video
    vae_classes = _LTX_CLASSES
    channels_key = "latent_channels"

    def __init__(
        self,
        vae: AutoencoderKLLTXVideo | AutoencoderKLLTX2Video,
        *,
        temb: Tensor | None = None,
        causal: bool | None = None,
    ) -> None:
        super().__init__(vae)
        self.temb = temb
        self._decoder_kwargs: dict[str, Any] = {}
        if "causal" in inspect.signature(vae.decode).parameters:
            self._decoder_kwargs["causal"] = causal
        elif causal is not None:
            raise TypeError(f"{type(vae).__name__}.decode takes no 'causal' argument (LTX-2 only)")

    @property
    def streams(self) -> bool:
        """True only with temporal tiling on (``use_framewise_decoding``, off by default): else the whole
        clip is one decoder call and one chunk."""
        return bool(self.vae.use_framewise_decoding)

    def entry_chunks(self, z: Tensor, entries: slice) -> Generator[Tensor, None, None]:
        vae = self.vae
        temb = self.temb
        if temb is not None and temb.ndim > 0 and temb.shape[0] > 1:
            temb = temb[entries]  # one timestep per entry; a single one applies to every entry

        def decode_window(latents: Tensor, first: bool) -> Tensor:
            return self._decode_window(latents, temb, first)

        min_window_latents = vae.tile_sample_min_num_frames // vae.temporal_compression_ratio
        if vae.use_framewise_decoding and z.shape[2] > min_window_latents:
            yield from overlapping_window_chunks(vae, z, decode_window)
        else:  # one decoder call; its frames still go to the encoder a latent frame's worth at a time
            yield from split_frames(
                decode_window(z, True), latent_frames=z.shape[2], step=vae.temporal_compression_ratio
            )

    def _decode_window(self, z: Tensor, temb: Tensor | None, first: bool) -> Tensor:
        """Decode latent frames ``z`` in one decoder call (spatially tiled if large), as diffusers does."""
        vae = self.vae
        decoded: Tensor
        if uses_spatial_tiling(vae, z.shape[-2], z.shape[-1]):
            decoded = cast(
                DecoderOutput, vae.tiled_decode(z, temb, return_dict=True, **self._decoder_kwargs)
            ).sample
        else:
            decoded = vae.decoder(z, temb, **self._decoder_kwargs)
        # diffusers drops the last frame of every later window (HunyuanVideo drops the first).
        return decoded if first else decoded[:, :, :-1]
