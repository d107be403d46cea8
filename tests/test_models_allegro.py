"""AllegroChunkedDecoder: each temporal tile position's frames, published once no later tile overlaps them.

A tiny random-weight ``AutoencoderKLAllegro`` (4× temporal as Allegro's, 2× spatial) with small tiles: 12
frames (3 latents) every 8 (2 latents), 8×8 pixels (4×4 latents) every 4 rows and 6 columns (2 and 3 latents).
A 7-latent clip of 4×7 latents spans 3 temporal positions of 1×2 tiles: 8, 8 and 12 frames.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from diffusers.models.autoencoders.autoencoder_kl_allegro import AutoencoderKLAllegro
from torch import Tensor

from streamvae.models.allegro import AllegroChunkedDecoder
from tests._adapters import conforms, reference
from tests._vaes import set_allegro_tiles as set_tiles
from tests._vaes import tiny_allegro as tiny_vae


def latent(batch: int = 1, frames: int = 7, height: int = 4, seed: int = 0) -> Tensor:
    return torch.randn(batch, 4, frames, height, 7, generator=torch.Generator().manual_seed(seed))


def bcthw(vae: AutoencoderKLAllegro, z: Tensor) -> Tensor:
    """``vae.decode`` in BCTHW, as ``AllegroPipeline.decode_latents`` permutes it (batches: with slicing)."""
    slicing, vae.use_slicing = vae.use_slicing, True
    try:
        return reference(vae, z).permute(0, 2, 1, 3, 4)
    finally:
        vae.use_slicing = slicing


def walk(adapter: AllegroChunkedDecoder, z: Tensor) -> tuple[list[Tensor], list[int]]:
    """The chunks of a decode, and the decoder calls made by the time each was published."""
    chunks: list[Tensor] = []
    calls_at: list[int] = []
    calls = [0]

    def count(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        calls[0] += 1

    def on_chunk(chunk: Tensor) -> None:
        chunks.append(chunk.clone())
        calls_at.append(calls[0])

    handle = adapter.vae.decoder.register_forward_pre_hook(count)
    try:
        adapter.decode_with_chunks(z, on_chunk=on_chunk)
    finally:
        handle.remove()
    return chunks, calls_at


def test_conforms_publishing_each_position_before_the_next_one_decodes() -> None:
    vae = tiny_vae()
    z = latent()
    report = conforms(AllegroChunkedDecoder(vae), z, expected=bcthw(vae, z))
    assert report.chunk_frames == [8, 8, 12]
    assert report.decoder_calls == [2, 4, 6]  # 2 tiles a position (1 row, 2 columns)


@pytest.mark.parametrize(
    ("frames", "latent_frames", "sizes"),
    [
        ((12, 8), 8, [8, 8, 16]),  # no tile reaches the last latent: its 4 frames stay zero
        ((12, 8), 3, [12]),  # one position: one chunk
        ((16, 4), 7, [4, 4, 4, 16]),  # 12 frames blended: each position overlaps the next three
        ((12, 12), 6, [12, 12]),  # tiles meet without overlap
        ((8, 12), 7, [12, 16]),  # a gap of zero frames between tiles
    ],
)
def test_chunks_concatenate_to_vae_decode_one_temporal_position_each(
    frames: tuple[int, int], latent_frames: int, sizes: list[int]
) -> None:
    vae = tiny_vae()
    adapter = AllegroChunkedDecoder(vae)
    set_tiles(vae, frames)  # read at each decode, not when the adapter is made
    z = latent(frames=latent_frames)
    chunks, calls = walk(adapter, z)
    assert torch.equal(torch.cat(chunks, dim=2), bcthw(vae, z))
    assert [chunk.shape[2] for chunk in chunks] == sizes
    assert calls == [2 * (step + 1) for step in range(len(sizes))]


def test_rows_and_columns_of_spatial_tiles_match_vae_decode() -> None:
    vae = tiny_vae()
    z = latent(height=6)  # 2 rows of tiles (4 pixels blended) by 2 columns (2 pixels blended)
    chunks, calls = walk(AllegroChunkedDecoder(vae), z)
    assert torch.equal(torch.cat(chunks, dim=2), bcthw(vae, z))
    assert [chunk.shape[2] for chunk in chunks] == [8, 8, 12] and calls == [4, 8, 12]


def test_half_precision_matches_vae_decode() -> None:
    vae = tiny_vae()
    vae.to(dtype=torch.bfloat16)
    z = latent(frames=5).to(torch.bfloat16)
    chunks, _ = walk(AllegroChunkedDecoder(vae), z)
    video = torch.cat(chunks, dim=2)
    assert video.dtype == torch.bfloat16 and torch.equal(video, bcthw(vae, z))


def test_batch_entries_decode_alone_as_vae_decode_with_slicing() -> None:
    vae = tiny_vae()
    z = latent(batch=2, frames=5)
    expected = bcthw(vae, z)
    vae.use_slicing = True
    chunks, calls = walk(AllegroChunkedDecoder(vae), z)
    assert torch.equal(torch.cat(chunks, dim=2), expected) and calls == [4, 8]
    vae.use_slicing = False  # diffusers' tile buffer holds one entry: vae.decode fails for two
    with pytest.raises(RuntimeError):
        reference(vae, z)
    report = conforms(AllegroChunkedDecoder(vae), z, expected=expected)
    assert [tuple(chunk.shape[:3]) for chunk in report.chunks] == [(2, 3, 8), (2, 3, 12)]
    assert report.decoder_calls == [4, 8]  # 2 tiles a position, for each entry alone


def test_position_frames_depend_on_no_later_latent() -> None:
    """The rule the adapter builds on, checked on diffusers itself: once position i's tiles are added,
    frames before position i + 1 starts are final; latents after position i's last leave them bit-identical.
    """
    vae = tiny_vae()
    z = latent()
    full = bcthw(vae, z)
    for last_latent, final in [(2, 8), (4, 16)]:  # positions 0 and 1: latents 0–2 and 2–4
        later = z.clone()
        later[:, :, last_latent + 1 :] += 1.0
        changed = bcthw(vae, later)
        assert torch.equal(changed[:, :, :final], full[:, :, :final])
        assert not torch.equal(changed[:, :, final:], full[:, :, final:])


def test_vae_decode_is_unchanged_after_a_complete_and_a_stopped_decode() -> None:
    vae = tiny_vae()
    z = latent(frames=5)
    before = bcthw(vae, z)
    adapter = AllegroChunkedDecoder(vae)
    assert torch.equal(torch.cat(list(adapter.iter_chunks(z)), dim=2), before)
    steps = adapter.iter_chunks(z)
    next(steps)
    steps.close()
    assert torch.equal(bcthw(vae, z), before)
    assert not hasattr(vae, "_hf_hook")


def refused(adapter: AllegroChunkedDecoder, z: Tensor, match: str) -> None:
    """``decode_with_chunks(z)`` raises ValueError matching ``match`` with no decoder call and no chunk."""
    handle = adapter.vae.decoder.register_forward_pre_hook(lambda module, args: pytest.fail("decoded"))
    try:
        with pytest.raises(ValueError, match=match):
            adapter.decode_with_chunks(z, on_chunk=lambda chunk: pytest.fail("published"))
    finally:
        handle.remove()


def test_without_tiling_a_decode_is_refused_before_it_starts() -> None:
    vae = tiny_vae()
    vae.disable_tiling()
    adapter = AllegroChunkedDecoder(vae)
    with pytest.raises(NotImplementedError, match="without tiling"):
        reference(vae, latent())
    refused(adapter, latent(), r"vae\.use_tiling is off.*enable_tiling\(\)")
    with pytest.raises(ValueError, match="decode_to_mp4: vae.use_tiling is off"):
        adapter.check_latents(latent(), owner="decode_to_mp4")
    assert not adapter.streams


@pytest.mark.parametrize(("frames", "height"), [(2, 4), (7, 3)])  # tiles are 3 latents by 4 by 4
def test_a_latent_smaller_than_one_tile_is_refused_before_it_starts(frames: int, height: int) -> None:
    adapter = AllegroChunkedDecoder(tiny_vae())
    z = latent(frames=frames, height=height)
    refused(adapter, z, r"z of shape .* smaller than one decode tile of \(3, 4, 4\) latents")


def test_streams_and_output_frames_follow_the_vae() -> None:
    vae = tiny_vae()
    adapter = AllegroChunkedDecoder(vae)
    assert adapter.streams
    assert adapter.output_frames(7) == bcthw(vae, latent()).shape[2] == 28
