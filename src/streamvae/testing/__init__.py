"""Checks for code built on streamvae: a conformance suite for chunked decoders, leak checks, tiny VAEs.

:func:`check_chunked_decoder` tests the contract of :class:`streamvae.SupportsChunkedVAEDecode` once, for
any decoder — streamvae's adapters and yours alike — the way ``trio.testing.check_one_way_stream`` tests a
stream: call it from your test suite with a small latent and the decode it must reproduce.
:func:`open_containers` counts the MP4 containers open in this process (a leak check for tests and
servers: it must come back to its value before a session once the session is over), and
:func:`foreign_threads` names the threads a session could have left behind. :data:`TINY_VAE_CONFIGS` and
:func:`enable_small_tiling` make diffusers VAEs small enough to decode on a CPU in a fraction of a second.
"""

from __future__ import annotations

from streamvae.testing._configs import TINY_VAE_CONFIGS, enable_small_tiling
from streamvae.testing._conformance import ChunkedDecoderReport, check_chunked_decoder
from streamvae.testing._leaks import foreign_threads, open_containers

__all__ = [
    "TINY_VAE_CONFIGS",
    "ChunkedDecoderReport",
    "check_chunked_decoder",
    "enable_small_tiling",
    "foreign_threads",
    "open_containers",
]

# Shown (in reprs, tracebacks and docs) where users import them from. open_containers keeps its own: it is
# streamvae._encode's, re-exported here.
for _obj in (ChunkedDecoderReport, check_chunked_decoder, enable_small_tiling, foreign_threads):
    _obj.__module__ = __name__
del _obj
