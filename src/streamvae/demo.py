"""The embedded demo: a small Wan 2.1-style VAE with seeded weights and a seeded, slowly moving latent.

It needs no download and decodes a few seconds of video on a laptop CPU, so ``streamvae demo``, the server
and the examples run anywhere. The weights are random, so the video is abstract: every 3×3 convolution
kernel is a seeded channel mix times a blur, which makes the decoder paint smooth colour fields instead of
noise, and the latent is a sum of low-frequency waves that drift over time, so the fields move.
"""

from __future__ import annotations

import math
from typing import cast

import torch
from diffusers import AutoencoderKLWan
from torch import Tensor, nn

from streamvae._checks import is_int

__all__ = ["DEMO_FPS", "check_demo_request", "demo_latent", "demo_vae", "latent_frames_for"]

#: frames per second of the demo video
DEMO_FPS = 16
#: the decoder's upscaling: a latent [.., h, w] decodes to frames of 8h × 8w
_SPATIAL = 8
#: each latent frame after the first decodes to this many frames
_TEMPORAL = 4
_Z_DIM = 16


def demo_vae(seed: int = 3) -> AutoencoderKLWan:
    """A Wan 2.1-layout ``AutoencoderKLWan`` (z_dim 16, 8× spatial, 4× temporal) with seeded weights.

    It is a real diffusers module, so everything streamvae does with it it does with a full-size Wan VAE.
    The same seed always gives the same weights.
    """
    torch.manual_seed(seed)  # the constructor's own initialisation, overwritten below, draws from it
    vae = AutoencoderKLWan(base_dim=3, z_dim=_Z_DIM, dim_mult=[1, 1, 1, 1], num_res_blocks=1)
    module = cast(nn.Module, vae)  # diffusers' ModelMixin is an nn.Module its stubs do not show
    _smooth_weights(module, seed)
    module.eval().requires_grad_(False)
    return vae


def _smooth_weights(vae: nn.Module, seed: int) -> None:
    """Re-draw every parameter from a seeded generator; spatial 3×3 kernels become a channel mix × blur."""
    generator = torch.Generator().manual_seed(seed)
    blur = torch.tensor([1.0, 2.0, 1.0])
    blur = blur[:, None] * blur[None, :] / 16
    with torch.no_grad():
        for name, param in vae.named_parameters():
            if name.endswith("gamma"):  # RMS-norm scales: positive, around 1
                param.copy_(torch.rand(param.shape, generator=generator) + 0.5)
            elif param.ndim >= 4 and param.shape[-2:] == (3, 3):
                # [out, in, (t,) 3, 3]: a random mix of blurred inputs keeps the picture smooth.
                mix_shape = (*param.shape[:-2], 1, 1)
                fan_in = math.prod(param.shape[1:-2])
                param.copy_(torch.randn(mix_shape, generator=generator) / math.sqrt(fan_in) * blur)
            elif param.ndim > 1:
                param.copy_(torch.randn(param.shape, generator=generator) / math.sqrt(param[0].numel()))
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)


def latent_frames_for(frames: int) -> int:
    """Latent frames that decode to ``frames`` video frames (``frames`` must be 1 + 4k)."""
    return 1 + (frames - 1) // _TEMPORAL


def check_demo_request(frames: int, size: int) -> None:
    """Raise ValueError unless ``frames`` is 1 + 4k (k ≥ 0) and ``size`` a positive multiple of 16."""
    if not is_int(frames) or frames < 1 or (frames - 1) % _TEMPORAL:
        raise ValueError(f"frames must be 1 + 4k (1, 5, 9, ..., 65, ...), got {frames!r}")
    # The latent is size / 8 across, and the yuv420p video needs even sizes: 16 keeps both whole.
    if not is_int(size) or size < 16 or size % 16:
        raise ValueError(f"size must be a positive multiple of 16 (16, 32, ..., 128, ...), got {size!r}")


def demo_latent(frames: int = 65, size: int = 128, seed: int = 0, *, batch: int = 1) -> Tensor:
    """A seeded latent ``[batch, 16, 1 + (frames − 1) / 4, size / 8, size / 8]`` that decodes to
    ``frames`` square frames of ``size`` pixels with :func:`demo_vae`.

    Each channel is a sum of three plane waves with seeded directions, phases and speeds, so the decoded
    picture is made of broad shapes that drift. Batch entries get different waves.
    """
    check_demo_request(frames, size)
    generator = torch.Generator().manual_seed(seed)
    side = size // _SPATIAL
    t = torch.arange(latent_frames_for(frames), dtype=torch.float32)[:, None, None]
    y = torch.linspace(0, 1, side)[None, :, None]
    x = torch.linspace(0, 1, side)[None, None, :]
    latent = torch.zeros(batch, _Z_DIM, t.shape[0], side, side)
    for entry in range(batch):
        for channel in range(_Z_DIM):
            for _ in range(3):
                fx, fy, phase, speed = (torch.rand(4, generator=generator) * 2 * math.pi).tolist()
                amplitude = float(torch.randn(1, generator=generator))
                wave = torch.sin(1.5 * (fx * x + fy * y) + phase + 0.35 * speed * t / (2 * math.pi))
                latent[entry, channel] += amplitude * wave
    return latent
