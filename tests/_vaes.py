"""Tiny seeded diffusers VAEs and latents for tests: real classes, random weights, CPU float32, fast.

Every factory builds a fresh instance, so a test may enable tiling or slicing, attach hooks or offload it
without affecting others. The same call always gives the same weights. Default initialisation makes the
tiny Wan 2.1 decoder output nearly flat and never clamped, so all weights are re-drawn with a larger spread:
outputs span the value range, vary over space and time, and a share of them hits the clamp.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from diffusers import (
    AutoencoderKLAllegro,
    AutoencoderKLCogVideoX,
    AutoencoderKLCosmos,
    AutoencoderKLHunyuanVideo,
    AutoencoderKLHunyuanVideo15,
    AutoencoderKLLTX2Video,
    AutoencoderKLLTXVideo,
    AutoencoderKLMochi,
    AutoencoderKLQwenImage,
    AutoencoderKLWan,
    Kandinsky6SRVAE,
)
from diffusers.models.autoencoders.autoencoder_kl_kvae_video import AutoencoderKLKVAEVideo
from diffusers.models.autoencoders.autoencoder_kl_magvit import AutoencoderKLMagvit
from diffusers.models.autoencoders.autoencoder_kl_minimax_h3 import AutoencoderKLMiniMaxH3
from diffusers.models.autoencoders.autoencoder_kl_temporal_decoder import AutoencoderKLTemporalDecoder
from torch import nn

from streamvae.testing import TINY_VAE_CONFIGS

__all__ = [
    "latent",
    "set_allegro_tiles",
    "tiny_allegro",
    "tiny_cogvideox",
    "tiny_cosmos",
    "tiny_hunyuan_video",
    "tiny_hunyuan_video15",
    "tiny_kvae",
    "tiny_ltx2_video",
    "tiny_ltx_video",
    "tiny_magvit",
    "tiny_minimax_h3",
    "tiny_mochi",
    "tiny_qwen_image",
    "tiny_stable_video",
    "tiny_wan21",
    "tiny_wan22",
    "with_small_ltx_windows",
]


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


def family_latents(channels: int, *, frames: int, size: int) -> Callable[..., torch.Tensor]:
    """``latent(batch=1, frames=frames, size=size, seed=0)``: a seeded standard-normal latent
    [batch, channels, frames, size, size] for a family's tests, with that file's defaults."""

    def latent(batch: int = 1, frames: int = frames, size: int = size, seed: int = 0) -> torch.Tensor:
        return torch.randn(batch, channels, frames, size, size, generator=torch.Generator().manual_seed(seed))

    return latent


def latent(
    vae: nn.Module, batch: int = 1, frames: int = 5, h: int = 8, w: int = 8, seed: int = 0
) -> torch.Tensor:
    """A seeded standard-normal latent [batch, z_dim, frames, h, w] in the VAE's dtype (on the CPU)."""
    z_dim = int(vae.config.z_dim)  # type: ignore[union-attr]
    generator = torch.Generator().manual_seed(seed)
    dtype = next(vae.parameters()).dtype
    return torch.randn(batch, z_dim, frames, h, w, generator=generator).to(dtype)


# The families beyond Wan: default initialisation, small layouts (8 channels or fewer, 8× compression).


def tiny_hunyuan_video(min_frames: int = 12, stride_frames: int = 8) -> AutoencoderKLHunyuanVideo:
    """HunyuanVideo: GroupNorm of 4 groups; windows of ``min_frames`` sample frames every ``stride_frames``
    (by default 3 latents + 1 every 2)."""
    torch.manual_seed(0)
    vae = AutoencoderKLHunyuanVideo(
        latent_channels=4, block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=4
    ).eval()
    vae.tile_sample_min_num_frames = min_frames
    vae.tile_sample_stride_num_frames = stride_frames
    return vae


def tiny_cogvideox() -> AutoencoderKLCogVideoX:
    """CogVideoX: latent batches of 2 (7 latents: 3, 2, 2), GroupNorm of 4 groups."""
    torch.manual_seed(0)
    return AutoencoderKLCogVideoX(
        latent_channels=4, block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=4
    ).eval()


#: LTX-Video and LTX-2 layouts: 8 latent channels, patch_size 1
TINY_LTX = {"latent_channels": 8, "layers_per_block": (1, 1, 1, 1, 1), "patch_size": 1}


def with_small_ltx_windows(vae: Any) -> Any:
    """Temporal tiling on: windows of 24 sample frames (3 latents + 1) every 16 (2 latents)."""
    vae.use_framewise_decoding = True
    vae.tile_sample_min_num_frames = 24
    vae.tile_sample_stride_num_frames = 16
    return vae.eval()


def tiny_ltx_video(**config: Any) -> AutoencoderKLLTXVideo:
    """LTX-Video with small windows; ``config`` adds to it (``timestep_conditioning=True``, ...)."""
    torch.manual_seed(0)
    blocks = {"block_out_channels": (8, 8, 8, 8), "decoder_block_out_channels": (8, 8, 8, 8)}
    layers = {"decoder_layers_per_block": (1, 1, 1, 1, 1)}
    return with_small_ltx_windows(AutoencoderKLLTXVideo(**TINY_LTX, **blocks, **layers, **config))


