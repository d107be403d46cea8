"""WanChunkedDecoder: the streamed decode of AutoencoderKLWan (2.1, 2.2) and AutoencoderKLQwenImage.

The reference for every exactness test is diffusers' own ``vae.decode`` (or ``tiled_decode``) on the same
instance with the same settings, compared with ``torch.equal`` on CPU float32.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from itertools import zip_longest
from typing import Any

import accelerate
import pytest
import torch
from diffusers import AutoencoderKLWan
from torch import Tensor, nn

from streamvae._protocol import SupportsChunkedVAEDecode
from streamvae.models import chunked_decoder
from streamvae.models.wan import WanChunkedDecoder, denormalize_wan_latents
from streamvae.testing import enable_small_tiling
from tests._adapters import conforms
from tests._vaes import latent, tiny_qwen_image, tiny_wan21, tiny_wan22

FAMILIES: dict[str, Callable[[], nn.Module]] = {
    "wan21": tiny_wan21,
    "wan22": tiny_wan22,
    "qwen_image": tiny_qwen_image,
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> tuple[Any, Tensor, Tensor]:
    """A family's tiny VAE, a 5-latent-frame latent and ``vae.decode`` of it."""
    vae = FAMILIES[request.param]()
    z = latent(vae, h=4, w=4)
    return vae, z, reference_decode(vae, z)


@pytest.fixture(scope="module")
def wan21() -> tuple[Any, Tensor, Tensor]:
    vae = tiny_wan21()
    z = latent(vae, h=4, w=4)
    return vae, z, reference_decode(vae, z)


def reference_decode(vae: Any, z: Tensor) -> Tensor:
    with torch.no_grad():
        out: Tensor = vae.decode(z).sample
    return out


def tiled_reference(vae: Any, z: Tensor) -> Tensor:
    """``tiled_decode``, clamped as ``decode`` clamps (Qwen-Image's ``tiled_decode`` does not)."""
    with torch.no_grad():
        out: Tensor = vae.tiled_decode(z).sample
    return out.clamp(-1.0, 1.0)


def collect(decoder: WanChunkedDecoder, z: Tensor) -> list[Tensor]:
    chunks: list[Tensor] = []
    decoder.decode_with_chunks(z, on_chunk=chunks.append)
    return chunks


@contextlib.contextmanager
def counting_decoder_calls(vae: Any) -> Iterator[list[int]]:
    """Count calls of ``vae.decoder`` (one per latent frame and tile) while the block runs."""
    calls = [0]

    def count(module: nn.Module, args: tuple[Any, ...]) -> None:
        calls[0] += 1

    handle = vae.decoder.register_forward_pre_hook(count)
    try:
        yield calls
    finally:
        handle.remove()


# The contract, exactness and chunk layout


def test_conforms_with_one_chunk_and_one_decoder_step_per_latent_frame(
    family: tuple[Any, Tensor, Tensor],
) -> None:
    vae, z, expected = family
    report = conforms(WanChunkedDecoder(vae), z, expected=expected)
    assert report.chunk_frames == [1, 4, 4, 4, 4]
    assert report.decoder_calls == [1, 2, 3, 4, 5]
    assert all(chunk.min() >= -1.0 and chunk.max() <= 1.0 for chunk in report.chunks)


def test_drain_runs_every_step_after_a_failure_without_publishing(wan21: tuple[Any, Tensor, Tensor]) -> None:
    vae, z, expected = wan21
    decoder = WanChunkedDecoder(vae, drain=True)
    assert decoder.drain
    conforms(decoder, z, expected=expected)  # the suite expects all 5 steps after each failure


def test_slicing_decodes_each_entry_alone_and_publishes_whole_batch_chunks() -> None:
    vae = tiny_wan22()
    vae.enable_slicing()
    report = conforms(WanChunkedDecoder(vae), latent(vae, batch=2, frames=3, h=4, w=4))
    assert report.decoder_calls == [2, 4, 6]  # each entry runs its own decoder step per latent frame
    assert [chunk.shape[0] for chunk in report.chunks] == [2, 2, 2]


@pytest.mark.parametrize("make_vae", [tiny_wan21, tiny_wan22], ids=["wan21", "wan22"])
def test_tiling_equals_tiled_decode(make_vae: Callable[[], Any]) -> None:
    vae = make_vae()
    enable_small_tiling(vae)
    z = latent(vae, frames=3, h=6, w=7)
    report = conforms(WanChunkedDecoder(vae), z, expected=tiled_reference(vae, z))
    assert report.decoder_calls == [6, 12, 18]  # 2×3 tiles, each stepped once per latent frame
    assert report.chunk_frames == [1, 4, 4]


