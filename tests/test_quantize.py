from __future__ import annotations

import av
import numpy as np
import pytest
import torch

from streamvae import quantize_chunk, quantize_chunk_yuv420
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
