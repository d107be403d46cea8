from __future__ import annotations

import av
import numpy as np
import pytest
import torch

from streamvae import PerChannelRange, quantize_chunk, quantize_chunk_yuv420
from streamvae._quantize import ChunkQuantizer, PixelFormat
from tests._media import moving_pattern


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quantize_clamps_scales_and_rounds_to_contiguous_bthwc_uint8(dtype: torch.dtype) -> None:
    chunk = torch.tensor([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0]).to(dtype)
    chunk = chunk.reshape(1, 1, 1, 1, 7).expand(2, 3, 2, 1, 7).clone()
    out = quantize_chunk(chunk, (-1.0, 1.0))
    assert out.dtype == torch.uint8 and out.is_contiguous()
    assert out.shape == (2, 2, 1, 7, 3)
    assert out[0, 0, 0, :, 0].tolist() == [0, 0, 64, 128, 191, 255, 255]


def test_quantize_keeps_channel_order_and_honours_any_value_range() -> None:
    chunk = torch.zeros(1, 3, 1, 2, 2)
    chunk[:, 0], chunk[:, 1], chunk[:, 2] = 0.0, 0.5, 1.0
    out = quantize_chunk(chunk, (0.0, 1.0))
    assert out[0, 0, 0, 0].tolist() == [0, 128, 255]


@pytest.mark.parametrize("value_range", [(1.0, -1.0), (0.0, 0.0), (1.0,), "ab", None])
def test_quantize_rejects_a_value_range_that_is_not_increasing(value_range: object) -> None:
    with pytest.raises(ValueError, match="value_range"):
        quantize_chunk(torch.zeros(1, 3, 1, 2, 2), value_range)  # type: ignore[arg-type]


def test_quantize_rejects_bad_chunks_with_the_expected_form() -> None:
    with pytest.raises(ValueError, match="5-D"):
        quantize_chunk(torch.zeros(3, 1, 2, 2), (-1, 1))
    with pytest.raises(ValueError, match="floating point"):
        quantize_chunk(torch.zeros(1, 3, 1, 2, 2, dtype=torch.uint8), (-1, 1))
    with pytest.raises(TypeError, match="torch.Tensor"):
        quantize_chunk(np.zeros((1, 3, 1, 2, 2)), (-1, 1))  # type: ignore[arg-type]


def test_yuv420_planes_match_pyav_bt709_conversion_of_the_same_rgb_frames() -> None:
    chunk = moving_pattern(0, 3, batch=2, height=48, width=80)
    rgb = quantize_chunk(chunk, (-1, 1)).numpy()
    yuv = quantize_chunk_yuv420(chunk, (-1, 1)).numpy()
    assert yuv.shape == (2, 3, 72, 80)
    for b in range(2):
        for t in range(3):
            frame = av.VideoFrame.from_ndarray(rgb[b, t], format="rgb24")
            reference = frame.reformat(format="yuv420p", dst_colorspace="ITU709").to_ndarray()
            difference = np.abs(reference.astype(int) - yuv[b, t].astype(int))
            assert difference.max() <= 2, (b, t, difference.max())
            assert difference.mean() < 0.5


def test_yuv420_uses_limited_range_levels() -> None:
    white, black = torch.ones(1, 3, 1, 2, 2), -torch.ones(1, 3, 1, 2, 2)
    assert quantize_chunk_yuv420(white, (-1, 1)).flatten().tolist() == [235] * 4 + [128, 128]
    assert quantize_chunk_yuv420(black, (-1, 1)).flatten().tolist() == [16] * 4 + [128, 128]


def test_yuv420_rejects_odd_sizes() -> None:
    with pytest.raises(ValueError, match="even"):
        quantize_chunk_yuv420(torch.zeros(1, 3, 1, 3, 4), (-1, 1))


def reference_rgb24(chunk: torch.Tensor, value_range: tuple[float, float]) -> torch.Tensor:
    """The whole-chunk formula quantize_chunk has always computed (one float32 temporary per chunk)."""
    low, high = value_range
    x = chunk.permute(0, 2, 3, 4, 1).to(torch.float32, copy=True)
    x = x.clamp_(low, high).sub_(low).mul_(1.0 / (high - low))
    return x.mul_(255.0).round_().to(torch.uint8).contiguous()


