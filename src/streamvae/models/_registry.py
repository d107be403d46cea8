"""The one entry point that turns anything decodable into a :class:`~streamvae.models.ChunkedDecoder`:
an adapter (which one wraps which diffusers VAE is ``_families.py``'s table), a protocol wrapper, or the
decoder itself.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from streamvae._protocol import SupportsChunkedVAEDecode
from streamvae.models._base import ChunkedDecoder, ProtocolDecoder
from streamvae.models._families import ADAPTERS, adapter_class, piecewise_classes, supported_classes

__all__ = ["as_decoder", "chunked_decoder"]

_ALL = tuple(supported_classes())


def chunked_decoder(vae: Any, **decode_kwargs: Any) -> ChunkedDecoder:
    """Return the streaming adapter for a supported diffusers VAE instance.

    ``decode_kwargs`` pass through to the adapter (for decoders whose ``decode`` takes extra inputs, such
    as LTX-Video's ``temb``). Raises :class:`TypeError` naming the class when it is not supported.
    """
    return _adapter(
        vae, decode_kwargs, owner="chunked_decoder", accepted="a supported diffusers VAE", supported=_ALL
    )


def as_decoder(
    vae: Any, *, owner: str = "as_decoder", pieces: bool = False, **decode_kwargs: Any
) -> ChunkedDecoder:
    """The :class:`ChunkedDecoder` that decodes with ``vae``, so callers need not probe what it is.

    A :class:`ChunkedDecoder` is returned as it is; any other :class:`streamvae.SupportsChunkedVAEDecode`
    is wrapped in a :class:`ProtocolDecoder`; a supported diffusers VAE gets its adapter
    (:func:`chunked_decoder`, which takes ``decode_kwargs``). Anything else raises TypeError naming its
    class and ``owner`` (the function the user called), and listing the diffusers classes that would do:
    those that decode latents in pieces when ``pieces`` is true. Importing diffusers happens only for a
    diffusers VAE.
    """
    decoder: ChunkedDecoder
    if isinstance(vae, ChunkedDecoder):
        decoder = vae
    elif isinstance(vae, SupportsChunkedVAEDecode):
        decoder = ProtocolDecoder(vae)
    elif pieces:
        accepted = "a diffusers VAE or a streamvae.models.ChunkedDecoder that decodes latents in pieces"
        return _adapter(vae, decode_kwargs, owner=owner, accepted=accepted, supported=piecewise_classes())
    else:
        accepted = "a supported diffusers VAE or a streamvae.SupportsChunkedVAEDecode"
        return _adapter(vae, decode_kwargs, owner=owner, accepted=accepted, supported=_ALL)
    if decode_kwargs:
        raise TypeError(
            f"{owner}: {', '.join(decode_kwargs)} apply only to a diffusers VAE, "
            f"got a decoder ({type(vae).__qualname__})"
        )
    return decoder


def _adapter(
    vae: Any, decode_kwargs: dict[str, Any], *, owner: str, accepted: str, supported: Sequence[str]
) -> ChunkedDecoder:
    """The adapter of diffusers VAE ``vae``, or a TypeError naming ``owner`` and what it ``accepted``."""
    for cls in type(vae).__mro__:
        entry = ADAPTERS.get(cls.__name__)
        if entry is not None and cls.__module__.startswith("diffusers."):
            adapter_cls = adapter_class(cls.__name__)
            _check_decode_kwargs(adapter_cls, cls.__name__, vae, decode_kwargs, owner)
            adapter: ChunkedDecoder = adapter_cls(vae, **decode_kwargs)
            return adapter
    raise TypeError(
        f"{owner}: vae must be {accepted}, got {type(vae).__module__}.{type(vae).__qualname__}; "
        f"supported diffusers classes: {', '.join(supported)}"
    )


def _check_decode_kwargs(
    adapter_cls: type, vae_class: str, vae: Any, decode_kwargs: dict[str, Any], owner: str
) -> None:
    """A TypeError naming ``owner`` for keywords the adapter does not take: Python's own would name the
    adapter's ``__init__``, which the user never called."""
    signature = inspect.signature(adapter_cls)
    try:
        signature.bind(vae, **decode_kwargs)
    except TypeError as error:
        taken = ", ".join(list(signature.parameters)[1:]) or "none"
        raise TypeError(
            f"{owner}: {error} (the adapter of a diffusers {vae_class}, {adapter_cls.__name__}, "
            f"takes: {taken})"
        ) from None
