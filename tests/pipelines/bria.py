"""Bria Fibo and Bria Fibo Edit (AutoencoderKLWan)."""

from __future__ import annotations
