"""Streaming decode for diffusers' Wan-family VAEs: Wan 2.1, Wan 2.2 and Qwen-Image.

The decoders of ``AutoencoderKLWan`` and ``AutoencoderKLQwenImage`` are causal in time: ``vae.decode`` runs
the decoder once per latent frame, carrying a cache of the last two frames of every causal convolution from
one call to the next, and nothing later changes a frame once it has come out. The first latent frame gives 1
video frame, every later one 4 (1 + 4(T−1) in all). So each latent frame's output can be published as soon
as it is decoded.

:class:`WanChunkedDecoder` runs exactly the operations of ``vae.decode`` in the same order, per latent frame,
and publishes each latent frame's frames as one chunk: concatenated, the chunks are ``torch.equal`` to
``vae.decode(z).sample``, including with ``use_slicing`` and ``use_tiling``. It keeps its decoder caches to
itself (never the module's ``_feat_map``), so adapters over one module, or a decode after a failed one, do
not interfere.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeAlias

import torch
from diffusers.models.autoencoders.autoencoder_kl_qwenimage import (
    AutoencoderKLQwenImage,
    QwenImageCausalConv3d,
)
from diffusers.models.autoencoders.autoencoder_kl_wan import AutoencoderKLWan, WanCausalConv3d, unpatchify
from torch import Tensor

from streamvae.models._common import execution_device
from streamvae.protocol import check_latents, publish_chunks

__all__ = ["WanChunkedDecoder", "WanFamilyVAE", "denormalize_wan_latents"]

WanFamilyVAE: TypeAlias = AutoencoderKLWan | AutoencoderKLQwenImage
"""The diffusers VAE classes :class:`WanChunkedDecoder` wraps."""

_CAUSAL_CONVS = (WanCausalConv3d, QwenImageCausalConv3d)  # the layers that keep a slot in the decoder cache


def denormalize_wan_latents(vae: WanFamilyVAE, latents: Tensor) -> Tensor:
    """Turn a pipeline's ``output_type="latent"`` latents into what ``vae.decode`` takes.

    Diffusion pipelines return normalized latents; ``vae.decode`` casts and scales nothing. This repeats,
    operation for operation, what ``WanPipeline`` does before ``vae.decode`` (so the decode is bit-identical
    to the pipeline's own): cast to the VAE's execution device and dtype, then ``latents / latents_std +
    latents_mean`` with ``latents_std`` held as ``1 / config.latents_std``. The Qwen-Image pipeline applies
    the same formula.

    Raises ValueError unless ``latents`` is a non-empty [B, z_dim, T, H, W] tensor.
    """
    z_dim = int(vae.config["z_dim"])
    check_latents(latents, z_dim, owner="denormalize_wan_latents", name="latents")
    latents = latents.to(execution_device(vae), dtype=vae.dtype)
    latents_mean = (
        torch.tensor(vae.config["latents_mean"]).view(1, z_dim, 1, 1, 1).to(latents.device, latents.dtype)
    )
    latents_std = 1.0 / torch.tensor(vae.config["latents_std"]).view(1, z_dim, 1, 1, 1).to(
        latents.device, latents.dtype
    )
    return latents / latents_std + latents_mean


@dataclass(frozen=True)
class _TileGrid:
    """The tile layout of ``tiled_decode`` for one latent size, read from the VAE once per decode.

    Sample sizes are in the decoder's output space: patched (``1/patch_size``) for Wan 2.2.
    """

    row_starts: list[int]  # latent rows where a tile starts
    col_starts: list[int]  # latent columns where a tile starts
    latent_height: int  # latent extent of a tile
    latent_width: int
    stride_height: int  # output kept from each tile after blending
    stride_width: int
    blend_height: int  # output rows / columns blended with the neighbour above / to the left
    blend_width: int
    sample_height: int  # output size the blended rows are cropped to
    sample_width: int


@dataclass
class _Lane:
    """One batch slice decoded together: the whole batch, or a single entry under ``use_slicing``."""

    latent: Tensor  # after post_quant_conv when untiled (as _decode); raw when tiled (as tiled_decode)
    caches: list[list[Any]]  # one decoder cache per tile, row-major; a single one when untiled


class WanChunkedDecoder:
    """Streams the decode of an ``AutoencoderKLWan`` or ``AutoencoderKLQwenImage`` one latent frame at a time.

    Implements :class:`streamvae.SupportsChunkedVAEDecode` for the instance the user already has (same
    module, same weights; nothing is copied or reloaded). Each chunk is BCTHW in ``[-1, 1]``: 1 frame for
    the first latent frame, 4 for each later one. The chunks concatenated along T are ``torch.equal`` to
    ``vae.decode(z).sample`` for the same module settings (``use_slicing``, ``use_tiling`` and the tile
    sizes), read once when a decode starts.

    ``drain=False`` (a single process) stops decoding at the next latent-frame boundary once ``on_chunk``
    has failed. ``drain=True`` keeps running every step without publishing, for a distributed decoder
    whose peers wait on this rank in collectives; such a decoder can also drive :meth:`iter_chunks` itself.

    Memory: frame-major order keeps one decoder cache (the last two frames of every causal convolution) per
    tile and, under ``use_slicing``, per batch entry, where ``vae.decode`` keeps one at a time.
    """

    chunk_value_range: tuple[float, float] = (-1.0, 1.0)
    is_output_rank: bool = True

    def __init__(self, vae: WanFamilyVAE, *, drain: bool = False) -> None:
        if not isinstance(vae, (AutoencoderKLWan, AutoencoderKLQwenImage)):
            raise TypeError(
                f"WanChunkedDecoder wraps a diffusers AutoencoderKLWan or AutoencoderKLQwenImage, "
                f"got {type(vae).__module__}.{type(vae).__qualname__}"
            )
        self.vae = vae
        self.latent_channels = int(vae.config["z_dim"])
        self.drain = drain
        # Wan 2.2's decoder needs to know which call holds the first latent frame; Qwen-Image's takes no flag.
        self._takes_first_chunk = isinstance(vae, AutoencoderKLWan)
        self._patch_size: int | None = vae.config.get("patch_size")  # Wan 2.2: 2; Qwen-Image has none

    def prepare_latents(self, z: Tensor) -> Tensor:
        """Validate a latent and cast it to the VAE's dtype and execution device, as the Wan pipeline does.

        ``z`` must already be de-normalized (see :func:`denormalize_wan_latents`). Raises ValueError naming
        ``z`` and the expected shape unless it is a non-empty [B, z_dim, T, H, W] tensor.
        """
        check_latents(z, self.latent_channels, owner=type(self).__name__)
        return z.to(execution_device(self.vae), dtype=self.vae.dtype)

    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        """Decode ``z`` [B, z_dim, T, H, W] and hand each latent frame's final frames to ``on_chunk``.

        ``on_chunk`` is called T times with BCTHW chunks unless it raises: then it is not called again, no
        chunk is kept alive, decoding stops before the next latent frame (or, with ``drain=True``, runs to
        the end unpublished) and the error is re-raised. The instance is reusable afterwards. Like
        ``vae.decode``, ``z`` is not cast: use :meth:`prepare_latents` first.
        """
        publish_chunks(self.iter_chunks(z), on_chunk, drain=self.drain)

    def iter_chunks(self, z: Tensor) -> Generator[Tensor, None, None]:
        """Run the decode step by step: yields the final chunk of each latent frame, in order.

        Runs the VAE's accelerate forward hook (``vae._hf_hook.pre_forward``, which moves offloaded weights)
        once, now, as ``vae.decode`` does. Each latent frame is decoded only when its chunk is requested, so
        a consumer that stops iterating stops decoding at a latent-frame boundary. Close the iterator to free
        the decoder caches at once. No chunk is retained by the iterator after it is yielded.
        """
        check_latents(z, self.latent_channels, owner=type(self).__name__)
        # What diffusers' apply_forward_hook does around vae.decode (it never calls post_forward).
        hook = getattr(self.vae, "_hf_hook", None)
        if hook is not None and hasattr(hook, "pre_forward"):
            hook.pre_forward(self.vae)
        return self._steps(z)

    def _steps(self, z: Tensor) -> Generator[Tensor, None, None]:
        vae = self.vae
        grid = self._tile_grid(z) if self._uses_tiling(z) else None
        # vae.decode splits the batch into entries under use_slicing; each entry decodes on its own.
        batch = z.shape[0]
        slices = [z[b : b + 1] for b in range(batch)] if vae.use_slicing and batch > 1 else [z]
        lanes = [self._start_lane(z_slice, grid) for z_slice in slices]
        for k in range(z.shape[2]):
            yield self._decode_latent_frame(lanes, grid, k)

    def _uses_tiling(self, z: Tensor) -> bool:
        """The condition under which ``vae.decode`` (its ``_decode``) switches to ``tiled_decode``."""
        vae = self.vae
        height, width = z.shape[-2:]
        tile_latent_min_height = vae.tile_sample_min_height // vae.spatial_compression_ratio
        tile_latent_min_width = vae.tile_sample_min_width // vae.spatial_compression_ratio
        return bool(vae.use_tiling and (width > tile_latent_min_width or height > tile_latent_min_height))

    def _tile_grid(self, z: Tensor) -> _TileGrid:
        """The arithmetic of ``tiled_decode``, unchanged (patch_size 1 where the VAE has none)."""
        vae = self.vae
        patch = self._patch_size or 1
        height, width = z.shape[-2:]
        ratio = vae.spatial_compression_ratio
        latent_stride_height = vae.tile_sample_stride_height // ratio
        latent_stride_width = vae.tile_sample_stride_width // ratio
        stride_height = vae.tile_sample_stride_height // patch
        stride_width = vae.tile_sample_stride_width // patch
        return _TileGrid(
            row_starts=list(range(0, height, latent_stride_height)),
            col_starts=list(range(0, width, latent_stride_width)),
            latent_height=vae.tile_sample_min_height // ratio,
            latent_width=vae.tile_sample_min_width // ratio,
            stride_height=stride_height,
            stride_width=stride_width,
            blend_height=vae.tile_sample_min_height // patch - stride_height,
            blend_width=vae.tile_sample_min_width // patch - stride_width,
            sample_height=height * ratio // patch,
            sample_width=width * ratio // patch,
        )

    # no_grad on each step, never across a yield: grad mode is thread state the consumer would inherit.
    @torch.no_grad()
    def _start_lane(self, z_slice: Tensor, grid: _TileGrid | None) -> _Lane:
        # The size of the module's own cache (clear_cache): one slot per causal conv of the decoder.
        counts = getattr(self.vae, "_cached_conv_counts", None)
        if counts is not None:
            cache_size = int(counts["decoder"])
        else:
            cache_size = sum(isinstance(m, _CAUSAL_CONVS) for m in self.vae.decoder.modules())
        if grid is None:
            return _Lane(latent=self.vae.post_quant_conv(z_slice), caches=[[None] * cache_size])
        tiles = len(grid.row_starts) * len(grid.col_starts)
        return _Lane(latent=z_slice, caches=[[None] * cache_size for _ in range(tiles)])

    @torch.no_grad()
    def _decode_latent_frame(self, lanes: list[_Lane], grid: _TileGrid | None, k: int) -> Tensor:
        """Decode latent frame ``k`` of every lane; one BCTHW chunk for the whole batch."""
        outputs = [self._decode_lane_frame(lane, grid, k) for lane in lanes]
        if len(outputs) == 1:
            return outputs[0]
        return torch.cat(outputs)  # as vae.decode joins the slices

    def _decode_lane_frame(self, lane: _Lane, grid: _TileGrid | None, k: int) -> Tensor:
        if grid is None:
            out = self._decoder_step(lane.latent[:, :, k : k + 1], lane.caches[0], first_chunk=(k == 0))
            return self._to_pixels(out)

        vae = self.vae
        rows: list[list[Tensor]] = []
        caches = iter(lane.caches)
        for i in grid.row_starts:
            row = []
            for j in grid.col_starts:
                tile = lane.latent[:, :, k : k + 1, i : i + grid.latent_height, j : j + grid.latent_width]
                tile = vae.post_quant_conv(tile)
                row.append(self._decoder_step(tile, next(caches), first_chunk=(k == 0)))
            rows.append(row)

        # tiled_decode's blend, on this frame only: blending is per position, so per frame it is the same.
        # It writes in place, so each tile blends with its upper and left neighbours already blended.
        result_rows = []
        for i, row in enumerate(rows):
            result_row = []
            for j, tile in enumerate(row):
                if i > 0:
                    tile = vae.blend_v(rows[i - 1][j], tile, grid.blend_height)
                if j > 0:
                    tile = vae.blend_h(row[j - 1], tile, grid.blend_width)
                result_row.append(tile[:, :, :, : grid.stride_height, : grid.stride_width])
            result_rows.append(torch.cat(result_row, dim=-1))
        out = torch.cat(result_rows, dim=3)[:, :, :, : grid.sample_height, : grid.sample_width]
        return self._to_pixels(out)

    def _decoder_step(self, x: Tensor, cache: list[Any], *, first_chunk: bool) -> Tensor:
        """One decoder call for one latent frame; a fresh ``feat_idx`` each call, as ``_decode`` resets it."""
        if self._takes_first_chunk:
            out: Tensor = self.vae.decoder(x, feat_cache=cache, feat_idx=[0], first_chunk=first_chunk)
        else:
            out = self.vae.decoder(x, feat_cache=cache, feat_idx=[0])
        return out

    def _to_pixels(self, out: Tensor) -> Tensor:
        # Qwen-Image's tiled_decode skips this clamp (its _decode does not); we clamp always, so every
        # chunk is in chunk_value_range. Wan 2.2 unpatchifies first, as diffusers does.
        if self._patch_size is not None:
            out = unpatchify(out, patch_size=self._patch_size)  # type: ignore[no-untyped-call]
        return torch.clamp(out, min=-1.0, max=1.0)
