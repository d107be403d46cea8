"""Deprecated: import these names from :mod:`streamvae` (this module path goes away in the next release)."""

from __future__ import annotations

import warnings

from streamvae._transfer import ChunkLease, ChunkTransferStats, PinnedChunkRing, RingAbortedError, host_lease

__all__ = ["ChunkLease", "ChunkTransferStats", "PinnedChunkRing", "RingAbortedError", "host_lease"]

_PUBLIC = "import the public names from streamvae (leak checks from streamvae.testing)"
warnings.warn(
    f"streamvae.transfer is deprecated and goes away in the next release: {_PUBLIC}",
    DeprecationWarning,
    stacklevel=2,
)
