"""Streaming decode for diffusers' ``AutoencoderKLCogVideoX`` (CogVideoX and the pipelines built on it).

CogVideoX's decoder walks time in batches of ``num_latent_frames_batch_size`` latent frames (2), the first
batch taking the remainder (13 latents: 3, 2, 2, 2, 2, 2), and carries each causal convolution's last input
frames from one batch to the next (``conv_cache``). A batch's frames (9 for a first batch of 3, 8 for a
batch of 2) depend only on that batch and the cache, so each is final once decoded and is published right
away. GroupNorm inside the decoder normalizes over the frames of one call, which is why the batching, not
just the order, must be the one diffusers uses.

With spatial tiling, diffusers is tile-major: each tile runs the whole time loop with its own cache, and
the tiles are blended afterwards. Here the loops are swapped (every tile's cache is kept, each batch is
blended on its own): the blend is elementwise per frame, so the result is the same tensor. It costs one
cache per tile held at once, where diffusers holds one at a time.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

from diffusers.models.autoencoders.autoencoder_kl_cogvideox import AutoencoderKLCogVideoX
from torch import Tensor

from streamvae.models._base import ChunkedDecoder
from streamvae.models._common import blend_tiles, uses_spatial_tiling

__all__ = ["CogVideoXChunkedDecoder"]


class CogVideoXChunkedDecoder(ChunkedDecoder):
    """Publishes each latent batch of an ``AutoencoderKLCogVideoX`` decode as soon as it is decoded.

    The concatenated chunks are ``torch.equal`` to ``vae.decode(z).sample`` with the instance's settings
    (``num_latent_frames_batch_size``, ``use_tiling``, ``use_slicing``). Chunks are in [-1, 1] nominally.
    """

    vae: AutoencoderKLCogVideoX
    vae_classes = (AutoencoderKLCogVideoX,)
    channels_key = "latent_channels"

    def entry_chunks(self, z: Tensor, entries: slice) -> Generator[Tensor, None, None]:
        vae = self.vae
        latent_tile = (vae.tile_latent_min_height, vae.tile_latent_min_width)  # CogVideoX keeps its own
        if uses_spatial_tiling(vae, z.shape[-2], z.shape[-1], latent_tile=latent_tile):
            yield from self._tiled_batches(z)
            return
        conv_cache = None
        for start, end in self._latent_batches(z.shape[2]):
            latents = z[:, :, start:end]
            if vae.post_quant_conv is not None:
                latents = vae.post_quant_conv(latents)
            decoded: Tensor
            decoded, conv_cache = vae.decoder(latents, conv_cache=conv_cache)
            yield decoded

    def _latent_batches(self, num_frames: int) -> Iterator[tuple[int, int]]:
        """The [start, end) latent ranges diffusers decodes together: the first batch takes the remainder."""
        batch_size = self.vae.num_latent_frames_batch_size
        remainder = num_frames % batch_size
        for i in range(max(num_frames // batch_size, 1)):
            start = batch_size * i + (0 if i == 0 else remainder)
            yield start, batch_size * (i + 1) + remainder

    def _tiled_batches(self, z: Tensor) -> Generator[Tensor, None, None]:
        """diffusers' ``tiled_decode`` with the tile and time loops swapped: one blended chunk per batch."""
        vae = self.vae
        height, width = z.shape[-2:]
        overlap_height = int(vae.tile_latent_min_height * (1 - vae.tile_overlap_factor_height))
        overlap_width = int(vae.tile_latent_min_width * (1 - vae.tile_overlap_factor_width))
        blend_extent_height = int(vae.tile_sample_min_height * vae.tile_overlap_factor_height)
        blend_extent_width = int(vae.tile_sample_min_width * vae.tile_overlap_factor_width)
        row_limit_height = vae.tile_sample_min_height - blend_extent_height
        row_limit_width = vae.tile_sample_min_width - blend_extent_width
        tile_height, tile_width = vae.tile_latent_min_height, vae.tile_latent_min_width
        tile_rows = range(0, height, overlap_height)
        tile_columns = range(0, width, overlap_width)

        conv_caches: dict[tuple[int, int], object] = {}
        for start, end in self._latent_batches(z.shape[2]):
            rows: list[list[Tensor]] = []
            for i in tile_rows:
                row: list[Tensor] = []
                for j in tile_columns:
                    tile = z[:, :, start:end, i : i + tile_height, j : j + tile_width]
                    if vae.post_quant_conv is not None:
                        tile = vae.post_quant_conv(tile)
                    tile, conv_caches[i, j] = vae.decoder(tile, conv_cache=conv_caches.get((i, j)))
                    row.append(tile)
                rows.append(row)

            yield blend_tiles(
                vae,
                rows,
                blend=(blend_extent_height, blend_extent_width),
                keep=(row_limit_height, row_limit_width),
            )
