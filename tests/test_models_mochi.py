"""MochiChunkedDecoder: the whole-clip decode of ``vae.decode``, handed on a latent frame's worth at a time.

A tiny random-weight ``AutoencoderKLMochi`` (6× temporal, 8× spatial; 32 channels, the least its GroupNorm of
32 groups takes). A T-latent clip decodes to 6 T frames less the first 5: 1 + 6 (T − 1).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from streamvae.models.mochi import MochiChunkedDecoder
from tests._adapters import check_small_tiles, conforms, reference
from tests._vaes import family_latents
from tests._vaes import tiny_mochi as tiny_vae

latent = family_latents(12, frames=4, size=2)


def calls_of(module: torch.nn.Module) -> list[int]:
    """A counter of ``module``'s forward calls, from now on."""
    calls = [0]

    def count(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        calls[0] += 1

    module.register_forward_pre_hook(count)
    return calls


def test_without_dropping_frames_the_first_latent_frame_gives_six() -> None:
    vae = tiny_vae()
    vae.drop_last_temporal_frames = False
    adapter = MochiChunkedDecoder(vae)
    assert conforms(adapter, latent(frames=2)).chunk_frames == [6, 6]
    assert adapter.output_frames(2) == 12


def test_spatial_tiling_is_diffusers_tiled_decode() -> None:
    check_small_tiles(MochiChunkedDecoder(tiny_vae()), latent(frames=2, size=4), frames=[1, 6])


def test_vae_decode_is_unchanged_after_a_chunked_decode() -> None:
    vae = tiny_vae()
    z = latent(frames=2)
    before = reference(vae, z)
    settings = {name: getattr(vae, name) for name in ("use_tiling", "use_slicing", "use_framewise_decoding")}
    chunks = list(MochiChunkedDecoder(vae).iter_chunks(z))
    assert torch.equal(torch.cat(chunks, dim=2), before)
    assert torch.equal(reference(vae, z), before)
    assert {name: getattr(vae, name) for name in settings} == settings


def test_framewise_decoding_is_refused_before_any_work() -> None:
    vae = tiny_vae()
    vae.use_framewise_decoding = True
    adapter = MochiChunkedDecoder(vae)
    calls = calls_of(vae.decoder)
    published: list[Tensor] = []
    with pytest.raises(ValueError, match=r"vae\.use_framewise_decoding is on.*= False"):
        adapter.decode_with_chunks(latent(), on_chunk=published.append)
    with pytest.raises(ValueError, match=r"vae\.use_framewise_decoding"):
        adapter.iter_chunks(latent())
    assert calls == [0] and not published


def test_diffusers_framewise_decode_fails_or_does_not_join_its_batches() -> None:
    """Why the adapter refuses framewise decoding, checked on diffusers itself (0.42.1): the documented
    switch breaks the decoder, and the flag alone decodes batches of latents apart."""
    z = latent(frames=3)  # batches of 2 and 1 latent frames
    whole = reference(tiny_vae(), z)
    switched = tiny_vae()
    switched._enable_framewise_decoding()  # constant padding: the convolutions lose their spatial padding
    with pytest.raises(RuntimeError):
        reference(switched, z)
    flagged = tiny_vae()
    flagged.use_framewise_decoding = True
    apart = reference(flagged, z)
    assert apart.shape == whole.shape and (apart - whole).abs().max() > 0.05
    # the first batch alone is the same frames (a convolution over fewer frames rounds apart: not bit-equal)
    assert torch.allclose(apart[:, :, :7], whole[:, :, :7], rtol=0, atol=1e-5)
