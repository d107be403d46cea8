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

warnings.warn(
    "streamvae.session is deprecated: import its names from streamvae", DeprecationWarning, stacklevel=2
)
