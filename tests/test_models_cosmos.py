"""CosmosChunkedDecoder: the whole-clip decode of ``vae.decode``, handed on a latent frame's worth at a time.

A tiny random-weight ``AutoencoderKLCosmos`` (8× temporal, 8× spatial, Haar patches of 4; 8 channels, one
resnet a block, the mid block's spatial and temporal attention). A T-latent clip decodes to 1 + 8 (T − 1)
frames.
"""

from __future__ import annotations

import torch

from streamvae.models.cosmos import CosmosChunkedDecoder
from tests._adapters import conforms, reference
from tests._vaes import family_latents
from tests._vaes import tiny_cosmos as tiny_vae

latent = family_latents(4, frames=3, size=2)


def test_tiling_and_framewise_flags_change_nothing_as_in_vae_decode() -> None:
    vae = tiny_vae()
    z = latent(frames=2, size=4)
    plain = reference(vae, z)
    vae.enable_tiling(tile_sample_min_height=16, tile_sample_min_width=16)
    vae.use_framewise_decoding = True
    vae.num_latent_frames_batch_size = 1
    report = conforms(CosmosChunkedDecoder(vae), z, expected=plain)
    assert report.chunk_frames == [1, 8] and report.decoder_calls == [1, 1]
    assert torch.equal(reference(vae, z), plain)


def test_vae_decode_is_unchanged_after_a_chunked_decode() -> None:
    vae = tiny_vae()
    z = latent()
    before = reference(vae, z)
    assert torch.equal(torch.cat(list(CosmosChunkedDecoder(vae).iter_chunks(z)), dim=2), before)
    assert torch.equal(reference(vae, z), before)
    assert (vae.use_slicing, vae.use_tiling, vae.use_framewise_decoding) == (False, False, False)
