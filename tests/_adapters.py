"""Helpers shared by the model adapter tests: the conformance suite run against ``vae.decode``."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest
import torch
from accelerate.hooks import ModelHook, add_hook_to_module
from torch import Tensor

from streamvae.models import ChunkedDecoder, chunked_decoder
from streamvae.testing import ChunkedDecoderReport, check_chunked_decoder


def reference(vae: Any, z: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """What ``vae.decode`` gives for ``z``: the result every adapter must reproduce."""
    with torch.no_grad():
        sample: Tensor = vae.decode(z, *args, **kwargs).sample
        return sample


def conforms(
    adapter: ChunkedDecoder, z: Tensor, *args: Any, expected: Tensor | None = None, **kwargs: Any
) -> ChunkedDecoderReport:
    """Run the conformance suite on ``adapter`` against ``adapter.vae.decode(z, *args, **kwargs)``.

    A no-op accelerate hook is attached to the VAE first (unless it has one), so the suite also checks
    that the adapter runs it once per decode, as ``vae.decode`` does.
    """
    vae = adapter.vae
    if getattr(vae, "_hf_hook", None) is None:
        add_hook_to_module(vae, ModelHook())
    if expected is None:
        expected = reference(vae, z, *args, **kwargs)
    return check_chunked_decoder(adapter, z, reference=expected)


def check_later_latents_leave_frames(
    vae: Any, z: Tensor, kept: list[tuple[int, int]], *, moved: tuple[int, int] | None = None
) -> None:
    """The rule a causal family's adapter builds on, checked on diffusers itself: for each
    ``(first_later_latent, frames)`` in ``kept``, changing every latent from ``first_later_latent`` on leaves
    the first ``frames`` frames of ``vae.decode`` bit-identical. ``moved=(latent, frame)``: changing that
    latent alone moves that frame (GroupNorm spans a decoder call, so nothing in it is final early)."""
    full = reference(vae, z)
    for first_later_latent, frames in kept:
        later = z.clone()
        later[:, :, first_later_latent:] += 1.0
        assert torch.equal(reference(vae, later)[:, :, :frames], full[:, :, :frames])
    if moved is not None:
        latent, frame = moved
        inside = z.clone()
        inside[:, :, latent] += 1.0
        assert not torch.equal(reference(vae, inside)[:, :, frame], full[:, :, frame])


def check_batch_chunks(
    adapter: ChunkedDecoder, z: Tensor, frames: list[int], *, use_slicing: bool, tiles: int = 1
) -> None:
    """Every chunk holds the whole batch; with ``use_slicing`` each entry decodes alone, as ``vae.decode``
    does: one decoder call per entry, tile and step."""
    adapter.vae.use_slicing = use_slicing
    report = conforms(adapter, z)
    batch = z.shape[0]
    assert [tuple(chunk.shape[:3]) for chunk in report.chunks] == [(batch, 3, count) for count in frames]
    calls = (batch if use_slicing else 1) * tiles
    assert report.decoder_calls == [calls * (step + 1) for step in range(len(frames))]


def check_whole_clip(
    adapter: ChunkedDecoder, z: Tensor, frames: list[int], *, use_slicing: bool | None = None
) -> None:
    """A family that decodes the whole clip in one decoder call (one an entry with ``use_slicing``) before
    its first chunk: chunks of ``frames`` frames, each holding the whole batch; it does not stream."""
    if use_slicing is not None:
        adapter.vae.use_slicing = use_slicing
    report = conforms(adapter, z)
    batch = z.shape[0]
    assert [tuple(chunk.shape[:3]) for chunk in report.chunks] == [(batch, 3, count) for count in frames]
    calls = batch if adapter.vae.use_slicing else 1
    assert report.decoder_calls == [calls] * len(frames)  # one decoder call over the clip, before any chunk
    assert adapter.output_frames(z.shape[2]) == sum(frames) and not adapter.streams


def check_decode_chunk_size_passed_on(
    vae: Any, adapter_class: type[ChunkedDecoder], decode_chunk_size: int, height: int, width: int
) -> None:
    """``chunked_decoder(vae, decode_chunk_size=...)`` gives the family's adapter with that chunk size (a
    family that decodes frames in batches of a size, 4 latent channels in [-1, 1]); decoding a batch of
    frames at a time, it refuses latents in pieces (``height`` × ``width``), naming the families that take
    them."""
    adapter = chunked_decoder(vae, decode_chunk_size=decode_chunk_size)
    assert type(adapter) is adapter_class and adapter.vae is vae
    assert (adapter.decode_chunk_size, adapter.latent_channels, adapter.chunk_value_range) == (
        decode_chunk_size,
        4,
        (-1, 1),
    )
    with pytest.raises(TypeError, match="cannot decode latents in pieces .*AutoencoderKLWan"):
        adapter.start(1, height, width)


def enable_square_tiles(vae: Any, **settings: float) -> None:
    """``vae.enable_tiling`` with each ``tile_<name>_height`` / ``tile_<name>_width`` pair its family takes
    set alike: ``sample_min=24, sample_stride=16`` gives tiles of 24 × 24 pixels every 16 across and down."""
    vae.enable_tiling(
        **{f"tile_{name}_{side}": value for name, value in settings.items() for side in ("height", "width")}
    )


def check_tiling_matters(vae: Any, z: Tensor) -> None:
    """``vae.decode`` of ``z`` with spatial tiling differs from without: a tiling test tests tiling."""
    tiled = reference(vae, z)
    vae.use_tiling = False
    assert not torch.equal(reference(vae, z), tiled)


def check_small_tiles(adapter: ChunkedDecoder, z: Tensor, frames: list[int]) -> None:
    """Spatial tiles of 24 pixels every 16, inside each window: the chunks still equal ``vae.decode``."""
    vae = adapter.vae
    vae.use_tiling = True
    vae.tile_sample_min_height = vae.tile_sample_min_width = 24
    vae.tile_sample_stride_height = vae.tile_sample_stride_width = 16
    assert conforms(adapter, z).chunk_frames == frames
    check_tiling_matters(vae, z)


def check_window_rule(vae: Any, z: Tensor, kept: list[int]) -> None:
    """The rule the window adapters build on, checked on diffusers itself.

    Window k keeps frames up to ``kept[k]``, fixed by the latents it decodes (up to 2k + 3 here, windows
    starting every 2 latents): changing any later latent leaves them bit-identical, changing its own last
    one does not. And nothing in one decoder call is final before its last latent (GroupNorm spans the
    call's frames, or the decoder is not causal): without windows, a decode is one chunk.
    """
    full = reference(vae, z)
    for window, end in enumerate(kept):
        last_latent = 2 * window + 3
        later = z.clone()
        later[:, :, last_latent + 1 :] += 1.0
        assert torch.equal(reference(vae, later)[:, :, :end], full[:, :, :end])
        edge = z.clone()
        edge[:, :, last_latent] += 1.0  # the window's own last latent does reach its kept frames
        assert not torch.equal(reference(vae, edge)[:, :, end - 8 : end], full[:, :, end - 8 : end])
    vae.use_framewise_decoding = False
    moved = z.clone()
    moved[:, :, -1] += 1.0
    assert not torch.equal(reference(vae, moved)[:, :, :1], reference(vae, z)[:, :, :1])


class FrameVAE(torch.nn.Module):
    """Stands in for a video VAE whose latent frames decode apart: each gives 2 frames (1×1 conv, tanh)."""

    def __init__(self, latent_channels: int = 4) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.decoder = torch.nn.Conv3d(latent_channels, 3, 1)
        with torch.no_grad():
            self.decoder.weight.copy_(torch.randn(self.decoder.weight.shape, generator=generator))
        self.use_slicing = False

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.weight.dtype

    def frame(self, latent_frame: Tensor) -> Tensor:
        return torch.tanh(self.decoder(latent_frame)).repeat_interleave(2, dim=2)

    def decode_frames(self, z: Tensor) -> Tensor:
        """The reference: every latent frame decoded, one after another."""
        with torch.no_grad():
            return torch.cat([self.frame(z[:, :, k : k + 1]) for k in range(z.shape[2])], dim=2)


class FrameDecoder(ChunkedDecoder):
    """A model family in one generator: a chunk per latent frame of a :class:`FrameVAE`."""

    vae: FrameVAE

    def __init__(self, vae: FrameVAE, **options: Any) -> None:
        super().__init__(vae, latent_channels=vae.decoder.in_channels, **options)

    def entry_chunks(self, z: Tensor, entries: slice) -> Generator[Tensor, None, None]:
        for k in range(z.shape[2]):
            yield self.vae.frame(z[:, :, k : k + 1])


# A causal segment family (KVAE, Kandinsky 6 SR): ``vae.decode`` cuts the latent into segments decoded one
# after another over a shared cache; the adapter publishes each as a chunk as soon as it is decoded. What the
# families share is tested once in test_segment_families.py; these two checks their own files use too.


def check_segment_chunks(adapter: ChunkedDecoder, z: Tensor, frames: list[int]) -> None:
    """The chunks of ``z`` concatenate to ``vae.decode``, one chunk of ``frames[k]`` frames a segment."""
    report = conforms(adapter, z)
    assert report.chunk_frames == frames
    # one decoder call a segment: every chunk leaves before the next segment's call
    assert report.decoder_calls == list(range(1, len(frames) + 1))
    assert adapter.output_frames(z.shape[2]) == sum(frames)


def decode_pieces(adapter: ChunkedDecoder, pieces: list[Tensor]) -> list[Tensor]:
    """The chunks of one stream fed ``pieces`` one after another, then ended."""
    batch, _, _, height, width = pieces[0].shape
    state = adapter.start(batch, height, width)
    chunks: list[Tensor] = []
    for piece in pieces:
        chunks += list(adapter.feed(state, piece))
    return chunks + list(adapter.end(state))
