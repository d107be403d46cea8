"""Adapters that stream the decode of a diffusers VAE instance the user already has.

Each adapter wraps the instance (same module, same weights, nothing reloaded) and derives from
:class:`ChunkedDecoder`, which implements :class:`streamvae.SupportsChunkedVAEDecode`. One module per model
family (``streamvae.models.wan``, ``.hunyuan_video``, ``.hunyuan_video15``, ``.ltx_video``, ``.cogvideox``,
``.minimax_h3``, ``.mochi``, ``.allegro``, ``.cosmos``, ``.magvit``, ``.stable_video``, ``.kvae``,
``.image_vae``, ``.kandinsky6``); importing this package does not import diffusers. :func:`as_decoder`
turns anything decodable into a :class:`ChunkedDecoder`; check a decoder of your own with
:func:`streamvae.testing.check_chunked_decoder`.
"""

from __future__ import annotations

from streamvae.models._base import ChunkedDecoder, DecodeState, ProtocolDecoder
from streamvae.models._families import supported_classes
from streamvae.models._registry import as_decoder, chunked_decoder

__all__ = [
    "ChunkedDecoder",
    "DecodeState",
    "ProtocolDecoder",
    "as_decoder",
    "chunked_decoder",
    "supported_classes",
]
