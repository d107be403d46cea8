"""CogVideoXChunkedDecoder: each latent batch's frames, published as soon as the batch is decoded.

A tiny random-weight ``AutoencoderKLCogVideoX`` (4× temporal, 8× spatial). With the default batch of 2 latent
frames a 7-latent clip decodes as batches of 3, 2 and 2 latents: 9, 8 and 8 frames.
"""

from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKLCogVideoX
from torch import Tensor

from streamvae.models import chunked_decoder
from streamvae.models.cogvideox import CogVideoXChunkedDecoder
from streamvae.protocol import SupportsChunkedVAEDecode
from tests._adapters import check_hook_runs_once_per_decode, fail_at_second_chunk, reference, stream

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_vae() -> AutoencoderKLCogVideoX:
    torch.manual_seed(0)
    return AutoencoderKLCogVideoX(
        latent_channels=4, block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=4
    ).eval()


def latent(batch: int = 1, frames: int = 7, size: int = 2, seed: int = 0) -> Tensor:
    return torch.randn(batch, 4, frames, size, size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    ("latent_frames", "batch_size", "sizes"),
    [
        (7, 2, [9, 8, 8]),  # batches of 3, 2, 2 latents: an odd batch keeps its first frame single
        (6, 2, [8, 8, 8]),
        (1, 2, [1]),
        (7, 3, [16, 9]),  # batches of 4, 3 latents
        (2, 3, [8]),  # fewer latents than a batch: one batch of all of them
    ],
)
def test_chunks_concatenate_to_vae_decode_one_batch_each(
    latent_frames: int, batch_size: int, sizes: list[int]
) -> None:
    vae = tiny_vae()
    vae.num_latent_frames_batch_size = batch_size
    z = latent(frames=latent_frames)
    chunks = stream(CogVideoXChunkedDecoder(vae), z)
    assert [chunk.shape[2] for chunk in chunks] == sizes
    assert torch.equal(torch.cat(chunks, dim=2), reference(vae, z))


@pytest.mark.parametrize("use_slicing", [False, True])
def test_spatial_tiling_frame_major_matches_tile_major_vae_decode(use_slicing: bool) -> None:
    vae = tiny_vae()
    vae.enable_tiling(
        tile_sample_min_height=24,
        tile_sample_min_width=24,
        tile_overlap_factor_height=1 / 3,
        tile_overlap_factor_width=1 / 3,
    )
    vae.use_slicing = use_slicing
    z = latent(batch=2, size=4)
    chunks = stream(CogVideoXChunkedDecoder(vae), z)
    assert [tuple(chunk.shape[:3]) for chunk in chunks] == [(2, 3, 9), (2, 3, 8), (2, 3, 8)]
    expected = reference(vae, z)
    assert torch.equal(torch.cat(chunks, dim=2), expected)
    vae.use_tiling = False
    assert not torch.equal(reference(vae, z), expected)  # tiling did change the decode


@pytest.mark.parametrize("use_slicing", [False, True])
def test_batches_publish_whole_batch_chunks(use_slicing: bool) -> None:
    vae = tiny_vae()
    vae.use_slicing = use_slicing
    z = latent(batch=2)
    chunks = stream(CogVideoXChunkedDecoder(vae), z)
    assert [tuple(chunk.shape[:3]) for chunk in chunks] == [(2, 3, 9), (2, 3, 8), (2, 3, 8)]
    assert torch.equal(torch.cat(chunks, dim=2), reference(vae, z))


def test_batch_frames_depend_on_no_later_latent() -> None:
    """The rule the adapter builds on, checked on diffusers itself: a batch's frames are fixed by its own
    latents and the cache from earlier batches; changing any later latent leaves them bit-identical."""
    vae = tiny_vae()
    z = latent()
    full = reference(vae, z)
    for first_later_latent, kept in [(3, 9), (5, 17)]:
        later = z.clone()
        later[:, :, first_later_latent:] += 1.0
        assert torch.equal(reference(vae, later)[:, :, :kept], full[:, :, :kept])
    # Nothing in a batch is final early: GroupNorm spans the batch, so its last latent moves its first frame.
    inside = z.clone()
    inside[:, :, 4] += 1.0
    assert not torch.equal(reference(vae, inside)[:, :, 9], full[:, :, 9])


def test_forward_hook_runs_once_per_decode_like_vae_decode() -> None:
    check_hook_runs_once_per_decode(tiny_vae(), CogVideoXChunkedDecoder, latent())


@pytest.mark.parametrize("use_slicing", [False, True])
def test_failing_on_chunk_stops_at_the_next_batch_and_keeps_no_chunk(use_slicing: bool) -> None:
    vae = tiny_vae()
    vae.use_slicing = use_slicing
    adapter = CogVideoXChunkedDecoder(vae)
    error = KeyboardInterrupt()
    z = latent(batch=2)
    decoder_calls, published = fail_at_second_chunk(vae, adapter, z, error)
    # The third batch never ran: two decoder calls, or two per entry with slicing.
    assert len(published) == 2 and decoder_calls == (4 if use_slicing else 2)
    assert all(ref() is None for ref in published)
    assert torch.equal(torch.cat(stream(adapter, z), dim=2), reference(vae, z))


@pytest.mark.parametrize(
    ("shape", "message"),
    [((4, 7, 2, 2), "5-D"), ((1, 16, 7, 2, 2), "4 latent channels"), ((1, 4, 7, 0, 2), "empty")],
)
def test_prepare_latents_names_z_and_the_expected_form(shape: tuple[int, ...], message: str) -> None:
    adapter = CogVideoXChunkedDecoder(tiny_vae())
    with pytest.raises(ValueError, match=rf"z must .*{message}.*\[batch, 4, frames, height, width\]"):
        adapter.prepare_latents(torch.zeros(shape))


def test_prepare_latents_casts_to_the_vae_dtype_and_device() -> None:
    vae = tiny_vae().to(torch.bfloat16)
    z = CogVideoXChunkedDecoder(vae).prepare_latents(latent())
    assert z.dtype == torch.bfloat16 and z.device == torch.device("cpu")


def test_registry_returns_the_adapter() -> None:
    vae = tiny_vae()
    adapter = chunked_decoder(vae)
    assert isinstance(adapter, CogVideoXChunkedDecoder) and adapter.vae is vae
    assert isinstance(adapter, SupportsChunkedVAEDecode)
    assert (
        adapter.chunk_value_range == (-1.0, 1.0) and adapter.latent_channels == 4 and adapter.is_output_rank
    )
