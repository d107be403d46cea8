"""Kandinsky6SRChunkedDecoder: each segment of Kandinsky6SRVAE's causal decode, published as it is decoded.

A tiny random-weight ``Kandinsky6SRVAE`` (four levels of 8 channels: 8× spatial, 4× temporal, 4 latent
channels). Its ``vae.decode`` cuts a latent into segments of 5, then 4 latent frames (17, then 16 sample
frames) sharing a cache. The reference of every exactness test is diffusers' own ``vae.decode`` on the
same instance, compared with ``torch.equal``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import Kandinsky6SRVAE
from torch import Tensor

from streamvae import decode_to_mp4
from streamvae.models import chunked_decoder
from streamvae.models.kandinsky6 import Kandinsky6SRChunkedDecoder
from tests._adapters import check_later_latents_leave_frames, conforms, reference
from tests._media import bt709_luma, read_luma
from tests._vaes import family_latents, tiny_kandinsky6_sr

latent = family_latents(4, frames=10, size=2)


@pytest.fixture(scope="module")
def k6() -> tuple[Kandinsky6SRVAE, Tensor, Tensor]:
    """The tiny VAE, a 10-latent-frame latent (segments of 5, 4 and 1) and ``vae.decode`` of it."""
    vae = tiny_kandinsky6_sr()
    z = latent()
    return vae, z, reference(vae, z)


def diffusers_segments(latent_frames: int, segment: int = 4) -> list[int]:
    """``Kandinsky6SRVAE.decode``'s cut of a latent, as it computes it."""
    if latent_frames == 1:
        return [1]
    sizes = [segment] * ((latent_frames - 1) // segment)
    if (latent_frames - 1) % segment:
        sizes.append((latent_frames - 1) % segment)
    sizes[0] += 1
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
    adapter = Kandinsky6SRChunkedDecoder(tiny_kandinsky6_sr())
    report = conforms(adapter, latent(frames=latent_frames))
    assert report.chunk_frames == sizes
    # one decoder call a segment: every chunk leaves before the next segment's call
    assert report.decoder_calls == list(range(1, len(sizes) + 1))
    assert adapter.output_frames(latent_frames) == sum(sizes)


def test_the_cut_is_diffusers_own_and_greedy() -> None:
    adapter = Kandinsky6SRChunkedDecoder(tiny_kandinsky6_sr())
    for frames in range(1, 40):
        assert adapter._segment_sizes(frames) == diffusers_segments(frames)


def test_the_first_chunk_leaves_before_the_next_segment_is_decoded(
    k6: tuple[Kandinsky6SRVAE, Tensor, Tensor],
) -> None:
    vae, z, expected = k6
    calls = [0]
    handle = vae.decoder.register_forward_pre_hook(lambda module, args: calls.__setitem__(0, calls[0] + 1))
    try:
        chunks = Kandinsky6SRChunkedDecoder(vae).iter_chunks(z)
        first = next(chunks)
        assert calls[0] == 1 and torch.equal(first, expected[:, :, :17])
        chunks.close()  # stopping decodes nothing more
        assert calls[0] == 1
    finally:
        handle.remove()
    assert Kandinsky6SRChunkedDecoder(vae).streams


def test_output_frames_match_vae_decode_for_every_length() -> None:
    vae = tiny_kandinsky6_sr()
    adapter = Kandinsky6SRChunkedDecoder(vae)
    for frames in range(1, 11):
        assert adapter.output_frames(frames) == reference(vae, latent(frames=frames)).shape[2]


def test_segment_frames_depend_on_no_later_latent(k6: tuple[Kandinsky6SRVAE, Tensor, Tensor]) -> None:
    """The rule the adapter builds on, checked on diffusers itself: changing any latent after a segment
    leaves its frames bit-identical."""
    vae, z, _ = k6
    check_later_latents_leave_frames(vae, z, [(5, 17), (9, 33)])


def test_a_batch_decodes_together_in_each_segment() -> None:
    vae = tiny_kandinsky6_sr()
    z = latent(batch=2, frames=6, seed=1)
    chunks = list(Kandinsky6SRChunkedDecoder(vae).iter_chunks(z))
    assert [tuple(chunk.shape[:3]) for chunk in chunks] == [(2, 3, 17), (2, 3, 4)]
    assert torch.equal(torch.cat(chunks, dim=2), reference(vae, z))


def test_vae_decode_is_unchanged_after_decodes_finished_stopped_and_abandoned(
    k6: tuple[Kandinsky6SRVAE, Tensor, Tensor],
) -> None:
    vae, z, expected = k6
    attributes = {name: set(vars(module)) for name, module in vae.named_modules()}
    adapter = Kandinsky6SRChunkedDecoder(vae)
    assert torch.equal(torch.cat(list(adapter.iter_chunks(z)), dim=2), expected)

    def failing(chunk: Tensor) -> None:
        raise RuntimeError("sink closed")

    with pytest.raises(RuntimeError, match="sink closed"):
        adapter.decode_with_chunks(z, on_chunk=failing)  # stopped after the first segment
    state = adapter.start(1, 2, 2)
    assert len(list(adapter.feed(state, z[:, :, :7]))) == 1  # a stream left open, frames held
    assert torch.equal(reference(vae, z), expected)
    assert {name: set(vars(module)) for name, module in vae.named_modules()} == attributes
    adapter.abort(state)
    assert torch.equal(reference(vae, z), expected)


# Latents in pieces

SPLITS = {
    "frame-by-frame": [1] * 10,
    "uneven": [2, 3, 5],
    "long-first": [7, 3],
    "across-segments": [4, 1, 5],
    "whole": [10],
}


def decode_pieces(adapter: Kandinsky6SRChunkedDecoder, pieces: list[Tensor]) -> list[Tensor]:
    batch, _, _, height, width = pieces[0].shape
    state = adapter.start(batch, height, width)
    chunks: list[Tensor] = []
    for piece in pieces:
        chunks += list(adapter.feed(state, piece))
    return chunks + list(adapter.end(state))


@pytest.mark.parametrize("sizes", list(SPLITS.values()), ids=list(SPLITS))
def test_frames_from_any_split_equal_decoding_the_concatenated_latent(
    k6: tuple[Kandinsky6SRVAE, Tensor, Tensor], sizes: list[int]
) -> None:
    vae, z, expected = k6
    chunks = decode_pieces(Kandinsky6SRChunkedDecoder(vae), list(z.split(sizes, dim=2)))
    assert [chunk.shape[2] for chunk in chunks] == [17, 16, 4]  # the whole latent's segments
    assert torch.equal(torch.cat(chunks, dim=2), expected)


def test_a_piece_gives_the_segments_it_fills_and_the_end_the_short_last(
    k6: tuple[Kandinsky6SRVAE, Tensor, Tensor],
) -> None:
    vae, z, expected = k6
    adapter = Kandinsky6SRChunkedDecoder(vae)
    state = adapter.start(1, 2, 2)
    assert list(adapter.feed(state, z[:, :, :3])) == []  # held: the first segment needs 5
    piece = z[:, :, 3:10].clone()
    made = list(adapter.feed(state, piece))
    piece.fill_(7.0)  # the caller reuses its tensor: the frame held back was copied
    assert [chunk.shape[2] for chunk in made] == [17, 16]
    last = list(adapter.end(state))
    assert torch.equal(torch.cat([*made, *last], dim=2), expected)
    assert list(adapter.end(state)) == []


def test_two_streams_on_one_module_interleaved_each_equal_their_own_decode(
    k6: tuple[Kandinsky6SRVAE, Tensor, Tensor],
) -> None:
    vae, z, expected = k6
    other_z = latent(batch=2, frames=6, size=3, seed=3)
    adapter = Kandinsky6SRChunkedDecoder(vae)
    one, other = adapter.start(1, 2, 2), adapter.start(2, 3, 3)
    one_chunks: list[Tensor] = []
    other_chunks: list[Tensor] = []
    for one_piece, other_piece in zip(z.split([6, 4], dim=2), other_z.split([2, 4], dim=2), strict=True):
        one_chunks += list(adapter.feed(one, one_piece))
        other_chunks += list(adapter.feed(other, other_piece))
    one_chunks += list(adapter.end(one))
    other_chunks += list(adapter.end(other))
    assert torch.equal(torch.cat(one_chunks, dim=2), expected)
    assert torch.equal(torch.cat(other_chunks, dim=2), reference(vae, other_z))


def test_a_piece_left_half_decoded_leaves_only_end_which_gives_nothing(
    k6: tuple[Kandinsky6SRVAE, Tensor, Tensor],
) -> None:
    vae, z, _ = k6
    adapter = Kandinsky6SRChunkedDecoder(vae)
    state = adapter.start(1, 2, 2)
    with pytest.raises(ValueError, match=r"piece of the stream's latent \[1, 4, frames, 2, 2\]"):
        adapter.feed(state, latent(frames=1, size=3))
    steps = adapter.feed(state, z)
    next(steps)
    steps.close()
    with pytest.raises(ValueError, match=r"not decoded to its end \(5 of 10 latent frames\)"):
        adapter.feed(state, z)
    assert list(adapter.end(state)) == []
    with pytest.raises(ValueError, match="stream has ended"):
        adapter.feed(state, z)
    with pytest.raises(ValueError, match="width must be a positive int, got 0"):
        adapter.start(1, 2, 0)


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
async def test_decode_to_mp4_writes_every_frame_of_the_decode(
    k6: tuple[Kandinsky6SRVAE, Tensor, Tensor],
) -> None:
    vae, z, expected = k6
    lossless = {"video_codec_options": {"threads": "1", "crf": "0"}}
    (video,) = await decode_to_mp4(vae, z, fps=8, **lossless)
    pixels = ((expected[0].permute(1, 2, 3, 0) + 1) / 2).clamp(0, 1)  # [F, H, W, 3] in [0, 1]
    luma = bt709_luma(np.round(pixels.numpy() * 255).astype(np.uint8)).astype(int)
    assert luma.shape == (37, 16, 16)
    assert abs(read_luma(video).astype(int) - luma).max() <= 1
