"""Deprecated: import these names from :mod:`streamvae` (this module path goes away in the next release)."""

from __future__ import annotations

import warnings

from streamvae._decode import as_chunked_decoder, decode_to_mp4, stream_mp4

__all__ = ["as_chunked_decoder", "decode_to_mp4", "stream_mp4"]

_PUBLIC = "import the public names from streamvae (leak checks from streamvae.testing)"
warnings.warn(
    f"streamvae.decode is deprecated and goes away in the next release: {_PUBLIC}",
    DeprecationWarning,
    stacklevel=2,
)
