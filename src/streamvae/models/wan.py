"""Streaming decode for diffusers' Wan-family VAEs: Wan 2.1, Wan 2.2 and Qwen-Image.

The decoders of ``AutoencoderKLWan`` and ``AutoencoderKLQwenImage`` are causal in time: ``vae.decode`` runs
the decoder once per latent frame, carrying a cache of the last two frames of every causal convolution from
one call to the next, and nothing later changes a frame once it has come out. The first latent frame gives 1
video frame, every later one 4 (1 + 4(T−1) in all). So each latent frame's output can be published as soon
as it is decoded.

:class:`WanChunkedDecoder` runs exactly the operations of ``vae.decode`` in the same order, per latent frame,
and publishes each latent frame's frames as one chunk: concatenated, the chunks are ``torch.equal`` to
``vae.decode(z).sample``, including with ``use_slicing`` and ``use_tiling``. Its decoder caches belong to a
stream's :class:`~streamvae.models.DecodeState` (never the module's ``_feat_map``), so a latent may arrive
in pieces, and streams over one module, or a decode after a failed one, do not interfere.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeAlias, cast

import torch
from diffusers.models.autoencoders.autoencoder_kl_qwenimage import (
    AutoencoderKLQwenImage,
    QwenImageCausalConv3d,
)
from diffusers.models.autoencoders.autoencoder_kl_wan import AutoencoderKLWan, WanCausalConv3d, unpatchify
from torch import Tensor

from streamvae._checks import check_latents, is_int
from streamvae.models._base import ChunkedDecoder, DecodeState
from streamvae.models._common import blend_tiles, execution_device, uses_spatial_tiling

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
    """The tile layout of ``tiled_decode`` for one latent size, read from the VAE once per stream.

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


@dataclass(eq=False)
class _WanState(DecodeState):
    """A Wan stream: the tile grid (None when untiled) and one decoder cache per lane and tile."""

    grid: _TileGrid | None = None
    # (lane, its caches): a lane is the batch slice decoded together (the whole batch, or one entry under
    # use_slicing); it has one cache per tile, row-major (a single one when untiled)
    lanes: list[tuple[slice, list[list[Any]]]] = field(default_factory=list)


