"""What the causal segment families share, checked once for each: KVAE and Kandinsky 6 SR.

``vae.decode`` of both cuts a latent into segments of 5, then 4 latent frames (17, then 16 sample frames)
decoded one after another over a shared cache, and their adapters publish each segment as a chunk as soon as
it is decoded, from a whole latent or from latents in pieces. Each family's own file
(``test_models_kvae.py``, ``test_kandinsky6_vae.py``) checks its cut, its last segment and what else it does
alone. Here: a tiny random-weight VAE of each, a 10-latent-frame latent (segments of 5, 4 and 1) and
diffusers' own ``vae.decode`` of it on the same instance, compared with ``torch.equal``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch
from torch import Tensor

from streamvae.models import ChunkedDecoder
from streamvae.models.kandinsky6 import Kandinsky6SRChunkedDecoder
from streamvae.models.kvae import KVAEVideoChunkedDecoder
from tests._adapters import check_later_latents_leave_frames, decode_pieces, reference
from tests._vaes import family_latents, tiny_kandinsky6_sr, tiny_kvae

latent = family_latents(4, frames=10, size=2)


class Family(NamedTuple):
    """A segment family's adapter, its tiny VAE, the frames of each segment of the test latent and, where
    a segment's own last latent moves its first frame, ``(that latent, that frame)``."""

    adapter: type[ChunkedDecoder]
    tiny_vae: Callable[[], Any]
    frames: list[int]
    moved: tuple[int, int] | None


#: the last segment, of one latent frame, gives 1 frame in KVAE and 4 in Kandinsky 6 SR; in KVAE GroupNorm
#: spans a segment's decoder call, so its last latent moves its first frame
FAMILIES = {
    "kvae": Family(KVAEVideoChunkedDecoder, tiny_kvae, [17, 16, 1], moved=(8, 17)),
    "kandinsky6": Family(Kandinsky6SRChunkedDecoder, tiny_kandinsky6_sr, [17, 16, 4], moved=None),
}


class Decode(NamedTuple):
    """A family, a tiny VAE of it, the test latent and ``vae.decode`` of it."""

    family: Family
    vae: Any
    z: Tensor
    expected: Tensor

    def adapter(self) -> ChunkedDecoder:
        return self.family.adapter(self.vae)


@pytest.fixture(scope="module", params=list(FAMILIES.values()), ids=list(FAMILIES))
def decode(request: pytest.FixtureRequest) -> Decode:
    family: Family = request.param
    vae = family.tiny_vae()
    z = latent()
    return Decode(family, vae, z, reference(vae, z))


# Whole latents


def test_the_first_chunk_leaves_before_the_next_segment_is_decoded(decode: Decode) -> None:
    calls = [0]
    handle = decode.vae.decoder.register_forward_pre_hook(
        lambda module, args: calls.__setitem__(0, calls[0] + 1)
    )
    try:
        chunks = decode.adapter().iter_chunks(decode.z)
        first = next(chunks)
        assert calls[0] == 1 and torch.equal(first, decode.expected[:, :, :17])
        chunks.close()  # stopping decodes nothing more
        assert calls[0] == 1
    finally:
        handle.remove()
    assert decode.adapter().streams


def test_segment_frames_depend_on_no_later_latent(decode: Decode) -> None:
    """The rule the adapters build on, checked on diffusers itself: changing any latent after a segment
    leaves its frames bit-identical (and in KVAE, its own last latent moves its first frame)."""
    check_later_latents_leave_frames(decode.vae, decode.z, [(5, 17), (9, 33)], moved=decode.family.moved)


@pytest.mark.parametrize("family", list(FAMILIES.values()), ids=list(FAMILIES))
def test_output_frames_match_vae_decode_for_every_length(family: Family) -> None:
    vae = family.tiny_vae()
    adapter = family.adapter(vae)
    for frames in range(1, 11):
        assert adapter.output_frames(frames) == reference(vae, latent(frames=frames)).shape[2]


def test_vae_decode_is_unchanged_after_decodes_finished_stopped_and_abandoned(decode: Decode) -> None:
    vae, z, expected = decode.vae, decode.z, decode.expected
    attributes = {name: set(vars(module)) for name, module in vae.named_modules()}
    adapter = decode.adapter()
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


@pytest.mark.parametrize("sizes", list(SPLITS.values()), ids=list(SPLITS))
def test_frames_from_any_split_equal_decoding_the_concatenated_latent(
    decode: Decode, sizes: list[int]
) -> None:
    chunks = decode_pieces(decode.adapter(), list(decode.z.split(sizes, dim=2)))
    assert [chunk.shape[2] for chunk in chunks] == decode.family.frames  # the whole latent's segments
    assert torch.equal(torch.cat(chunks, dim=2), decode.expected)


def test_a_piece_gives_the_segments_it_fills_and_the_end_the_short_last(decode: Decode) -> None:
    adapter, z = decode.adapter(), decode.z
    state = adapter.start(1, 2, 2)
    assert list(adapter.feed(state, z[:, :, :3])) == []  # held: the first segment needs 5
    piece = z[:, :, 3:10].clone()
    made = list(adapter.feed(state, piece))
    piece.fill_(7.0)  # the caller reuses its tensor: the frame held back was copied
    assert [chunk.shape[2] for chunk in made] == [17, 16]
    last = list(adapter.end(state))
    assert torch.equal(torch.cat([*made, *last], dim=2), decode.expected)
    assert list(adapter.end(state)) == []


def test_two_streams_on_one_module_interleaved_each_equal_their_own_decode(decode: Decode) -> None:
    z = decode.z
    other_z = latent(batch=2, frames=6, size=3, seed=3)
    adapter = decode.adapter()
    one, other = adapter.start(1, 2, 2), adapter.start(2, 3, 3)
    one_chunks: list[Tensor] = []
    other_chunks: list[Tensor] = []
    for one_piece, other_piece in zip(z.split([6, 4], dim=2), other_z.split([2, 4], dim=2), strict=True):
        one_chunks += list(adapter.feed(one, one_piece))
        other_chunks += list(adapter.feed(other, other_piece))
    one_chunks += list(adapter.end(one))
    other_chunks += list(adapter.end(other))
    assert torch.equal(torch.cat(one_chunks, dim=2), decode.expected)
    assert torch.equal(torch.cat(other_chunks, dim=2), reference(decode.vae, other_z))


def test_a_piece_left_half_decoded_leaves_only_end_which_gives_nothing(decode: Decode) -> None:
    adapter, z = decode.adapter(), decode.z
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
