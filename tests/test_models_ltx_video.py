"""LTXVideoChunkedDecoder: LTX-Video and LTX-2 temporal windows, published as soon as they are final.

Tiny random-weight VAEs (8× temporal, 8× spatial, ``patch_size=1``) with temporal tiling on and small windows:
24 sample frames (3 latents + 1) every 16 (2 latents), blending 8 frames. A 7-latent clip (49 frames) spans
three windows.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from streamvae.models import chunked_decoder
from streamvae.models.ltx_video import LTXVideoChunkedDecoder
from tests._adapters import check_batch_chunks, check_small_tiles, check_window_rule, conforms, reference
from tests._vaes import family_latents
from tests._vaes import tiny_ltx2_video as tiny_ltx2
from tests._vaes import tiny_ltx_video as tiny_vae

latent = family_latents(8, frames=7, size=2)


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
    report = conforms(LTXVideoChunkedDecoder(vae), latent(frames=latent_frames))
    assert report.chunk_frames == sizes
    assert report.decoder_calls == list(range(1, len(sizes) + 1))  # one decoder call a window


def test_spatial_tiling_inside_each_window_matches_vae_decode() -> None:
    check_small_tiles(LTXVideoChunkedDecoder(tiny_vae()), latent(size=4), frames=[17, 16, 16])


def test_window_frames_depend_on_no_later_latent_and_a_single_call_on_its_last() -> None:
    check_window_rule(tiny_vae(), latent(), kept=[17, 33])  # frames kept by windows 0 and 1


def test_without_temporal_tiling_one_decoder_call_is_handed_on_a_latent_frame_at_a_time() -> None:
    vae = tiny_vae()
    vae.use_framewise_decoding = False  # diffusers' default for LTX-Video
    adapter = LTXVideoChunkedDecoder(vae)
    report = conforms(adapter, latent(frames=3))
    assert report.chunk_frames == [1, 8, 8] and report.decoder_calls == [1, 1, 1]
    assert not adapter.streams


def test_timestep_passes_through_to_every_window() -> None:
    vae = tiny_vae(timestep_conditioning=True)
    z = latent()
    temb = torch.tensor([0.05])
    chunks = conforms(chunked_decoder(vae, temb=temb), z, temb).chunks
    assert not torch.equal(torch.cat(chunks, dim=2), reference(vae, z, torch.tensor([0.5])))


def test_slicing_without_timestep_matches_vae_decode() -> None:
    check_batch_chunks(LTXVideoChunkedDecoder(tiny_vae()), latent(batch=2), [17, 16, 16], use_slicing=True)


@pytest.mark.parametrize("timesteps", [[0.05, 0.5], [0.05]])
def test_slicing_gives_each_entry_its_timestep(timesteps: list[float]) -> None:
    # diffusers' sliced decode mis-pairs latents and timesteps (it fails); the meaning is one entry at a time.
    vae = tiny_vae(timestep_conditioning=True)
    vae.use_slicing = True
    z = latent(batch=2)
    temb = torch.tensor(timesteps)
    vae.use_slicing = False
    entries = [reference(vae, z[b : b + 1], temb[b : b + 1] if len(temb) > 1 else temb) for b in range(2)]
    vae.use_slicing = True
    conforms(LTXVideoChunkedDecoder(vae, temb=temb), z, expected=torch.cat(entries))


def test_injected_noise_matches_vae_decode_from_the_same_rng_state() -> None:
    vae = tiny_vae(timestep_conditioning=True, decoder_inject_noise=(True, True, True, True, False))
    z = latent()
    temb = torch.tensor([0.05])
    chunks: list[Tensor] = []
    torch.manual_seed(7)
    LTXVideoChunkedDecoder(vae, temb=temb).decode_with_chunks(z, on_chunk=chunks.append)
    torch.manual_seed(7)
    assert torch.equal(torch.cat(chunks, dim=2), reference(vae, z, temb))


@pytest.mark.parametrize("causal", [None, True, False])
def test_ltx2_windows_match_vae_decode(causal: bool | None) -> None:
    vae = tiny_ltx2()
    z = latent()
    adapter = chunked_decoder(vae, causal=causal)
    assert isinstance(adapter, LTXVideoChunkedDecoder)
    assert conforms(adapter, z, causal=causal).chunk_frames == [17, 16, 16]


def test_causal_is_refused_for_ltx_video() -> None:
    with pytest.raises(TypeError, match="causal"):
        LTXVideoChunkedDecoder(tiny_vae(), causal=True)


def test_other_modules_are_refused_by_name() -> None:
    with pytest.raises(TypeError, match="AutoencoderKLLTXVideo or AutoencoderKLLTX2Video, got torch.nn"):
        LTXVideoChunkedDecoder(torch.nn.Linear(1, 1))  # type: ignore[arg-type]
