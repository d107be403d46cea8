"""streamvae: stream a video VAE's decode straight into MP4 bytes, chunk by chunk.

A causal VAE publishes each temporal chunk as soon as it is final; streamvae moves it through quantize →
host transfer → H.264 encode while later chunks still decode. Runs on asyncio and trio (through anyio).
"""

from streamvae._decode import decode_to_mp4, stream_mp4
from streamvae._errors import RingAbortedError, SessionClosedError, StreamVAEError, UnreadStreamError
from streamvae._latent_stream import LatentStream, LatentStreamStatistics, open_latent_stream
from streamvae._options import SessionKeywords, SessionOptions
from streamvae._pipeline import StageSpan
from streamvae._protocol import ChunkPublisher, SupportsChunkedVAEDecode, publish_chunks
from streamvae._quantize import quantize_chunk, quantize_chunk_yuv420
from streamvae._session import ChunkedVideoMP4Session
from streamvae._sinks import MP4ByteStream, read_entries
from streamvae._statistics import SessionStatistics
from streamvae._transfer import ChunkLease, ChunkTransferStats, PinnedChunkRing

__all__ = [
    "ChunkLease",
    "ChunkPublisher",
    "ChunkTransferStats",
    "ChunkedVideoMP4Session",
    "LatentStream",
    "LatentStreamStatistics",
    "MP4ByteStream",
    "PinnedChunkRing",
    "RingAbortedError",
    "SessionClosedError",
    "SessionKeywords",
    "SessionOptions",
    "SessionStatistics",
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

# Public objects show where users import them from (``streamvae.ChunkedVideoMP4Session``), not the private
# module that implements them, as anyio's and httpx's do: in reprs, tracebacks and documentation.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
