"""Deprecated: import these names from :mod:`streamvae` (this module path goes away in the next release)."""

from __future__ import annotations

import warnings

from streamvae._quantize import (
    ChunkQuantizer,
    PixelPath,
    check_chunk,
    check_value_range,
    quantize_chunk,
    quantize_chunk_yuv420,
)

__all__ = [
    "ChunkQuantizer",
    "PixelPath",
    "check_chunk",
    "check_value_range",
    "quantize_chunk",
    "quantize_chunk_yuv420",
]

_PUBLIC = "import the public names from streamvae (leak checks from streamvae.testing)"
warnings.warn(
    f"streamvae.quantize is deprecated and goes away in the next release: {_PUBLIC}",
    DeprecationWarning,
    stacklevel=2,
)
