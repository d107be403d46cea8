"""MiniMaxH3ChunkedDecoder: each clip's head published as soon as the clip is decoded, then the last tail.

A tiny random-weight ``AutoencoderKLMiniMaxH3`` with the released temporal geometry (``clip_length`` 17,
``token_drop`` 3, 4× temporal compression: clips of 7 latents every 5, heads of 17 frames, tails of 5) and
4× spatial compression, so a 4×4 latent is a 16×16 frame. 5n + 2 latent frames fill n clips exactly; other
lengths are padded, and the padding's frames never published.
"""

from __future__ import annotations

import pytest
import torch
from diffusers.models.autoencoders.autoencoder_kl_minimax_h3 import AutoencoderKLMiniMaxH3
from torch import Tensor

from streamvae import PerChannelRange, quantize_chunk
from streamvae.models import chunked_decoder
from streamvae.models.minimax_h3 import IMAGENET_RANGE, MiniMaxH3ChunkedDecoder
from tests._adapters import check_batch_chunks, conforms, enable_square_tiles, reference
from tests._vaes import family_latents
from tests._vaes import tiny_minimax_h3 as tiny_vae

latent = family_latents(4, frames=12, size=4)


def small_tiles(vae: AutoencoderKLMiniMaxH3) -> None:
    """Tiles of 8 pixels (2 latents) overlapping by 4: a 16-pixel frame is 3×3 tiles."""
    enable_square_tiles(vae, sample_min=8, sample_min_overlap=4)


def walk(adapter: MiniMaxH3ChunkedDecoder, z: Tensor) -> tuple[list[int], list[int]]:
    """Decode ``z`` chunk by chunk, check the chunks join to ``vae.decode``, and give the frames of each
    chunk and the decoder calls made by the time it was published (the conformance suite, without its
    failure cases: :func:`conforms` runs those for a few lengths)."""
    calls = [0]
    handle = adapter.vae.decoder.register_forward_pre_hook(
        lambda module, args: calls.__setitem__(0, calls[0] + 1)
    )
    try:
        chunks: list[Tensor] = []
        published_at: list[int] = []
        for chunk in adapter.iter_chunks(z):
            chunks.append(chunk)
            published_at.append(calls[0])
    finally:
        handle.remove()
    assert torch.equal(torch.cat(chunks, dim=2), reference(adapter.vae, z))
    return [chunk.shape[2] for chunk in chunks], published_at


# (latent frames, frames per chunk, decoder calls when each chunk was published)
LENGTHS = [
    (3, [9], [1]),  # the fewest: one padded clip, its tail all padding
    (7, [17, 5], [1, 1]),  # exactly one clip: its head, then its tail
    (8, [17, 9], [1, 2]),  # two clips: the second head ends in padding, its tail is all padding
    (11, [17, 17, 1], [1, 2, 2]),  # two clips, one frame of the last tail kept
    (12, [17, 17, 5], [1, 2, 2]),  # exactly two clips
    (17, [17, 17, 17, 5], [1, 2, 3, 3]),  # exactly three clips
]


@pytest.mark.parametrize(("latent_frames", "sizes", "calls"), LENGTHS)
def test_chunks_concatenate_to_vae_decode_one_head_per_clip(
    latent_frames: int, sizes: list[int], calls: list[int]
) -> None:
    adapter = MiniMaxH3ChunkedDecoder(tiny_vae())
    # A head leaves before the next clip's decoder call.
    assert walk(adapter, latent(frames=latent_frames)) == (sizes, calls)
    assert adapter.output_frames(latent_frames) == sum(sizes)


@pytest.mark.parametrize("latent_frames", [7, 11])  # one exact clip; two clips and padding
def test_conformance_suite_passes(latent_frames: int) -> None:
    sizes, calls = next((s, c) for t, s, c in LENGTHS if t == latent_frames)
    report = conforms(MiniMaxH3ChunkedDecoder(tiny_vae()), latent(frames=latent_frames))
    assert (report.chunk_frames, report.decoder_calls) == (sizes, calls)


def test_output_frames_match_vae_decode_for_every_length() -> None:
    vae = tiny_vae()
    adapter = MiniMaxH3ChunkedDecoder(vae)
    for frames in range(1, 23):
        z = latent(frames=frames, size=1)
        if frames < adapter.min_latent_frames:
            with pytest.raises(ValueError):
                reference(vae, z)
            assert adapter.output_frames(frames) is None
        else:
            assert adapter.output_frames(frames) == reference(vae, z).shape[2]


@pytest.mark.parametrize(
    "geometry",
    [
        {"clip_length": 9, "token_drop": 1},  # clips of 5 latents every 3, heads of 9 frames, tails of 5
        {"clip_length": 8, "token_drop": 0},  # clips of 2 latents, no overlap, no pre-padding, no tails
        {"clip_length": 17, "token_drop": 5},  # token_drop a whole clip: tails of no frames
    ],
)
def test_other_clip_geometries_match_vae_decode(geometry: dict[str, int]) -> None:
    adapter = MiniMaxH3ChunkedDecoder(tiny_vae(**geometry))
    for frames in range(adapter.min_latent_frames, 12):
        sizes, calls = walk(adapter, latent(frames=frames, size=2))
        assert sum(sizes) == adapter.output_frames(frames)
        assert calls[: len(set(calls))] == list(range(1, len(set(calls)) + 1))  # one head per clip


