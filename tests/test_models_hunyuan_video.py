"""HunyuanVideoChunkedDecoder: each overlapping window's final frames, published as soon as they are final.

A tiny random-weight ``AutoencoderKLHunyuanVideo`` (4× temporal, 8× spatial) with small windows: 12 sample
frames (3 latents + 1) every 8 (2 latents), blending 4 frames. A 7-latent clip (25 frames) spans three
windows.
"""

from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKLHunyuanVideo
from torch import Tensor

from streamvae.models import chunked_decoder
from streamvae.models.hunyuan_video import HunyuanVideoChunkedDecoder
from streamvae.protocol import SupportsChunkedVAEDecode
from tests._adapters import check_hook_runs_once_per_decode, fail_at_second_chunk, reference, stream

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_vae(min_frames: int = 12, stride_frames: int = 8) -> AutoencoderKLHunyuanVideo:
    torch.manual_seed(0)
    vae = AutoencoderKLHunyuanVideo(
        latent_channels=4, block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=4
    ).eval()
    vae.tile_sample_min_num_frames = min_frames
    vae.tile_sample_stride_num_frames = stride_frames
    return vae


def latent(batch: int = 1, frames: int = 7, size: int = 2, seed: int = 0) -> Tensor:
    return torch.randn(batch, 4, frames, size, size, generator=torch.Generator().manual_seed(seed))


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
    z = latent(frames=latent_frames)
    chunks = stream(HunyuanVideoChunkedDecoder(vae), z)
    assert [chunk.shape[2] for chunk in chunks] == window_chunk_sizes(latent_frames, stride_frames)
    assert torch.equal(torch.cat(chunks, dim=2), reference(vae, z))


def test_spatial_tiling_inside_each_window_matches_vae_decode() -> None:
    vae = tiny_vae()
    vae.enable_tiling(
        tile_sample_min_height=24,
        tile_sample_min_width=24,
        tile_sample_stride_height=16,
        tile_sample_stride_width=16,
    )
    z = latent(size=4)
    chunks = stream(HunyuanVideoChunkedDecoder(vae), z)
    assert [chunk.shape[2] for chunk in chunks] == [9, 8, 8]
    expected = reference(vae, z)
    assert torch.equal(torch.cat(chunks, dim=2), expected)
    vae.use_tiling = False
    assert not torch.equal(reference(vae, z), expected)  # tiling did change the decode


@pytest.mark.parametrize("use_slicing", [False, True])
def test_batches_publish_whole_batch_chunks(use_slicing: bool) -> None:
    vae = tiny_vae()
    vae.use_slicing = use_slicing
    z = latent(batch=2)
    chunks = stream(HunyuanVideoChunkedDecoder(vae), z)
    assert [tuple(chunk.shape[:3]) for chunk in chunks] == [(2, 3, 9), (2, 3, 8), (2, 3, 8)]
    assert torch.equal(torch.cat(chunks, dim=2), reference(vae, z))


def test_window_frames_depend_on_no_later_latent() -> None:
    """The rule the adapter builds on, checked on diffusers itself: window k's kept frames are fixed by the
    latents it decodes (up to 2k + 3 here); changing any later latent leaves them bit-identical."""
    vae = tiny_vae()
    z = latent()
    full = reference(vae, z)
    ends = [9, 17]  # frames kept by windows 0 and 1
    for window, kept in enumerate(ends):
        last_latent = 2 * window + 3
        later = z.clone()
        later[:, :, last_latent + 1 :] += 1.0
        assert torch.equal(reference(vae, later)[:, :, :kept], full[:, :, :kept])
        edge = z.clone()
        edge[:, :, last_latent] += 1.0  # the window's own last latent does reach its kept frames
        assert not torch.equal(reference(vae, edge)[:, :, kept - 8 : kept], full[:, :, kept - 8 : kept])


def test_without_framewise_decoding_the_decode_is_one_chunk() -> None:
    vae = tiny_vae()
    vae.use_framewise_decoding = False
    z = latent()
    chunks = stream(HunyuanVideoChunkedDecoder(vae), z)
    assert len(chunks) == 1
    assert torch.equal(chunks[0], reference(vae, z))
    # Why one chunk: in one decoder call GroupNorm spans all frames, so the last latent moves the first frame.
    moved = z.clone()
    moved[:, :, -1] += 1.0
    assert not torch.equal(reference(vae, moved)[:, :, :1], chunks[0][:, :, :1])


def test_forward_hook_runs_once_per_decode_like_vae_decode() -> None:
    check_hook_runs_once_per_decode(tiny_vae(), HunyuanVideoChunkedDecoder, latent())


@pytest.mark.parametrize("error", [RuntimeError("sink closed"), KeyboardInterrupt()])
def test_failing_on_chunk_stops_at_the_next_window_and_keeps_no_chunk(error: BaseException) -> None:
    vae = tiny_vae()
    adapter = HunyuanVideoChunkedDecoder(vae)
    z = latent()
    decoder_calls, published = fail_at_second_chunk(vae, adapter, z, error)
    assert len(published) == 2 and decoder_calls == 2  # the third window never ran
    assert all(ref() is None for ref in published)
    assert torch.equal(torch.cat(stream(adapter, z), dim=2), reference(vae, z))


@pytest.mark.parametrize(
    ("shape", "message"),
    [((1, 4, 7, 4), "5-D"), ((1, 3, 7, 4, 4), "4 latent channels"), ((1, 4, 0, 4, 4), "empty")],
)
def test_prepare_latents_names_z_and_the_expected_form(shape: tuple[int, ...], message: str) -> None:
    adapter = HunyuanVideoChunkedDecoder(tiny_vae())
    with pytest.raises(ValueError, match=rf"z must .*{message}.*\[batch, 4, frames, height, width\]"):
        adapter.prepare_latents(torch.zeros(shape))


def test_prepare_latents_casts_to_the_vae_dtype_and_device() -> None:
    adapter = HunyuanVideoChunkedDecoder(tiny_vae())
    z = adapter.prepare_latents(latent().double())
    assert z.dtype == torch.float32 and z.device == torch.device("cpu")


def test_registry_returns_the_adapter() -> None:
    vae = tiny_vae()
    adapter = chunked_decoder(vae)
    assert isinstance(adapter, HunyuanVideoChunkedDecoder) and adapter.vae is vae
    assert isinstance(adapter, SupportsChunkedVAEDecode)
    assert (
        adapter.chunk_value_range == (-1.0, 1.0) and adapter.latent_channels == 4 and adapter.is_output_rank
    )


def test_other_modules_are_refused_by_name() -> None:
    with pytest.raises(TypeError, match="wraps a diffusers AutoencoderKLHunyuanVideo, got torch.nn"):
        HunyuanVideoChunkedDecoder(torch.nn.Linear(1, 1))  # type: ignore[arg-type]
