"""Deprecated: this module is private now; the alias goes away in the next release."""

from __future__ import annotations

import warnings

from streamvae._transfer import *  # noqa: F403  (its public names, as before)
from streamvae._transfer import __all__ as __all__

_PUBLIC = "import the public names from streamvae (leak checks from streamvae.testing)"
warnings.warn(
    f"streamvae.transfer is deprecated and goes away in the next release: {_PUBLIC}",
    DeprecationWarning,
    stacklevel=2,
)
