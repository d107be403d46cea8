"""KVAEVideoChunkedDecoder: each segment of KVAE's causal decode, published as soon as it is decoded.

A tiny random-weight ``AutoencoderKLKVAEVideo`` (4× temporal, 4× spatial; 32 channels, the least its
32-group norms take). Its ``vae.decode`` cuts a latent into segments of 5, then 4 latent frames (17, then
16 sample frames) sharing a cache; a last segment of one latent frame gives one frame. The reference of
every exactness test is diffusers' own ``vae.decode`` on the same instance, compared with ``torch.equal``.
"""

from __future__ import annotations

import math

import pytest
import torch
from diffusers.models.autoencoders.autoencoder_kl_kvae_video import AutoencoderKLKVAEVideo
from torch import Tensor

from streamvae.models import DecodeState
from streamvae.models.kvae import KVAEVideoChunkedDecoder
from tests._adapters import check_batch_chunks, check_later_latents_leave_frames, conforms, reference
from tests._vaes import family_latents
from tests._vaes import tiny_kvae as tiny_vae

latent = family_latents(4, frames=10, size=2)


@pytest.fixture(scope="module")
def kvae() -> tuple[AutoencoderKLKVAEVideo, Tensor, Tensor]:
    """A tiny KVAE, a 10-latent-frame latent (segments of 5, 4 and 1) and ``vae.decode`` of it."""
    vae = tiny_vae()
    z = latent()
    return vae, z, reference(vae, z)


def diffusers_segments(latent_frames: int, ratio: int, seg_len: int = 16) -> list[int]:
    """``AutoencoderKLKVAEVideo._decode``'s cut of a latent, verbatim."""
    split_list = [seg_len + 1]
    n_frames = ratio * (latent_frames - 1) - seg_len
    while n_frames > 0:
        split_list.append(seg_len)
        n_frames -= seg_len
    split_list[-1] += n_frames
    return [math.ceil(size / ratio) for size in split_list]


# Whole latents


@pytest.mark.parametrize(
    ("latent_frames", "sizes"),
    [
        (3, [9]),  # fewer latents than a segment: one short segment
        (5, [17]),  # one full segment
        (6, [17, 1]),  # a last segment of one latent frame gives one frame, as vae.decode does
        (8, [17, 12]),  # a short last segment of 3 latents
    ],
)
def test_chunks_concatenate_to_vae_decode_one_segment_each(latent_frames: int, sizes: list[int]) -> None:
    adapter = KVAEVideoChunkedDecoder(tiny_vae())
    report = conforms(adapter, latent(frames=latent_frames))
    assert report.chunk_frames == sizes
    # one decoder call a segment: every chunk leaves before the next segment's call
    assert report.decoder_calls == list(range(1, len(sizes) + 1))
    assert adapter.output_frames(latent_frames) == sum(sizes)


def test_the_first_chunk_leaves_before_the_last_segment_is_decoded(
    kvae: tuple[AutoencoderKLKVAEVideo, Tensor, Tensor],
) -> None:
    vae, z, expected = kvae
    calls = [0]
    handle = vae.decoder.register_forward_pre_hook(lambda module, args: calls.__setitem__(0, calls[0] + 1))
    try:
        chunks = KVAEVideoChunkedDecoder(vae).iter_chunks(z)
        first = next(chunks)
        assert calls[0] == 1 and torch.equal(first, expected[:, :, :17])
        chunks.close()  # stopping decodes nothing more
        assert calls[0] == 1
    finally:
        handle.remove()
    assert KVAEVideoChunkedDecoder(vae).streams


def test_output_frames_match_vae_decode_for_every_length() -> None:
    vae = tiny_vae()
    adapter = KVAEVideoChunkedDecoder(vae)
    for frames in range(1, 11):
        assert adapter.output_frames(frames) == reference(vae, latent(frames=frames)).shape[2]


@pytest.mark.parametrize("ratio", [1, 2, 4, 8, 16])
def test_full_segments_keep_their_bounds_whatever_follows(ratio: int) -> None:
    """The rule latents in pieces build on, checked on diffusers' own cut: it is greedy, so a full segment
    is the same for every longer latent and only the last may be short."""
    first, later = math.ceil(17 / ratio), math.ceil(16 / ratio)
    for frames in range(1, 60):
        cut = diffusers_segments(frames, ratio)
        assert sum(cut) == frames
        assert all(size == (first if k == 0 else later) for k, size in enumerate(cut[:-1]))
        assert 0 < cut[-1] <= (first if len(cut) == 1 else later)


def test_a_two_times_temporal_layout_decodes_in_its_own_segments() -> None:
    vae = tiny_vae(ch_mult=[1, 1], temporal_compress_times=2)  # segments of 9, then 8 latent frames
    adapter = KVAEVideoChunkedDecoder(vae)
    report = conforms(adapter, latent(frames=11))
    assert report.chunk_frames == [17, 4] and adapter.output_frames(11) == 21


