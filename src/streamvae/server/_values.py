"""A client's values as the server checks and quotes them: the seed range, and how an error shows a value."""

from __future__ import annotations

__all__ = ["MAX_SEED", "shown"]

#: the largest seed ``torch.Generator.manual_seed`` takes
MAX_SEED = 2**64 - 1


def shown(value: object) -> str:
    """``value`` as an error message quotes it: a client's megabyte is not echoed back."""
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "…"
