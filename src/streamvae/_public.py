"""``@public``: the mark of an object that users import from ``streamvae`` itself.

It sets the object's ``__module__`` to ``"streamvae"``, so it shows where users import it from — in
reprs, tracebacks and documentation — and not as the private module that implements it, as anyio's and
httpx's public objects do. ``streamvae/__init__.py`` maps each such name to its module
(``tests/test_public_api.py`` checks the two agree).
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ["public"]

_T = TypeVar("_T")


def public(obj: _T) -> _T:
    """Mark ``obj`` as ``streamvae.<name>``."""
    obj.__module__ = "streamvae"
    return obj