def test_too_few_latent_frames_are_refused_naming_z() -> None:
    adapter = MiniMaxH3ChunkedDecoder(tiny_vae())
    assert adapter.min_latent_frames == 3
    published: list[Tensor] = []
    with pytest.raises(ValueError, match=r"z must have at least 3 latent frames"):
        adapter.decode_with_chunks(latent(frames=2), on_chunk=published.append)
    with pytest.raises(ValueError, match=r"\bz\b"):
        adapter.prepare_latents(latent(frames=1))
    assert not published


def test_the_first_head_is_published_before_the_second_clip_decodes_a_tile() -> None:
    vae = tiny_vae()
    small_tiles(vae)
    assert walk(MiniMaxH3ChunkedDecoder(vae), latent(frames=12)) == ([17, 17, 5], [9, 18, 18])  # 3×3 tiles


def test_spatial_tiling_inside_each_clip_matches_vae_decode() -> None:
    vae = tiny_vae()
    assert vae.use_tiling  # on by default; a 16-pixel frame fits the default 256-pixel tile
    small_tiles(vae)
    z = latent(frames=11)
    assert conforms(MiniMaxH3ChunkedDecoder(vae), z).chunk_frames == [17, 17, 1]
    tiled = reference(vae, z)
    vae.disable_tiling()
    assert not torch.equal(reference(vae, z), tiled)  # the tiles matter: this tests tiling


def test_without_tiling_matches_vae_decode() -> None:
    vae = tiny_vae()
    vae.disable_tiling()
    assert walk(MiniMaxH3ChunkedDecoder(vae), latent(frames=12)) == ([17, 17, 5], [1, 2, 2])


@pytest.mark.parametrize("use_slicing", [False, True])
def test_batches_publish_whole_batch_chunks(use_slicing: bool) -> None:
    adapter = MiniMaxH3ChunkedDecoder(tiny_vae())
    check_batch_chunks(adapter, latent(batch=2, frames=8), [17, 9], use_slicing=use_slicing)


def test_mixed_precision_casts_like_vae_decode() -> None:
    # As from_pretrained(torch_dtype=torch.bfloat16) loads it: the _keep_in_fp32_modules stay float32.
    vae = tiny_vae()
    with torch.no_grad():
        for name, param in vae.named_parameters():
            if not any(kept in name.split(".") for kept in vae._keep_in_fp32_modules):
                param.data = param.data.to(torch.bfloat16)
    adapter = MiniMaxH3ChunkedDecoder(vae)
    z = latent(frames=7)
    prepared = adapter.prepare_latents(z)
    assert prepared.dtype == vae.post_quant_conv.weight.dtype == torch.bfloat16
    conforms(adapter, prepared, expected=reference(vae, z))


def test_vae_decode_is_unchanged_after_a_chunked_decode() -> None:
    vae = tiny_vae()
    small_tiles(vae)
    z = latent(frames=11)
    before = reference(vae, z)
    settings = dict(vars(vae))
    chunks = list(MiniMaxH3ChunkedDecoder(vae).iter_chunks(z))
    assert len(chunks) == 3
    assert dict(vars(vae)).keys() == settings.keys()
    assert all(vars(vae)[key] is value for key, value in settings.items() if key != "_modules")
    assert torch.equal(reference(vae, z), before)


def test_registry_returns_the_adapter_with_imagenet_pixels() -> None:
    vae = tiny_vae()
    adapter = chunked_decoder(vae)
    assert type(adapter) is MiniMaxH3ChunkedDecoder and adapter.vae is vae
    assert adapter.chunk_value_range == IMAGENET_RANGE
    assert PerChannelRange(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)) == IMAGENET_RANGE
    assert (adapter.latent_channels, adapter.is_output_rank, adapter.streams) == (4, True, True)
    with pytest.raises(TypeError, match="cannot decode latents in pieces .*AutoencoderKLWan"):
        adapter.start(1, 4, 4)


def test_pixel_mean_and_std_replace_imagenet() -> None:
    adapter = chunked_decoder(tiny_vae(), pixel_mean=(0.5, 0.5, 0.5), pixel_std=(0.5, 0.5, 0.5))
    assert adapter.chunk_value_range == PerChannelRange(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    assert MiniMaxH3ChunkedDecoder.chunk_value_range == IMAGENET_RANGE  # the class keeps ImageNet's
    only_std = MiniMaxH3ChunkedDecoder(tiny_vae(), pixel_std=(1.0, 1.0, 1.0))
    assert only_std.chunk_value_range == PerChannelRange(mean=IMAGENET_RANGE.mean, std=(1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="std must be positive"):
        MiniMaxH3ChunkedDecoder(tiny_vae(), pixel_std=(0.5, 0.0, 0.5))


def test_quantized_chunks_are_the_modular_pipelines_pixels() -> None:
    """The chunks in chunk_value_range quantize to what MiniMaxH3VideoDecodeStep and the video processor
    make of vae.decode: ``(video.float() * pixel_std + pixel_mean).clamp(0, 1)``, then ``* 255`` rounded."""
    vae = tiny_vae()
    z = latent(frames=12)
    adapter = MiniMaxH3ChunkedDecoder(vae)
    levels = torch.cat(
        [quantize_chunk(chunk, adapter.chunk_value_range) for chunk in adapter.iter_chunks(z)], 1
    )
    mean = torch.tensor(IMAGENET_RANGE.mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(IMAGENET_RANGE.std).view(1, -1, 1, 1, 1)
    video = (reference(vae, z).float() * std + mean).clamp(0, 1)
    assert bool((video == 0).any()) and bool((video == 1).any())  # both clamps are reached
    assert torch.equal(levels, (video * 255).round().to(torch.uint8).permute(0, 2, 3, 4, 1))
