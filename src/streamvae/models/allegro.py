"""Streaming decode for diffusers' ``AutoencoderKLAllegro`` (Allegro).

Allegro's VAE decodes only tiled. ``tiled_decode`` cuts the latent into overlapping 3-D tiles of
``vae.kernel`` sample pixels (frames, rows, columns) every ``vae.stride``, in latents ``kernel // (r, s,
s)`` every ``stride // (r, s, s)`` (``r`` the temporal, ``s`` the spatial compression; by default 24×320×320
pixels every 16×200×240, that is 6×40×40 latents every 4×25×30), only where a whole tile fits. Each tile is
one decoder call. Its overlaps are faded linearly (``_prepare_for_blend``: a head overlap ramps 0 → 1, a tail
one 1 → 0) and the faded tiles are added into a zero video in tile order: frame position, then row, then
column. What no tile covers stays zero, as in ``vae.decode``.

The decoder calls are independent and the video is their sum, so a frame is final once every tile covering
it is added. Temporal position ``i`` covers frames ``[i·stride, i·stride + kernel)`` and the next starts at
``(i + 1)·stride``: once position ``i``'s tiles are added, the frames before ``(i + 1)·stride`` are final and
are published (16 a position by default; the last position publishes the rest). Each tile is faded and added
as soon as its call returns, positions in diffusers' order, so every pixel gets the same float additions in
the same order as in ``vae.decode``: the result is the same tensor, while only the frames from the first
unpublished one to the end of the current position are held.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass

import torch
from diffusers.models.autoencoders.autoencoder_kl_allegro import AutoencoderKLAllegro
from torch import Tensor

from streamvae.models._base import ChunkedDecoder

__all__ = ["AllegroChunkedDecoder"]

#: a size per axis of a tile: frames, rows, columns
Sizes = tuple[int, int, int]


class AllegroChunkedDecoder(ChunkedDecoder):
    """Publishes the frames of each temporal tile position of an ``AutoencoderKLAllegro`` decode as soon
    as no later tile overlaps them.

    The chunks concatenated along T are ``torch.equal`` to ``vae.decode(z).sample.permute(0, 2, 1, 3, 4)``
    (diffusers' Allegro VAE returns [B, T, C, H, W]; ``AllegroPipeline.decode_latents`` permutes it, and so
    does this): the same decoder calls on the same tiles, the same fades, the same sums in the same order.
    The tile geometry is read from ``vae.kernel`` and ``vae.stride`` at each decode. ``streams`` is True
    with tiling on: a latent longer than one tile (``kernel[0] // r`` latent frames) publishes
    ``stride[0]`` frames a temporal position, the last position the rest (its tail, and any frames no tile
    reaches, zero as in ``vae.decode``). Chunks are nominally in [-1, 1] (the decoder does not clamp; the
    pipeline's post-processing does).

    Refused before any work (ValueError): ``vae.use_tiling`` off (``vae.decode`` raises
    NotImplementedError: Allegro has no untiled decode), and a latent smaller than one tile in frames, rows
    or columns (``vae.decode`` then gives a video of zeros, or fails). Batch entries decode one at a time,
    with or without ``use_slicing``: ``tiled_decode`` holds one entry per decoder call, so ``vae.decode``
    works for batch > 1 only with ``use_slicing``, and the chunks equal that decode.

    Memory: one tile's activations at a time, and a window of whole frames from the first unpublished
    one to the end of the current position (``kernel[0]`` frames; 24 by default), where ``vae.decode``
    keeps every decoded tile and the whole video (at 88×720×1280, 75 tiles: about 3 GB in float32).
    """

    vae: AutoencoderKLAllegro
    vae_classes = (AutoencoderKLAllegro,)
    channels_key = "latent_channels"

    @property
    def streams(self) -> bool:
        """True with ``vae.use_tiling`` on (the only way Allegro decodes): a frame leaves once every tile
        covering it is added."""
        return bool(self.vae.use_tiling)

    def output_frames(self, latent_frames: int) -> int:
        """``r`` frames a latent frame: ``tiled_decode`` makes a video of ``r·T`` frames."""
        return latent_frames * int(self.vae.config["temporal_compression_ratio"])

    def check_latents(self, z: object, *, owner: str | None = None) -> None:
        """The base's latent checks, and a ValueError with ``vae.use_tiling`` off or a latent smaller than
        one tile (why: the class docstring), so a decode is refused before it starts."""
        super().check_latents(z, owner=owner)
        assert isinstance(z, Tensor)
        prefix = owner or type(self).__name__
        if not self.vae.use_tiling:
            raise ValueError(
                f"{prefix}: vae.use_tiling is off, and AutoencoderKLAllegro decodes only tiled (vae.decode "
                "raises NotImplementedError without it); call vae.enable_tiling() to decode z"
            )
        tiles = _Tiles.of(self.vae, z)
        if min(tiles.counts) < 1:
            raise ValueError(
                f"{prefix}: z of shape {tuple(z.shape)} is smaller than one decode tile of "
                f"{tiles.latent_kernel} latents (frames, rows, columns: vae.kernel {tiles.kernel} divided by "
                "the compression), so AutoencoderKLAllegro's tiled decode has no tile to decode"
            )

    def entry_slices(self, batch: int) -> list[slice]:
        """One a batch entry, whatever ``use_slicing`` says: ``tiled_decode`` decodes one entry a call."""
        return [slice(b, b + 1) for b in range(batch)]

    def entry_chunks(self, z: Tensor, entries: slice) -> Generator[Tensor, None, None]:
        vae = self.vae
        tiles = _Tiles.of(vae, z)
        batch_size, _, num_frames, height, width = z.shape
        # post quant conv (a per-frame mapping), as tiled_decode runs it
        z = z.permute(0, 2, 1, 3, 4).flatten(0, 1)
        z = vae.post_quant_conv(z)
        z = z.view(batch_size, -1, *z.shape[1:]).permute(0, 2, 1, 3, 4)  # unflatten(0, (batch_size, -1))

        total = num_frames * tiles.ratios[0]
        overlaps = _per_axis(lambda axis: tiles.kernel[axis] - tiles.stride[axis])
        # frames [published, published + window.shape[2]) of the video tiled_decode sums its tiles into
        shape = (batch_size, vae.config["out_channels"], 0, height * tiles.ratios[1], width * tiles.ratios[2])
        window = z.new_zeros(shape)
        published = 0
        frames, rows, columns = tiles.counts
        for i in range(frames):
            start = i * tiles.stride[0] - published  # the position's first frame, in the window
            window = _grow(window, min(start + tiles.kernel[0], total - published))
            for j in range(rows):
                h_start = j * tiles.stride[1]
                for k in range(columns):
                    w_start = k * tiles.stride[2]
                    tile = _fade(self._decode_tile(z, tiles, (i, j, k)), (i, j, k), tiles.counts, overlaps)
                    window[
                        :,
                        :,
                        start : start + tiles.kernel[0],
                        h_start : h_start + tiles.kernel[1],
                        w_start : w_start + tiles.kernel[2],
                    ] += tile
            # no later position reaches the frames before the next one's start
            final = total if i == frames - 1 else min((i + 1) * tiles.stride[0], total)
            window = _grow(window, final - published)
            if final > published:
                size, published = final - published, final
                yield window[:, :, :size]
                window = window[:, :, size:]

    def _decode_tile(self, z: Tensor, tiles: _Tiles, index: Sizes) -> Tensor:
        """Decode the latent tile at ``index`` (its temporal, row and column position) in one decoder call,
        in the dtype of ``tiled_decode``'s tile store (that of the post-quant-conv latent)."""
        region = [
            slice(index[axis] * tiles.latent_stride[axis], index[axis] * tiles.latent_stride[axis] + size)
            for axis, size in enumerate(tiles.latent_kernel)
        ]
        # tiled_decode copies each tile into a fresh buffer: the decoder sees a contiguous latent
        decoded: Tensor = self.vae.decoder(z[(slice(None), slice(None), *region)].contiguous())
        return decoded.to(z.dtype)


@dataclass(frozen=True)
class _Tiles:
    """The tile walk of one ``tiled_decode``, per axis (frames, rows, columns)."""

    kernel: Sizes  # a tile's size in sample pixels (``vae.kernel``)
    stride: Sizes  # pixels from one tile to the next (``vae.stride``)
    latent_kernel: Sizes  # the same in latents
    latent_stride: Sizes
    counts: Sizes  # tile positions; fewer than one: the latent is smaller than a tile
    ratios: Sizes  # the compression: temporal, spatial, spatial

    @classmethod
    def of(cls, vae: AutoencoderKLAllegro, z: Tensor) -> _Tiles:
        """The walk ``tiled_decode`` makes over ``z`` with ``vae``'s geometry now."""
        temporal, spatial = int(vae.config["temporal_compression_ratio"]), int(vae.spatial_compression_ratio)
        ratios = (temporal, spatial, spatial)
        kernel = _per_axis(lambda axis: int(vae.kernel[axis]))
        stride = _per_axis(lambda axis: int(vae.stride[axis]))
        latent_kernel = _per_axis(lambda axis: kernel[axis] // ratios[axis])
        latent_stride = _per_axis(lambda axis: stride[axis] // ratios[axis])
        counts = _per_axis(
            lambda axis: math.floor((z.shape[2 + axis] - latent_kernel[axis]) / latent_stride[axis]) + 1
        )
        return cls(kernel, stride, latent_kernel, latent_stride, counts, ratios)


def _per_axis(size: Callable[[int], int]) -> Sizes:
    return size(0), size(1), size(2)


def _grow(window: Tensor, frames: int) -> Tensor:
    """``window`` extended with zero frames to ``frames`` frames (as it is when it holds that many)."""
    missing = frames - window.shape[2]
    if missing <= 0:
        return window
    shape = (*window.shape[:2], missing, *window.shape[3:])
    return torch.cat([window, window.new_zeros(shape)], dim=2)


def _fade(tile: Tensor, positions: Sizes, counts: Sizes, overlaps: Sizes) -> Tensor:
    """diffusers' ``_prepare_for_blend``, operation for operation: fade the overlaps of ``tile`` in place.

    Per axis (frames, rows, columns) ``tile`` is at ``positions`` of ``counts`` and overlaps its neighbours
    by ``overlaps`` pixels: a tile after the first ramps its head up from 0, one before the last ramps its
    tail down to 0. Frames fade only with a positive overlap (diffusers guards that axis alone).
    """
    for dim, position, count, overlap in zip((2, 3, 4), positions, counts, overlaps, strict=True):
        if dim == 2 and overlap <= 0:
            continue
        if position > 0:
            _ramp(tile, dim, overlap, head=True)
        if position < count - 1:
            _ramp(tile, dim, overlap, head=False)
    return tile


def _ramp(tile: Tensor, dim: int, overlap: int, *, head: bool) -> None:
    """Scale ``tile``'s first ``overlap`` pixels along ``dim`` by 0, 1/overlap, … (``head``), or its last
    ones by 1, 1 − 1/overlap, …: one line of ``_prepare_for_blend``."""
    index = [slice(None)] * tile.ndim
    index[dim] = slice(0, overlap) if head else slice(-overlap, None)
    weights = torch.arange(0, overlap).float().to(tile.device) / overlap
    if not head:
        weights = 1 - weights
    weights = weights.reshape(overlap, *(1,) * (tile.ndim - 1 - dim))
    tile[tuple(index)] = tile[tuple(index)] * weights
