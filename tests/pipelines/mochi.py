"""The Mochi builder: text to video with :mod:`tests._vaes`' ``tiny_mochi``, one decode after the loop."""

from __future__ import annotations

from typing import Any

import torch
from diffusers import FlowMatchEulerDiscreteScheduler, MochiPipeline, MochiTransformer3DModel

from tests._vaes import tiny_mochi
from tests.pipelines._shared import (
    TEXT_TOKENS,
    MakeKwargs,
    Pipeline,
    builder,
    pipeline,
    prompt_pair,
    seeded,
    video_kwargs,
)

#: diffusers' tests/pipelines/mochi transformer (its VAE is tests._vaes.tiny_mochi's layout).
_MOCHI_TRANSFORMER: dict[str, Any] = {
    "patch_size": 2,
    "num_attention_heads": 2,
    "attention_head_dim": 8,
    "num_layers": 2,
    "pooled_projection_dim": 16,
    "in_channels": 12,
    "out_channels": None,
    "qk_norm": "rms_norm",
    "text_embed_dim": 32,
    "time_embed_dim": 4,
    "activation_fn": "swiglu",
    "max_sequence_length": TEXT_TOKENS,
}


@builder(frames=(1, 13, 16, 16, 3), latents=(1, 12, 3, 2, 2))
def mochi() -> tuple[Pipeline, MakeKwargs]:
    """Mochi text to video (``tiny_mochi``: 12 channels, 6× in time, 8× in space): 16×16, 13 frames (Mochi
    makes ``(n − 1) // 6 · 6 + 1`` of ``num_frames`` n) → ``.frames`` [1, 13, 16, 16, 3]. One
    ``vae.decode(latents · latents_std / scaling_factor + latents_mean, return_dict=False)`` (the VAE's
    default per-channel statistics, scaling factor 1) of [1, 12, 3, 2, 2]; ``output_type="latent"`` gives
    the normalized [1, 12, 3, 2, 2]."""
    pipe = pipeline(
        MochiPipeline,
        transformer=seeded(MochiTransformer3DModel, _MOCHI_TRANSFORMER),
        vae=tiny_mochi(),
        scheduler=FlowMatchEulerDiscreteScheduler(),
    )
    return pipe, video_kwargs(16, 4.5, prompt_pair(32, mask_dtype=torch.long), num_frames=13)
