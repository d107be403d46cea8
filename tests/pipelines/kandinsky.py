"""Kandinsky 5 builders: text and image to video with the HunyuanVideo VAE ``tiny_hunyuan_video`` (the
pipelines read its ``temporal_compression_ratio`` 4, ``spatial_compression_ratio`` 8 and ``scaling_factor``);
one decode after the loop, latents kept channels-last ``[B, T, h, w, C]``."""

from __future__ import annotations

from typing import Any

import torch
from diffusers import (
    FlowMatchEulerDiscreteScheduler,
    Kandinsky5I2VPipeline,
    Kandinsky5T2VPipeline,
    Kandinsky5Transformer3DModel,
)

from tests._vaes import tiny_hunyuan_video
from tests.pipelines._shared import (
    TEXT_TOKENS,
    MakeKwargs,
    Pipeline,
    builder,
    pipeline,
    randn,
    seeded,
    video_kwargs,
)

_KANDINSKY_QWEN_DIM = 16
_KANDINSKY_CLIP_DIM = 32
#: diffusers' tiny Kandinsky 5 transformer (tests/pipelines/kandinsky5).
_KANDINSKY_TRANSFORMER: dict[str, Any] = {
    "in_visual_dim": 4,
    "in_text_dim": _KANDINSKY_QWEN_DIM,
    "in_text_dim2": _KANDINSKY_CLIP_DIM,
    "time_dim": 32,
    "out_visual_dim": 4,
    "patch_size": (1, 2, 2),
    "model_dim": 48,
    "ff_dim": 128,
    "num_text_blocks": 1,
    "num_visual_blocks": 1,
    "axes_dims": (8, 8, 8),
    "visual_cond": False,
}


def _kandinsky_prompt() -> dict[str, Any]:
    """Qwen embeddings [1, 16, 16], a pooled CLIP embedding [1, 32] and the Qwen ``cu_seqlens`` [0, 16], for
    the prompt (seeds 1, 2) and the negative prompt (seeds 3, 4)."""
    kwargs: dict[str, Any] = {}
    for prefix, seed in (("", 1), ("negative_", 3)):
        kwargs[f"{prefix}prompt_embeds_qwen"] = randn(1, TEXT_TOKENS, _KANDINSKY_QWEN_DIM, seed=seed)
        kwargs[f"{prefix}prompt_embeds_clip"] = randn(1, _KANDINSKY_CLIP_DIM, seed=seed + 1)
        kwargs[f"{prefix}prompt_cu_seqlens"] = torch.tensor([0, TEXT_TOKENS], dtype=torch.int32)
    return kwargs


def _kandinsky(pipeline_class: Any, **transformer: Any) -> Pipeline:
    return pipeline(
        pipeline_class,
        vae=tiny_hunyuan_video(),
        transformer=seeded(Kandinsky5Transformer3DModel, {**_KANDINSKY_TRANSFORMER, **transformer}),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
    )


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 3, 4, 4, 4))
def kandinsky5_t2v() -> tuple[Pipeline, MakeKwargs]:
    """Kandinsky 5 text-to-video with the HunyuanVideo VAE ``tiny_hunyuan_video``: 32×32, 9 frames → one
    ``vae.decode`` of [1, 4, 3, 4, 4]; the ``"latent"`` output is channels-last [1, 3, 4, 4, 4]
    (``[B, T, h, w, C]``)."""
    return _kandinsky(Kandinsky5T2VPipeline), video_kwargs(32, 5.0, _kandinsky_prompt)


@builder(frames=(1, 17, 32, 32, 3), latents=(1, 5, 4, 4, 4))
def kandinsky5_i2v() -> tuple[Pipeline, MakeKwargs]:
    """Kandinsky 5 image to video (:func:`kandinsky5_t2v`'s transformer with ``visual_cond``: noise, a zero
    condition and a first-frame mask in; ``tiny_hunyuan_video``): a 32×32 image, 17 frames → ``vae.encode``
    of the image (sampled from the call's generator), its latent the first of [1, 5, 4, 4, 4] (channels
    last), not denoised. After the loop the pipeline re-normalizes the first 4 latent frames to the mean
    and std of the (up to 5) after them (``normalize_first_frame``, also for the ``"latent"`` output
    [1, 5, 4, 4, 4]), then one ``vae.decode`` of [1, 4, 5, 4, 4] → 17 frames.

    ``num_frames`` must be 17 or more: with 4 latent frames or fewer there are none after the first 4,
    their std is NaN, and so is every pixel (diffusers 0.42.1). About 0.25 s a call on 2 CPU cores; no
    audio."""
    pipe = _kandinsky(Kandinsky5I2VPipeline, visual_cond=True)
    return pipe, video_kwargs(32, 5.0, _kandinsky_prompt, image=True, num_frames=17)
