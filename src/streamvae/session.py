"""Deprecated: import these names from :mod:`streamvae` (this module path goes away in the next release)."""

from __future__ import annotations

import warnings

from streamvae._errors import SessionClosedError, UnreadStreamError
from streamvae._pipeline import StageSpan
from streamvae._session import ChunkedVideoMP4Session
from streamvae._sinks import MP4ByteStream, read_entries

__all__ = [
    "ChunkedVideoMP4Session",
    "MP4ByteStream",
    "SessionClosedError",
    "StageSpan",
    "UnreadStreamError",
    "read_entries",
]

_PUBLIC = "import the public names from streamvae (leak checks from streamvae.testing)"
warnings.warn(
    f"streamvae.session is deprecated and goes away in the next release: {_PUBLIC}",
    DeprecationWarning,
    stacklevel=2,
)
