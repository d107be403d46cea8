"""CosmosChunkedDecoder: the whole-clip decode of ``vae.decode``, handed on a latent frame's worth at a time.

A tiny random-weight ``AutoencoderKLCosmos`` (8× temporal, 8× spatial, Haar patches of 4; 8 channels, one
resnet a block, the mid block's spatial and temporal attention). A T-latent clip decodes to 1 + 8 (T − 1)
frames.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from streamvae.models.cosmos import CosmosChunkedDecoder
from tests._adapters import check_registry, conforms, reference
from tests._vaes import tiny_cosmos as tiny_vae

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def latent(batch: int = 1, frames: int = 3, size: int = 2, seed: int = 0) -> Tensor:
    return torch.randn(batch, 4, frames, size, size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("latent_frames", "sizes"), [(3, [1, 8, 8]), (1, [1])])
def test_chunks_are_the_whole_clip_decode_one_latent_frame_each(latent_frames: int, sizes: list[int]) -> None:
    adapter = CosmosChunkedDecoder(tiny_vae())
    report = conforms(adapter, latent(frames=latent_frames))
    assert report.chunk_frames == sizes
    assert report.decoder_calls == [1] * len(sizes)  # one decoder call over the clip, before any chunk
    assert adapter.output_frames(latent_frames) == sum(sizes) and not adapter.streams


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


@pytest.mark.parametrize("use_slicing", [False, True])
def test_batches_publish_whole_batch_chunks_slicing_decodes_each_entry_alone(use_slicing: bool) -> None:
    vae = tiny_vae()
    vae.use_slicing = use_slicing
    report = conforms(CosmosChunkedDecoder(vae), latent(batch=2, frames=2))
    assert [tuple(chunk.shape[:3]) for chunk in report.chunks] == [(2, 3, 1), (2, 3, 8)]
    entries = 2 if use_slicing else 1
    assert report.decoder_calls == [entries, entries]


def test_vae_decode_is_unchanged_after_a_chunked_decode() -> None:
    vae = tiny_vae()
    z = latent()
    before = reference(vae, z)
    assert torch.equal(torch.cat(list(CosmosChunkedDecoder(vae).iter_chunks(z)), dim=2), before)
    assert torch.equal(reference(vae, z), before)
    assert (vae.use_slicing, vae.use_tiling, vae.use_framewise_decoding) == (False, False, False)


def test_registry_returns_the_adapter() -> None:
    check_registry(tiny_vae(), CosmosChunkedDecoder, latent_channels=4)
