"""How the server's errors show a client's value."""

from __future__ import annotations

__all__ = ["shown"]


def shown(value: object) -> str:
    """``value`` as an error message quotes it: a client's megabyte is not echoed back."""
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "…"
