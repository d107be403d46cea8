"""Quantize: float video chunks to the 8-bit pixels an encoder takes, on the chunk's own device.

Two pixel paths. ``rgb24`` gives BTHWC uint8 (what ``quantize_chunk`` returns), which PyAV converts to
yuv420p with swscale on the host. ``yuv420p`` converts on the device to planar BT.709 limited-range 4:2:0
(2×2 chroma average), so the host receives half the bytes and builds frames without any conversion — that
pays where the device is a GPU, whose conversion is free for the host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, TypeAlias

import torch
from torch import Tensor

from streamvae._checks import check_choice, check_chunk, prefixed
from streamvae._public import public

__all__ = [
    "ChunkQuantizer",
    "PerChannelRange",
    "PixelFormat",
    "ValueRange",
    "check_value_range",
    "quantize_chunk",
    "quantize_chunk_yuv420",
]

PixelFormat = Literal["rgb24", "yuv420p"]


@public
@dataclass(frozen=True)
class PerChannelRange:
    """A value range per colour channel: chunks hold ``(pixel - mean) / std``, pixels in [0, 1].

    For a family whose decoder gives normalized pixels (MiniMax-H3's ImageNet normalization, mean (0.485,
    0.456, 0.406) and std (0.229, 0.224, 0.225)): quantizing computes ``(x * std + mean).clamp(0, 1)`` per
    channel in float32 — the pipeline's own float math, operation for operation — then scales to 0–255 and
    rounds, on the chunk's device in the same pass as a plain range. ``mean`` and ``std`` hold one number
    per channel (R, G, B), finite in float32; every ``std`` is positive. Bad values raise ValueError.
    """

    #: the channel means the pixels were normalized by, (R, G, B)
    mean: tuple[float, float, float]
    #: the channel standard deviations the pixels were normalized by, (R, G, B)
    std: tuple[float, float, float]

    def __post_init__(self) -> None:
        for name in ("mean", "std"):
            given = getattr(self, name)
            try:
                values = tuple(_number(v) for v in given)
            except (TypeError, ValueError, RuntimeError):
                values = ()
            if len(values) != 3 or not all(_finite32(v) for v in values):
                raise ValueError(
                    f"PerChannelRange: {name} must be three finite float32 numbers (R, G, B), got {given!r}"
                )
            if name == "std" and not all(_in_float32(v) > 0 for v in values):
                raise ValueError(f"PerChannelRange: std must be positive for every channel, got {given!r}")
            object.__setattr__(self, name, values)


ValueRange: TypeAlias = "tuple[float, float] | PerChannelRange"
"""What ``value_range`` takes: a pair (low, high) for every channel, or a :class:`PerChannelRange`."""

# BT.709 luma weights; limited ("TV") range puts Y in [16, 235] and Cb/Cr in [16, 240].
_KR, _KB = 0.2126, 0.0722
_KG = 1.0 - _KR - _KB
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)
# Scratch elements a CPU band holds for its RGB (~1 MiB of float32): cache-sized, and few enough bands per
# frame that per-operation overhead stays small.
_CPU_BAND_ELEMENTS = 1 << 18


def _in_float32(value: float) -> float:
    """``value`` as float32 holds it (±inf beyond its range), back as a Python float."""
    return float(torch.tensor(value, dtype=torch.float32))


def _finite32(value: float) -> bool:
    return math.isfinite(value) and abs(value) <= _FLOAT32_MAX


def check_value_range(value_range: object, *, owner: str | None = None) -> ValueRange:
    """Return ``value_range`` as two floats (or the :class:`PerChannelRange` it is), or raise ValueError if
    it is neither an increasing pair of numbers nor a :class:`PerChannelRange`.

    ``owner`` (the function the user called) prefixes the message.
    """
    if isinstance(value_range, PerChannelRange):
        return value_range  # checked when it was made
    try:
        low, high = (_number(v) for v in value_range)  # type: ignore[attr-defined]
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of more than one value
        raise ValueError(
            prefixed(
                owner,
                "value_range must be a pair (low, high) of numbers or a streamvae.PerChannelRange, "
                f"got {value_range!r}",
            )
        ) from None
    # Quantize computes in float32: both ends, and the span it divides by, must be finite there.
    low32, high32 = _in_float32(low), _in_float32(high)
    if not all(_finite32(v) for v in (low, high)):
        raise ValueError(
            prefixed(
                owner,
                f"value_range must be two finite numbers within float32's range (±{_FLOAT32_MAX:.4g}), "
                f"got {value_range!r}",
            )
        )
    if not low32 < high32:
        raise ValueError(
            prefixed(owner, f"value_range must be increasing in float32 (low < high), got {value_range!r}")
        )
    span = _in_float32(high32 - low32)
    if not (math.isfinite(span) and math.isfinite(_in_float32(255.0 / span))):
        raise ValueError(
            prefixed(
                owner,
                f"value_range's span high - low must be finite in float32 and not vanishingly small "
                f"(between {255 / _FLOAT32_MAX:.3g} and {_FLOAT32_MAX:.4g}), got {value_range!r}",
            )
        )
    return low, high


def _number(value: object) -> float:
    """``value`` as a float; a TypeError for what ``float`` takes but is no number (``"0"``, ``True``)."""
    if isinstance(value, (str, bytes, bool)):
        raise TypeError(value)
    return float(value)  # type: ignore[arg-type]  # float() says what it cannot convert


class ChunkQuantizer:
    """Quantizes chunks into uint8 frames the caller provides, a band of rows at a time.

    On the CPU the float32 arithmetic runs in a band-sized scratch buffer the quantizer keeps from chunk to
    chunk, so quantizing allocates nothing the size of a chunk: per-chunk float32 temporaries (4 bytes a
    value) are what kept each worker thread's malloc arena tens of MB large. On other devices a band is a
    batch entry's whole chunk, and its scratch comes from the device's caching allocator on each call.

    Results are those of :func:`quantize_chunk` and :func:`quantize_chunk_yuv420`, bit for bit. Use one
    quantizer per stream of chunks, from one thread at a time. ``owner`` (the function the user called)
    prefixes its errors.
    """

    def __init__(
        self,
        value_range: ValueRange,
        pixel_format: PixelFormat = "rgb24",
        *,
        owner: str = "ChunkQuantizer",
    ) -> None:
        self._owner = owner
        check_choice("pixel_format", pixel_format, ("rgb24", "yuv420p"), owner=owner)
        checked = check_value_range(value_range, owner=owner)
        self.value_range: ValueRange
        self._channels: PerChannelRange | None = None
        # the per-channel std and mean as float32 [3, 1, 1, 1] on the last chunk's device (the pipeline's
        # own tensors are float32 too, so x * std + mean rounds as its does)
        self._affine: tuple[Tensor, Tensor] | None = None
        if isinstance(checked, PerChannelRange):
            self.value_range = self._channels = checked
            self._low, self._high, self._scale = 0.0, 1.0, 1.0
        else:
            # The ends as float32 holds them, and the span between those: values are clamped in float32, so
            # a span taken from the float64 ends would put float32's ``high`` off 1 — below it (no top level)
            # or above it (wrapping past 255) for ends float32 cannot hold, like (128, 128.001).
            low, high = _in_float32(checked[0]), _in_float32(checked[1])
            self.value_range = (low, high)
            self._low, self._high, self._scale = low, high, 1.0 / (high - low)
        self.pixel_format: PixelFormat = pixel_format
        self._scratch: Tensor | None = None  # kept between calls on the CPU only

    def frame_shape(self, height: int, width: int) -> tuple[int, ...]:
        """The shape of one quantized frame: ``(H, W, 3)`` for rgb24, ``(H * 3 // 2, W)`` for yuv420p (a
        ValueError for an odd height or width: 4:2:0 takes 2×2 blocks)."""
        if self.pixel_format == "yuv420p" and (height % 2 or width % 2):
            raise ValueError(
                prefixed(self._owner, f"yuv420p needs a chunk of even height and width, got {height}×{width}")
            )
        return (height * 3 // 2, width) if self.pixel_format == "yuv420p" else (height, width, 3)

    def quantize_into(self, chunk: Tensor, out: Tensor, nan_count: Tensor | None = None) -> None:
        """Quantize BCTHW ``chunk`` into ``out``: ``[B, T, *frame_shape]`` uint8 on the chunk's device.

        ``out`` may be a view (a range of frames of a bigger buffer) as long as each frame is contiguous.
        With ``nan_count`` (an int64 scalar tensor on the chunk's device), the number of NaN values in the
        chunk is added to it on the device, without waiting for the device.
        """
        batch, _, frames, height, width = check_chunk(chunk, owner=self._owner).shape
        expected = (batch, frames, *self.frame_shape(height, width))
        if out.dtype != torch.uint8 or tuple(out.shape) != expected or out.device != chunk.device:
            raise ValueError(
                f"out must be uint8 of shape {expected} on {chunk.device}, "
                f"got {out.dtype} {tuple(out.shape)} on {out.device}"
            )
        on_cpu = chunk.device.type == "cpu"
        # A band of rows (even, for 4:2:0) of one frame on the CPU; a batch entry's whole chunk elsewhere.
        rows = min(height, max(2, _CPU_BAND_ELEMENTS // max(1, 3 * width) // 2 * 2)) if on_cpu else height
        step = 1 if on_cpu else frames
        band = self._band_into_yuv420 if self.pixel_format == "yuv420p" else self._band_into_rgb
        with torch.no_grad():
            for entry in range(batch):
                for t in range(0, frames, step):
                    for top in range(0, height, rows):
                        band(chunk, out, nan_count, entry, slice(t, t + step), slice(top, top + rows))
        if not on_cpu:
            self._scratch = None

    def _unit_band(
        self, chunk: Tensor, entry: int, ts: slice, ys: slice, floats: int
    ) -> tuple[Tensor, Tensor]:
        """The band's RGB as float32 ``[3, t, rows, W]`` in [0, 1] (clamped) and ``floats`` more scratch."""
        source = chunk[entry, :, ts, ys]
        size = source.numel()
        scratch = self._scratch
        if scratch is None or scratch.numel() < size + floats or scratch.device != chunk.device:
            scratch = self._scratch = torch.empty(size + floats, dtype=torch.float32, device=chunk.device)
        # fp32 arithmetic: bf16 has 8 significant bits, too few to scale to 255 levels and round exactly.
        x = scratch[:size].view(source.shape).copy_(source)
        if self._channels is None:
            x.clamp_(self._low, self._high).sub_(self._low).mul_(self._scale)
        else:
            std, mean = self._channel_affine(chunk.device)
            x.mul_(std).add_(mean).clamp_(0.0, 1.0)  # the pipeline's (x * std + mean).clamp(0, 1)
        return x, scratch[size : size + floats]

    def _channel_affine(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """The per-channel ``std`` and ``mean`` as float32 ``[3, 1, 1, 1]`` tensors on ``device``."""
        affine = self._affine
        if affine is None or affine[0].device != device:
            assert self._channels is not None
            std, mean = (
                torch.tensor(values, dtype=torch.float32).view(3, 1, 1, 1).to(device)
                for values in (self._channels.std, self._channels.mean)
            )
            affine = self._affine = (std, mean)
        return affine

    @staticmethod
    def _count_nan(x: Tensor, nan_count: Tensor | None) -> None:
        if nan_count is None:
            return
        # On the CPU a sum (one read, no temporary; clamped values are finite) tells whether the band holds
        # NaN, and only such a band is counted. Elsewhere always count: a branch would wait for the device.
        if x.device.type != "cpu" or bool(x.sum().isnan()):
            nan_count.add_(torch.isnan(x).sum())

    def _band_into_rgb(
        self, chunk: Tensor, out: Tensor, nan_count: Tensor | None, entry: int, ts: slice, ys: slice
    ) -> None:
        x, _ = self._unit_band(chunk, entry, ts, ys, 0)
        x.mul_(255.0).round_()
        self._count_nan(x, nan_count)
        out[entry, ts, ys].copy_(x.permute(1, 2, 3, 0))

    def _band_into_yuv420(
        self, chunk: Tensor, out: Tensor, nan_count: Tensor | None, entry: int, ts: slice, ys: slice
    ) -> None:
        _, _, _, height, width = chunk.shape
        _, frames, rows, _ = chunk[entry, :, ts, ys].shape
        full, half = frames * rows * width, frames * rows * width // 4
        x, more = self._unit_band(chunk, entry, ts, ys, 2 * full + 5 * half)
        self._count_nan(x, nan_count)
        y, tmp = (more[i * full : (i + 1) * full].view(frames, rows, width) for i in range(2))
        rest = more[2 * full :]
        chroma = rest[: 3 * half].view(3, frames, rows // 2, width // 2)
        luma, part = (
            rest[(3 + i) * half : (4 + i) * half].view(frames, rows // 2, width // 2) for i in range(2)
        )
        # The same operations, in the same order, as quantize_chunk_yuv420 always did: bit-exact results.
        r, g, b = x.unbind(0)
        _weighted_sum(r, g, b, out=y, tmp=tmp)
        y.mul_(219.0).add_(16.0).round_().clamp_(0, 255)
        # 2×2 box average of RGB per chroma sample.
        torch.mean(x.view(3, frames, rows // 2, 2, width // 2, 2), dim=(3, 5), out=chroma)
        hr, hg, hb = chroma.unbind(0)
        _weighted_sum(hr, hg, hb, out=luma, tmp=part)
        planes = out[entry, ts].view(frames, -1)
        area, top = height * width, (ys.start or 0) // 2
        u_plane = planes[:, area : area + area // 4].view(frames, height // 2, width // 2)
        v_plane = planes[:, area + area // 4 :].view(frames, height // 2, width // 2)
        planes[:, :area].view(frames, height, width)[:, ys].copy_(y)
        for plane, colour, scale in ((u_plane, hb, 1.0 - _KB), (v_plane, hr, 1.0 - _KR)):
            torch.sub(colour, luma, out=part)
            part.mul_(224.0 / (2.0 * scale)).add_(128.0).round_().clamp_(0, 255)
            plane[:, top : top + rows // 2].copy_(part)


def _weighted_sum(r: Tensor, g: Tensor, b: Tensor, *, out: Tensor, tmp: Tensor) -> None:
    """``out = _KR * r + _KG * g + _KB * b`` in that order of float32 operations, without temporaries."""
    torch.mul(r, _KR, out=out)
    out.add_(torch.mul(g, _KG, out=tmp))
    out.add_(torch.mul(b, _KB, out=tmp))


@public
def quantize_chunk(chunk: Tensor, value_range: ValueRange) -> Tensor:
    """BCTHW float in ``value_range`` → contiguous BTHWC uint8 (rgb24) on the same device.

    Values are clamped to ``value_range``, scaled to 0–255 and rounded to the nearest level. With a
    :class:`PerChannelRange` each channel is first mapped to [0, 1] as ``(x * std + mean).clamp(0, 1)``.
    """
    return _quantize(chunk, value_range, "rgb24", owner="quantize_chunk")


@public
def quantize_chunk_yuv420(chunk: Tensor, value_range: ValueRange) -> Tensor:
    """BCTHW float in ``value_range`` → planar yuv420p frames, ``[B, T, H * 3 // 2, W]`` uint8, same device.

    Each frame is the I420 layout PyAV's ``VideoFrame.from_numpy_buffer(format="yuv420p")`` reads: the Y plane
    (H×W), then U and V (H/2×W/2 each). BT.709 coefficients, limited range; chroma is the 2×2 average of
    the RGB values (the transform is linear, so this equals averaging the full-resolution chroma).
    Height and width must be even.
    """
    return _quantize(chunk, value_range, "yuv420p", owner="quantize_chunk_yuv420")


def _quantize(chunk: Tensor, value_range: ValueRange, pixel_format: PixelFormat, *, owner: str) -> Tensor:
    quantizer = ChunkQuantizer(value_range, pixel_format, owner=owner)
    batch, _, frames, height, width = check_chunk(chunk, owner=owner).shape
    shape = (batch, frames, *quantizer.frame_shape(height, width))
    out = torch.empty(shape, dtype=torch.uint8, device=chunk.device)
    quantizer.quantize_into(chunk, out)
    return out
