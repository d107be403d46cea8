"""Streaming decode for diffusers' ``AutoencoderKLMagvit`` (EasyAnimate).

Magvit's decoder is causal in time and walks it framewise: ``vae.decode`` runs the decoder on the first
latent frame alone (1 video frame), then on ``num_latent_frames_batch_size`` latent frames a call (1 by
default; ``temporal_compression_ratio`` frames each, 4 for EasyAnimate), 1 + 4(T−1) frames in all. Every
causal convolution keeps its last input frames from one call to the next (``prev_features``) and each
temporal upsampler remembers that the first call is past; nothing in a later call changes an earlier
call's frames, so each call's frames are final when it returns and are published right away.

Those caches live in the modules, where ``vae.decode`` leaves them between calls and clears them at its end.
Here each walk holds its own caches (``_Caches``): it puts them into the modules for one decoder call
and takes them out again right after, so between steps, after a decode stopped early and after a failure
inside a call, the modules hold no cache and ``vae.decode`` is unaffected. This touch of the modules' state
is this module's only reach into diffusers' internals.

With spatial tiling, diffusers is tile-major: each tile runs the whole time walk, then its caches are
cleared, and the tiles are blended afterwards. Here the loops are swapped (one cache set per tile, each
step's tiles blended on their own): the blend is elementwise per frame, so the result is the same tensor.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

from diffusers.models.autoencoders.autoencoder_kl_magvit import (
    AutoencoderKLMagvit,
    EasyAnimateCausalConv3d,
    EasyAnimateUpsampler3D,
)
from torch import Tensor, nn

from streamvae.models._base import ChunkedDecoder
from streamvae.models._common import blend_tiles

__all__ = ["MagvitChunkedDecoder"]

_CACHING_MODULES = (EasyAnimateCausalConv3d, EasyAnimateUpsampler3D)  # what ``_clear_conv_cache`` clears
_CACHE = "prev_features"  # the attribute where each of them keeps its cache (None: clear)


class _Caches:
    """One walk's decoder caches (one per tile when tiled): in the modules only for the length of a call."""

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        self.modules = modules
        self.features: list[object] = [None] * len(modules)  # a fresh walk: no call made yet

    def decode(self, decoder: nn.Module, latents: Tensor) -> Tensor:
        """One decoder call continuing this walk; it leaves the modules as clean as ``vae.decode`` does."""
        for module, features in zip(self.modules, self.features, strict=True):
            setattr(module, _CACHE, features)
        try:
            frames: Tensor = decoder(latents)
            self.features = [getattr(module, _CACHE) for module in self.modules]
        finally:
            for module in self.modules:
                setattr(module, _CACHE, None)
        return frames


class MagvitChunkedDecoder(ChunkedDecoder):
    """Publishes each decoder call of an ``AutoencoderKLMagvit`` decode as soon as it returns.

    The concatenated chunks are ``torch.equal`` to ``vae.decode(z).sample`` with the instance's settings
    (``num_latent_frames_batch_size``, ``use_tiling`` and the tile sizes), read at each decode: 1 frame
    for the first latent frame, then ``temporal_compression_ratio`` frames a latent frame. ``streams`` is
    True. Chunks are in [-1, 1] nominally (the decoder does not clamp; the pipeline's post-processing
    does). The latents are those ``vae.decode`` takes: the EasyAnimate pipeline's
    ``1 / vae.config.scaling_factor * latents``.

    With ``use_slicing`` and batch > 1, each entry decodes alone, with caches of its own: the same as
    ``vae.decode`` of each entry. (diffusers' own sliced ``decode`` clears the caches only after the
    last entry, so every entry after the first continues the previous one's caches, gets more frames
    than the first and the join raises; with tiling on it clears them per tile and equals this.)

    Memory: the caches of one walk are what ``vae.decode`` keeps; frame-major tiling keeps one set per
    tile, and ``use_slicing`` one per entry, where ``vae.decode`` keeps one at a time. The module's state is
    shared: as with ``vae.decode``, one decoder call at a time per module (steps of several decodes may
    interleave in one thread).
    """

    vae: AutoencoderKLMagvit
    vae_classes = (AutoencoderKLMagvit,)
    channels_key = "latent_channels"

    def entry_chunks(self, z: Tensor, entries: slice) -> Generator[Tensor, None, None]:
        vae = self.vae
        modules: list[nn.Module] = [m for m in vae.decoder.modules() if isinstance(m, _CACHING_MODULES)]
        ratio = int(vae.spatial_compression_ratio)
        tile_height = vae.tile_sample_min_height // ratio
        tile_width = vae.tile_sample_min_width // ratio
        # _decode's own test (it compares the width with the tile height and the height with its width)
        if vae.use_tiling and (z.shape[-1] > tile_height or z.shape[-2] > tile_width):
            yield from self._tiled_calls(z, modules)
            return
        latents = vae.post_quant_conv(z)  # over the whole latent, as _decode runs it
        caches = _Caches(modules)
        for start, end in self._latent_calls(z.shape[2]):
            yield caches.decode(vae.decoder, latents[:, :, start:end])

    def _latent_calls(self, num_frames: int) -> Generator[tuple[int, int], None, None]:
        """The [start, end) latent ranges of ``_decode``'s decoder calls: the first frame alone, then
        ``num_latent_frames_batch_size`` a call."""
        yield 0, 1
        batch_size = self.vae.num_latent_frames_batch_size
        for start in range(1, num_frames, batch_size):
            yield start, min(start + batch_size, num_frames)

    def _tiled_calls(self, z: Tensor, modules: Sequence[nn.Module]) -> Generator[Tensor, None, None]:
        """``tiled_decode`` with the tile and time loops swapped: one blended chunk per decoder call."""
        vae = self.vae
        height, width = z.shape[-2:]
        ratio = int(vae.spatial_compression_ratio)
        tile_height = vae.tile_sample_min_height // ratio
        tile_width = vae.tile_sample_min_width // ratio
        stride_height = vae.tile_sample_stride_height // ratio
        stride_width = vae.tile_sample_stride_width // ratio
        # post_quant_conv per tile over all its frames, as tiled_decode runs it; each tile a walk of its own
        tiles = [
            [
                (vae.post_quant_conv(z[:, :, :, i : i + tile_height, j : j + tile_width]), _Caches(modules))
                for j in range(0, width, stride_width)
            ]
            for i in range(0, height, stride_height)
        ]
        blend = (
            vae.tile_sample_min_height - vae.tile_sample_stride_height,
            vae.tile_sample_min_width - vae.tile_sample_stride_width,
        )
        keep = (vae.tile_sample_stride_height, vae.tile_sample_stride_width)
        for start, end in self._latent_calls(z.shape[2]):
            rows = [
                [caches.decode(vae.decoder, tile[:, :, start:end]) for tile, caches in row] for row in tiles
            ]
            yield blend_tiles(vae, rows, blend=blend, keep=keep)[:, :, :, : height * ratio, : width * ratio]