class WanChunkedDecoder(ChunkedDecoder):
    """Streams the decode of an ``AutoencoderKLWan`` or ``AutoencoderKLQwenImage`` one latent frame at a time.

    For the instance the user already has (same module, same weights; nothing is copied or reloaded). Each
    chunk is BCTHW in ``[-1, 1]``: 1 frame for the first latent frame, 4 for each later one. The chunks
    concatenated along T are ``torch.equal`` to ``vae.decode(z).sample`` for the same module settings
    (``use_slicing``, ``use_tiling`` and the tile sizes), read once when a decode or stream starts. Latents
    may arrive in pieces (:meth:`start`, :meth:`feed`, :meth:`end`): frames decoded from any split equal
    ``vae.decode(torch.cat(pieces, dim=2)).sample``; a whole-latent decode is one piece. Latents must be
    de-normalized first (:func:`denormalize_wan_latents`); :meth:`prepare_latents` casts them as the Wan
    pipeline does.

    Memory: frame-major order keeps one decoder cache (the last two frames of every causal convolution) per
    tile and, under ``use_slicing``, per batch entry, where ``vae.decode`` keeps one at a time.
    """

    vae: WanFamilyVAE
    vae_classes = (AutoencoderKLWan, AutoencoderKLQwenImage)
    channels_key = "z_dim"
    takes_pieces = True

    def __init__(self, vae: WanFamilyVAE, *, drain: bool = False) -> None:
        super().__init__(vae, drain=drain)
        # Wan 2.2's decoder needs to know which call holds the first latent frame; Qwen-Image's takes no flag.
        self._takes_first_chunk = isinstance(vae, AutoencoderKLWan)
        self._patch_size: int | None = vae.config.get("patch_size")  # Wan 2.2: 2; Qwen-Image has none

    def start(self, batch: int, height: int, width: int) -> DecodeState:
        """Begin a stream of latent pieces [batch, z_dim, t, height, width]; ``use_slicing`` and
        ``use_tiling`` are read now."""
        for name, size in (("batch", batch), ("height", height), ("width", width)):
            if not is_int(size) or size < 1:
                raise ValueError(f"{type(self).__name__}.start: {name} must be a positive int, got {size!r}")
        grid = self._tile_grid(height, width) if uses_spatial_tiling(self.vae, height, width) else None
        tiles = 1 if grid is None else len(grid.row_starts) * len(grid.col_starts)
        size = self._cache_size()
        lanes = [(entries, [[None] * size for _ in range(tiles)]) for entries in self.entry_slices(batch)]
        return _WanState(owner=self, batch=batch, height=height, width=width, grid=grid, lanes=lanes)

    def piece_chunks(self, state: DecodeState, z: Tensor) -> Generator[Tensor, None, None]:
        assert isinstance(state, _WanState)
        if state.grid is None:  # post_quant_conv over the piece, as _decode does over the whole latent
            latents = [self.vae.post_quant_conv(z[entries]) for entries, _ in state.lanes]
        else:  # tiled_decode runs it per tile
            latents = [z[entries] for entries, _ in state.lanes]
        for k in range(z.shape[2]):
            yield self._decode_frame(state, [latent[:, :, k : k + 1] for latent in latents])

    def _decode_frame(self, state: _WanState, frames: list[Tensor]) -> Tensor:
        """Decode one latent frame of every lane; one chunk for the whole batch."""
        first = state.decoded == 0
        outputs = [
            self._decode_lane_frame(frame, caches, state.grid, first)
            for frame, (_, caches) in zip(frames, state.lanes, strict=True)
        ]
        state.decoded += 1
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)  # as vae.decode joins slices

    @property
    def temporal_ratio(self) -> int:
        """The frames each latent frame after the first gives: 2 per temporal upsampling of the decoder
        (the mirror of the encoder's ``temperal_downsample``; 4 for Wan 2.1, Wan 2.2 and Qwen-Image)."""
        return int(2 ** sum(bool(flag) for flag in self.vae.config["temperal_downsample"]))

    def output_frames(self, latent_frames: int) -> int:
        """One frame for the first latent frame, :attr:`temporal_ratio` for each after it."""
        return 1 + (latent_frames - 1) * self.temporal_ratio

    def end_chunks(self, state: DecodeState) -> Iterator[Tensor]:
        assert isinstance(state, _WanState)
        state.lanes.clear()  # every frame was final when decoded: nothing to flush, only caches to free
        return iter(())

    def _cache_size(self) -> int:
        """The size of the module's own cache (clear_cache): one slot per causal conv of the decoder."""
        counts = getattr(self.vae, "_cached_conv_counts", None)
        if counts is not None:
            return int(counts["decoder"])
        return sum(isinstance(m, _CAUSAL_CONVS) for m in self.vae.decoder.modules())

    def _tile_grid(self, height: int, width: int) -> _TileGrid:
        """The arithmetic of ``tiled_decode``, unchanged (patch_size 1 where the VAE has none)."""
        vae = self.vae
        patch = self._patch_size or 1
        ratio = cast(int, vae.spatial_compression_ratio)
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

    def _decode_lane_frame(
        self, frame: Tensor, caches: list[list[Any]], grid: _TileGrid | None, first: bool
    ) -> Tensor:
        """Decode one latent frame of one lane: one decoder call, or one per tile blended as tiled_decode."""
        if grid is None:
            return self._to_pixels(self._decoder_step(frame, caches[0], first_chunk=first))

        vae = self.vae
        rows: list[list[Tensor]] = []
        tile_caches = iter(caches)
        height, width = grid.latent_height, grid.latent_width
        for i in grid.row_starts:
            row = []
            for j in grid.col_starts:
                tile = vae.post_quant_conv(frame[:, :, :, i : i + height, j : j + width])
                row.append(self._decoder_step(tile, next(tile_caches), first_chunk=first))
            rows.append(row)
        out = blend_tiles(
            vae,
            rows,
            blend=(grid.blend_height, grid.blend_width),
            keep=(grid.stride_height, grid.stride_width),
        )
        return self._to_pixels(out[:, :, :, : grid.sample_height, : grid.sample_width])

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
