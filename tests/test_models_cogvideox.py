"""CogVideoXChunkedDecoder: each latent batch's frames, published as soon as the batch is decoded.

A tiny random-weight ``AutoencoderKLCogVideoX`` (4× temporal, 8× spatial). With the default batch of 2 latent
frames a 7-latent clip decodes as batches of 3, 2 and 2 latents: 9, 8 and 8 frames.
"""

from __future__ import annotations

import pytest

from streamvae.models.cogvideox import CogVideoXChunkedDecoder
from tests._adapters import (
    check_batch_chunks,
    check_later_latents_leave_frames,
    check_tiling_matters,
    conforms,
    enable_square_tiles,
)
from tests._vaes import family_latents
from tests._vaes import tiny_cogvideox as tiny_vae

latent = family_latents(4, frames=7, size=2)


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
    report = conforms(CogVideoXChunkedDecoder(vae), latent(frames=latent_frames))
    assert report.chunk_frames == sizes
    assert report.decoder_calls == list(range(1, len(sizes) + 1))  # one decoder call a latent batch


@pytest.mark.parametrize("use_slicing", [False, True])
def test_spatial_tiling_frame_major_matches_tile_major_vae_decode(use_slicing: bool) -> None:
    vae = tiny_vae()
    enable_square_tiles(vae, sample_min=24, overlap_factor=1 / 3)
    z = latent(batch=2, size=4)
    check_batch_chunks(CogVideoXChunkedDecoder(vae), z, [9, 8, 8], use_slicing=use_slicing, tiles=2 * 2)
    check_tiling_matters(vae, z)


@pytest.mark.parametrize("use_slicing", [False, True])
def test_batches_publish_whole_batch_chunks_slicing_decodes_each_entry_alone(use_slicing: bool) -> None:
    check_batch_chunks(
        CogVideoXChunkedDecoder(tiny_vae()), latent(batch=2), [9, 8, 8], use_slicing=use_slicing
    )


def test_batch_frames_depend_on_no_later_latent() -> None:
    """The rule the adapter builds on, checked on diffusers itself: a batch's frames are fixed by its own
    latents and the cache from earlier batches; changing any later latent leaves them bit-identical."""
    # Nothing in a batch is final early: GroupNorm spans the batch, so its last latent moves its first frame.
    check_later_latents_leave_frames(tiny_vae(), latent(), [(3, 9), (5, 17)], moved=(4, 9))
