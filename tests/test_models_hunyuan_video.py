"""HunyuanVideoChunkedDecoder: each overlapping window's final frames, published as soon as they are final.

A tiny random-weight ``AutoencoderKLHunyuanVideo`` (4× temporal, 8× spatial) with small windows: 12 sample
frames (3 latents + 1) every 8 (2 latents), blending 4 frames. A 7-latent clip (25 frames) spans three
windows.
"""

from __future__ import annotations

import pytest

from streamvae.models.hunyuan_video import HunyuanVideoChunkedDecoder
from tests._adapters import check_batch_chunks, check_small_tiles, check_window_rule, conforms
from tests._vaes import family_latents
from tests._vaes import tiny_hunyuan_video as tiny_vae

latent = family_latents(4, frames=7, size=2)


def window_chunk_sizes(latent_frames: int, stride_frames: int) -> list[int]:
    """Frames per chunk: ``stride + 1`` for the first window, then ``stride`` a window, to the end."""
    total = (latent_frames - 1) * 4 + 1
    sizes = [min(stride_frames + 1, total)]
    while sum(sizes) < total:
        sizes.append(min(stride_frames, total - sum(sizes)))
    return sizes


@pytest.mark.parametrize(
    ("min_frames", "stride_frames", "latent_frames"),
    [(12, 8, 7), (12, 8, 6), (8, 4, 5), (16, 12, 9), (16, 12, 5)],
)
def test_chunks_concatenate_to_vae_decode_one_window_each(
    min_frames: int, stride_frames: int, latent_frames: int
) -> None:
    vae = tiny_vae(min_frames, stride_frames)
    report = conforms(HunyuanVideoChunkedDecoder(vae), latent(frames=latent_frames))
    assert report.chunk_frames == window_chunk_sizes(latent_frames, stride_frames)
    assert report.decoder_calls == list(range(1, len(report.chunks) + 1))  # one decoder call a window


def test_spatial_tiling_inside_each_window_matches_vae_decode() -> None:
    check_small_tiles(HunyuanVideoChunkedDecoder(tiny_vae()), latent(size=4), frames=[9, 8, 8])


@pytest.mark.parametrize("use_slicing", [False, True])
def test_batches_publish_whole_batch_chunks(use_slicing: bool) -> None:
    adapter = HunyuanVideoChunkedDecoder(tiny_vae())
    check_batch_chunks(adapter, latent(batch=2), [9, 8, 8], use_slicing=use_slicing)


def test_window_frames_depend_on_no_later_latent_and_a_single_call_on_its_last() -> None:
    check_window_rule(tiny_vae(), latent(), kept=[9, 17])  # frames kept by windows 0 and 1


def test_without_framewise_decoding_one_decoder_call_is_handed_on_a_latent_frame_at_a_time() -> None:
    vae = tiny_vae()
    vae.use_framewise_decoding = False
    adapter = HunyuanVideoChunkedDecoder(vae)
    report = conforms(adapter, latent())
    assert report.chunk_frames == [1, 4, 4, 4, 4, 4, 4] and report.decoder_calls == [1] * 7
    assert not adapter.streams
