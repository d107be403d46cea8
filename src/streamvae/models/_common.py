"""Arithmetic the family adapters share: where ``vae.decode`` runs, when it tiles, how it blends tiles,
the overlapping-window walk of HunyuanVideo and LTX, and batch groups decoded apart and stepped together.

Each helper repeats one piece of diffusers' own decode, operation for operation, so an adapter that streams
a decode step by step reproduces it bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "blend_tiles",
    "execution_device",
    "joined_steps",
    "overlapping_window_chunks",
    "split_frames",
    "uses_spatial_tiling",
]


def execution_device(vae: Any) -> torch.device:
    """The device ``vae.decode`` needs its input on (the offload hook's device when weights are offloaded)."""
    try:
        from diffusers.utils.torch_utils import get_module_execution_device
    except ImportError:  # diffusers < 0.37: accelerate's hooks are the only offload to look through
        for module in vae.modules():
            device = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
            if device is not None:
                return torch.device(device)
        return torch.device(vae.device)
    return get_module_execution_device(vae)


def uses_spatial_tiling(
    vae: Any, height: int, width: int, *, latent_tile: tuple[int, int] | None = None
) -> bool:
    """The condition under which ``vae.decode`` switches to ``tiled_decode`` for a latent of this size.

    ``vae.use_tiling`` and a latent larger than one tile, whose latent size is
    ``tile_sample_min_{height,width} // spatial_compression_ratio`` unless the family keeps its own
    (``latent_tile``: CogVideoX's ``tile_latent_min_{height,width}``).
    """
    if latent_tile is None:
        ratio = int(vae.spatial_compression_ratio)
        latent_tile = (int(vae.tile_sample_min_height) // ratio, int(vae.tile_sample_min_width) // ratio)
    tile_height, tile_width = latent_tile
    return bool(vae.use_tiling and (height > tile_height or width > tile_width))


def blend_tiles(
    vae: Any, rows: list[list[Tensor]], *, blend: tuple[int, int], keep: tuple[int, int]
) -> Tensor:
    """diffusers' ``tiled_decode`` blend: one tensor from decoded tiles, row-major.

    Each tile takes ``blend`` (rows, columns) from the tile above and to its left — already blended, since
    ``vae.blend_v`` / ``vae.blend_h`` write in place — and keeps its first ``keep`` rows and columns. The
    blend is elementwise per frame, so blending one frame's tiles gives that frame of the whole blend.
    """
    blend_height, blend_width = blend
    keep_height, keep_width = keep
    result_rows = []
    for i, row in enumerate(rows):
        result_row = []
        for j, tile in enumerate(row):
            if i > 0:
                tile = vae.blend_v(rows[i - 1][j], tile, blend_height)
            if j > 0:
                tile = vae.blend_h(row[j - 1], tile, blend_width)
            result_row.append(tile[:, :, :, :keep_height, :keep_width])
        result_rows.append(torch.cat(result_row, dim=4))
    return torch.cat(result_rows, dim=3)


def overlapping_window_chunks(
    vae: Any, z: Tensor, decode_window: Callable[[Tensor, bool], Tensor]
) -> Generator[Tensor, None, None]:
    """Yield the final chunks of diffusers' ``_temporal_tiled_decode`` (HunyuanVideo, LTX), one per window.

    diffusers decodes windows of ``tile_sample_min_num_frames // r + 1`` latent frames every
    ``tile_sample_stride_num_frames // r`` latents (``r`` the temporal compression), blends the last
    ``min - stride`` sample frames of each window into the first frames of the next (``vae.blend_t``, in
    place), and keeps ``stride`` sample frames of each window (``stride + 1`` of the first). A window's kept
    frames are final as soon as it is blended: a later window only reads this one's tail, which is never
    kept. So each window publishes its kept frames right away; the video is the same tensor ``decode``
    returns, trimmed like it to ``(T - 1) r + 1`` frames. Windows that only decode past that end are skipped.

    ``decode_window(latents, first)`` decodes one window the way the family does (spatial tiling included)
    and drops the frame the family drops from every window but the first.
    """
    num_frames = z.shape[2]
    ratio = vae.temporal_compression_ratio
    window = vae.tile_sample_min_num_frames // ratio + 1
    stride = vae.tile_sample_stride_num_frames // ratio
    blend = vae.tile_sample_min_num_frames - vae.tile_sample_stride_num_frames
    keep = vae.tile_sample_stride_num_frames
    remaining = (num_frames - 1) * ratio + 1

    previous: Tensor | None = None
    for start in range(0, num_frames, stride):
        if remaining <= 0:
            return
        decoded = decode_window(z[:, :, start : start + window], previous is None)
        if previous is None:
            chunk = decoded[:, :, : keep + 1]
        else:
            decoded = vae.blend_t(previous, decoded, blend)
            chunk = decoded[:, :, :keep]
        chunk = chunk[:, :, :remaining]
        remaining -= chunk.shape[2]
        previous = decoded
        if chunk.shape[2] > 0:
            yield chunk


def split_frames(video: Tensor, *, latent_frames: int, step: int) -> Generator[Tensor, None, None]:
    """Hand a whole decoded ``video`` (BCTHW) on a latent frame's worth at a time: the first latent frame's
    frames (what the ``latent_frames - 1`` others, ``step`` each, leave), then ``step`` a chunk.

    For a family whose decoder needs the whole latent at once: the encoder still takes one latent frame's
    worth of frames at a time (``step`` = the temporal compression), so quantizing and encoding overlap the
    chunks after. Chunks are views of ``video``.
    """
    frames = video.shape[2]
    start = 0
    size = max(1, frames - (latent_frames - 1) * step)
    while start < frames:
        yield video[:, :, start : start + size]
        start += size
        size = max(1, step)


def joined_steps(walks: Iterable[Generator[Tensor, None, None]]) -> Generator[Tensor, None, None]:
    """Step ``walks`` (one decode per batch group, each decoded alone, as ``vae.decode`` decodes its
    slices or a pipeline its separate calls) together: each step's chunks joined along the batch, so every
    chunk holds the whole batch. Closing the generator, or a walk that fails, closes every walk."""
    walks = list(walks)
    try:
        for step in zip(*walks, strict=True):
            yield torch.cat(step)
    finally:
        for walk in walks:
            walk.close()
