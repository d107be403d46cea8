"""MagvitChunkedDecoder: each decoder call's frames, published as soon as the call returns.

A tiny random-weight ``AutoencoderKLMagvit`` (EasyAnimate's layout: 4× temporal, 8× spatial). The decoder runs
on the first latent frame alone (1 frame), then on ``num_latent_frames_batch_size`` latents a call (4 frames
each), carrying causal caches in its modules from one call to the next.
"""

from __future__ import annotations

import pytest
import torch
from diffusers.models.autoencoders.autoencoder_kl_magvit import (
    AutoencoderKLMagvit,
    EasyAnimateCausalConv3d,
    EasyAnimateUpsampler3D,
)
from torch import Tensor

from streamvae.models.magvit import MagvitChunkedDecoder
from tests._adapters import check_batch_chunks, check_tiling_matters, conforms, enable_square_tiles, reference
from tests._vaes import family_latents
from tests._vaes import tiny_magvit as tiny_vae

latent = family_latents(4, frames=4, size=2)


def module_caches(vae: AutoencoderKLMagvit) -> list[object]:
    """Every cache ``_clear_conv_cache`` clears that is not clear."""
    return [
        module.prev_features
        for module in vae.modules()
        if isinstance(module, (EasyAnimateCausalConv3d, EasyAnimateUpsampler3D))
        and module.prev_features is not None
    ]


@pytest.mark.parametrize(
    ("latent_frames", "batch_size", "sizes"),
    [
        (4, 1, [1, 4, 4, 4]),  # the default: the first latent alone, then one a call
        (5, 2, [1, 8, 8]),
        (4, 2, [1, 8, 4]),  # the last call takes what is left
        (3, 4, [1, 8]),
    ],
)
def test_chunks_concatenate_to_vae_decode_one_decoder_call_each(
    latent_frames: int, batch_size: int, sizes: list[int]
) -> None:
    vae = tiny_vae()
    vae.num_latent_frames_batch_size = batch_size
    adapter = MagvitChunkedDecoder(vae)
    report = conforms(adapter, latent(frames=latent_frames))
    assert report.chunk_frames == sizes
    assert report.decoder_calls == list(range(1, len(sizes) + 1))
    assert adapter.streams and not module_caches(vae)


def test_a_single_latent_frame_is_one_chunk_of_one_frame() -> None:
    vae = tiny_vae()
    z = latent(frames=1)
    chunks: list[Tensor] = []
    MagvitChunkedDecoder(vae).decode_with_chunks(z, on_chunk=chunks.append)
    assert [chunk.shape[2] for chunk in chunks] == [1]
    assert torch.equal(chunks[0], reference(vae, z))


def test_call_frames_depend_on_no_later_latent() -> None:
    """The rule the adapter builds on, checked on diffusers itself: a call's frames are fixed by its latents
    and the caches of earlier calls; changing any later latent leaves them bit-identical."""
    vae = tiny_vae()
    z = latent()
    full = reference(vae, z)
    for first_later_latent, kept in [(1, 1), (2, 5), (3, 9)]:
        later = z.clone()
        later[:, :, first_later_latent:] += 1.0
        assert torch.equal(reference(vae, later)[:, :, :kept], full[:, :, :kept])
        assert not torch.equal(reference(vae, later)[:, :, kept:], full[:, :, kept:])


def small_tiles(vae: AutoencoderKLMagvit) -> None:
    """Tiles of 24 pixels (3 latents) every 16 (2 latents): a 4×4 latent is 2×2 tiles."""
    enable_square_tiles(vae, sample_min=24, sample_stride=16)


@pytest.mark.parametrize("use_slicing", [False, True])
def test_spatial_tiling_frame_major_matches_tile_major_vae_decode(use_slicing: bool) -> None:
    vae = tiny_vae()
    small_tiles(vae)
    z = latent(batch=2, frames=3, size=4)
    check_batch_chunks(MagvitChunkedDecoder(vae), z, [1, 4, 4], use_slicing=use_slicing, tiles=2 * 2)
    vae.use_slicing = False  # untiled, diffusers' sliced decode fails (below)
    check_tiling_matters(vae, z)
    assert not module_caches(vae)


