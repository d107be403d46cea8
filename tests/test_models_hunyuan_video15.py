"""HunyuanVideo15ChunkedDecoder: a causal decoder walked a latent frame a step, each step's frames published.

A tiny random-weight ``AutoencoderKLHunyuanVideo15`` (4× temporal, 8× spatial, 8 channels). Step by step
rounds like the whole clip only in part, so float32 decodes are compared within ``ATOL`` (measured max
|Δ| about 5e-6; one uint8 level is 7.8e-3). The decoder's steps are counted by its first convolution
(``decoder.conv_in.conv``): the adapter calls the decoder's submodules, never the decoder itself.
"""

from __future__ import annotations

import pytest
import torch
from accelerate.hooks import ModelHook, add_hook_to_module
from torch import Tensor

from streamvae.models.hunyuan_video15 import HunyuanVideo15ChunkedDecoder
from streamvae.testing import ChunkedDecoderReport, check_chunked_decoder
from tests._adapters import check_tiling_matters, enable_square_tiles, reference
from tests._vaes import family_latents
from tests._vaes import tiny_hunyuan_video15 as tiny_vae

#: What the tiny VAE's float32 step-by-step decode may differ by from ``vae.decode`` (measured: 5e-6).
ATOL = 2e-5

latent = family_latents(4, frames=5, size=3)


def conforms(
    adapter: HunyuanVideo15ChunkedDecoder, z: Tensor, *, expected: Tensor | None = None, atol: float = ATOL
) -> ChunkedDecoderReport:
    """The conformance suite against ``vae.decode(z)`` (or ``expected``), with a no-op accelerate hook on
    the VAE (checked to run once a decode) and the decoder's steps counted by its first convolution."""
    vae = adapter.vae
    if getattr(vae, "_hf_hook", None) is None:
        add_hook_to_module(vae, ModelHook())
    if expected is None:
        expected = reference(vae, z)
    return check_chunked_decoder(
        adapter, z, reference=expected, atol=atol, step_module=vae.decoder.conv_in.conv
    )


@pytest.mark.parametrize("latent_frames", [2, 5, 7])
def test_chunks_concatenate_to_vae_decode_one_latent_frame_each(latent_frames: int) -> None:
    report = conforms(HunyuanVideo15ChunkedDecoder(tiny_vae()), latent(frames=latent_frames))
    assert report.chunk_frames == [1] + [4] * (latent_frames - 1)
    assert report.decoder_calls == list(range(1, latent_frames + 1))  # each chunk leaves after its step


def test_a_single_latent_frame_decodes_bit_for_bit() -> None:
    report = conforms(HunyuanVideo15ChunkedDecoder(tiny_vae()), latent(frames=1), atol=0.0)
    assert report.chunk_frames == [1]


def test_frames_depend_on_no_later_latent_frame() -> None:
    """The rule the adapter builds on, checked on diffusers itself: frames up to latent frame k's (1 + 4k)
    are bit-identical whatever the later latents hold, and latent frame k itself does reach its frames (no
    norm over the call's frames, unlike HunyuanVideo's GroupNorm)."""
    vae = tiny_vae()
    z = latent()
    full = reference(vae, z)
    for k in range(4):
        kept = 1 + 4 * k
        later = z.clone()
        later[:, :, k + 1 :] += 1.0
        assert torch.equal(reference(vae, later)[:, :, :kept], full[:, :, :kept])
        own = z.clone()
        own[:, :, k] += 1.0
        assert not torch.equal(reference(vae, own)[:, :, kept - 1], full[:, :, kept - 1])


def test_spatial_tiles_walk_apart_and_blend_each_step_as_tiled_decode() -> None:
    vae = tiny_vae()
    enable_square_tiles(vae, sample_min=32, latent_min=4)
    z = latent(size=6)  # latent tiles of 4 every 3: 2 × 2 tiles
    report = conforms(HunyuanVideo15ChunkedDecoder(vae), z)
    assert report.chunk_frames == [1, 4, 4, 4, 4]
    assert report.decoder_calls == [4 * step for step in range(1, 6)]
    check_tiling_matters(vae, z)


def test_slicing_decodes_each_entry_alone_and_publishes_whole_batch_chunks() -> None:
    vae = tiny_vae()
    vae.use_slicing = True
    report = conforms(HunyuanVideo15ChunkedDecoder(vae), latent(batch=2))
    assert [tuple(chunk.shape[:3]) for chunk in report.chunks] == [(2, 3, 1)] + [(2, 3, 4)] * 4
    assert report.decoder_calls == [2 * step for step in range(1, 6)]


def test_a_batch_without_slicing_decodes_together_as_each_entry_alone() -> None:
    """diffusers' own decode fails here (its attention mask, expanded over the batch, broadcasts against
    the heads); the adapter gives what decoding the entries one by one gives."""
    vae = tiny_vae()
    z = latent(batch=2)
    with pytest.raises(RuntimeError, match="broadcast"):
        reference(vae, z)
    vae.use_slicing = True
    entries_alone = reference(vae, z)
    vae.use_slicing = False
    report = conforms(HunyuanVideo15ChunkedDecoder(vae), z, expected=entries_alone)
    assert report.decoder_calls == list(range(1, 6))  # one call a step for the whole batch


def test_bfloat16_decodes_within_one_bfloat16_step() -> None:
    """bfloat16 rounds the float32 noise away (measured: bit for bit here); one bfloat16 step at values in
    [1, 2) is 1/128, the bound allowed on other CPUs."""
    vae = tiny_vae().to(torch.bfloat16)
    z = latent(frames=3).to(torch.bfloat16)
    conforms(HunyuanVideo15ChunkedDecoder(vae), z, atol=1 / 128)


def test_vae_decode_is_unchanged_after_a_chunked_decode() -> None:
    vae = tiny_vae()
    z = latent()
    before = reference(vae, z)
    modules = {name: dict(vars(module)) for name, module in vae.named_modules()}
    chunks = list(HunyuanVideo15ChunkedDecoder(vae).iter_chunks(z))
    assert torch.allclose(torch.cat(chunks, dim=2), before, atol=ATOL)
    assert {name: dict(vars(module)) for name, module in vae.named_modules()} == modules
    assert torch.equal(reference(vae, z), before)


def test_output_frames_and_streams() -> None:
    adapter = HunyuanVideo15ChunkedDecoder(tiny_vae())
    assert adapter.streams
    assert [adapter.output_frames(t) for t in (1, 2, 5)] == [1, 5, 17]
