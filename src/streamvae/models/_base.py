"""The adapter base: what every chunked decoder shares, so a model family is one generator of chunks.

:class:`ChunkedDecoder` completes :class:`streamvae.SupportsChunkedVAEDecode`: latent checks and casts, the
accelerate forward hook, batch slicing, the failure rule and the step API (:meth:`~ChunkedDecoder.iter_chunks`
for a whole latent; :meth:`~ChunkedDecoder.start` / :meth:`~ChunkedDecoder.feed` /
:meth:`~ChunkedDecoder.end` for latents that arrive in pieces, with one check of a piece).
:class:`WholeClipDecoder` is the base of a family whose decoder needs the whole latent at once,
:class:`SegmentDecoder` of one whose decode walks time in segments sharing a cache.
:class:`ProtocolDecoder` gives the same surface to a decoder that implements only the protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import Tensor

from streamvae._checks import check_bool, check_latents, is_int
from streamvae._protocol import SupportsChunkedVAEDecode, publish_chunks
from streamvae._quantize import ValueRange
from streamvae.models._common import execution_device, joined_steps, split_frames
from streamvae.models._families import piecewise_classes

__all__ = [
    "ChunkedDecoder",
    "DecodeState",
    "ProtocolDecoder",
    "SegmentDecoder",
    "SegmentState",
    "WholeClipDecoder",
]

#: what a :class:`SegmentDecoder` family keeps as one stream's decoder caches
CachesT = TypeVar("CachesT")


@dataclass(eq=False)
class DecodeState:
    """One stream's step state (:meth:`ChunkedDecoder.start`): its shape, its progress, its caches.

    The caches belong to the state, never to the module, so many streams can run on one module.
    """

    owner: ChunkedDecoder  # the decoder that started it; only that one feeds it
    batch: int
    height: int  # latent rows and columns every piece must have
    width: int
    fed: int = 0  # latent frames fed so far
    decoded: int = 0  # latent frames decoded so far (== fed once a piece's chunks are all taken)
    ended: bool = False


class ChunkedDecoder:
    """Base of every chunked decoder; implements :class:`streamvae.SupportsChunkedVAEDecode`.

    A model family subclasses it and writes one generator, :meth:`entry_chunks`, that decodes a latent step
    by step and yields each final chunk (a ``yield`` is a step boundary). A family whose decoder is causal
    across calls (Wan) writes :meth:`start` and :meth:`piece_chunks` instead and sets ``takes_pieces``;
    its whole-latent decode then runs through the same code. ``vae`` is used as it is: same module, same
    weights, same settings (``use_slicing``, ``use_tiling``, window sizes) read at each decode.

    ``drain=False`` (a single process) stops decoding at the next step boundary once ``on_chunk`` has
    failed; ``drain=True`` runs every remaining step unpublished, for a distributed decoder whose peers
    wait on this rank in collectives.
    """

    #: the value range of published chunks
    chunk_value_range: ValueRange = (-1.0, 1.0)
    #: the diffusers classes a family adapter wraps (empty: any object, or none)
    vae_classes: ClassVar[tuple[type, ...]] = ()
    #: the ``vae.config`` key holding the latent channel count, read when none is given
    channels_key: ClassVar[str | None] = None
    #: whether :meth:`start` / :meth:`feed` / :meth:`end` decode latents that arrive in pieces
    takes_pieces: ClassVar[bool] = False

    def __init__(self, vae: Any = None, *, latent_channels: int | None = None, drain: bool = False) -> None:
        if self.vae_classes and not isinstance(vae, self.vae_classes):
            names = " or ".join(cls.__name__ for cls in self.vae_classes)
            raise TypeError(
                f"{type(self).__name__} wraps a diffusers {names}, "
                f"got {type(vae).__module__}.{type(vae).__qualname__}"
            )
        if latent_channels is None and self.channels_key is not None:
            latent_channels = int(vae.config[self.channels_key])
        #: the wrapped module (its hook runs once per decode), or None
        self.vae: Any = vae
        #: latent channels in dim 1, or None when any count is accepted
        self.latent_channels: int | None = latent_channels
        #: whether a failed ``on_chunk`` lets the decode run to its end (a distributed decoder) or stops it
        self.drain = check_bool("drain", drain, owner=type(self).__name__)

    @property
    def is_output_rank(self) -> bool:
        """True where ``on_chunk`` is called: always, but on a distributed decoder's other ranks."""
        return True

    @property
    def streams(self) -> bool:
        """Whether a chunk leaves while later ones still decode (True), or the family's decoder needs the
        whole latent at once (False): it decodes whole, then hands its frames on chunk by chunk.

        Read from the instance's settings now (LTX-Video streams only with temporal tiling on). A family
        overrides it; the default is True.
        """
        return True

    def output_frames(self, latent_frames: int) -> int | None:
        """The frames per entry a decode of ``latent_frames`` latent frames gives, where the family's
        adapter knows it without decoding (progress totals); None otherwise (the default)."""
        return None

    # Latents

    def check_latents(self, z: object, *, owner: str | None = None) -> None:
        """Raise TypeError (not a tensor) or ValueError (not 5-D, wrong channel count, empty) naming ``z``.

        Reads shapes only, never tensor data, so it may run on an event loop. ``owner`` prefixes the
        message (default: the class name).
        """
        check_latents(z, self.latent_channels, owner=owner or type(self).__name__)

    def prepare_latents(self, z: Tensor) -> Tensor:
        """Check ``z`` (:meth:`check_latents`) and return it in the VAE's dtype, on its execution device.

        The device is the one the VAE runs on: the offload device when the weights are offloaded (they may
        sit on the CPU or the meta device until the hook moves them), else the device of the weights. It
        may wait for a device copy: call it in the decode's thread. Without a VAE, ``z`` is returned as is.
        """
        self.check_latents(z)
        if self.vae is None:
            return z
        return z.to(device=execution_device(self.vae), dtype=self.vae.dtype)

    # Whole latents

    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        """Decode ``z`` [batch, latent_channels, frames, height, width] and publish each final chunk.

        The chunks concatenated along T equal the family's ``vae.decode(z).sample`` with the instance's
        settings. With ``vae.use_slicing`` and batch > 1 the entries decode one at a time, as
        ``vae.decode`` does, and each chunk still holds the whole batch. When ``on_chunk`` raises, it is
        not called again, no chunk is retained, the decode stops at the next step boundary (or, with
        ``drain``, runs to the end unpublished) and the error is re-raised; the instance decodes correctly
        afterwards. ``z`` is not cast (:meth:`prepare_latents` does that). Chunks may be views of a window
        the decode still reads (to blend the next one): treat them as read-only.
        """
        publish_chunks(self.iter_chunks(z), on_chunk, drain=self.drain)

    def iter_chunks(self, z: Tensor) -> Generator[Tensor, None, None]:
        """Run the decode step by step: a generator of the final chunks of ``z``, in order.

        Checks ``z`` and runs the VAE's forward hook once, now, as ``vae.decode`` does. Each step runs only
        when its chunk is requested, so a consumer that stops iterating stops decoding at a step boundary;
        closing the generator frees the decode's caches at once. The generator keeps no chunk it yielded.
        Steps run without autograd, the consumer's code between them in its own grad mode.
        """
        self.check_latents(z)
        if self.takes_pieces:
            state = self.start(z.shape[0], z.shape[3], z.shape[4])
            return self._whole_latent(state, self.feed(state, z))
        self.run_forward_hook()
        return _without_grad(self._batch_chunks(z))

    def entry_chunks(self, z: Tensor, entries: slice) -> Generator[Tensor, None, None]:
        """What a family writes: yield the final chunks of ``z``, the batch entries ``entries`` of the latent.

        Called once per decode, or once per entry with ``vae.use_slicing`` (the base steps the entries
        together and joins each step's chunks). Runs under ``torch.no_grad``.
        """
        raise NotImplementedError(f"{type(self).__name__} implements no entry_chunks")

    def entry_slices(self, batch: int) -> list[slice]:
        """The batch slices ``vae.decode`` decodes apart: one per entry with ``use_slicing``, else one."""
        if batch > 1 and getattr(self.vae, "use_slicing", False):
            return [slice(b, b + 1) for b in range(batch)]
        return [slice(None)]

    def run_forward_hook(self) -> None:
        """Run the accelerate hook's ``pre_forward`` (offloading moves the weights there), as diffusers'
        ``apply_forward_hook`` does around ``decode``; it never calls ``post_forward``."""
        hook = getattr(self.vae, "_hf_hook", None)
        if hook is not None and hasattr(hook, "pre_forward"):
            hook.pre_forward(self.vae)

    def _batch_chunks(self, z: Tensor) -> Generator[Tensor, None, None]:
        slices = self.entry_slices(z.shape[0])
        if len(slices) == 1:
            yield from self.entry_chunks(z, slices[0])
            return
        # One walk per entry, stepped together: each step decodes every entry alone, as vae.decode does,
        # and publishes the step's frames for the whole batch.
        yield from joined_steps([self.entry_chunks(z[entries], entries) for entries in slices])

    # Latents in pieces

    def check_takes_pieces(self, *, owner: str | None = None) -> None:
        """Raise TypeError unless this decoder decodes latents that arrive in pieces (``takes_pieces``).

        The message names the decoders that do. Reads nothing but the decoder itself, so it may run on an
        event loop, before any work (:func:`streamvae.open_latent_stream` calls it). ``owner`` prefixes it.
        """
        if not self.takes_pieces:
            prefix = "" if owner is None else f"{owner}: "
            raise TypeError(
                f"{prefix}{type(self).__name__} cannot decode latents in pieces (its decoder is not causal "
                f"across calls); {_who_takes_pieces()}"
            )

    def start(self, batch: int, height: int, width: int) -> DecodeState:
        """Begin a stream of latent pieces [batch, latent_channels, t, height, width]; returns its state.

        Frames decoded from any split of a latent equal the decode of the whole. Raises TypeError for a
        family whose decoder is not causal across calls: its output depends on latents still to come.
        """
        self.check_takes_pieces()
        raise NotImplementedError(f"{type(self).__name__} sets takes_pieces but implements no start")

    def feed(self, state: DecodeState, z: Tensor) -> Generator[Tensor, None, None]:
        """Decode the next piece ``z`` of ``state``'s stream: a generator of the chunks it makes final.

        Checks the piece and runs the VAE's forward hook, now. Take every chunk of a piece before feeding
        the next; a piece whose generator was closed early leaves the state able only to :meth:`end`.
        """
        self._take_piece(state, z)
        self.run_forward_hook()
        return _without_grad(self.piece_chunks(state, z))

    def end(self, state: DecodeState) -> Iterator[Tensor]:
        """End ``state``'s stream: frees its caches now and gives any chunks still held back (none for Wan).

        Ending an ended stream gives nothing.
        """
        self._check_owner(state)
        if state.ended:
            return iter(())
        state.ended = True
        return _without_grad(self.end_chunks(state))

    def feed_with_chunks(self, state: DecodeState, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        """:meth:`feed` piece ``z`` and publish its chunks into ``on_chunk`` under the failure rule (as
        :meth:`decode_with_chunks` does a whole latent's). What :func:`streamvae.open_latent_stream`
        calls; a distributed decoder overrides it to step in lockstep with its peers."""
        publish_chunks(self.feed(state, z), on_chunk, drain=self.drain)

    def end_with_chunks(self, state: DecodeState, *, on_chunk: Callable[[Tensor], None]) -> None:
        """:meth:`end` ``state``'s stream and publish the chunks it held back into ``on_chunk``."""
        publish_chunks(self.end(state), on_chunk, drain=self.drain)

    def abort(self, state: DecodeState, *, reason: str | None = None) -> None:
        """End ``state``'s stream without its held-back chunks (after a failure, or a stream left before
        its end): its caches are freed now. ``reason`` says why, for a distributed decoder's peers."""
        chunks = self.end(state)
        close = getattr(chunks, "close", None)
        if close is not None:
            close()

    # After a decode

    def settle(self, failure: BaseException | None) -> None:
        """Say how the output's end went, after a decode or stream whose every step ended on every rank.

        ``failure`` is what finishing the output raised (None: it finished), on the output rank; the other
        ranks pass what they are failing with, if anything. A distributed decoder's output rank tells its
        peers, which raise :class:`streamvae.distributed.PeerDecodeError` naming that failure (a reader
        that closed its stream, an encoder or file error at the end): they would otherwise return as if
        the output were whole. Call it on every rank, after the session ends; :func:`streamvae.decode_to_mp4`,
        :func:`streamvae.stream_mp4` and :func:`streamvae.open_latent_stream` do. One process has no one to
        tell: the base does nothing.
        """

    def piece_chunks(self, state: DecodeState, z: Tensor) -> Generator[Tensor, None, None]:
        """What a piece-taking family writes (with :meth:`start`): yield the chunks piece ``z`` makes final,
        counting ``state.decoded`` as its latent frames are decoded. Called by :meth:`feed`, without autograd.
        """
        raise NotImplementedError(f"{type(self).__name__} implements no piece_chunks")

    def end_chunks(self, state: DecodeState) -> Iterator[Tensor]:
        """What a piece-taking family may write: free ``state``'s caches now and give the chunks it still
        holds back (default: none). Called once, by :meth:`end`."""
        return iter(())

    def _check_owner(self, state: DecodeState) -> None:
        if state.owner is not self:
            raise ValueError(f"{type(self).__name__}: this state belongs to another decoder")

    def _check_open(self, state: DecodeState) -> None:
        self._check_owner(state)
        if state.ended:
            raise ValueError(f"{type(self).__name__}: this stream has ended; start() a new one")

    def _take_piece(self, state: DecodeState, z: Tensor) -> None:
        """Count piece ``z`` as fed to ``state``'s stream, if it may be fed now; else ValueError or TypeError.

        The one check of a piece, for every decoder that takes pieces (a sharded one's too): the stream is
        open, ``z`` is a latent of the stream's batch and size, and the previous piece was decoded whole.
        """
        self._check_open(state)
        self.check_latents(z)
        if (z.shape[0], *z.shape[3:]) != (state.batch, state.height, state.width):
            channels = "channels" if self.latent_channels is None else self.latent_channels
            raise ValueError(
                f"{type(self).__name__}: z must be a piece of the stream's latent [{state.batch}, "
                f"{channels}, frames, {state.height}, {state.width}], got shape {tuple(z.shape)}"
            )
        if state.decoded != state.fed:
            raise ValueError(
                f"{type(self).__name__}: the previous piece was not decoded to its end "
                f"({state.decoded} of {state.fed} latent frames); only end() or abort() is possible now"
            )
        state.fed += z.shape[2]

    def _whole_latent(
        self, state: DecodeState, piece: Generator[Tensor, None, None]
    ) -> Generator[Tensor, None, None]:
        try:
            yield from piece
            yield from self.end(state)
        finally:
            piece.close()
            self.end(state)  # a consumer that stopped early: free the caches now


class WholeClipDecoder(ChunkedDecoder):
    """Base of a family whose decoder needs the whole latent at once (Cosmos, Mochi): it decodes the clip as
    ``vae.decode`` does, then hands it on a latent frame's worth at a time, for the encoder to take while
    the rest wait.

    A family writes :meth:`decode_clip`; ``streams`` is False. Memory: as ``vae.decode``; the chunks are
    views of the decoded clip, held until the last is released.
    """

    @property
    def streams(self) -> bool:
        """False: the decoder runs over the whole clip at once."""
        return False

    @property
    def temporal_ratio(self) -> int:
        """The frames each latent frame after the first gives: the VAE's ``temporal_compression_ratio``,
        read from its config where the config holds it (reading a config value as an attribute is
        deprecated), else its attribute."""
        config = self.vae.config
        if "temporal_compression_ratio" in config:
            return int(config["temporal_compression_ratio"])
        return int(self.vae.temporal_compression_ratio)

    def output_frames(self, latent_frames: int) -> int:
        """One frame for the first latent frame, :attr:`temporal_ratio` for each after it."""
        return 1 + (latent_frames - 1) * self.temporal_ratio

    def decode_clip(self, z: Tensor) -> Tensor:
        """What a family writes: the whole clip of latent ``z`` (BCTHW), decoded as ``vae.decode`` does."""
        raise NotImplementedError(f"{type(self).__name__} implements no decode_clip")

    def entry_chunks(self, z: Tensor, entries: slice) -> Generator[Tensor, None, None]:
        # the first latent frame's frames, then a latent frame's worth a chunk
        yield from split_frames(self.decode_clip(z), latent_frames=z.shape[2], step=self.temporal_ratio)


@dataclass(eq=False)
class SegmentState(DecodeState, Generic[CachesT]):
    """A :class:`SegmentDecoder` stream: its decoder caches, and the latent frames fed but not yet decoded."""

    caches: CachesT | None = None  # what new_caches made; None once the stream let go of them
    held: list[Tensor] = field(default_factory=list)  # the open segment's latent frames, in order
    segments: int = 0  # segments decoded


class SegmentDecoder(ChunkedDecoder, Generic[CachesT]):
    """Base of a family whose ``vae.decode`` walks time in segments, one decoder call each, the calls
    sharing a cache (KVAE, Kandinsky 6 SR): each segment's frames are published as soon as it is decoded.

    The cut is greedy: a first segment of :attr:`first_segment` latent frames, then segments of
    :attr:`segment`, the last taking what is left. A full segment has the same bounds whatever follows it,
    and only the last one may be short. So latents may also arrive in pieces: the frames fed are held until
    they fill the next segment, which is then decoded, and what is left at the end is decoded as the short
    last segment (when its chunk is asked for; never, by a stream aborted) — the cut of the whole latent,
    whatever the split. The caches are made per stream and never put on the module, so ``vae.decode`` is
    unaffected by any stream, finished or not.

    A family sets :attr:`first_segment` and :attr:`segment` and writes :meth:`new_caches`,
    :meth:`decode_segment` and :meth:`segment_frames`. Memory: the caches, and the latent frames of the
    open segment (fewer than one segment).
    """

    takes_pieces = True
    #: latent frames of the first full segment, and of every full one after it
    first_segment: int
    segment: int

    def new_caches(self, batch: int) -> CachesT:
        """What a family writes: the empty caches of a stream of ``batch`` entries, as ``vae.decode`` makes
        them for one decode."""
        raise NotImplementedError(f"{type(self).__name__} implements no new_caches")

    def decode_segment(self, frames: Tensor, caches: CachesT) -> Tensor:
        """What a family writes: the decoder call(s) of one segment, as ``vae.decode`` makes them, with the
        stream's ``caches``; one chunk for the whole batch."""
        raise NotImplementedError(f"{type(self).__name__} implements no decode_segment")

    def segment_frames(self, latent_frames: int, *, first: bool) -> int:
        """What a family writes: the frames a segment of ``latent_frames`` gives (``first``: the first)."""
        raise NotImplementedError(f"{type(self).__name__} implements no segment_frames")

    def output_frames(self, latent_frames: int) -> int:
        """Frames per entry of a decode of ``latent_frames`` latent frames, segment by segment."""
        sizes = self._segment_sizes(latent_frames)
        return sum(self.segment_frames(size, first=index == 0) for index, size in enumerate(sizes))

    def start(self, batch: int, height: int, width: int) -> DecodeState:
        """Begin a stream of latent pieces [batch, latent_channels, t, height, width]; its caches are made
        now."""
        for name, size in (("batch", batch), ("height", height), ("width", width)):
            if not is_int(size) or size < 1:
                raise ValueError(f"{type(self).__name__}.start: {name} must be a positive int, got {size!r}")
        caches = self.new_caches(batch)
        return SegmentState(owner=self, batch=batch, height=height, width=width, caches=caches)

    def piece_chunks(self, state: DecodeState, z: Tensor) -> Generator[Tensor, None, None]:
        assert isinstance(state, SegmentState)
        state.held.append(z)
        while sum(piece.shape[2] for piece in state.held) >= self._size_of(state.segments):
            frames = state.held[0] if len(state.held) == 1 else torch.cat(state.held, dim=2)
            size = self._size_of(state.segments)
            rest = frames[:, :, size:]
            state.held = [rest] if rest.shape[2] > 0 else []
            state.decoded += size
            yield self._next_segment(state, frames[:, :, :size])
        # The frames left wait for the next piece or the end; a copy, as the caller may reuse its tensor.
        state.held = [torch.cat(state.held, dim=2).clone()] if state.held else []
        state.decoded = state.fed

    def end_chunks(self, state: DecodeState) -> Iterator[Tensor]:
        assert isinstance(state, SegmentState)
        complete = state.decoded == state.fed  # else a piece was left half decoded: nothing is final
        held, caches = state.held, state.caches
        state.held, state.caches = (
            [],
            None,
        )  # the stream lets go of its caches now; the last segment takes them
        if not complete or not held or caches is None:
            return iter(())
        return self._last_segment(state, torch.cat(held, dim=2), caches)

    def _last_segment(
        self, state: SegmentState[CachesT], frames: Tensor, caches: CachesT
    ) -> Iterator[Tensor]:
        """The short last segment, decoded when its chunk is asked for (never, by a stream aborted)."""
        state.caches = caches
        try:
            yield self._next_segment(state, frames)
        finally:
            state.caches = None

    def _next_segment(self, state: SegmentState[CachesT], frames: Tensor) -> Tensor:
        assert state.caches is not None
        decoded = self.decode_segment(frames, state.caches)
        state.segments += 1
        return decoded

    def _size_of(self, index: int) -> int:
        """Latent frames of full segment ``index``."""
        return self.first_segment if index == 0 else self.segment

    def _segment_sizes(self, latent_frames: int) -> list[int]:
        """The greedy cut of ``latent_frames``: full segments, then what is left."""
        sizes: list[int] = []
        left = latent_frames
        while left > 0:
            sizes.append(min(self._size_of(len(sizes)), left))
            left -= sizes[-1]
        return sizes


def _without_grad(chunks: Iterator[Tensor]) -> Generator[Tensor, None, None]:
    """Run each step of ``chunks`` under ``torch.no_grad``, never across a ``yield``: grad mode is thread
    state that the consumer's code between steps would otherwise inherit."""
    step: list[Tensor] = []  # handed out by pop(), so the suspended frame never holds a yielded chunk
    try:
        while True:
            with torch.no_grad():
                try:
                    step.append(next(chunks))
                except StopIteration:
                    return
            yield step.pop()
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def _who_takes_pieces() -> str:
    """What a decoder that refuses pieces names instead: the adapters that take them, as they say."""
    return (
        f"pieces work for the adapters of {', '.join(piecewise_classes())}, and for a ChunkedDecoder "
        "subclass of your own that sets takes_pieces and writes start / piece_chunks"
    )


class ProtocolDecoder(ChunkedDecoder):
    """The base's surface for a decoder that implements only :class:`streamvae.SupportsChunkedVAEDecode`.

    Its optional attributes are used when present (``latent_channels``, ``is_output_rank``,
    ``prepare_latents``, ``settle``), else the defaults: any channel count, the output rank, a latent used as
    it is, no one to tell how the output ended.
    Latent checks run before the wrapped decoder sees ``z``. It cannot be stepped: :meth:`iter_chunks` and
    :meth:`start` raise TypeError.
    """

    def __init__(self, decoder: SupportsChunkedVAEDecode) -> None:
        if not isinstance(decoder, SupportsChunkedVAEDecode):
            raise TypeError(
                f"ProtocolDecoder wraps a SupportsChunkedVAEDecode (chunk_value_range and "
                f"decode_with_chunks), got {type(decoder).__module__}.{type(decoder).__qualname__}"
            )
        super().__init__(latent_channels=getattr(decoder, "latent_channels", None))
        #: the wrapped decoder
        self.decoder = decoder
        self.chunk_value_range = decoder.chunk_value_range

    @property
    def is_output_rank(self) -> bool:
        return bool(getattr(self.decoder, "is_output_rank", True))

    def prepare_latents(self, z: Tensor) -> Tensor:
        self.check_latents(z)
        prepare: Callable[[Tensor], Tensor] | None = getattr(self.decoder, "prepare_latents", None)
        return z if prepare is None else prepare(z)

    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        """Check ``z``, then let the wrapped decoder decode it (the failure rule is its own)."""
        self.check_latents(z)
        self.decoder.decode_with_chunks(z, on_chunk=on_chunk)

    def settle(self, failure: BaseException | None) -> None:
        """The wrapped decoder's ``settle``, if it has one (a wrapper around a sharded decoder)."""
        settle: Callable[[BaseException | None], None] | None = getattr(self.decoder, "settle", None)
        if settle is not None:
            settle(failure)

    def iter_chunks(self, z: Tensor) -> Generator[Tensor, None, None]:
        raise TypeError(
            f"{type(self.decoder).__qualname__} implements only decode_with_chunks: it cannot be stepped"
        )

    def check_takes_pieces(self, *, owner: str | None = None) -> None:
        prefix = "" if owner is None else f"{owner}: "
        raise TypeError(
            f"{prefix}{type(self.decoder).__qualname__} implements only decode_with_chunks: it cannot decode "
            f"latents in pieces; {_who_takes_pieces()}"
        )
