"""Which adapter wraps which diffusers VAE, and the one entry point that turns anything decodable into a
:class:`~streamvae.models.ChunkedDecoder`."""

from __future__ import annotations

import importlib
from typing import Any

from streamvae._protocol import SupportsChunkedVAEDecode
from streamvae.models._base import ChunkedDecoder, ProtocolDecoder

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
    for cls in type(vae).__mro__:
        entry = _ADAPTERS.get(cls.__name__)
        if entry is not None and cls.__module__.startswith("diffusers."):
            module_name, adapter_name = entry
            adapter_cls = getattr(importlib.import_module(module_name), adapter_name)
            adapter: ChunkedDecoder = adapter_cls(vae, **decode_kwargs)
            return adapter
    raise TypeError(
        f"chunked_decoder: {type(vae).__module__}.{type(vae).__qualname__} is not a supported VAE; "
        f"supported diffusers classes: {', '.join(supported_classes())}"
    )


def as_decoder(vae: Any, **decode_kwargs: Any) -> ChunkedDecoder:
    """The :class:`ChunkedDecoder` that decodes with ``vae``, so callers need not probe what it is.

    A :class:`ChunkedDecoder` is returned as it is; any other :class:`streamvae.SupportsChunkedVAEDecode`
    is wrapped in a :class:`ProtocolDecoder`; a supported diffusers VAE gets its adapter
    (:func:`chunked_decoder`, which takes ``decode_kwargs``). Anything else raises TypeError naming its
    class. Importing diffusers happens only for a diffusers VAE.
    """
    decoder: ChunkedDecoder
    if isinstance(vae, ChunkedDecoder):
        decoder = vae
    elif isinstance(vae, SupportsChunkedVAEDecode):
        decoder = ProtocolDecoder(vae)
    else:
        return chunked_decoder(vae, **decode_kwargs)
    if decode_kwargs:
        raise TypeError(
            f"as_decoder: {', '.join(decode_kwargs)} apply only to a diffusers VAE, "
            f"got a decoder ({type(vae).__qualname__})"
        )
    return decoder
