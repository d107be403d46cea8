"""LTXVideoChunkedDecoder: LTX-Video and LTX-2 temporal windows, published as soon as they are final.

Tiny random-weight VAEs (8× temporal, 8× spatial, ``patch_size=1``) with temporal tiling on and small windows:
24 sample frames (3 latents + 1) every 16 (2 latents), blending 8 frames. A 7-latent clip (49 frames) spans
three windows.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from diffusers import AutoencoderKLLTX2Video, AutoencoderKLLTXVideo
from torch import Tensor

from streamvae.models import chunked_decoder
from streamvae.models.ltx_video import LTXVideoChunkedDecoder
from tests._adapters import check_hook_runs_once_per_decode, fail_at_second_chunk, reference, stream

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_vae(**config: Any) -> AutoencoderKLLTXVideo:
    torch.manual_seed(0)
    vae = AutoencoderKLLTXVideo(
        latent_channels=8,
        block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8),
        layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1),
        patch_size=1,
        **config,
    ).eval()
    vae.use_framewise_decoding = True
    vae.tile_sample_min_num_frames = 24
    vae.tile_sample_stride_num_frames = 16
    return vae


def tiny_ltx2() -> AutoencoderKLLTX2Video:
    torch.manual_seed(0)
    vae = AutoencoderKLLTX2Video(
        latent_channels=8,
        block_out_channels=(8, 16, 32, 64),
        decoder_block_out_channels=(8, 16, 32),
        layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1),
        patch_size=1,
        spatial_compression_ratio=8,
        temporal_compression_ratio=8,
    ).eval()
    vae.use_framewise_decoding = True
    vae.tile_sample_min_num_frames = 24
    vae.tile_sample_stride_num_frames = 16
    return vae


def latent(batch: int = 1, frames: int = 7, size: int = 2, seed: int = 0) -> Tensor:
    return torch.randn(batch, 8, frames, size, size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    ("min_frames", "stride_frames", "latent_frames", "sizes"),
    [
        (24, 16, 7, [17, 16, 16]),
        (24, 16, 6, [17, 16, 8]),
        (16, 8, 5, [9, 8, 8, 8]),
        (32, 16, 7, [17, 16, 16]),
    ],
)
def test_chunks_concatenate_to_vae_decode_one_window_each(
    min_frames: int, stride_frames: int, latent_frames: int, sizes: list[int]
) -> None:
    vae = tiny_vae()
    vae.tile_sample_min_num_frames = min_frames
    vae.tile_sample_stride_num_frames = stride_frames
    z = latent(frames=latent_frames)
    chunks = stream(LTXVideoChunkedDecoder(vae), z)
    assert [chunk.shape[2] for chunk in chunks] == sizes
    assert torch.equal(torch.cat(chunks, dim=2), reference(vae, z))


def test_spatial_tiling_inside_each_window_matches_vae_decode() -> None:
    vae = tiny_vae()
    vae.use_tiling = True
    vae.tile_sample_min_height = vae.tile_sample_min_width = 24
    vae.tile_sample_stride_height = vae.tile_sample_stride_width = 16
    z = latent(size=4)
    chunks = stream(LTXVideoChunkedDecoder(vae), z)
    assert [chunk.shape[2] for chunk in chunks] == [17, 16, 16]
    expected = reference(vae, z)
    assert torch.equal(torch.cat(chunks, dim=2), expected)
    vae.use_tiling = False
    assert not torch.equal(reference(vae, z), expected)  # tiling did change the decode


def test_window_frames_depend_on_no_later_latent() -> None:
    """The rule the adapter builds on, checked on diffusers itself: window k's kept frames are fixed by the
    latents it decodes (up to 2k + 3 here); changing any later latent leaves them bit-identical."""
    vae = tiny_vae()
    z = latent()
    full = reference(vae, z)
    for window, kept in enumerate([17, 33]):
        last_latent = 2 * window + 3
        later = z.clone()
        later[:, :, last_latent + 1 :] += 1.0
        assert torch.equal(reference(vae, later)[:, :, :kept], full[:, :, :kept])
        edge = z.clone()
        edge[:, :, last_latent] += 1.0  # the window's own last latent does reach its kept frames
        assert not torch.equal(reference(vae, edge)[:, :, kept - 8 : kept], full[:, :, kept - 8 : kept])


def test_without_temporal_tiling_the_decode_is_one_chunk() -> None:
    vae = tiny_vae()
    vae.use_framewise_decoding = False  # diffusers' default for LTX-Video
    z = latent(frames=3)
    chunks = stream(LTXVideoChunkedDecoder(vae), z)
    assert len(chunks) == 1
    assert torch.equal(chunks[0], reference(vae, z))
    # Why one chunk: the decoder is not causal, so the last latent moves the first frame.
    moved = z.clone()
    moved[:, :, -1] += 1.0
    assert not torch.equal(reference(vae, moved)[:, :, :1], chunks[0][:, :, :1])


def test_timestep_passes_through_to_every_window() -> None:
    vae = tiny_vae(timestep_conditioning=True)
    z = latent()
    temb = torch.tensor([0.05])
    chunks = stream(chunked_decoder(vae, temb=temb), z)
    assert torch.equal(torch.cat(chunks, dim=2), reference(vae, z, temb))
    assert not torch.equal(torch.cat(chunks, dim=2), reference(vae, z, torch.tensor([0.5])))


def test_slicing_without_timestep_matches_vae_decode() -> None:
    vae = tiny_vae()
    vae.use_slicing = True
    z = latent(batch=2)
    chunks = stream(LTXVideoChunkedDecoder(vae), z)
    assert [tuple(chunk.shape[:3]) for chunk in chunks] == [(2, 3, 17), (2, 3, 16), (2, 3, 16)]
    assert torch.equal(torch.cat(chunks, dim=2), reference(vae, z))


@pytest.mark.parametrize("timesteps", [[0.05, 0.5], [0.05]])
def test_slicing_gives_each_entry_its_timestep(timesteps: list[float]) -> None:
    # diffusers' sliced decode mis-pairs latents and timesteps (it fails); the meaning is one entry at a time.
    vae = tiny_vae(timestep_conditioning=True)
    vae.use_slicing = True
    z = latent(batch=2)
    temb = torch.tensor(timesteps)
    chunks = stream(LTXVideoChunkedDecoder(vae, temb=temb), z)
    vae.use_slicing = False
    entries = [reference(vae, z[b : b + 1], temb[b : b + 1] if len(temb) > 1 else temb) for b in range(2)]
    assert torch.equal(torch.cat(chunks, dim=2), torch.cat(entries))


def test_injected_noise_matches_vae_decode_from_the_same_rng_state() -> None:
    vae = tiny_vae(timestep_conditioning=True, decoder_inject_noise=(True, True, True, True, False))
    z = latent()
    temb = torch.tensor([0.05])
    torch.manual_seed(7)
    chunks = stream(LTXVideoChunkedDecoder(vae, temb=temb), z)
    torch.manual_seed(7)
    assert torch.equal(torch.cat(chunks, dim=2), reference(vae, z, temb))


@pytest.mark.parametrize("causal", [None, True, False])
def test_ltx2_windows_match_vae_decode(causal: bool | None) -> None:
    vae = tiny_ltx2()
    z = latent()
    adapter = chunked_decoder(vae, causal=causal)
    assert isinstance(adapter, LTXVideoChunkedDecoder)
    chunks = stream(adapter, z)
    assert [chunk.shape[2] for chunk in chunks] == [17, 16, 16]
    assert torch.equal(torch.cat(chunks, dim=2), reference(vae, z, causal=causal))


def test_causal_is_refused_for_ltx_video() -> None:
    with pytest.raises(TypeError, match="causal"):
        LTXVideoChunkedDecoder(tiny_vae(), causal=True)


def test_other_modules_are_refused_by_name() -> None:
    with pytest.raises(TypeError, match="AutoencoderKLLTXVideo or AutoencoderKLLTX2Video, got torch.nn"):
        LTXVideoChunkedDecoder(torch.nn.Linear(1, 1))  # type: ignore[arg-type]


def test_forward_hook_runs_once_per_decode_like_vae_decode() -> None:
    check_hook_runs_once_per_decode(tiny_vae(), LTXVideoChunkedDecoder, latent())


def test_failing_on_chunk_stops_at_the_next_window_and_keeps_no_chunk() -> None:
    vae = tiny_vae()
    adapter = LTXVideoChunkedDecoder(vae)
    error = RuntimeError("sink closed")
    z = latent()
    decoder_calls, published = fail_at_second_chunk(vae, adapter, z, error)
    assert len(published) == 2 and decoder_calls == 2  # the third window never ran
    assert all(ref() is None for ref in published)
    assert torch.equal(torch.cat(stream(adapter, z), dim=2), reference(vae, z))


@pytest.mark.parametrize(
    ("shape", "message"),
    [((1, 8, 7, 2), "5-D"), ((1, 4, 7, 2, 2), "8 latent channels"), ((0, 8, 7, 2, 2), "empty")],
)
def test_prepare_latents_names_z_and_the_expected_form(shape: tuple[int, ...], message: str) -> None:
    adapter = LTXVideoChunkedDecoder(tiny_vae())
    with pytest.raises(ValueError, match=rf"z must .*{message}.*\[batch, 8, frames, height, width\]"):
        adapter.prepare_latents(torch.zeros(shape))


def test_prepare_latents_casts_to_the_vae_dtype_and_device() -> None:
    adapter = LTXVideoChunkedDecoder(tiny_vae())
    z = adapter.prepare_latents(latent().double())
    assert z.dtype == torch.float32 and z.device == torch.device("cpu")
    assert (
        adapter.chunk_value_range == (-1.0, 1.0) and adapter.latent_channels == 8 and adapter.is_output_rank
    )
