"""KVAEVideoChunkedDecoder: each segment of KVAE's causal decode, published as soon as it is decoded.

A tiny random-weight ``AutoencoderKLKVAEVideo`` (4× temporal, 4× spatial; 32 channels, the least its
32-group norms take). Its ``vae.decode`` cuts a latent into segments of 5, then 4 latent frames (17, then
16 sample frames) sharing a cache; a last segment of one latent frame gives one frame. The reference of
every exactness test is diffusers' own ``vae.decode`` on the same instance, compared with ``torch.equal``.
What it shares with Kandinsky 6 SR (the first chunk leaving alone, latents in pieces, the VAE left as it was)
is tested for both in test_segment_families.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from streamvae.models.kvae import KVAEVideoChunkedDecoder
from tests._adapters import (
    check_batch_chunks,
    check_segment_chunks,
    conforms,
    decode_pieces,
    reference,
)
from tests._vaes import family_latents
from tests._vaes import tiny_kvae as tiny_vae

latent = family_latents(4, frames=10, size=2)


def diffusers_segments(latent_frames: int, ratio: int, seg_len: int = 16) -> list[int]:
    """``AutoencoderKLKVAEVideo._decode``'s cut of a latent, verbatim."""
    split_list = [seg_len + 1]
    n_frames = ratio * (latent_frames - 1) - seg_len
    while n_frames > 0:
        split_list.append(seg_len)
        n_frames -= seg_len
    split_list[-1] += n_frames
    return [math.ceil(size / ratio) for size in split_list]


# Whole latents


@pytest.mark.parametrize(
    ("latent_frames", "sizes"),
    [
        (3, [9]),  # fewer latents than a segment: one short segment
        (5, [17]),  # one full segment
        (6, [17, 1]),  # a last segment of one latent frame gives one frame, as vae.decode does
        (8, [17, 12]),  # a short last segment of 3 latents
    ],
)
def test_chunks_concatenate_to_vae_decode_one_segment_each(latent_frames: int, sizes: list[int]) -> None:
    check_segment_chunks(KVAEVideoChunkedDecoder(tiny_vae()), latent(frames=latent_frames), sizes)


@pytest.mark.parametrize("ratio", [1, 2, 4, 8, 16])
def test_full_segments_keep_their_bounds_whatever_follows(ratio: int) -> None:
    """The rule latents in pieces build on, checked on diffusers' own cut: it is greedy, so a full segment
    is the same for every longer latent and only the last may be short."""
    first, later = math.ceil(17 / ratio), math.ceil(16 / ratio)
    for frames in range(1, 60):
        cut = diffusers_segments(frames, ratio)
        assert sum(cut) == frames
        assert all(size == (first if k == 0 else later) for k, size in enumerate(cut[:-1]))
        assert 0 < cut[-1] <= (first if len(cut) == 1 else later)


def test_a_two_times_temporal_layout_decodes_in_its_own_segments() -> None:
    vae = tiny_vae(ch_mult=[1, 1], temporal_compress_times=2)  # segments of 9, then 8 latent frames
    adapter = KVAEVideoChunkedDecoder(vae)
    report = conforms(adapter, latent(frames=11))
    assert report.chunk_frames == [17, 4] and adapter.output_frames(11) == 21


@pytest.mark.parametrize("use_slicing", [False, True])
def test_batches_publish_whole_batch_chunks_slicing_decodes_each_entry_alone(use_slicing: bool) -> None:
    adapter = KVAEVideoChunkedDecoder(tiny_vae())
    check_batch_chunks(adapter, latent(batch=2, frames=6, seed=1), [17, 1], use_slicing=use_slicing)


def test_tiling_flag_changes_nothing_as_vae_decode_never_tiles() -> None:
    vae = tiny_vae()
    z = latent()
    untiled = reference(vae, z)
    vae.enable_tiling()
    assert vae.use_tiling and torch.equal(reference(vae, z), untiled)
    assert torch.equal(torch.cat(list(KVAEVideoChunkedDecoder(vae).iter_chunks(z)), dim=2), untiled)


# Latents in pieces


def test_pieces_with_slicing_equal_the_whole_decode() -> None:
    vae = tiny_vae()
    vae.enable_slicing()
    z = latent(batch=2, frames=10, seed=2)
    chunks = decode_pieces(KVAEVideoChunkedDecoder(vae), list(z.split([3, 4, 3], dim=2)))
    assert torch.equal(torch.cat(chunks, dim=2), reference(vae, z))


# Construction, registry, end to end
