"""Which adapter wraps which diffusers VAE, and the one entry point that turns anything decodable into a
:class:`~streamvae.models.ChunkedDecoder`."""

from __future__ import annotations

import importlib
from typing import Any

from streamvae._protocol import SupportsChunkedVAEDecode
from streamvae.models._base import PIECEWISE_CLASSES, ChunkedDecoder, ProtocolDecoder

__all__ = ["as_decoder", "chunked_decoder", "supported_classes"]

# diffusers class name -> (adapter module, adapter class). Imported lazily: each family pulls only its own.
_ADAPTERS: dict[str, tuple[str, str]] = {
    "AutoencoderKLWan": ("streamvae.models.wan", "WanChunkedDecoder"),
    "AutoencoderKLQwenImage": ("streamvae.models.wan", "WanChunkedDecoder"),
    "AutoencoderKLHunyuanVideo": ("streamvae.models.hunyuan_video", "HunyuanVideoChunkedDecoder"),
    "AutoencoderKLLTXVideo": ("streamvae.models.ltx_video", "LTXVideoChunkedDecoder"),
    "AutoencoderKLCogVideoX": ("streamvae.models.cogvideox", "CogVideoXChunkedDecoder"),
    "AutoencoderKLLTX2Video": ("streamvae.models.ltx_video", "LTXVideoChunkedDecoder"),
}


def supported_classes() -> list[str]:
    """The diffusers VAE class names :func:`chunked_decoder` accepts."""
    return sorted(_ADAPTERS)


def chunked_decoder(vae: Any, **decode_kwargs: Any) -> ChunkedDecoder:
    """Return the streaming adapter for a supported diffusers VAE instance.

    ``decode_kwargs`` pass through to the adapter (for decoders whose ``decode`` takes extra inputs, such
    as LTX-Video's ``temb``). Raises :class:`TypeError` naming the class when it is not supported.
    """
    return _adapter(vae, decode_kwargs, owner="chunked_decoder", supported=supported_classes())


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
    else:
        supported = list(PIECEWISE_CLASSES) if pieces else supported_classes()
        return _adapter(vae, decode_kwargs, owner=owner, supported=supported)
    if decode_kwargs:
        raise TypeError(
            f"{owner}: {', '.join(decode_kwargs)} apply only to a diffusers VAE, "
            f"got a decoder ({type(vae).__qualname__})"
        )
    return decoder


def _adapter(vae: Any, decode_kwargs: dict[str, Any], *, owner: str, supported: list[str]) -> ChunkedDecoder:
    for cls in type(vae).__mro__:
        entry = _ADAPTERS.get(cls.__name__)
        if entry is not None and cls.__module__.startswith("diffusers."):
            module_name, adapter_name = entry
            adapter_cls = getattr(importlib.import_module(module_name), adapter_name)
            adapter: ChunkedDecoder = adapter_cls(vae, **decode_kwargs)
            return adapter
    raise TypeError(
        f"{owner}: vae must be a supported diffusers VAE or a streamvae.SupportsChunkedVAEDecode, got "
        f"{type(vae).__module__}.{type(vae).__qualname__}; "
        f"supported diffusers classes: {', '.join(supported)}"
    )
