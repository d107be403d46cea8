"""Deprecated: import these names from :mod:`streamvae` (this module path goes away in the next release)."""

from __future__ import annotations

import warnings

from streamvae._protocol import ChunkPublisher, SupportsChunkedVAEDecode, check_latents, publish_chunks

__all__ = ["ChunkPublisher", "SupportsChunkedVAEDecode", "check_latents", "publish_chunks"]

_PUBLIC = "import the public names from streamvae (leak checks from streamvae.testing)"
warnings.warn(
    f"streamvae.protocol is deprecated and goes away in the next release: {_PUBLIC}",
    DeprecationWarning,
    stacklevel=2,
)
