"""Streaming decode for diffusers' ``Kandinsky6SRVAE`` (the causal K-VAE of Kandinsky 6's super-resolution).

Its ``vae.decode`` walks time in segments: the latent is cut into a first segment of ``s + 1`` latent
frames and then segments of ``s`` (``s = 16 // r``, ``r`` the VAE's ``temporal_compression_ratio``: 5, 4,
4, …, the last taking what is left), and each segment is one call of the decoder module. The calls share
a cache, a dict the decoder makes (``vae.decoder.make_cache()``) and that ``decode`` passes to each call:
every causal convolution keeps there the input frames the next segment's first window needs, every
spatial norm a flag that its first segment is behind it. Nothing in a later call reads or changes an
earlier call's output, so a segment's frames are final as soon as it is decoded and are published right
away.

The cut is greedy: a full segment has the same bounds whatever follows it, and only the last one may be
short. So latents may also arrive in pieces: the frames fed are held until they fill the next segment,
which is then decoded, and what is left at the end is decoded as the short last segment — the cut of the
whole latent, whatever the split. The cache is made per stream and never put on the module, so
``vae.decode`` is unaffected by any stream, finished or not.

Frames per segment follow the decoder's temporal upsamplers: each doubles a call's frames, but the first
call drops the extra copy of its first frame (``T + 1`` latent frames become ``2T + 1``): the first segment
of ``n`` latent frames gives ``1 + r (n − 1)`` frames, every later one ``r n``, ``1 + r (T − 1)`` in all.
``vae.decode`` reads no slicing or tiling setting: the whole batch goes through each call.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from diffusers.models.autoencoders.autoencoder_kandinsky6_sr import Kandinsky6SRUpsample, Kandinsky6SRVAE
from torch import Tensor

from streamvae._checks import is_int
from streamvae.models._base import ChunkedDecoder, DecodeState

__all__ = ["Kandinsky6SRChunkedDecoder"]

#: ``autoencoder_kandinsky6_sr.SEGMENT_FRAMES``: sample frames a segment adds (the first adds one more);
#: ``vae.decode`` never uses another
_SEGMENT_FRAMES = 16


@dataclass(eq=False)
class _Kandinsky6State(DecodeState):
    """A Kandinsky6SRVAE stream: its decoder cache and the latent frames fed but not yet decoded."""

    cache: dict[str, Any] | None = None  # the dict vae.decode makes and hands to every decoder call
    held: list[Tensor] = field(default_factory=list)  # the open segment's latent frames, in order
    segments: int = 0  # segments decoded


class Kandinsky6SRChunkedDecoder(ChunkedDecoder):
    """Publishes each segment of a ``Kandinsky6SRVAE`` decode as soon as it is decoded.

    For the instance the user already has (same module, same weights). The chunks concatenated along T are
    ``torch.equal`` to ``vae.decode(z).sample``: the same decoder calls on the same segments in the same
    order, with a cache of their own. ``streams`` is True: 17 frames for the first segment (5 latents at
    ``r`` 4), 16 for each full one after. Latents may arrive in pieces (:meth:`start`, :meth:`feed`,
    :meth:`end`): frames decoded from any split equal the whole decode; a piece's frames leave once a
    segment is full, the short last segment's at :meth:`end`. Chunks are nominally in [-1, 1]; the decoder
    does not clamp (neither does ``vae.decode``; the super-resolution pipeline rescales and clamps), so
    values may overshoot.

    Memory: the cache ``vae.decode`` keeps (the last input frames of every causal convolution), and the
    latent frames of the open segment (fewer than one segment).
    """

    vae: Kandinsky6SRVAE
    vae_classes = (Kandinsky6SRVAE,)
    channels_key = "latent_channels"
    takes_pieces = True

    def __init__(self, vae: Kandinsky6SRVAE, *, drain: bool = False) -> None:
        super().__init__(vae, drain=drain)
        # latent frames of every full segment after the first, as decode cuts them
        self._segment = _SEGMENT_FRAMES // int(vae.config["temporal_compression_ratio"])
        self._temporal_upsamplers = sum(
            isinstance(module, Kandinsky6SRUpsample) and module.compress_time
            for module in vae.decoder.modules()
        )

    def output_frames(self, latent_frames: int) -> int:
        """Frames per entry of a decode of ``latent_frames`` latent frames, segment by segment."""
        frames = 0
        for index, size in enumerate(self._segment_sizes(latent_frames)):
            for _ in range(self._temporal_upsamplers):  # each doubles; the first call drops its first copy
                size = 2 * size - (index == 0)
            frames += size
        return frames

    def start(self, batch: int, height: int, width: int) -> DecodeState:
        """Begin a stream of latent pieces [batch, latent_channels, t, height, width]."""
        for name, size in (("batch", batch), ("height", height), ("width", width)):
            if not is_int(size) or size < 1:
                raise ValueError(f"{type(self).__name__}.start: {name} must be a positive int, got {size!r}")
        cache: dict[str, Any] = self.vae.decoder.make_cache()
        return _Kandinsky6State(owner=self, batch=batch, height=height, width=width, cache=cache)

    def piece_chunks(self, state: DecodeState, z: Tensor) -> Generator[Tensor, None, None]:
        assert isinstance(state, _Kandinsky6State)
        state.held.append(z)
        while sum(piece.shape[2] for piece in state.held) >= self._size_of(state.segments):
            frames = state.held[0] if len(state.held) == 1 else torch.cat(state.held, dim=2)
            size = self._size_of(state.segments)
            rest = frames[:, :, size:]
            state.held = [rest] if rest.shape[2] > 0 else []
            state.decoded += size
            yield self._decode_segment(state, frames[:, :, :size])
        # The frames left wait for the next piece or the end; a copy, as the caller may reuse its tensor.
        state.held = [torch.cat(state.held, dim=2).clone()] if state.held else []
        state.decoded = state.fed

    def end_chunks(self, state: DecodeState) -> Iterator[Tensor]:
        assert isinstance(state, _Kandinsky6State)
        complete = state.decoded == state.fed  # else a piece was left half decoded: nothing is final
        held, cache = state.held, state.cache
        state.held, state.cache = [], None  # the stream lets go of its cache now; the last segment takes it
        if not complete or not held or cache is None:
            return iter(())
        return self._last_segment(state, torch.cat(held, dim=2), cache)

    def _last_segment(
        self, state: _Kandinsky6State, frames: Tensor, cache: dict[str, Any]
    ) -> Iterator[Tensor]:
        """The short last segment, decoded when its chunk is asked for (never, by a stream aborted)."""
        state.cache = cache
        try:
            yield self._decode_segment(state, frames)
        finally:
            state.cache = None

    def _decode_segment(self, state: _Kandinsky6State, frames: Tensor) -> Tensor:
        """One decoder call for one segment, as ``decode`` makes it."""
        assert state.cache is not None
        decoded: Tensor = self.vae.decoder(frames, state.cache)
        state.segments += 1
        return decoded

    def _size_of(self, index: int) -> int:
        """Latent frames of full segment ``index``: the first takes the leading latent frame too."""
        return self._segment + 1 if index == 0 else self._segment

    def _segment_sizes(self, latent_frames: int) -> list[int]:
        """The greedy cut of ``latent_frames``: full segments, then what is left."""
        sizes: list[int] = []
        left = latent_frames
        while left > 0:
            sizes.append(min(self._size_of(len(sizes)), left))
            left -= sizes[-1]
        return sizes