def test_qwen_image_tiling_equals_tiled_decode_clamped_into_the_value_range() -> None:
    vae = tiny_qwen_image()
    enable_small_tiling(vae)
    z = latent(vae, frames=3, h=6, w=7)
    with torch.no_grad():
        assert (
            vae.tiled_decode(z).sample.abs().max() > 1.0
        )  # diffusers' Qwen-Image tiled_decode does not clamp
    conforms(WanChunkedDecoder(vae), z, expected=tiled_reference(vae, z))


def test_tiling_with_slicing_equals_vae_decode() -> None:
    vae = tiny_wan21()
    enable_small_tiling(vae)
    vae.enable_slicing()
    z = latent(vae, batch=2, frames=2, h=6, w=4)  # 2×2 tiles per entry
    assert conforms(WanChunkedDecoder(vae), z).decoder_calls == [8, 16]  # decode takes the tiled path


def test_tiling_is_skipped_for_a_latent_within_one_tile_as_decode_does() -> None:
    vae = tiny_wan21()
    enable_small_tiling(vae)
    assert conforms(WanChunkedDecoder(vae), latent(vae, frames=3, h=4, w=4)).decoder_calls == [1, 2, 3]


def test_bfloat16_vae_decodes_exactly_like_vae_decode() -> None:
    vae = tiny_wan21().to(torch.bfloat16)
    decoder = WanChunkedDecoder(vae)
    z = decoder.prepare_latents(latent(tiny_wan21(), h=4, w=4))
    assert z.dtype == torch.bfloat16
    assert conforms(decoder, z).chunks[0].dtype == torch.bfloat16


def test_chunks_carry_no_autograd_graph_and_on_chunk_keeps_the_callers_grad_mode(
    wan21: tuple[Any, Tensor, Tensor],
) -> None:
    vae, z, _ = wan21
    grad_modes: list[bool] = []

    def on_chunk(chunk: Tensor) -> None:
        grad_modes.append(torch.is_grad_enabled())
        assert not chunk.requires_grad

    with torch.enable_grad():
        WanChunkedDecoder(vae).decode_with_chunks(z, on_chunk=on_chunk)
    assert grad_modes == [True] * z.shape[2]


def test_decode_under_accelerate_cpu_offload_equals_reference(wan21: tuple[Any, Tensor, Tensor]) -> None:
    _, z, expected = wan21
    vae = tiny_wan21()  # same weights as the fixture's
    accelerate.cpu_offload(vae, execution_device=torch.device("cpu"))
    assert next(vae.parameters()).device.type == "meta"  # weights arrive only through the hooks
    decoder = WanChunkedDecoder(vae)
    assert decoder.prepare_latents(z).device.type == "cpu"
    conforms(decoder, z, expected=expected)  # counts the offload hook's pre_forward: once a decode


# Streams over one module


def test_two_adapters_over_one_module_decode_interleaved_and_both_exactly(
    wan21: tuple[Any, Tensor, Tensor],
) -> None:
    vae, z, reference = wan21
    other_z = latent(vae, frames=3, h=4, w=4, seed=7)
    other_reference = reference_decode(vae, other_z)
    outer_chunks: list[Tensor] = []
    inner_chunks: list[Tensor] = []
    inner = WanChunkedDecoder(vae)

    def on_outer_chunk(chunk: Tensor) -> None:
        outer_chunks.append(chunk)
        if len(outer_chunks) == 2:  # the outer decode is mid-way, its caches full
            inner.decode_with_chunks(other_z, on_chunk=inner_chunks.append)

    feat_map_before = vae.__dict__.get("_feat_map")
    WanChunkedDecoder(vae).decode_with_chunks(z, on_chunk=on_outer_chunk)
    assert torch.equal(torch.cat(outer_chunks, dim=2), reference)
    assert torch.equal(torch.cat(inner_chunks, dim=2), other_reference)
    assert vae.__dict__.get("_feat_map") is feat_map_before  # the module's own cache is never touched


def test_iter_chunks_decodes_only_the_latent_frames_asked_for(wan21: tuple[Any, Tensor, Tensor]) -> None:
    vae, z, reference = wan21
    with counting_decoder_calls(vae) as calls:
        chunks = WanChunkedDecoder(vae).iter_chunks(z)
        first, second = next(chunks), next(chunks)
        chunks.close()
    assert calls[0] == 2  # two latent frames asked for, two decoded; closing decoded nothing more
    assert torch.equal(torch.cat([first, second], dim=2), reference[:, :, :5])


