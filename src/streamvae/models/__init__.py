"""Adapters that stream the decode of a diffusers VAE instance the user already has.

Each adapter wraps the instance (same module, same weights, nothing reloaded) and implements
:class:`streamvae.SupportsChunkedVAEDecode`. One module per model family.
"""

from __future__ import annotations

import importlib
from typing import Any

from streamvae.protocol import SupportsChunkedVAEDecode

__all__ = ["chunked_decoder", "supported_classes"]

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


def chunked_decoder(vae: Any, **decode_kwargs: Any) -> SupportsChunkedVAEDecode:
    """Return the streaming adapter for a supported diffusers VAE instance.

    ``decode_kwargs`` pass through to the adapter (for decoders whose ``decode`` takes extra inputs, such
    as LTX-Video's ``temb``). Raises :class:`TypeError` naming the class when it is not supported.
    """
    for cls in type(vae).__mro__:
        entry = _ADAPTERS.get(cls.__name__)
        if entry is not None and cls.__module__.startswith("diffusers."):
            module_name, adapter_name = entry
            adapter_cls = getattr(importlib.import_module(module_name), adapter_name)
            adapter: SupportsChunkedVAEDecode = adapter_cls(vae, **decode_kwargs)
            return adapter
    raise TypeError(
        f"chunked_decoder: {type(vae).__module__}.{type(vae).__qualname__} is not a supported VAE; "
        f"supported diffusers classes: {', '.join(supported_classes())}"
    )
