"""JoyImage Edit and Edit Plus (AutoencoderKLWan)."""

from __future__ import annotations
