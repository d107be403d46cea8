"""Kandinsky6SRChunkedDecoder: each segment of Kandinsky6SRVAE's causal decode, published as it is decoded.

A tiny random-weight ``Kandinsky6SRVAE`` (four levels of 8 channels: 8× spatial, 4× temporal, 4 latent
channels). Its ``vae.decode`` cuts a latent into segments of 5, then 4 latent frames (17, then 16 sample
frames) sharing a cache. The reference of every exactness test is diffusers' own ``vae.decode`` on the
same instance, compared with ``torch.equal``. What it shares with KVAE (the first chunk leaving alone, latents
in pieces, the VAE left as it was) is tested for both in test_segment_families.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import Kandinsky6SRVAE

from streamvae import decode_to_mp4
from streamvae.models import chunked_decoder
from streamvae.models.kandinsky6 import Kandinsky6SRChunkedDecoder
from tests._adapters import check_segment_chunks, reference
from tests._generate import LOSSLESS
from tests._media import bt709_luma, read_luma
from tests._vaes import family_latents, tiny_kandinsky6_sr

latent = family_latents(4, frames=10, size=2)


def diffusers_segments(vae: Kandinsky6SRVAE, latent_frames: int) -> list[int]:
    """The latent frames of each call ``vae.decode`` makes to its decoder: its own cut, recorded."""
    sizes: list[int] = []
    hook = vae.decoder.register_forward_pre_hook(lambda module, args: sizes.append(args[0].shape[2]))
    try:
        with torch.no_grad():
            vae.decode(latent(frames=latent_frames))
    finally:
        hook.remove()
    return sizes


# Whole latents


@pytest.mark.parametrize(
    ("latent_frames", "sizes"),
    [
        (1, [1]),  # one latent frame: one frame
        (3, [9]),  # fewer latents than a segment: one short segment
        (5, [17]),  # one full segment
        (6, [17, 4]),  # a last segment of one latent frame gives 4 frames
        (10, [17, 16, 4]),
    ],
)
def test_chunks_concatenate_to_vae_decode_one_segment_each(latent_frames: int, sizes: list[int]) -> None:
    check_segment_chunks(
        Kandinsky6SRChunkedDecoder(tiny_kandinsky6_sr()), latent(frames=latent_frames), sizes
    )


def test_the_cut_is_diffusers_own_and_greedy() -> None:
    vae = tiny_kandinsky6_sr()
    adapter = Kandinsky6SRChunkedDecoder(vae)
    for frames in range(1, 15):
        assert adapter._segment_sizes(frames) == diffusers_segments(vae, frames), frames


def test_a_batch_decodes_together_in_each_segment() -> None:
    vae = tiny_kandinsky6_sr()
    z = latent(batch=2, frames=6, seed=1)
    chunks = list(Kandinsky6SRChunkedDecoder(vae).iter_chunks(z))
    assert [tuple(chunk.shape[:3]) for chunk in chunks] == [(2, 3, 17), (2, 3, 4)]
    assert torch.equal(torch.cat(chunks, dim=2), reference(vae, z))


# Construction, registry, end to end


def test_chunked_decoder_wraps_the_class_in_its_adapter() -> None:
    vae = tiny_kandinsky6_sr()
    adapter = chunked_decoder(vae)
    assert type(adapter) is Kandinsky6SRChunkedDecoder and adapter.vae is vae
    assert (adapter.latent_channels, adapter.chunk_value_range, adapter.takes_pieces) == (
        4,
        (-1.0, 1.0),
        True,
    )
    with pytest.raises(TypeError, match="wraps a diffusers Kandinsky6SRVAE"):
        Kandinsky6SRChunkedDecoder(object())  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_decode_to_mp4_writes_every_frame_of_the_decode() -> None:
    vae = tiny_kandinsky6_sr()
    z = latent()  # 10 latent frames: segments of 5, 4 and 1
    expected = reference(vae, z)
    (video,) = await decode_to_mp4(vae, z, fps=8, **LOSSLESS)
    pixels = ((expected[0].permute(1, 2, 3, 0) + 1) / 2).clamp(0, 1)  # [F, H, W, 3] in [0, 1]
    luma = bt709_luma(np.round(pixels.numpy() * 255).astype(np.uint8)).astype(int)
    assert luma.shape == (37, 16, 16)
    assert abs(read_luma(video).astype(int) - luma).max() <= 1