def test_spatial_tiling_switches_on_decodes_own_size_test() -> None:
    """diffusers compares the latent's width with the tile height and its height with the tile width."""
    vae = tiny_vae()
    small_tiles(vae)
    vae.tile_sample_min_height = 40  # 5 latents high, 3 wide: a 4-high, 2-wide latent fits one tile …
    z = latent(frames=3, size=4)[:, :, :, :, :2]
    assert conforms(MagvitChunkedDecoder(vae), z).chunk_frames == [1, 4, 4]
    check_tiling_matters(vae, z)  # … yet decode tiles it (height 4 > tile width 3), and so does the adapter


def test_batches_publish_whole_batch_chunks() -> None:
    check_batch_chunks(MagvitChunkedDecoder(tiny_vae()), latent(batch=2), [1, 4, 4, 4], use_slicing=False)


def test_slicing_decodes_each_entry_alone_where_diffusers_joins_mismatched_entries() -> None:
    vae = tiny_vae()
    z = latent(batch=2)
    each_alone = torch.cat([reference(vae, z[b : b + 1]) for b in range(2)])
    vae.use_slicing = True
    report = conforms(MagvitChunkedDecoder(vae), z, expected=each_alone)
    assert [tuple(chunk.shape[:3]) for chunk in report.chunks] == [(2, 3, n) for n in [1, 4, 4, 4]]
    assert report.decoder_calls == [2, 4, 6, 8]  # each step decodes each entry alone
    # diffusers' sliced decode leaves the first entry's caches to the second, which then gets 16 frames
    sliced = tiny_vae()
    sliced.use_slicing = True
    with pytest.raises(RuntimeError, match="Expected size 13 but got size 16"):
        reference(sliced, z)


def test_vae_decode_is_unchanged_after_a_complete_and_a_stopped_decode() -> None:
    vae = tiny_vae()
    z = latent()
    expected = reference(vae, z)
    adapter = MagvitChunkedDecoder(vae)
    adapter.decode_with_chunks(z, on_chunk=lambda chunk: None)
    assert not module_caches(vae) and torch.equal(reference(vae, z), expected)

    def fail(chunk: Tensor) -> None:
        raise OSError("sink closed")

    with pytest.raises(OSError, match="sink closed"):
        adapter.decode_with_chunks(z, on_chunk=fail)
    assert not module_caches(vae) and torch.equal(reference(vae, z), expected)

    chunks = adapter.iter_chunks(z)
    next(chunks)
    assert not module_caches(vae)  # between steps too: another decode may run in between
    assert torch.equal(reference(vae, z), expected)
    chunks.close()
    assert not module_caches(vae) and torch.equal(reference(vae, z), expected)


def test_a_decoder_call_that_fails_leaves_no_cache() -> None:
    vae = tiny_vae()
    z = latent()
    expected = reference(vae, z)
    calls = 0

    def fail_on_third_call(module: torch.nn.Module, inputs: tuple[Tensor]) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise MemoryError("out of memory")

    handle = vae.decoder.conv_out.register_forward_pre_hook(fail_on_third_call)
    with pytest.raises(MemoryError):
        MagvitChunkedDecoder(vae).decode_with_chunks(z, on_chunk=lambda chunk: None)
    handle.remove()
    assert not module_caches(vae) and torch.equal(reference(vae, z), expected)


def test_steps_of_two_decodes_on_one_module_interleave() -> None:
    vae = tiny_vae()
    first, second = latent(seed=1), latent(seed=2)
    adapter = MagvitChunkedDecoder(vae)
    steps = zip(adapter.iter_chunks(first), adapter.iter_chunks(second), strict=True)
    chunks = [torch.cat(step) for step in steps]
    assert torch.equal(torch.cat(chunks, dim=2), torch.cat([reference(vae, first), reference(vae, second)]))
