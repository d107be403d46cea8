"""Deprecated: import these names from :mod:`streamvae` (this module path goes away in the next release)."""

from __future__ import annotations

import warnings

from streamvae._encode import (
    EntryEncoder,
    OutputKind,
    PixelFormat,
    as_fps,
    check_video_codec,
    check_waveform,
    default_codec_options,
    merge_codec_options,
    open_containers,
)

__all__ = [
    "EntryEncoder",
    "OutputKind",
    "PixelFormat",
    "as_fps",
    "check_video_codec",
    "check_waveform",
    "default_codec_options",
    "merge_codec_options",
    "open_containers",
]

_PUBLIC = "import the public names from streamvae (leak checks from streamvae.testing)"
warnings.warn(
    f"streamvae.encode is deprecated and goes away in the next release: {_PUBLIC}",
    DeprecationWarning,
    stacklevel=2,
)
