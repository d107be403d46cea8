"""Which adapter wraps which diffusers VAE: the one table of families, and what is read off it.

It names each adapter by its module, imported only when asked for (each family pulls only its own
diffusers module); what an adapter can do (``takes_pieces``) is read off the adapter itself. Nothing here
imports the base at run time, so the base can name the families that take latent pieces in its errors.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamvae.models._base import ChunkedDecoder

__all__ = ["ADAPTERS", "adapter_class", "piecewise_classes", "supported_classes"]

# diffusers class name -> (adapter module, adapter class). Imported lazily: each family pulls only its own.
ADAPTERS: dict[str, tuple[str, str]] = {
    "AutoencoderKLWan": ("streamvae.models.wan", "WanChunkedDecoder"),
    "AutoencoderKLQwenImage": ("streamvae.models.wan", "WanChunkedDecoder"),
    "AutoencoderKLHunyuanVideo": ("streamvae.models.hunyuan_video", "HunyuanVideoChunkedDecoder"),
    "AutoencoderKLLTXVideo": ("streamvae.models.ltx_video", "LTXVideoChunkedDecoder"),
    "AutoencoderKLCogVideoX": ("streamvae.models.cogvideox", "CogVideoXChunkedDecoder"),
    "AutoencoderKLLTX2Video": ("streamvae.models.ltx_video", "LTXVideoChunkedDecoder"),
    "AutoencoderKLMiniMaxH3": ("streamvae.models.minimax_h3", "MiniMaxH3ChunkedDecoder"),
    "AutoencoderKLHunyuanVideo15": ("streamvae.models.hunyuan_video15", "HunyuanVideo15ChunkedDecoder"),
    "AutoencoderKLMochi": ("streamvae.models.mochi", "MochiChunkedDecoder"),
    "AutoencoderKLAllegro": ("streamvae.models.allegro", "AllegroChunkedDecoder"),
    "AutoencoderKLCosmos": ("streamvae.models.cosmos", "CosmosChunkedDecoder"),
    "AutoencoderKLMagvit": ("streamvae.models.magvit", "MagvitChunkedDecoder"),
    "AutoencoderKLTemporalDecoder": ("streamvae.models.stable_video", "StableVideoChunkedDecoder"),
    "AutoencoderKLKVAEVideo": ("streamvae.models.kvae", "KVAEVideoChunkedDecoder"),
    "AutoencoderKL": ("streamvae.models.image_vae", "ImageVAEChunkedDecoder"),
    "Kandinsky6SRVAE": ("streamvae.models.kandinsky6", "Kandinsky6SRChunkedDecoder"),
}


def supported_classes() -> list[str]:
    """The diffusers VAE class names :func:`streamvae.models.chunked_decoder` accepts."""
    return sorted(ADAPTERS)


@functools.cache
def piecewise_classes() -> tuple[str, ...]:
    """The diffusers VAE class names whose adapter decodes latents in pieces, read off each adapter's
    ``takes_pieces``. It imports every adapter (and diffusers): for messages, never on a decode's path."""
    found = []
    for vae_class in ADAPTERS:
        try:
            adapter_cls = adapter_class(vae_class)
        except ImportError:  # a family this diffusers lacks: no VAE of it can be in hand here
            continue
        if adapter_cls.takes_pieces:
            found.append(vae_class)
    return tuple(found)


def adapter_class(vae_class: str) -> type[ChunkedDecoder]:
    """The adapter class of diffusers class ``vae_class`` (a key of ``ADAPTERS``), imported now."""
    module_name, adapter_name = ADAPTERS[vae_class]
    adapter_cls: type[ChunkedDecoder] = getattr(importlib.import_module(module_name), adapter_name)
    return adapter_cls
