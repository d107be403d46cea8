"""Tiny seeded diffusers VAEs and latents for tests: real classes, random weights, CPU float32, fast.

Every factory builds a fresh instance, so a test may enable tiling or slicing, attach hooks or offload it
without affecting others. The same call always gives the same weights. Default initialisation makes the
tiny Wan 2.1 decoder output nearly flat and never clamped, so all weights are re-drawn with a larger spread:
outputs span the value range, vary over space and time, and a share of them hits the clamp.
"""

from __future__ import annotations

import math

import torch
from diffusers import AutoencoderKLQwenImage, AutoencoderKLWan
from torch import nn

from streamvae.testing import TINY_VAE_CONFIGS

__all__ = ["latent", "tiny_qwen_image", "tiny_wan21", "tiny_wan22"]


def _randomize(vae: nn.Module, seed: int) -> None:
    """Re-draw every parameter from a seeded generator, scaled by fan-in so activations stay O(1)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in vae.named_parameters():
            if name.endswith("gamma"):  # RMS-norm scales: positive, around 1
                param.copy_(torch.rand(param.shape, generator=generator) + 0.5)
            elif param.ndim > 1:
                param.copy_(torch.randn(param.shape, generator=generator) / math.sqrt(param[0].numel()))
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)


def _latent_stats(z_dim: int, seed: int) -> tuple[list[float], list[float]]:
    """Seeded ``latents_mean`` / ``latents_std`` config lists of length ``z_dim`` (std kept positive)."""
    generator = torch.Generator().manual_seed(seed)
    mean = torch.randn(z_dim, generator=generator)
    std = torch.rand(z_dim, generator=generator) * 2.5 + 0.5
    return [round(v, 4) for v in mean.tolist()], [round(v, 4) for v in std.tolist()]


def tiny_wan21(seed: int = 1) -> AutoencoderKLWan:
    """Wan 2.1 layout (z_dim 16, 8× spatial): latent [B, 16, T, H, W] → video [B, 3, 1+4(T−1), 8H, 8W]."""
    torch.manual_seed(seed)
    vae = AutoencoderKLWan(**TINY_VAE_CONFIGS["wan21"])
    _randomize(vae, seed)
    return vae.eval()


def tiny_wan22(seed: int = 2) -> AutoencoderKLWan:
    """Wan 2.2 layout (z_dim 48, residual, patch_size 2): [B, 48, T, H, W] → [B, 3, 1+4(T−1), 16H, 16W]."""
    torch.manual_seed(seed)
    latents_mean, latents_std = _latent_stats(48, seed)
    vae = AutoencoderKLWan(
        **TINY_VAE_CONFIGS["wan22"],
        latents_mean=latents_mean,
        latents_std=latents_std,
    )
    _randomize(vae, seed)
    return vae.eval()


def tiny_qwen_image(seed: int = 3) -> AutoencoderKLQwenImage:
    """Qwen-Image layout (Wan 2.1's loop, no ``first_chunk``): [B, 16, T, H, W] → [B, 3, 1+4(T−1), 8H, 8W]."""
    torch.manual_seed(seed)
    vae = AutoencoderKLQwenImage(**TINY_VAE_CONFIGS["wan21"])
    _randomize(vae, seed)
    return vae.eval()


def latent(
    vae: nn.Module, batch: int = 1, frames: int = 5, h: int = 8, w: int = 8, seed: int = 0
) -> torch.Tensor:
    """A seeded standard-normal latent [batch, z_dim, frames, h, w] in the VAE's dtype (on the CPU)."""
    z_dim = int(vae.config.z_dim)  # type: ignore[union-attr]
    generator = torch.Generator().manual_seed(seed)
    dtype = next(vae.parameters()).dtype
    return torch.randn(batch, z_dim, frames, h, w, generator=generator).to(dtype)
