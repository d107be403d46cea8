"""streamvae: stream a video VAE's decode straight into MP4 bytes, chunk by chunk.

A causal VAE publishes each temporal chunk as soon as it is final; streamvae moves it through quantize →
host transfer → H.264 encode while later chunks still decode. Runs on asyncio and trio (through anyio).

The public names load on first use (PEP 562): ``import streamvae`` itself imports neither torch nor PyAV,
so a command's ``--help`` answers at once; ``from streamvae import decode_to_mp4`` imports what that needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamvae._decode import decode_to_mp4, stream_mp4
    from streamvae._errors import (
        NoEncoderError,
        RingAbortedError,
        SessionClosedError,
        SigningError,
        StreamVAEError,
        UnreadStreamError,
    )
    from streamvae._fragments import MP4Piece
    from streamvae._latent_stream import LatentStream, LatentStreamStatistics, open_latent_stream
    from streamvae._options import SessionKeywords, SessionOptions
    from streamvae._pipeline import StageSpan
    from streamvae._protocol import ChunkPublisher, SupportsChunkedVAEDecode, publish_chunks
    from streamvae._provenance import Provenance
    from streamvae._quantize import PerChannelRange, quantize_chunk, quantize_chunk_yuv420
    from streamvae._session import ChunkedVideoMP4Session
    from streamvae._sinks import MP4ByteStream, read_entries
    from streamvae._statistics import SessionStatistics
    from streamvae._transfer import ChunkLease, ChunkTransferStats, PinnedChunkRing

#: each public name → the private module that defines it
_HOMES = {
    "ChunkLease": "_transfer",
    "ChunkPublisher": "_protocol",
    "ChunkTransferStats": "_transfer",
    "ChunkedVideoMP4Session": "_session",
    "LatentStream": "_latent_stream",
    "LatentStreamStatistics": "_latent_stream",
    "MP4ByteStream": "_sinks",
    "MP4Piece": "_fragments",
    "NoEncoderError": "_errors",
    "PerChannelRange": "_quantize",
    "PinnedChunkRing": "_transfer",
    "Provenance": "_provenance",
    "RingAbortedError": "_errors",
    "SessionClosedError": "_errors",
    "SessionKeywords": "_options",
    "SessionOptions": "_options",
    "SessionStatistics": "_statistics",
    "SigningError": "_errors",
    "StageSpan": "_pipeline",
    "StreamVAEError": "_errors",
    "SupportsChunkedVAEDecode": "_protocol",
    "UnreadStreamError": "_errors",
    "decode_to_mp4": "_decode",
    "open_latent_stream": "_latent_stream",
    "publish_chunks": "_protocol",
    "quantize_chunk": "_quantize",
    "quantize_chunk_yuv420": "_quantize",
    "read_entries": "_sinks",
    "stream_mp4": "_decode",
}

__all__ = [
    "ChunkLease",
    "ChunkPublisher",
    "ChunkTransferStats",
    "ChunkedVideoMP4Session",
    "LatentStream",
    "LatentStreamStatistics",
    "MP4ByteStream",
    "MP4Piece",
    "NoEncoderError",
    "PerChannelRange",
    "PinnedChunkRing",
    "Provenance",
    "RingAbortedError",
    "SessionClosedError",
    "SessionKeywords",
    "SessionOptions",
    "SessionStatistics",
    "SigningError",
    "StageSpan",
    "StreamVAEError",
    "SupportsChunkedVAEDecode",
    "UnreadStreamError",
    "decode_to_mp4",
    "open_latent_stream",
    "publish_chunks",
    "quantize_chunk",
    "quantize_chunk_yuv420",
    "read_entries",
    "stream_mp4",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'streamvae' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"streamvae.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