def reference_yuv420(chunk: torch.Tensor, value_range: tuple[float, float]) -> torch.Tensor:
    """The whole-chunk formula quantize_chunk_yuv420 has always computed."""
    kr, kb = 0.2126, 0.0722
    kg = 1.0 - kr - kb
    low, high = value_range
    batch, _, frames, height, width = chunk.shape
    rgb = chunk.permute(0, 2, 3, 4, 1).to(torch.float32, copy=True)
    rgb = rgb.clamp_(low, high).sub_(low).mul_(1.0 / (high - low))
    r, g, b = rgb.unbind(-1)
    y = (kr * r + kg * g + kb * b).mul_(219.0).add_(16.0)
    half = rgb.reshape(batch, frames, height // 2, 2, width // 2, 2, 3).mean(dim=(3, 5))
    hr, hg, hb = half.unbind(-1)
    luma = kr * hr + kg * hg + kb * hb
    u = (hb - luma).mul_(224.0 / (2.0 * (1.0 - kb))).add_(128.0)
    v = (hr - luma).mul_(224.0 / (2.0 * (1.0 - kr))).add_(128.0)
    planes = torch.cat([p.reshape(batch, frames, -1) for p in (y, u, v)], dim=2)
    return planes.round_().clamp_(0, 255).to(torch.uint8).reshape(batch, frames, height * 3 // 2, width)


def awkward_chunk(
    shape: tuple[int, ...], value_range: tuple[float, float], dtype: torch.dtype
) -> torch.Tensor:
    """Values over and beyond ``value_range``, many exactly on a rounding boundary, and ±inf."""
    low, high = value_range
    generator = torch.Generator().manual_seed(sum(shape))
    x = torch.rand(shape, generator=generator) * (high - low) * 1.2 + low - 0.1 * (high - low)
    flat = x.view(-1)
    levels = torch.randint(0, 511, flat[::7].shape, generator=generator)
    flat[::7] = low + (high - low) * levels / 510.0
    x = x.to(dtype)
    x.view(-1)[::101] = float("inf")
    x.view(-1)[::103] = float("-inf")
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("value_range", [(-1.0, 1.0), (0.0, 1.0), (-0.37, 2.9), (0.0, 255.0)])
@pytest.mark.parametrize("shape", [(2, 3, 3, 64, 96), (1, 3, 2, 300, 1000), (1, 3, 1, 2, 2)])
def test_quantize_in_bands_is_bit_exact_with_the_whole_chunk_formula(
    dtype: torch.dtype, value_range: tuple[float, float], shape: tuple[int, ...]
) -> None:
    # 300×1000 takes several bands of rows per frame; a crop view is not contiguous.
    chunk = awkward_chunk(shape, value_range, dtype)
    cropped = chunk[..., : shape[3] // 4 * 2 or 2, : shape[4] - 2 or 2]
    for source in (chunk, cropped):
        assert torch.equal(quantize_chunk(source, value_range), reference_rgb24(source, value_range))
        assert torch.equal(quantize_chunk_yuv420(source, value_range), reference_yuv420(source, value_range))


def test_infinities_are_clamped_to_the_ends_of_the_range() -> None:
    chunk = torch.tensor([float("-inf"), float("inf")]).reshape(1, 1, 1, 1, 2).expand(1, 3, 1, 2, 2)
    assert quantize_chunk(chunk.contiguous(), (-1, 1))[0, 0, 0, :, 0].tolist() == [0, 255]


@pytest.mark.parametrize("pixel_format", ["rgb24", "yuv420p"])
def test_quantize_into_counts_nan_values_on_the_device(pixel_format: PixelFormat) -> None:
    chunk = moving_pattern(0, 3, batch=2, height=300, width=1000)  # several bands per frame
    quantizer = ChunkQuantizer((-1, 1), pixel_format)
    out = torch.empty((2, 3, *quantizer.frame_shape(300, 1000)), dtype=torch.uint8)
    count = torch.zeros((), dtype=torch.int64)
    quantizer.quantize_into(chunk, out, count)
    assert int(count) == 0
    chunk[1, 2, 1, 7, 3:9] = float("nan")
    chunk[0, 0, 2, 290, 999] = float("nan")
    chunk[0, 1, 0, 0, 0] = float("inf")  # not counted: clamped
    quantizer.quantize_into(chunk, out, count)
    assert int(count) == 7


@pytest.mark.parametrize("pixel_format", ["rgb24", "yuv420p"])
def test_quantize_into_allocates_nothing_the_size_of_a_chunk(pixel_format: PixelFormat) -> None:
    chunk = moving_pattern(0, 4, height=480, width=832)
    quantizer = ChunkQuantizer((-1, 1), pixel_format)
    out = torch.empty((1, 4, *quantizer.frame_shape(480, 832)), dtype=torch.uint8)
    count = torch.zeros((), dtype=torch.int64)
    quantizer.quantize_into(chunk, out, count)  # allocates the scratch it keeps
    with torch.autograd.profiler.profile(profile_memory=True, use_kineto=False) as profiler:
        quantizer.quantize_into(chunk, out, count)
    allocations = [e.cpu_memory_usage for e in profiler.function_events if e.cpu_memory_usage > 0]
    # Scalars only (a band's sum): the float32 arithmetic runs in the kept band-sized scratch.
    assert max(allocations, default=0) <= 64


def test_quantize_into_checks_its_output() -> None:
    quantizer = ChunkQuantizer((-1, 1))
    with pytest.raises(ValueError, match=r"out must be uint8 of shape \(1, 2, 4, 6, 3\)"):
        quantizer.quantize_into(torch.zeros(1, 3, 2, 4, 6), torch.empty(1, 2, 4, 6, 3))
    with pytest.raises(ValueError, match="pixel_format"):
        ChunkQuantizer((-1, 1), "nv12")  # type: ignore[arg-type]


# Per-channel value ranges (MiniMax-H3's ImageNet-normalized pixels)

IMAGENET = PerChannelRange(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


def imagenet_pipeline_levels(video: torch.Tensor) -> torch.Tensor:
    """What MiniMax-H3's modular pipeline does to its decode, then the video processor's uint8 rounding:
    ``(video.float() * pixel_std + pixel_mean).clamp(0, 1)``, ``* 255``, rounded, as BTHWC."""
    pixel_mean = torch.tensor(IMAGENET.mean).view(1, -1, 1, 1, 1)
    pixel_std = torch.tensor(IMAGENET.std).view(1, -1, 1, 1, 1)
    unit = (video.float() * pixel_std + pixel_mean).clamp(0, 1)
    return (unit * 255).round().to(torch.uint8).permute(0, 2, 3, 4, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_channel_range_quantizes_exactly_as_the_pipelines_float_math(dtype: torch.dtype) -> None:
    # Values spread over and beyond the normalized range, with every channel hitting both clamps.
    chunk = (torch.randn(2, 3, 3, 37, 41, generator=torch.Generator().manual_seed(0)) * 2.5).to(dtype)
    assert torch.equal(quantize_chunk(chunk, IMAGENET), imagenet_pipeline_levels(chunk))


def test_per_channel_range_in_bands_equals_the_whole_chunk() -> None:
    # A frame wider than one CPU band, so the quantizer's bands split it.
    chunk = torch.randn(1, 3, 2, 96, 1400, generator=torch.Generator().manual_seed(1))
    out = torch.empty(1, 2, 96, 1400, 3, dtype=torch.uint8)
    ChunkQuantizer(IMAGENET).quantize_into(chunk, out)
    assert torch.equal(out, imagenet_pipeline_levels(chunk))


def test_per_channel_range_yuv420_is_the_yuv420_of_its_rgb_levels() -> None:
    chunk = torch.randn(1, 3, 2, 16, 24, generator=torch.Generator().manual_seed(2))
    unit = chunk * torch.tensor(IMAGENET.std).view(1, 3, 1, 1, 1) + torch.tensor(IMAGENET.mean).view(
        1, 3, 1, 1, 1
    )
    assert torch.equal(quantize_chunk_yuv420(chunk, IMAGENET), quantize_chunk_yuv420(unit, (0.0, 1.0)))


def test_per_channel_range_normalizes_its_numbers() -> None:
    assert PerChannelRange(mean=[0, 0.5, 1], std=(1, 2, 3)) == PerChannelRange(  # type: ignore[arg-type]
        mean=(0.0, 0.5, 1.0), std=(1.0, 2.0, 3.0)
    )


@pytest.mark.parametrize(
    ("mean", "std", "message"),
    [
        ((0.5, 0.5), (1, 1, 1), "mean must be three"),
        ((0.5, 0.5, "0.5"), (1, 1, 1), "mean must be three"),
        ((0.5, 0.5, float("nan")), (1, 1, 1), "mean must be three"),
        ((0.5, 0.5, 0.5), (1, 1, 0), "std must be positive"),
        ((0.5, 0.5, 0.5), (1, -1, 1), "std must be positive"),
        ((0.5, 0.5, 0.5), (1, 1, 1e300), "std must be three"),
        ((0.5, 0.5, 0.5), None, "std must be three"),
    ],
)
def test_per_channel_range_rejects_bad_numbers_naming_the_field(
    mean: object, std: object, message: str
) -> None:
    with pytest.raises(ValueError, match=f"PerChannelRange: {message}"):
        PerChannelRange(mean=mean, std=std)  # type: ignore[arg-type]


def test_a_session_takes_a_per_channel_range() -> None:
    from streamvae import SessionOptions

    assert SessionOptions(value_range=IMAGENET, fps=8).value_range == IMAGENET
    with pytest.raises(ValueError, match="pair \\(low, high\\) of numbers or a streamvae.PerChannelRange"):
        SessionOptions(value_range={"mean": 0}, fps=8)  # type: ignore[arg-type]