def tiny_ltx2_video() -> AutoencoderKLLTX2Video:
    """LTX-2 with small windows."""
    torch.manual_seed(0)
    blocks = {"block_out_channels": (8, 16, 32, 64), "decoder_block_out_channels": (8, 16, 32)}
    layers = {"decoder_layers_per_block": (1, 1, 1, 1)}
    ratios = {"spatial_compression_ratio": 8, "temporal_compression_ratio": 8}
    return with_small_ltx_windows(AutoencoderKLLTX2Video(**TINY_LTX, **blocks, **layers, **ratios))


# The families of diffusers 0.42.1's newer pipelines: default initialisation, the layouts of
# streamvae.testing.TINY_VAE_CONFIGS (the least channels their fixed-group norms take).


def tiny_kvae(**config: Any) -> AutoencoderKLKVAEVideo:
    """KVAE: latent [B, 4, T, H, W] → video [B, 3, frames, 4H, 4W]; ``config`` replaces keys of the layout."""
    torch.manual_seed(0)
    vae: AutoencoderKLKVAEVideo = AutoencoderKLKVAEVideo(**{**TINY_VAE_CONFIGS["kvae"], **config})
    return vae.eval()


def tiny_mochi() -> AutoencoderKLMochi:
    """Mochi: 12 latent channels, one resnet a block (outputs within ±0.7)."""
    torch.manual_seed(0)
    return AutoencoderKLMochi(**TINY_VAE_CONFIGS["mochi"]).eval()


def tiny_cosmos() -> AutoencoderKLCosmos:
    """Cosmos: 4 latent channels (outputs overshoot [-1, 1] several times over)."""
    torch.manual_seed(0)
    return AutoencoderKLCosmos(**TINY_VAE_CONFIGS["cosmos"]).eval()


def tiny_magvit(seed: int = 0) -> AutoencoderKLMagvit:
    """EasyAnimate's Magvit: latent [B, 4, T, H, W] → video [B, 3, 1 + 4(T−1), 8H, 8W]."""
    torch.manual_seed(seed)
    vae: AutoencoderKLMagvit = AutoencoderKLMagvit(**TINY_VAE_CONFIGS["magvit"])
    return vae.eval()


def tiny_stable_video(seed: int = 0) -> AutoencoderKLTemporalDecoder:
    """Stable Video Diffusion: latent [B·F, 4, H, W] → frames [B·F, 3, 2H, 2W]."""
    torch.manual_seed(seed)
    vae: AutoencoderKLTemporalDecoder = AutoencoderKLTemporalDecoder(**TINY_VAE_CONFIGS["stable_video"])
    return vae.eval()


def tiny_allegro(seed: int = 0, frames: tuple[int, int] | None = (12, 8)) -> AutoencoderKLAllegro:
    """Allegro: latent [B, 4, T, H, W] → ``vae.decode`` [B, 4T, 3, 2H, 2W]; tiling on, with tiles of
    ``frames`` (kernel, stride) frames, 8×8 pixels every 4 rows and 6 columns (``None``: diffusers' own
    tiles)."""
    torch.manual_seed(seed)
    vae = AutoencoderKLAllegro(**TINY_VAE_CONFIGS["allegro"]).eval()
    vae.enable_tiling()
    if frames is not None:
        set_allegro_tiles(vae, frames)
    return vae


def set_allegro_tiles(vae: AutoencoderKLAllegro, frames: tuple[int, int]) -> None:
    """Tiles of ``frames`` (kernel, stride) frames, 8×8 pixels every 4 rows and 6 columns."""
    vae.kernel = (frames[0], 8, 8)
    vae.stride = (frames[1], 4, 6)


def tiny_minimax_h3(seed: int = 7, **geometry: int) -> AutoencoderKLMiniMaxH3:
    """A seeded tiny MiniMax-H3 VAE whose decoder mixes tokens and whose pixels reach both clamps;
    ``geometry`` replaces config keys (``clip_length``, ``token_drop``, ...).

    Default initialisation zeroes the transformer blocks' residual scales (each token would decode alone,
    so neither tiles nor clips would matter): every parameter is re-drawn, and ``proj_out`` scaled so the
    ImageNet-normalized output spans [0, 1] and beyond.
    """
    torch.manual_seed(seed)
    vae = AutoencoderKLMiniMaxH3(**{**TINY_VAE_CONFIGS["minimax_h3"], **geometry})
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in vae.parameters():
            if param.ndim > 1:
                param.copy_(torch.randn(param.shape, generator=generator) / math.sqrt(param[0].numel()))
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
        vae.decoder.proj_out.weight.mul_(6.0)
    return vae.eval()


def tiny_hunyuan_video15(seed: int = 0) -> AutoencoderKLHunyuanVideo15:
    """HunyuanVideo 1.5: latent [B, 4, T, H, W] → video [B, 3, 1 + 4(T − 1), 8H, 8W]; weights re-drawn
    (default initialisation leaves its outputs nearly flat)."""
    torch.manual_seed(seed)
    vae = AutoencoderKLHunyuanVideo15(**TINY_VAE_CONFIGS["hunyuan_video15"])
    _randomize(vae, seed)
    return vae.eval()


def tiny_kandinsky6_sr(seed: int = 0) -> Kandinsky6SRVAE:
    """Kandinsky 6 super-resolution's VAE: four levels (the fewest whose upsamplers double time twice, as
    the declared ratio 4 says) of 8 channels, 4 latent channels."""
    torch.manual_seed(seed)
    channels = (8, 8, 8, 8)
    vae = Kandinsky6SRVAE(
        latent_channels=4,
        encoder_block_out_channels=channels,
        decoder_block_out_channels=channels,
        layers_per_block=1,
    )
    return vae.eval()