# Latents in pieces

SPLITS = {"frame-by-frame": [1, 1, 1, 1, 1], "uneven": [2, 3], "long-first": [3, 1, 1], "whole": [5]}


def decode_pieces(decoder: WanChunkedDecoder, pieces: list[Tensor]) -> Tensor:
    """Feed ``pieces`` to one stream; each piece of t latent frames gives t chunks, the end none."""
    batch, _, _, height, width = pieces[0].shape
    state = decoder.start(batch, height, width)
    chunks: list[Tensor] = []
    for piece in pieces:
        made = list(decoder.feed(state, piece))
        assert len(made) == piece.shape[2]
        chunks += made
    assert list(decoder.end(state)) == []
    return torch.cat(chunks, dim=2)


@pytest.mark.parametrize("sizes", list(SPLITS.values()), ids=list(SPLITS))
def test_frames_from_any_split_equal_decoding_the_concatenated_latent(
    family: tuple[Any, Tensor, Tensor], sizes: list[int]
) -> None:
    vae, z, expected = family
    assert torch.equal(decode_pieces(WanChunkedDecoder(vae), list(z.split(sizes, dim=2))), expected)


@pytest.mark.parametrize("make_vae", list(FAMILIES.values()), ids=list(FAMILIES))
def test_pieces_with_slicing_and_tiling_equal_the_whole_decode(make_vae: Callable[[], Any]) -> None:
    vae = make_vae()
    vae.enable_slicing()
    z = latent(vae, batch=2, frames=3, h=4, w=4)
    assert torch.equal(
        decode_pieces(WanChunkedDecoder(vae), list(z.split([2, 1], dim=2))), reference_decode(vae, z)
    )
    enable_small_tiling(vae)
    vae.disable_slicing()
    z = latent(vae, frames=3, h=6, w=7)
    assert torch.equal(
        decode_pieces(WanChunkedDecoder(vae), list(z.split([1, 2], dim=2))), tiled_reference(vae, z)
    )


def test_two_streams_on_one_module_interleaved_each_equal_their_own_decode(
    wan21: tuple[Any, Tensor, Tensor],
) -> None:
    vae, z, expected = wan21
    other_z = latent(vae, batch=2, frames=3, h=4, w=6, seed=7)
    decoder = WanChunkedDecoder(vae)
    one, other = decoder.start(1, 4, 4), decoder.start(2, 4, 6)
    one_chunks: list[Tensor] = []
    other_chunks: list[Tensor] = []
    for one_piece, other_piece in zip(z.split([2, 3], dim=2), other_z.split([1, 2], dim=2), strict=True):
        # step by step, alternating: each stream's caches are its own
        steps = zip_longest(decoder.feed(one, one_piece), decoder.feed(other, other_piece))
        for one_chunk, other_chunk in steps:
            one_chunks += [] if one_chunk is None else [one_chunk]
            other_chunks += [] if other_chunk is None else [other_chunk]
    assert list(decoder.end(one)) == list(decoder.end(other)) == []
    assert torch.equal(torch.cat(one_chunks, dim=2), expected)
    assert torch.equal(torch.cat(other_chunks, dim=2), reference_decode(vae, other_z))


def test_a_stream_refuses_mismatched_pieces_and_use_after_its_end(wan21: tuple[Any, Tensor, Tensor]) -> None:
    vae, z, _ = wan21
    decoder = WanChunkedDecoder(vae)
    state = decoder.start(1, 4, 4)
    with pytest.raises(ValueError, match=re.escape("piece of the stream's latent [1, 16, frames, 4, 4]")):
        decoder.feed(state, latent(vae, frames=1, h=4, w=6))
    with pytest.raises(ValueError, match="16 latent channels"):
        decoder.feed(state, torch.zeros(1, 8, 1, 4, 4))
    with pytest.raises(ValueError, match="belongs to another decoder"):
        WanChunkedDecoder(vae).feed(state, z)
    steps = decoder.feed(state, z)
    next(steps)
    steps.close()  # a piece left half decoded: its caches no longer match a next piece
    with pytest.raises(ValueError, match=re.escape("not decoded to its end (1 of 5 latent frames)")):
        decoder.feed(state, z)
    assert list(decoder.end(state)) == list(decoder.end(state)) == []
    with pytest.raises(ValueError, match="stream has ended"):
        decoder.feed(state, z)
    with pytest.raises(ValueError, match="height must be a positive int, got 0"):
        decoder.start(1, 0, 4)


# Construction, registry and latents