def test_segment_frames_depend_on_no_later_latent_and_on_every_latent_of_the_segment(
    kvae: tuple[AutoencoderKLKVAEVideo, Tensor, Tensor],
) -> None:
    """The rule the adapter builds on, checked on diffusers itself: changing any latent after a segment
    leaves its frames bit-identical; its own last latent moves its first frame (GroupNorm spans the call)."""
    vae, z, _ = kvae
    check_later_latents_leave_frames(vae, z, [(5, 17), (9, 33)], moved=(8, 17))


@pytest.mark.parametrize("use_slicing", [False, True])
def test_batches_publish_whole_batch_chunks_slicing_decodes_each_entry_alone(use_slicing: bool) -> None:
    adapter = KVAEVideoChunkedDecoder(tiny_vae())
    check_batch_chunks(adapter, latent(batch=2, frames=6, seed=1), [17, 1], use_slicing=use_slicing)


def test_tiling_flag_changes_nothing_as_vae_decode_never_tiles(
    kvae: tuple[AutoencoderKLKVAEVideo, Tensor, Tensor],
) -> None:
    vae = tiny_vae()
    _, z, untiled = kvae
    vae.enable_tiling()
    assert vae.use_tiling and torch.equal(reference(vae, z), untiled)
    assert torch.equal(torch.cat(list(KVAEVideoChunkedDecoder(vae).iter_chunks(z)), dim=2), untiled)


def test_vae_decode_is_unchanged_after_decodes_finished_stopped_and_abandoned(
    kvae: tuple[AutoencoderKLKVAEVideo, Tensor, Tensor],
) -> None:
    vae, z, expected = kvae
    attributes = {name: set(vars(module)) for name, module in vae.named_modules()}
    adapter = KVAEVideoChunkedDecoder(vae)
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


def decode_pieces(adapter: KVAEVideoChunkedDecoder, pieces: list[Tensor]) -> list[Tensor]:
    batch, _, _, height, width = pieces[0].shape
    state = adapter.start(batch, height, width)
    chunks: list[Tensor] = []
    for piece in pieces:
        chunks += list(adapter.feed(state, piece))
    return chunks + list(adapter.end(state))


def started(vae: AutoencoderKLKVAEVideo) -> tuple[KVAEVideoChunkedDecoder, DecodeState]:
    """An adapter over ``vae`` and a stream started on it for ``kvae``'s latent: batch 1, 2 × 2."""
    adapter = KVAEVideoChunkedDecoder(vae)
    return adapter, adapter.start(1, 2, 2)


@pytest.mark.parametrize("sizes", list(SPLITS.values()), ids=list(SPLITS))
def test_frames_from_any_split_equal_decoding_the_concatenated_latent(
    kvae: tuple[AutoencoderKLKVAEVideo, Tensor, Tensor], sizes: list[int]
) -> None:
    vae, z, expected = kvae
    chunks = decode_pieces(KVAEVideoChunkedDecoder(vae), list(z.split(sizes, dim=2)))
    assert [chunk.shape[2] for chunk in chunks] == [17, 16, 1]  # the whole latent's segments
    assert torch.equal(torch.cat(chunks, dim=2), expected)


def test_a_piece_gives_the_segments_it_fills_and_the_end_the_short_last(
    kvae: tuple[AutoencoderKLKVAEVideo, Tensor, Tensor],
) -> None:
    vae, z, expected = kvae
    adapter, state = started(vae)
    assert list(adapter.feed(state, z[:, :, :3])) == []  # held: the first segment needs 5
    piece = z[:, :, 3:10].clone()
    made = list(adapter.feed(state, piece))
    piece.fill_(7.0)  # the caller reuses its tensor: the frame held back was copied
    assert [chunk.shape[2] for chunk in made] == [17, 16]
    last = list(adapter.end(state))
    assert torch.equal(torch.cat([*made, *last], dim=2), expected)
    assert list(adapter.end(state)) == []


def test_pieces_with_slicing_equal_the_whole_decode() -> None:
    vae = tiny_vae()
    vae.enable_slicing()
    z = latent(batch=2, frames=10, seed=2)
    chunks = decode_pieces(KVAEVideoChunkedDecoder(vae), list(z.split([3, 4, 3], dim=2)))
    assert torch.equal(torch.cat(chunks, dim=2), reference(vae, z))


def test_two_streams_on_one_module_interleaved_each_equal_their_own_decode(
    kvae: tuple[AutoencoderKLKVAEVideo, Tensor, Tensor],
) -> None:
    vae, z, expected = kvae
    other_z = latent(batch=2, frames=6, size=3, seed=3)
    adapter = KVAEVideoChunkedDecoder(vae)
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
    kvae: tuple[AutoencoderKLKVAEVideo, Tensor, Tensor],
) -> None:
    vae, z, _ = kvae
    adapter, state = started(vae)
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
