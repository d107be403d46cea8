"""Quantize: float video chunks to the 8-bit pixels an encoder takes, on the chunk's own device.

Two pixel paths. ``rgb24`` gives BTHWC uint8 (what ``quantize_chunk`` returns), which PyAV converts to
yuv420p with swscale on the host. ``yuv420p`` converts on the device to planar BT.709 limited-range 4:2:0
(2×2 chroma average), so the host receives half the bytes and builds frames without any conversion — that
pays where the device is a GPU, whose conversion is free for the host.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["check_chunk", "check_value_range", "quantize_chunk", "quantize_chunk_yuv420"]

# BT.709 luma weights; limited ("TV") range puts Y in [16, 235] and Cb/Cr in [16, 240].
_KR, _KB = 0.2126, 0.0722
_KG = 1.0 - _KR - _KB


def check_value_range(value_range: object) -> tuple[float, float]:
    """Return ``value_range`` as two floats, or raise ValueError if it is not an increasing pair."""
    try:
        low, high = (float(v) for v in value_range)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        raise ValueError(f"value_range must be a pair (low, high) of numbers, got {value_range!r}") from None
    if not low < high:
        raise ValueError(f"value_range must be increasing (low < high), got {value_range!r}")
    return low, high


def check_chunk(chunk: object) -> Tensor:
    if not isinstance(chunk, Tensor):
        raise TypeError(f"chunk must be a torch.Tensor, got {type(chunk).__name__}")
    if chunk.ndim != 5:
        raise ValueError(
            f"chunk must be 5-D [batch, channels, frames, height, width], got shape {tuple(chunk.shape)}"
        )
    if not chunk.is_floating_point():
        raise ValueError(f"chunk must be floating point (fp32, fp16 or bf16), got {chunk.dtype}")
    if chunk.shape[1] != 3:
        raise ValueError(f"chunk must have 3 (RGB) channels in dim 1, got shape {tuple(chunk.shape)}")
    return chunk


def _unit_rgb(chunk: Tensor, value_range: tuple[float, float]) -> Tensor:
    """BCTHW in ``value_range`` → float32 BTHWC in [0, 1] (a fresh tensor, clamped)."""
    low, high = check_value_range(value_range)
    # fp32 arithmetic: bf16 has 8 significant bits, too few to scale to 255 levels and round exactly.
    x = chunk.permute(0, 2, 3, 4, 1).to(torch.float32, copy=True)
    return x.clamp_(low, high).sub_(low).mul_(1.0 / (high - low))


def quantize_chunk(chunk: Tensor, value_range: tuple[float, float]) -> Tensor:
    """BCTHW float in ``value_range`` → contiguous BTHWC uint8 (rgb24) on the same device.

    Values are clamped to ``value_range``, scaled to 0–255 and rounded to the nearest level.
    """
    x = _unit_rgb(check_chunk(chunk), value_range)
    return x.mul_(255.0).round_().to(torch.uint8).contiguous()


def quantize_chunk_yuv420(chunk: Tensor, value_range: tuple[float, float]) -> Tensor:
    """BCTHW float in ``value_range`` → planar yuv420p frames, ``[B, T, H * 3 // 2, W]`` uint8, same device.

    Each frame is the I420 layout PyAV's ``VideoFrame.from_numpy_buffer(format="yuv420p")`` reads: the Y plane
    (H×W), then U and V (H/2×W/2 each). BT.709 coefficients, limited range; chroma is the 2×2 average of
    the RGB values (the transform is linear, so this equals averaging the full-resolution chroma).
    Height and width must be even.
    """
    batch, _, frames, height, width = check_chunk(chunk).shape
    if height % 2 or width % 2:
        raise ValueError(f"yuv420p needs an even height and width, got {height}×{width}")
    rgb = _unit_rgb(chunk, value_range)
    r, g, b = rgb.unbind(-1)
    y = (_KR * r + _KG * g + _KB * b).mul_(219.0).add_(16.0)
    # 2×2 box average of RGB per chroma sample.
    half = rgb.reshape(batch, frames, height // 2, 2, width // 2, 2, 3).mean(dim=(3, 5))
    hr, hg, hb = half.unbind(-1)
    luma = _KR * hr + _KG * hg + _KB * hb
    u = (hb - luma).mul_(224.0 / (2.0 * (1.0 - _KB))).add_(128.0)
    v = (hr - luma).mul_(224.0 / (2.0 * (1.0 - _KR))).add_(128.0)
    planes = torch.cat(
        [y.reshape(batch, frames, -1), u.reshape(batch, frames, -1), v.reshape(batch, frames, -1)], dim=2
    )
    return planes.round_().clamp_(0, 255).to(torch.uint8).reshape(batch, frames, height * 3 // 2, width)