@pytest.mark.parametrize(
    ("make_vae", "channels"), [(tiny_wan21, 16), (tiny_wan22, 48), (tiny_qwen_image, 16)]
)
def test_chunked_decoder_wraps_the_same_instance(make_vae: Callable[[], Any], channels: int) -> None:
    vae = make_vae()
    decoder = chunked_decoder(vae)
    assert isinstance(decoder, WanChunkedDecoder)
    assert isinstance(decoder, SupportsChunkedVAEDecode)
    assert decoder.vae is vae
    assert decoder.latent_channels == channels
    assert decoder.chunk_value_range == (-1.0, 1.0)
    assert decoder.is_output_rank is True


def test_unsupported_objects_raise_type_error_naming_the_class() -> None:
    with pytest.raises(TypeError, match="Linear"):
        chunked_decoder(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="Linear"):
        WanChunkedDecoder(nn.Linear(2, 2))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "shape",
    [
        (1, 16, 5, 8),
        (16, 5, 8, 8, 1, 1),
        (1, 15, 5, 8, 8),
        (0, 16, 5, 8, 8),
        (1, 16, 0, 8, 8),
        (1, 16, 5, 0, 8),
    ],
    ids=["4-D", "6-D", "wrong-channels", "empty-batch", "no-frames", "zero-height"],
)
def test_prepare_latents_and_decode_reject_malformed_latents(
    wan21: tuple[Any, Tensor, Tensor], shape: tuple[int, ...]
) -> None:
    vae, _, _ = wan21
    decoder = WanChunkedDecoder(vae)
    form = re.escape("[batch, 16, frames, height, width]")
    message = f"z must .*{form}.*" + re.escape(f"got shape {shape}")
    with pytest.raises(ValueError, match=message):
        decoder.prepare_latents(torch.zeros(shape))
    with pytest.raises(ValueError, match=message):
        decoder.decode_with_chunks(torch.zeros(shape), on_chunk=lambda chunk: None)


def test_prepare_latents_casts_to_the_vae_dtype_and_device(wan21: tuple[Any, Tensor, Tensor]) -> None:
    vae, z, _ = wan21
    prepared = WanChunkedDecoder(vae).prepare_latents(z.to(torch.float64))
    assert prepared.dtype == torch.float32 and prepared.device == z.device
    assert torch.equal(prepared, z)


def test_denormalize_matches_the_wan_pipeline_before_vae_decode() -> None:
    vae = tiny_wan22()  # z_dim 48, its own latents_mean / latents_std
    normalized = latent(vae, frames=2).to(torch.float64)
    # pipeline_wan.py (diffusers 0.42.1), the lines before vae.decode, with self.vae -> vae:
    latents = normalized.to(torch.device("cpu"), dtype=vae.dtype)
    latents_mean = (
        torch.tensor(vae.config.latents_mean)
        .view(1, vae.config.z_dim, 1, 1, 1)
        .to(latents.device, latents.dtype)
    )
    latents_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, vae.config.z_dim, 1, 1, 1).to(
        latents.device, latents.dtype
    )
    expected = latents / latents_std + latents_mean

    denormalized = denormalize_wan_latents(vae, normalized)
    assert denormalized.dtype == torch.float32
    assert torch.equal(denormalized, expected)
    mean = torch.tensor(vae.config.latents_mean).view(1, 48, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, 48, 1, 1, 1)
    assert torch.allclose(denormalized, normalized.float() * std + mean, atol=1e-5)


def test_denormalize_rejects_latents_with_the_wrong_channel_count() -> None:
    with pytest.raises(ValueError, match=r"latents must have 48 latent channels in dim 1"):
        denormalize_wan_latents(tiny_wan22(), torch.zeros(1, 16, 2, 4, 4))


def test_checkpoint_loaded_with_from_pretrained_streams_like_its_decode(
    tmp_path: Any, wan21: tuple[Any, Tensor, Tensor]
) -> None:
    vae, z, reference = wan21
    vae.save_pretrained(tmp_path / "vae")
    loaded = AutoencoderKLWan.from_pretrained(tmp_path, subfolder="vae").eval()
    decoder = chunked_decoder(loaded)
    assert isinstance(decoder, WanChunkedDecoder) and decoder.vae is loaded
    chunks: list[Tensor] = []
    decoder.decode_with_chunks(decoder.prepare_latents(z), on_chunk=chunks.append)
    assert torch.equal(torch.cat(chunks, dim=2), reference_decode(loaded, z))
    assert torch.equal(torch.cat(chunks, dim=2), reference)  # the same weights as the saved module
