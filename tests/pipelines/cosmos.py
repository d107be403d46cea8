"""Cosmos 1 (AutoencoderKLCosmos), Cosmos 2, 2.5 and 3 (AutoencoderKLWan), and their modular blocks."""

from __future__ import annotations
